"""Where a store's bytes go: ``stats``' page breakdown, history kept by reference to the log,
long document values in chunks, entry rows packed.

Every test works on real LMDB files written through ``LmdbStorage``; the page counts are checked
against an independent reading of the same file with py-lmdb itself.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.errors import CorruptProjectionError
from pi_durable_lmdb.log import Environment
from pi_durable_lmdb.log.environment import MAIN_DB
from pi_durable_lmdb.projections import tables

from tests.support.cli_call import call
from tools.bench.workloads import ROOT, conversation, document_create, document_delta, entry, task


def write_turns(path: Path, turns: int, start: int = 1) -> None:
    """``turns`` commits of the bench's ``commit_turn`` workload (an entry and the task record)."""

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            if start == 1:
                await storage.commit([conversation(ROOT)], CTX)
                await storage.commit([{"type": "task", "value": task(2, ROOT, 0, "pending")}], CTX)
            for n in range(start, start + turns):
                await storage.commit(
                    [
                        {"type": "entry", "value": entry(1000 + n, ROOT, n, 2)},
                        {
                            "type": "task",
                            "value": task(2, ROOT, n, "running" if n % 3 else "sleeping"),
                        },
                    ],
                    CTX,
                )
        finally:
            await storage.close()

    asyncio.run(run())


def raw_pages(path: Path) -> tuple[int, dict[str, int], int]:
    """(page size, pages per named database, last page number) read with py-lmdb directly."""

    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=256, subdir=True)
    try:
        pages: dict[str, int] = {}
        with env.begin() as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
            for name in names:
                stat = txn.stat(env.open_db(name, txn=txn, create=False))
                pages[name.decode()] = (
                    stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
                )
        main = env.stat()
        pages[MAIN_DB] = main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
        return main["psize"], pages, env.info()["last_pgno"]
    finally:
        env.close()


@pytest.mark.parametrize("turns", [0, 40, 400])
def test_the_page_breakdown_accounts_for_every_page_of_the_file(tmp_path: Path, turns: int) -> None:
    path = tmp_path / "store"
    write_turns(path, turns)
    env = Environment(path, readonly=True)
    try:
        stats = env.page_stats()
    finally:
        env.close()
    psize, pages, last = raw_pages(path)
    assert stats.page_size == psize
    assert {name: db.pages for name, db in stats.dbs.items()} == pages
    assert stats.used_pages == last + 1
    # two meta pages, every database's pages, the free ones: nothing more, nothing less
    assert 2 + sum(pages.values()) + stats.free_pages == stats.used_pages
    assert stats.file_bytes == os.path.getsize(path / "data.mdb")
    assert stats.free_bytes >= stats.free_pages * psize
    assert stats.dbs["log"].entries == turns + 2


def test_stats_json_reports_each_database_and_the_free_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    write_turns(path, 300)
    code, out, _ = call(capsys, "stats", path, "--json")
    assert code == 0
    info = json.loads(out)
    foot = info["footprint"]
    psize, pages, last = raw_pages(path)
    for name, count in pages.items():
        db = foot["databases"][name]
        assert db["branchPages"] + db["leafPages"] + db["overflowPages"] == count
        assert db["bytes"] == count * psize
    log = foot["databases"]["log"]
    assert log["entries"] == info["records"] == 302
    assert foot["logBytesPerRecord"] == round(log["bytes"] / 302, 1)
    assert foot["freeBytes"] == foot["freePages"] * psize + info["fileBytes"] - (last + 1) * psize
    assert foot["freeShare"] == round(foot["freeBytes"] / info["fileBytes"], 4)
    assert info["logBytes"] == log["bytes"]
    assert info["projectionBytes"] == sum(
        db["bytes"] for name, db in foot["databases"].items() if name.startswith("p")
    )
    code, text, _ = call(capsys, "stats", path)
    assert code == 0
    assert "free pages" in text and "log per record" in text
    assert "p0.entries.by_conversation" in text


def test_a_rebuild_shows_as_free_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rebuild folds fresh projections beside the live ones and drops the old: their pages are
    free afterwards (the file does not shrink), and ``stats`` says so."""

    path = tmp_path / "store"
    write_turns(path, 300)
    before = json.loads(call(capsys, "stats", path, "--json")[1])
    assert call(capsys, "rebuild", path)[0] == 0
    after = json.loads(call(capsys, "stats", path, "--json")[1])
    assert after["fileBytes"] > before["fileBytes"]
    assert (
        after["footprint"]["freePages"] * after["footprint"]["pageSize"]
        >= before["projectionBytes"] // 2
    )
    assert after["footprint"]["freeShare"] > before["footprint"]["freeShare"]


def export_text(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = call(capsys, "export", path)
    assert code == 0, err
    return out


def reads_of(path: Path) -> dict[str, Any]:
    """Every read the contract offers on the turn workload's records, as JSON text."""

    async def run() -> dict[str, Any]:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            page = await storage.scan_entries({"conversationId": ROOT}, 10_000, None, CTX)
            return {
                "entries": page,
                "task": await storage.task(2, CTX),
                "conversation": await storage.conversation(ROOT, CTX),
            }
        finally:
            await storage.close()

    return asyncio.run(run())


# ── history by reference to the log, packed snapshots ─────────────────────────


def test_as_of_reads_of_a_task_rewritten_every_commit_come_back_from_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    write_turns(path, 60)

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for seq in range(2, 63):
                view = await storage.as_of(seq)
                n = seq - 2
                expected = task(
                    2, ROOT, n, "pending" if n == 0 else ("running" if n % 3 else "sleeping")
                )
                assert await view.task(2, CTX) == expected
            # a task written three times in one commit: the view after it shows the last write
            writes = [
                {"type": "task", "value": task(2, ROOT, 100 + k, "running")} for k in range(3)
            ]
            seq = await storage.commit(writes, CTX)
            await storage.commit([{"type": "task", "value": task(2, ROOT, 200, "sleeping")}], CTX)
            assert await (await storage.as_of(seq)).task(2, CTX) == task(2, ROOT, 102, "running")
            assert await (await storage.as_of(seq - 1)).task(2, CTX) == task(
                2, ROOT, 60, "running" if 60 % 3 else "sleeping"
            )
        finally:
            await storage.close()

    asyncio.run(run())
    assert call(capsys, "verify", path)[0] == 0
    env = Environment(path, readonly=True)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(name for name in names if name.endswith(".history")))
        with env.read() as txn:
            rows = list(txn.cursor(db=db))
    finally:
        env.close()
    logged = [value for _, value in rows if value[:1] == b"\x03"]
    assert len(logged) >= 60 and all(len(value) == 17 for value in logged)


def test_a_damaged_log_reference_in_history_is_named_not_served(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_turns(path, 5)
    env = Environment(path)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(name for name in names if name.endswith(".history")))
        with env.read() as txn:
            key, value = next((k, v) for k, v in txn.cursor(db=db) if v[:1] == b"\x03")
        env.write(
            lambda txn: txn.put(key, value[:-1] + bytes([value[-1] ^ 1]), db=db)
        )  # the checksum
    finally:
        env.close()

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            seq = int.from_bytes(key[-8:], "big")
            with pytest.raises(CorruptProjectionError):
                await (await storage.as_of(seq - 1)).task(2, CTX)
        finally:
            await storage.close()

    asyncio.run(run())


def test_document_reads_at_every_point_use_packed_snapshots_as_memory_storage_answers(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        memory = MemoryStorage()
        try:
            for store in (storage, memory):
                await store.commit([conversation(ROOT)], CTX)
                await store.commit([document_create(2)], CTX)
                for _ in range(300):
                    await store.commit([document_delta(2)], CTX)
            for seq in [2, 3, 64, 65, 66, 67, 130, 131, 200, 302, "current"]:
                assert await storage.document(2, seq, CTX) == await memory.document(2, seq, CTX), (
                    seq
                )
        finally:
            await storage.close()

    asyncio.run(run())
    env = Environment(tmp_path / "store", readonly=True)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith(".documents.snapshots")))
        with env.read() as txn:
            snapshots = list(txn.cursor(db=db))
    finally:
        env.close()
    assert len(snapshots) == 4 and all(value[8:9] == b"\xc1" for _, value in snapshots)


# ── entry rows packed ──────────────────────────────────────────────────────────


def entry_rows(path: Path) -> list[tuple[bytes, bytes]]:
    env = Environment(path, readonly=True)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith(".entries.by_conversation")))
        with env.read() as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
    finally:
        env.close()


def test_entry_rows_are_packed_and_read_back_as_memory_storage_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model message's entry row is kept zstd-packed (fewer bytes, more rows a page);
    a one-line entry too short to save bytes is kept as it is; every read answers as before."""

    path = tmp_path / "store"

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        memory = MemoryStorage()
        try:
            for store in (storage, memory):
                await store.commit([conversation(ROOT)], CTX)
                for n in range(1, 41):
                    value = entry(1000 + n, ROOT, n)
                    if n % 4 == 0:
                        value = {"id": 1000 + n, "conversationId": ROOT, "kind": "note"}
                    await store.commit([{"type": "entry", "value": value}], CTX)
            for descending in (False, True):
                query = {"conversationId": ROOT, "descending": descending}
                ours = await storage.scan_entries(query, 7, None, CTX)
                assert ours == await memory.scan_entries(query, 7, None, CTX)
                assert len(ours["items"]) == 7
            for id in (1001, 1004, 1040, 9999):
                assert await storage.entry(id, CTX) == await memory.entry(id, CTX)
            view = await storage.as_of(20)
            assert await view.entry(1019, CTX) == await memory.entry(1019, CTX)
            assert await view.entry(1020, CTX) is None
        finally:
            await storage.close()

    asyncio.run(run())
    rows = entry_rows(path)
    assert len(rows) == 40
    packed = [value for _, value in rows if value[8:9] == tables.FRAMED]
    plain = [value for _, value in rows if value[8:9] != tables.FRAMED]
    assert len(packed) == 30 and len(plain) == 10
    assert max(map(len, packed)) < 0.8 * len(codec_row(entry(1001, ROOT, 1)))
    assert call(capsys, "verify", path)[0] == 0


def codec_row(value: Any) -> bytes:
    return tables.encode_row(tables.EntryRow(2, value))


def test_an_unpacked_entry_row_reads_and_a_damaged_frame_is_named(tmp_path: Path) -> None:
    """Rows written unpacked (as before schema 10) still read; a packed row whose checksum holds
    but whose frame does not decompress raises ``CorruptProjectionError``, not garbage."""

    path = tmp_path / "store"
    write_turns(path, 3)
    (first, packed), (second, other) = entry_rows(path)[:2]
    encoded = tables.unpack_entry(packed[8:], tables.ENTRIES_BY_CONVERSATION, first)
    assert encoded != packed[8:]
    frame = other[8:]
    broken = frame[:-6] + bytes(6)
    env = Environment(path)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith(".entries.by_conversation")))

        def rewrite(txn: Any) -> None:
            txn.put(first, tables.seal(encoded), db=db)
            txn.put(second, tables.seal(broken), db=db)

        env.write(rewrite)
    finally:
        env.close()

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            found = await storage.entry(1001, CTX)
            assert found is not None and found["entry"] == entry(1001, ROOT, 1, 2)
            with pytest.raises(CorruptProjectionError):
                await storage.entry(1002, CTX)
            with pytest.raises(CorruptProjectionError):
                await storage.scan_entries({"conversationId": ROOT}, 10, None, CTX)
        finally:
            await storage.close()

    asyncio.run(run())
