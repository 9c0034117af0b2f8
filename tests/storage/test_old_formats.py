"""Stores and log records of older formats: a store written by an earlier release opens, reads,
verifies, exports and rebuilds; records of formats 1, 2 and 3 read back exactly, and one that lies
about its contents is corrupt."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX

# ── old stores keep working ───────────────────────────────────────────────────
from pi_durable.storage import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.projections import tables

from tests.fixtures import old_store
from tests.storage.test_footprint import export_text
from tests.support.cli_call import call
from tests.support.workload import snapshot
from tools.bench.concurrent import log_formats
from tools.bench.workloads import ROOT, entry, task


def snapshots_of(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every read of the fixture's ids, from the store at ``path`` and from ``MemoryStorage``
    fed the fixture's batches."""

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        work, _ = old_store.batches()
        memory = MemoryStorage()
        committed = await old_store.commit_all(memory, CTX)
        storage = await LmdbStorage.open(path, durability="process")
        try:
            assert storage.log.head() == committed
            return await snapshot(storage, work, committed), await snapshot(memory, work, committed)
        finally:
            await storage.close()

    return asyncio.run(run())


@pytest.mark.parametrize("written", sorted(old_store.ARCHIVES))
def test_a_store_of_an_old_format_opens_reads_verifies_exports_and_rebuilds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: int
) -> None:
    old_store.extract(tmp_path, old_store.ARCHIVES[written])
    path = tmp_path / "store"
    assert max(log_formats(str(path))) == written  # the fixture holds what it is named for
    exported = (tmp_path / "export.jsonl").read_text()
    # Its projections are of an older schema (6: written before snapshots were spaced by bytes):
    # a read-only check refuses them, naming both schemas; a read-only export reads the log.
    code, _, err = call(capsys, "verify", path)
    assert code == 2 and f"have schema 6, this program reads {tables.SCHEMA_VERSION}" in err, err
    assert export_text(path, capsys) == exported
    ours, reference = snapshots_of(path)  # opened for writing: the projections are rebuilt
    assert call(capsys, "verify", path)[0] == 0
    assert len(reference) > 3000 and ours == reference
    code, _out, err = call(capsys, "rebuild", path)
    assert code == 0, err
    assert call(capsys, "verify", path)[0] == 0
    assert export_text(path, capsys) == exported
    assert snapshots_of(path)[0] == reference

    new = [
        [{"type": "conversation", "value": {"id": 99_999}}],  # too short to compress: format 1
        [{"type": "entry", "value": entry(100_000, 99_999, 1, 99_999)}],  # format 3
    ]

    async def more() -> None:  # new records after the old ones: all read back
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for writes in new:
                await storage.commit(writes, CTX)
        finally:
            await storage.close()

    asyncio.run(more())
    assert log_formats(str(path)) == {1, written, 3}
    assert call(capsys, "verify", path)[0] == 0
    lines = export_text(path, capsys).splitlines(keepends=True)
    assert "".join(lines[:-2]) == exported
    assert [json.loads(line)["writes"] for line in lines[-2:]] == new


# ── log records: formats 1, 2 and 3 ──────────────────────────────────────────


import zlib  # noqa: E402

import msgspec  # noqa: E402
import zstandard  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pi_durable_lmdb.errors import CorruptRecordError  # noqa: E402
from pi_durable_lmdb.log import codec, zstd  # noqa: E402
from pi_durable_lmdb.log.deflate import PRESET  # noqa: E402
from pi_durable_lmdb.log.records import (  # noqa: E402
    RAW_BELOW,
    decode_record,
    encode_record,
    write_to_builtins,
)

from tests.support.workload import Workload  # noqa: E402
from tools.bench.workloads import document_delta  # noqa: E402


def test_the_preset_dictionary_never_changes() -> None:
    """Records of formats 2 and 3 decompress with exactly these bytes: a change would make them unreadable."""

    assert (
        hashlib.sha256(PRESET).hexdigest()
        == "93d63131aebf9e3d4fd1d8bbe7856d2b93db1dec773678a2cec0ad8c2effd08c"
    )


def crc(committed_at: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(committed_at.to_bytes(8, "big", signed=True)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), batches=st.integers(1, 30), at=st.integers(-(2**63), 2**63 - 1))
def test_every_batch_reads_back_exactly_and_raw_records_stay_format_1(
    seed: int, batches: int, at: int
) -> None:
    work = Workload(seed)
    for _ in range(batches):
        writes = work.batch()
        try:
            payload = codec.encode(writes)
        except (ValueError, TypeError):
            continue
        stored = encode_record(payload, at)
        fields = msgspec.msgpack.decode(stored)
        if fields[0] == 1:  # kept as it was: byte for byte what the earlier format wrote
            assert stored == msgspec.msgpack.encode([1, at, crc(at, payload), payload])
        else:
            assert fields[0] == 3 and fields[4] == len(payload) and len(stored) < len(payload) + 16
        commit = decode_record(7, stored)
        reference = decode_record(7, msgspec.msgpack.encode([1, at, crc(at, payload), payload]))
        assert commit == reference and commit.committed_at == at
        assert codec.encode([write_to_builtins(write) for write in commit.writes]) == payload


def test_a_turn_record_is_compressed_to_fit_six_to_a_page() -> None:
    payload = codec.encode(
        [
            {"type": "entry", "value": entry(1234, ROOT, 57, 2)},
            {"type": "task", "value": task(2, ROOT, 57, "running")},
        ]
    )
    stored = encode_record(payload, 1_760_000_000_000)
    assert msgspec.msgpack.decode(stored)[0] == 3
    assert len(stored) + 18 <= (4096 - 16) // 6  # key, node header, pointer: six records a page


def test_a_small_batch_is_stored_raw_and_reads_back() -> None:
    """A document delta's batch is under ``RAW_BELOW``: stored as format 1, byte for byte what
    that format always wrote (compressing it would save about 50 bytes for a third of the
    record's encoding time); a batch of ``RAW_BELOW`` bytes is compressed."""

    at = 1_760_000_000_000
    payload = codec.encode([document_delta(2)])
    assert len(payload) < RAW_BELOW
    stored = encode_record(payload, at)
    assert stored == msgspec.msgpack.encode([1, at, crc(at, payload), payload])
    commit = decode_record(4, stored)
    assert codec.encode([write_to_builtins(write) for write in commit.writes]) == payload
    frame = codec.encode([{"type": "conversation", "value": {"id": 5, "x": "t" * 40}}])
    for size in (RAW_BELOW - 1, RAW_BELOW):
        text = "t" * (size - len(frame) + 40)  # a str8 either way: one byte per letter
        payload = codec.encode([{"type": "conversation", "value": {"id": 5, "x": text}}])
        assert len(payload) == size
        fields = msgspec.msgpack.decode(encode_record(payload, at))
        assert fields[0] == (1 if size < RAW_BELOW else 3)


def test_a_small_batch_compressed_by_an_earlier_version_still_reads() -> None:
    """Earlier versions compressed every batch of 48 bytes or more: such records read as before."""

    payload = codec.encode([document_delta(2)])
    frame = zstd.compress(payload)
    assert frame is not None
    earlier = msgspec.msgpack.encode([3, 5, crc(5, frame), frame, len(payload)])
    expected = decode_record(1, msgspec.msgpack.encode([1, 5, crc(5, payload), payload]))
    assert decode_record(1, earlier) == expected
    assert decode_record(1, zstd_record(payload)) == expected
    assert decode_record(1, deflated_record(payload)) == expected


def deflated_record(payload: bytes, size: int | None = None, at: int = 5) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, PRESET)
    deflated = compressor.compress(payload) + compressor.flush()
    return msgspec.msgpack.encode(
        [2, at, crc(at, deflated), deflated, len(payload) if size is None else size]
    )


def zstd_record(
    payload: bytes, size: int | None = None, at: int = 5, tail: bytes = b"", cut: int = 0
) -> bytes:
    dictionary = zstandard.ZstdCompressionDict(PRESET, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    frame = zstandard.ZstdCompressor(
        level=3, dict_data=dictionary, write_content_size=True
    ).compress(payload)
    frame = frame[: len(frame) - cut] + tail
    return msgspec.msgpack.encode(
        [3, at, crc(at, frame), frame, len(payload) if size is None else size]
    )


def forged_zstd_record(claim: int) -> bytes:
    """A format-3 record whose frame header and size field agree on ``claim`` bytes, with a valid
    checksum: a 13-byte frame (magic, a single-segment descriptor, the 8-byte content size)."""

    frame = b"\x28\xb5\x2f\xfd\xe0" + claim.to_bytes(8, "little")
    assert zstandard.frame_content_size(frame) == claim
    return msgspec.msgpack.encode([3, 5, crc(5, frame), frame, claim])


def test_a_batch_too_dense_for_a_zstd_frame_is_stored_deflated_and_reads_back() -> None:
    payload = codec.encode(
        [{"type": "entry", "value": {"id": 5, "conversationId": 1, "text": "a" * 500_000}}]
    )
    stored = encode_record(payload, 9)
    fields = msgspec.msgpack.decode(stored)
    assert fields[0] == 2 and len(stored) < len(payload) // 200
    assert (
        codec.encode([write_to_builtins(write) for write in decode_record(4, stored).writes])
        == payload
    )


def test_records_of_format_2_and_3_made_elsewhere_read() -> None:
    """Any deflate or zstd writer's records read (other levels, a dictionary id, a checksum in
    the frame): the format fixes the dictionary, not the compressor's settings."""

    payload = codec.encode([{"type": "entry", "value": entry(77, ROOT, 3, 2)}])
    expected = decode_record(1, msgspec.msgpack.encode([1, 5, crc(5, payload), payload]))
    assert decode_record(1, deflated_record(payload)) == expected
    assert decode_record(1, zstd_record(payload)) == expected


@pytest.mark.parametrize(
    "stored, reason",
    [
        (zstd_record(b"\x91\xa1x" * 40, size=119), "a zstd frame of 120 bytes, not 119"),
        (zstd_record(b"\x91\xa1x" * 40, size=121), "a zstd frame of 120 bytes, not 121"),
        (zstd_record(b"\x91\xa1x" * 40, size=0), "size 0"),
        (zstd_record(b"\x91\xa1x" * 40, tail=b"\x00"), "unused data"),
        (
            zstd_record(b"\x91\xa1x" * 400_000, size=100),
            "not 100",
        ),  # the frame says otherwise: refused unread
        (
            zstd_record(b"\x91\xa1x" * 40, cut=3),
            "did not decompress full frame",
        ),  # the frame cut short
        (
            zstd_record(b"\x91\xa1x" * 40, tail=zstandard.ZstdCompressor().compress(b"more")),
            "unused data",
        ),
        (
            zstd_record(b"x" * 2_000_000),
            "more than 256 times",
        ),  # a writer stores such a batch as format 2
        (forged_zstd_record(2**40), "claims"),
        (forged_zstd_record(2**63), "claims"),
        (deflated_record(b"\x91\xa1x" * 40, size=2**63), "cannot hold"),
        (msgspec.msgpack.encode([3, 5, crc(5, b"not zstd"), b"not zstd", 50]), "not a zstd frame"),
        (deflated_record(b"\x91\xa1x" * 40, size=119), "deflate"),
        (deflated_record(b"\x91\xa1x" * 40, size=121), "deflate"),
        (deflated_record(b"\x91\xa1x" * 40, size=0), "size 0"),
        (
            deflated_record(b"\x91\xa1x" * 400_000, size=100),
            "deflate",
        ),  # never inflates past the size
        (msgspec.msgpack.encode([2, 5, crc(5, b"not deflate"), b"not deflate", 50]), "deflate"),
        (msgspec.msgpack.encode([1, 5, crc(5, b"\x90"), b"\x90", 1]), "format 1 with size"),
        (msgspec.msgpack.encode([6, 5, crc(5, b"\x90"), b"\x90"]), "unsupported record format 6"),
        (msgspec.msgpack.encode([4, 5, crc(5, b"\x90"), b"\x90"]), "tombstone's fields wrong"),
        (
            msgspec.msgpack.encode([4, 5, crc(5, b"\x90"), b"\x90", 0, bytes(32), 7, 1]),
            "checksum mismatch",
        ),  # a tombstone's checksum covers its leaf, erasure and count too
    ],
)
def test_a_record_that_lies_about_its_deflated_writes_is_corrupt(
    stored: bytes, reason: str
) -> None:
    with pytest.raises(CorruptRecordError, match=reason):
        decode_record(9, stored)


def test_a_record_of_format_1_made_the_old_way_reads() -> None:
    payload = codec.encode([{"type": "conversation", "value": {"id": 5}}])
    commit = decode_record(3, msgspec.msgpack.encode([1, 77, crc(77, payload), payload]))
    assert commit.committed_at == 77 and write_to_builtins(commit.writes[0]) == {
        "type": "conversation",
        "value": {"id": 5},
    }
