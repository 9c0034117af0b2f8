"""A writer killed (SIGKILL, a real process) while it trims its log leaves it trimmed whole or not
at all, and loses no acknowledged commit: at fixed points (the base folded but not written; the
trim committed, the projections not yet rebuilt; for ``power``, before the checkpoint that makes
the trim durable, then a power cut) and at random moments during the trim."""

from __future__ import annotations

import asyncio
import random
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import HistoryTrimmed, LmdbStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.storage.trim import SCRATCH_DIR

from tests.support.killed_writer import run_killed
from tools.harness.iofaults.check import reboot

RECORDS = 400
BEFORE = 300  # a whole tile on: 289

TRIMMING_WRITER = textwrap.dedent("""
    import asyncio, os, sys
    from pi_durable.context import BACKGROUND_CONTEXT as CTX
    from pi_durable_lmdb import LmdbStorage
    from pi_durable_lmdb.log.journal import JournalOptions
    from pi_durable_lmdb.log.journaled import CommitJournal
    from pi_durable_lmdb.storage import lmdb_storage

    store, durability, point, conversation, before = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

    def die(*args, **kwargs):
        os._exit(9)

    if point == "before-commit":
        lmdb_storage.commit_trim = die
    if point == "before-rebuild":
        lmdb_storage.rebuild = die
    if point == "before-durable":
        CommitJournal.checkpoint_rewrite = die

    def entry(id):
        return {"type": "entry", "value": {"id": id, "conversationId": conversation, "kind": "note"}}

    async def main():
        options = {"journal": JournalOptions(segment_size=2 * 4096, checkpoint_commits=6, background=False)} if durability == "power" else {}
        storage = await LmdbStorage.open(store, durability=durability, **options)
        for _ in range(10):  # acknowledged before the trim
            id = await storage.mint_id()
            await storage.commit([entry(id)], CTX)
            print("ack", id, flush=True)
        print("trimming", flush=True)
        await storage.trim(before)
        print("trimmed", flush=True)
        for _ in range(10):  # acknowledged after it
            id = await storage.mint_id()
            await storage.commit([entry(id)], CTX)
            print("ack", id, flush=True)
        await storage.close()

    asyncio.run(main())
""")


async def _make(path: Path, durability: str) -> int:
    storage = await LmdbStorage.open(path, durability=durability)  # type: ignore[arg-type]
    conversation = await storage.mint_id()
    await storage.commit([{"type": "conversation", "value": {"id": conversation}}], CTX)
    for _ in range(RECORDS - 1):
        id = await storage.mint_id()
        value = {"id": id, "conversationId": conversation, "kind": "note", "data": "x" * 200}
        await storage.commit([{"type": "entry", "value": value}], CTX)
    await storage.close()
    return conversation


async def _entries(storage: Any, conversation: int) -> list[int]:
    ids: list[int] = []
    cursor = None
    while True:
        page = await storage.scan_entries(
            {"conversationId": conversation, "order": "ascending"}, 500, cursor, CTX
        )
        ids += [item["id"] for item in page["items"]]
        cursor = page.get("next")
        if cursor is None:
            return ids


async def _check(path: Path, durability: str, conversation: int, acked: list[int]) -> bool:
    storage = await LmdbStorage.open(path, durability=durability)  # type: ignore[arg-type]
    try:
        assert not (path / SCRATCH_DIR).exists(), "the open removes what a killed trim left"
        first = storage.log.first()
        assert first in (1, 289), f"the log begins at {first}: a trim in part"
        trimmed = first == 289
        assert storage.log.trimmed_before() == (289 if trimmed else 0)
        entries = await _entries(storage, conversation)
        assert len(entries) >= RECORDS - 1 and entries == sorted(entries)
        assert set(acked) <= set(entries), "an acknowledged commit was lost"
        if trimmed:
            with pytest.raises(HistoryTrimmed):
                await storage.as_of(288)
        view = await storage.as_of(289)
        assert len(await _entries(view, conversation)) == 288
        return trimmed
    finally:
        await storage.close()


@pytest.mark.slow  # children killed at several points (a few seconds each)
@pytest.mark.parametrize("durability", ["process", "power"])
def test_a_kill_during_a_trim_leaves_all_or_nothing(tmp_path: Path, durability: str) -> None:
    made = tmp_path / "made"
    conversation = asyncio.run(_make(made, durability))
    rng = random.Random(durability)
    points = ["before-commit", "before-rebuild"]
    points += ["before-durable"] if durability == "power" else []
    points += ["random"] * 4
    outcomes = []
    for number, point in enumerate(points):
        path = tmp_path / f"case{number}"
        shutil.copytree(made, path)
        args = [str(path), durability, point, str(conversation), str(BEFORE)]
        acked, code = run_killed(TRIMMING_WRITER, args, "trimming", point == "random", rng, 0.3)
        if point != "random":
            assert code == 9
        if durability == "power" and point not in ("before-commit", "before-rebuild"):
            reboot(path)  # a power cut: only what the journal's checkpoint holds is sure
        outcomes.append(asyncio.run(_check(path, durability, conversation, acked)))
        assert verify(path) is None
    assert outcomes[0] is False  # killed before the trim's transaction: nothing trimmed
    assert outcomes[1] is True  # committed: the next open rebuilt the projections
    if durability == "power":
        assert outcomes[2] is False  # the trim was never made durable: undone whole
