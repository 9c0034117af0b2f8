"""Entry rows as stored since schema 11: a packed row is its zstd frame alone; a frame that does
not hold what it declares, or a row shorter than its seal, is named corrupt by every read of it;
schema 10's rows (marker, size, frame) still read, from a log's base, and a store of schema 10
is rebuilt at its open.

Every test works on real LMDB files written through ``LmdbStorage``; the damage is put with
py-lmdb under a seal that holds, so only the frame's own checks can find it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zstandard
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.errors import CorruptProjectionError
from pi_durable_lmdb.log import Environment, zstd
from pi_durable_lmdb.log.tree import TILE
from pi_durable_lmdb.projections import tables

from tests.storage.test_footprint import entry_rows
from tests.support.bases import mark_core_schema, rewrite_base
from tools.bench.workloads import ROOT, conversation, entry, task

TURNS = 12


def schema_10_row(encoded: bytes) -> bytes:
    """An encoded entry row as schema 10 packed it: ``PACKED`` + 4-byte size + the frame."""

    frame = zstd.compress(encoded, fast=True)
    assert frame is not None
    return tables.PACKED + struct.pack(">I", len(encoded)) + frame


async def fill(store: Any, turns: int = TURNS) -> None:
    await store.commit([conversation(ROOT)], CTX)
    for n in range(1, turns + 1):
        await store.commit([{"type": "entry", "value": entry(1000 + n, ROOT, n)}], CTX)


def write_store(path: Path) -> None:
    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await fill(storage)
        finally:
            await storage.close()

    asyncio.run(run())


def entries_db(env: Environment) -> Any:
    with env.read() as txn:
        names = [bytes(key).decode() for key, _ in txn.cursor()]
    return env.db(next(n for n in names if n.endswith(".entries.by_conversation")))


def rewrite_rows(path: Path, change: Callable[[bytes, bytes], bytes | None]) -> None:
    """Put ``change(key, value)`` (unsealed value; None: as it was) over each entry row,
    sealed anew."""

    env = Environment(path)
    try:
        db = entries_db(env)

        def put(txn: Any) -> None:
            for key, raw in [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]:
                new = change(key, raw[tables.SUM_SIZE :])
                if new is not None:
                    txn.put(key, tables.seal(new), db=db)

        env.write(put)
    finally:
        env.close()


async def answers(store: Any, turns: int = TURNS) -> dict[str, Any]:
    """Every entry read the tests compare: pages both ways, each entry by id."""

    pages = []
    for descending in (False, True):
        cursor = None
        while True:
            query = {"conversationId": ROOT, "descending": descending}
            page = await store.scan_entries(query, 5, cursor, CTX)
            pages.append(page)
            cursor = page.get("next")
            if cursor is None:
                break
    ids = range(1000, 1000 + turns + 2)
    return {"pages": pages, "entries": [await store.entry(id, CTX) for id in ids]}


def memory_answers(turns: int = TURNS) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        memory = MemoryStorage()
        await fill(memory, turns)
        return await answers(memory, turns)

    return asyncio.run(run())


def lmdb_answers(path: Path, turns: int = TURNS) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            return await answers(storage, turns)
        finally:
            await storage.close()

    return asyncio.run(run())


def test_a_packed_row_is_its_frame_alone(tmp_path: Path) -> None:
    """A model message's row is one zstd frame (it declares its own size, nothing before it),
    and reads answer as ``MemoryStorage`` does."""

    path = tmp_path / "store"
    write_store(path)
    rows = entry_rows(path)
    assert len(rows) == TURNS
    for key, raw in rows:
        frame = raw[tables.SUM_SIZE :]
        assert frame[:4] == zstd.MAGIC
        encoded = zstd.unframe(frame)
        assert tables.decode_entry(encoded, key).record["id"] == tables.read_u64(key, 8)
    assert lmdb_answers(path) == memory_answers()


def _dense_frame() -> bytes:
    """A valid frame whose declared size is more than ``MAX_EXPANSION`` times its own."""

    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(bytes(1 << 20))
    assert zstd.dense(frame, 1 << 20)
    return frame


def _claims(frame: bytes, size: int) -> bytes:
    """``frame`` with its 2-byte content size field set to declare ``size`` bytes."""

    assert frame[4] == 0x60  # single segment, a 2-byte size field (256 + value)
    return frame[:5] + struct.pack("<H", size - 256) + frame[7:]


DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "cut short": lambda frame: frame[:-6],
    "zeroed tail": lambda frame: frame[:-6] + bytes(6),
    "claims fewer bytes": lambda frame: _claims(frame, 300),
    "claims more bytes": lambda frame: _claims(frame, 2000),
    "claims past the bound": lambda frame: _dense_frame(),
    "claims nothing": lambda frame: zstd.MAGIC + b"\x20\x00\x01\x00\x00",
    "magic alone": lambda frame: zstd.MAGIC,
    "the marker and garbage": lambda frame: tables.FRAMED + b"\x00" * 40,
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_frame_that_does_not_hold_what_it_declares_is_named(tmp_path: Path, damage: str) -> None:
    """A packed row whose seal holds but whose frame is damaged raises
    ``CorruptProjectionError`` from a page, a read by id and a read as of a commit; the rows
    around it read as before."""

    path = tmp_path / "store"
    write_store(path)
    target = 1005
    rewrite_rows(
        path,
        lambda key, value: DAMAGE[damage](value) if tables.read_u64(key, 8) == target else None,
    )

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            with pytest.raises(CorruptProjectionError):
                await storage.entry(target, CTX)
            with pytest.raises(CorruptProjectionError):
                await storage.scan_entries({"conversationId": ROOT}, 50, None, CTX)
            view = await storage.as_of(storage.log.head())
            with pytest.raises(CorruptProjectionError):
                await view.scan_entries({"conversationId": ROOT}, 50, None, CTX)
            newest = await storage.scan_entries({"conversationId": ROOT}, 5, None, CTX)
            assert [item["id"] for item in newest["items"]] == [1012, 1011, 1010, 1009, 1008]
            found = await storage.entry(target + 1, CTX)
            assert found is not None and found["entry"] == entry(target + 1, ROOT, 6)
        finally:
            await storage.close()

    asyncio.run(run())


def test_a_row_shorter_than_its_seal_is_named(tmp_path: Path) -> None:
    """A row cut below its 8-byte checksum is corrupt to a page of entries too, not a
    ``struct.error``."""

    path = tmp_path / "store"
    write_store(path)
    env = Environment(path)
    try:
        db = entries_db(env)
        key = next(k for k, _ in entry_rows(path) if tables.read_u64(k, 8) == 1003)
        env.write(lambda txn: txn.put(key, b"\x01\x02\x03", db=db))
    finally:
        env.close()

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            with pytest.raises(CorruptProjectionError):
                await storage.scan_entries({"conversationId": ROOT}, 50, None, CTX)
            with pytest.raises(CorruptProjectionError):
                await storage.entry(1003, CTX)
        finally:
            await storage.close()

    asyncio.run(run())


def test_schema_10_rows_read_as_before(tmp_path: Path) -> None:
    """Rows in schema 10's form (what a log's base trimmed under it holds) read as the frames
    do, and a damaged one of them is corrupt."""

    path = tmp_path / "store"
    write_store(path)
    rewrite_rows(path, lambda key, value: schema_10_row(tables.unpack_entry(value, "", key)))
    assert all(raw[8:9] == tables.PACKED for _, raw in entry_rows(path))
    assert lmdb_answers(path) == memory_answers()
    rewrite_rows(path, lambda key, value: value[:-6] if tables.read_u64(key, 8) == 1002 else None)
    with pytest.raises(CorruptProjectionError):
        lmdb_answers(path)


def mark_schema_10(path: Path) -> None:
    """Mark the store's projections as schema 10's: the next writer's open rebuilds them."""

    env = Environment(path)
    try:
        mark_core_schema(env, 10)
    finally:
        env.close()


def test_a_store_of_schema_10_is_rebuilt_at_its_open(tmp_path: Path) -> None:
    """A store whose projections are schema 10 (rows with marker and size) opens for writing
    into this schema: every entry row becomes its frame alone, and reads answer as before."""

    path = tmp_path / "store"
    write_store(path)
    rewrite_rows(path, lambda key, value: schema_10_row(tables.unpack_entry(value, "", key)))
    mark_schema_10(path)
    assert lmdb_answers(path) == memory_answers()
    rows = entry_rows(path)
    assert len(rows) == TURNS
    assert all(raw[8:12] == zstd.MAGIC for _, raw in rows)


def test_a_base_trimmed_under_schema_10_folds(tmp_path: Path) -> None:
    """A log's base holding schema 10's rows is read by this schema: the rebuild at the open of a
    store of schema 10 folds it, and the entries it holds read as ``MemoryStorage`` answers."""

    path = tmp_path / "store"
    turns = TILE + 20

    async def trim() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await fill(storage, turns)
            assert (await storage.trim(TILE + 1)).records == TILE
        finally:
            await storage.close()

    asyncio.run(trim())
    env = Environment(path)
    try:

        def schema_10(name: str, key: bytes, value: bytes) -> bytes:
            if name != tables.ENTRIES_BY_CONVERSATION:
                return value
            encoded = tables.unpack_entry(value[tables.SUM_SIZE :], name, key)
            return tables.seal(schema_10_row(encoded))

        old = rewrite_base(env, 10, schema_10)
        assert sum(1 for name, _, value in old if value[8:9] == tables.PACKED) == TILE - 1
    finally:
        env.close()
    mark_schema_10(path)
    assert lmdb_answers(path, turns) == memory_answers(turns)
    packed = [raw for _, raw in entry_rows(path) if raw[8:9] == tables.PACKED]
    assert len(packed) == TILE - 1  # folded from the base as they are


def test_a_task_row_shorter_than_its_seal_is_named_by_a_scan(tmp_path: Path) -> None:
    """The scans of the other tables check a row's seal the same way: a cut row is corrupt."""

    path = tmp_path / "store"

    async def write() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit([{"type": "task", "value": task(7, ROOT, 0, "pending")}], CTX)
        finally:
            await storage.close()

    asyncio.run(write())
    env = Environment(path)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith(f".{tables.TASKS}")))
        env.write(lambda txn: txn.put(tables.u64(7), b"\x01\x02\x03", db=db))
    finally:
        env.close()

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            with pytest.raises(CorruptProjectionError):
                await storage.scan_tasks({}, 10, None, CTX)
        finally:
            await storage.close()

    asyncio.run(run())
