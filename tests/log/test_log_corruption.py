"""Corrupted write-log records, also edited into ``data.mdb`` itself: each is raised naming its sequence,
never served.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable_lmdb.log import CorruptRecordError, seq_key
from pi_durable_lmdb.log.records import encode_record

from ..support.log_helpers import commit, open_log

# ── 8. corruption ───────────────────────────────────────────────────────────


def _flip_last_byte(raw: bytes) -> bytes:
    return raw[:-1] + bytes([raw[-1] ^ 0x5A])


CORRUPTIONS = {
    "payload-byte": _flip_last_byte,
    "truncated": lambda raw: raw[: len(raw) // 2],
    "empty": lambda raw: b"",
    "garbage": lambda raw: b"\xc1\xff\x00garbage",
    "format": lambda raw: raw[:1] + b"\x09" + raw[2:],
    "valid-crc-invalid-writes": lambda raw: encode_record(
        msgspec.msgpack.encode([{"type": "bogus"}]), 1
    ),
    "valid-crc-not-msgpack": lambda raw: encode_record(b"\xc1\xc1", 1),
}


@pytest.mark.parametrize("damage", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_corrupt_record_raises_naming_its_seq(tmp_path: Path, damage: Any) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    for i in range(4):
        commit(env, log, [{"type": "entry", "value": f"record {i}"}])
    with env.read() as txn:
        raw = txn.get(seq_key(3), db=log.db)
    env.write(lambda txn: txn.put(seq_key(3), damage(raw), db=log.db))
    env.close()

    env, log = open_log(path, readonly=True)
    try:
        with pytest.raises(CorruptRecordError, match=r"\b3\b") as caught:
            log.get(3)
        assert caught.value.seq == 3
        seen: list[int] = []
        with pytest.raises(CorruptRecordError) as caught:
            for c in log.read(1):
                seen.append(c.seq)
        assert caught.value.seq == 3 and seen == [1, 2]
        with pytest.raises(CorruptRecordError):
            list(log.read(3, 3))
        assert [c.seq for c in log.read(4)] == [4]
        assert log.get(2) is not None and log.get(4) is not None
    finally:
        env.close()


async def test_follow_raises_on_a_corrupt_record(tmp_path: Path) -> None:
    env, log = open_log(tmp_path / "store")
    try:
        for i in range(3):
            commit(env, log, [{"type": "entry", "value": i}])
        with env.read() as txn:
            raw = txn.get(seq_key(2), db=log.db)
        env.write(lambda txn: txn.put(seq_key(2), _flip_last_byte(raw), db=log.db))
        seen = []
        with pytest.raises(CorruptRecordError) as caught:
            async with contextlib.aclosing(log.follow(1)) as commits:
                async for c in commits:
                    seen.append(c.seq)
        assert caught.value.seq == 2 and seen == [1]
    finally:
        env.close()


def test_corruption_edited_into_data_mdb(tmp_path: Path) -> None:
    path = tmp_path / "store"
    marker = "MARKER-0123456789-abcdefghij"
    env, log = open_log(path)
    commit(env, log, [{"type": "entry", "value": "first"}])
    target = commit(env, log, [{"type": "entry", "value": marker}])
    commit(env, log, [{"type": "entry", "value": "third"}])
    with env.read() as txn:
        stored = bytes(txn.get(seq_key(target), db=log.db))
    env.close()

    data = bytearray((path / "data.mdb").read_bytes())
    needle = stored[-16:]  # the end of the stored (possibly compressed) payload
    hits = 0
    start = data.find(needle)
    while start != -1:
        data[start + 6] ^= 0x20  # one bit, inside the stored payload
        hits += 1
        start = data.find(needle, start + 1)
    assert hits >= 1
    (path / "data.mdb").write_bytes(bytes(data))

    env, log = open_log(path, readonly=True)
    try:
        with pytest.raises(CorruptRecordError, match=f"{target}") as caught:
            log.get(target)
        assert caught.value.seq == target == 2
        with pytest.raises(CorruptRecordError) as caught:
            list(log.read(1, 3))
        assert caught.value.seq == target
        assert log.get(1) is not None and log.get(3) is not None
    finally:
        env.close()
