"""Where a store's bytes go (issue 24): ``stats``' page breakdown, ``compact``, and old stores.

Every test works on real LMDB files written through ``LmdbStorage``; the page counts are checked
against an independent reading of the same file with py-lmdb itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb import cli as cli_module
from pi_durable_lmdb.log import Environment
from pi_durable_lmdb.log.environment import MAIN_DB

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench_workloads import ROOT, conversation, entry, task  # noqa: E402


def call(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``durable-log ARGS`` in this process: exit code, stdout, stderr."""

    capsys.readouterr()
    try:
        code = cli_module.main([str(arg) for arg in args])
    except SystemExit as exit:
        code = int(exit.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


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
                        {"type": "task", "value": task(2, ROOT, n, "running" if n % 3 else "sleeping")},
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
                pages[name.decode()] = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
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


def test_stats_json_reports_each_database_and_the_free_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
    assert info["projectionBytes"] == sum(db["bytes"] for name, db in foot["databases"].items() if name.startswith("p"))
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
    assert after["footprint"]["freePages"] * after["footprint"]["pageSize"] >= before["projectionBytes"] // 2
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


# ── old stores keep working ───────────────────────────────────────────────────


from pi_durable.storage import MemoryStorage  # noqa: E402

from tests.fixtures import old_store  # noqa: E402
from tests.workload import snapshot  # noqa: E402


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


def test_a_store_of_the_old_format_opens_reads_verifies_exports_and_rebuilds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old_store.extract(tmp_path)
    path = tmp_path / "store"
    exported = (tmp_path / "export.jsonl").read_text()
    assert call(capsys, "verify", path)[0] == 0
    assert export_text(path, capsys) == exported
    ours, reference = snapshots_of(path)
    assert len(reference) > 3000 and ours == reference
    code, out, err = call(capsys, "rebuild", path)
    assert code == 0, err
    assert call(capsys, "verify", path)[0] == 0
    assert export_text(path, capsys) == exported
    assert snapshots_of(path)[0] == reference

    async def one_more() -> None:  # a new record after the old ones: both read back
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 99_999}}], CTX)
        finally:
            await storage.close()

    asyncio.run(one_more())
    assert call(capsys, "verify", path)[0] == 0
    lines = export_text(path, capsys).splitlines(keepends=True)
    assert "".join(lines[:-1]) == exported
    assert json.loads(lines[-1])["writes"] == [{"type": "conversation", "value": {"id": 99_999}}]
