"""A log whose LMDB pages were damaged so that its index hands records back out of order (two
leaf pages' contents swapped, which LMDB cannot notice: its pages carry no checksum). Reading it
raises ``CorruptRecordError`` naming the record found out of place; before, ``WriteLog.read``
went back to an earlier sequence and read the same records again forever (the power-loss
checker spun for its whole timeout on such a crash state)."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.errors import CorruptRecordError
from pi_durable_lmdb.log import WriteLog

PAGE = 4096
P_LEAF = 0x02
HEADER = 16  # mp_pgno (8), mp_pad (2), mp_flags (2), mp_lower (2), mp_upper (2)


def log_leaf_pages(data: bytes) -> dict[int, int]:
    """Leaf pages whose first node has an 8-byte key and a log record (msgpack ``[3, ...]``) as
    its value: page number -> first sequence."""

    found: dict[int, int] = {}
    for number in range(2, len(data) // PAGE):
        page = data[number * PAGE : (number + 1) * PAGE]
        flags, lower = struct.unpack_from("<HH", page, 10)
        if flags != P_LEAF or lower <= HEADER:
            continue
        node = struct.unpack_from("<H", page, HEADER)[0]
        key_size = struct.unpack_from("<H", page, node + 6)[0]
        if key_size == 8 and page[node + 16 : node + 18] == b"\x95\x03":
            found[number] = struct.unpack_from(">Q", page, node + 8)[0]
    return found


async def test_a_log_whose_index_runs_out_of_order_is_corrupt_not_read_forever(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    for n in range(1, 200):
        await storage.commit(
            [{"type": "conversation", "value": {"id": n, "title": "x" * 300}}], CTX
        )
    await storage.close()

    data = bytearray((path / "data.mdb").read_bytes())
    reachable = {}
    for number, first in sorted(log_leaf_pages(bytes(data)).items()):
        reachable[first] = number  # a later copy of a page (copy-on-write) replaces an earlier one
    assert 1 in reachable and len(reachable) >= 3, reachable
    low, high = reachable[1], reachable[sorted(reachable)[1]]
    a, b = data[low * PAGE + 8 : (low + 1) * PAGE], data[high * PAGE + 8 : (high + 1) * PAGE]
    data[low * PAGE + 8 : (low + 1) * PAGE], data[high * PAGE + 8 : (high + 1) * PAGE] = (
        b,
        a,
    )  # each keeps its number
    (path / "data.mdb").write_bytes(bytes(data))

    reader = await LmdbStorage.open(path, readonly=True)
    try:
        log: WriteLog = reader.log
        with pytest.raises(CorruptRecordError, match="out of order") as caught:
            list(itertools.islice(log.read(1, None, decode=lambda seq, raw: seq), 10_000))
        assert caught.value.seq == 1
    finally:
        await reader.close()
