"""A writer killed (SIGKILL, a real process) while it erases a conversation leaves the
conversation whole or erased everywhere, never in part, and loses no acknowledged commit of
another conversation: at fixed points (the log rewritten, the projections not yet rebuilt; for
``power``, before the checkpoint that makes the rewrite durable, then a power cut) and at random
moments during the erasure."""

from __future__ import annotations

import asyncio
import random
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.errors import StorageRequestError
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit import verify

from tests.support.killed_writer import run_killed
from tools.harness.iofaults.check import reboot

ERASING_WRITER = textwrap.dedent("""
    import asyncio, os, sys, threading
    from pi_durable.context import BACKGROUND_CONTEXT as CTX
    from pi_durable_lmdb import LmdbStorage
    from pi_durable_lmdb.log.journal import JournalOptions
    from pi_durable_lmdb.log.journaled import CommitJournal
    from pi_durable_lmdb.storage import lmdb_storage

    store, durability, point, a, b = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    acks = sys.argv[6] if len(sys.argv) > 6 else ""  # a thread commits of b beside the erasure

    def die(*args, **kwargs):
        os._exit(9)

    if point == "before-rebuild":
        lmdb_storage.rebuild = die
    if point == "before-durable":
        CommitJournal.checkpoint_rewrite = die

    def entry(id, conversation):
        return {"type": "entry", "value": {"id": id, "conversationId": conversation, "kind": "note"}}

    async def main():
        options = {"journal": JournalOptions(segment_size=2 * 4096, checkpoint_commits=6, background=False)} if durability == "power" else {}
        storage = await LmdbStorage.open(store, durability=durability, **options)
        for _ in range(10):  # acknowledged before the erasure
            id = await storage.mint_id()
            await storage.commit([entry(id, b)], CTX)
            print("ack", id, flush=True)
        stop, started = threading.Event(), threading.Event()

        def beside():  # its own loop: commits acknowledged in the side file once they returned
            async def commits():
                with open(acks, "a") as out:
                    while not stop.is_set():
                        id = await storage.mint_id()
                        await storage.commit([entry(id, b)], CTX)
                        out.write(f"{id}\\n")
                        out.flush()
                        started.set()
            asyncio.run(commits())

        thread = threading.Thread(target=beside)
        if acks:
            thread.start()
            await asyncio.to_thread(started.wait)
        print("erasing", flush=True)
        await storage.erase_conversation(a, reason="a kill test")
        print("erased", flush=True)
        if acks:
            await asyncio.sleep(0.2)  # the thread commits on after the erasure too
            stop.set()
            await asyncio.to_thread(thread.join)
        for _ in range(10):  # acknowledged after it
            id = await storage.mint_id()
            await storage.commit([entry(id, b)], CTX)
            print("ack", id, flush=True)
        await storage.close()

    asyncio.run(main())
""")


def _entry(id: int, conversation: int) -> dict[str, Any]:
    return {"type": "entry", "value": {"id": id, "conversationId": conversation, "kind": "note"}}


async def _make(path: Path, durability: str) -> tuple[int, int, int]:
    storage = await LmdbStorage.open(path, durability=durability)  # type: ignore[arg-type]
    a, b = await storage.mint_id(), await storage.mint_id()
    await storage.commit([{"type": "conversation", "value": {"id": id}} for id in (a, b)], CTX)
    for _ in range(150):
        await storage.commit(
            [_entry(await storage.mint_id(), a), _entry(await storage.mint_id(), b)], CTX
        )
    await storage.close()
    return a, b, 150


async def _entries(storage: LmdbStorage, conversation: int) -> list[int]:
    ids: list[int] = []
    cursor = None
    while True:
        try:
            page = await storage.scan_entries(
                {"conversationId": conversation, "order": "ascending"}, 200, cursor, CTX
            )
        except StorageRequestError:  # an erased conversation is unknown
            return ids
        ids += [item["id"] for item in page["items"]]
        cursor = page.get("next")
        if cursor is None:
            return ids


async def _check(
    path: Path, durability: str, a: int, b: int, a_count: int, acked: list[int]
) -> bool:
    storage = await LmdbStorage.open(path, durability=durability)  # type: ignore[arg-type]
    try:
        commits = list(storage.log.read())
        erasures = [c for c in commits if c.erasure is not None]
        tombstones = [c for c in commits if c.tombstone is not None]
        a_entries = await _entries(storage, a)
        if erasures:
            assert len(erasures) == 1 and len(tombstones) == a_count + 1
            assert a_entries == [] and await storage.conversation(a, CTX) is None
            assert all(
                w.value["conversationId"] != a
                for c in commits
                for w in c.writes
                if w.value.get("conversationId")
            )
        else:
            assert tombstones == []
            assert len(a_entries) == a_count and await storage.conversation(a, CTX) == {"id": a}
        b_entries = set(await _entries(storage, b))
        assert set(acked) <= b_entries, "an acknowledged commit of another conversation was lost"
        return bool(erasures)
    finally:
        await storage.close()


@pytest.mark.slow  # children killed at several points (about 5 s each)
@pytest.mark.parametrize("durability", ["process", "power"])
def test_a_kill_during_an_erasure_leaves_all_or_nothing(tmp_path: Path, durability: str) -> None:
    made = tmp_path / "made"
    a, b, count = asyncio.run(_make(made, durability))
    rng = random.Random(durability)
    points = ["before-rebuild"] + (["before-durable"] if durability == "power" else [])
    points += ["random"] * 4
    outcomes = []
    for number, point in enumerate(points):
        path = tmp_path / f"case{number}"
        shutil.copytree(made, path)
        args = [str(path), durability, point, str(a), str(b)]
        acked, code = run_killed(ERASING_WRITER, args, "erasing", point == "random", rng, 0.25)
        if point != "random":
            assert code == 9
        if durability == "power" and point != "before-rebuild":
            reboot(path)  # a power cut: only what the journal's checkpoint holds is sure
        outcomes.append(asyncio.run(_check(path, durability, a, b, count, acked)))
        assert verify(path) is None
    assert outcomes[0] is True  # the log was rewritten: the next open rebuilt the projections
    if durability == "power":
        assert outcomes[1] is False  # the rewrite was never made durable: undone whole


@pytest.mark.slow  # children killed at several points (about 5 s each)
@pytest.mark.parametrize("durability", ["process", "power"])
def test_a_kill_during_an_erasure_loses_no_commit_made_beside_it(
    tmp_path: Path, durability: str
) -> None:
    """Another thread of the writer commits entries of another conversation before, during and
    after the erasure; killed at each point (and a power cut for ``power``), the store keeps
    every commit that thread saw return, and the conversation is whole or erased."""

    made = tmp_path / "made"
    a, b, count = asyncio.run(_make(made, durability))
    rng = random.Random(f"beside {durability}")
    points = ["before-rebuild"] + (["before-durable"] if durability == "power" else [])
    points += ["random"] * 4 + ["none"]
    outcomes = []
    for number, point in enumerate(points):
        path = tmp_path / f"case{number}"
        shutil.copytree(made, path)
        acks = tmp_path / f"acks{number}"
        args = [str(path), durability, point, str(a), str(b), str(acks)]
        acked, code = run_killed(
            ERASING_WRITER, args, "erasing", point == "random", rng, 0.25, acks
        )
        beside = acks.read_text().split()
        assert beside, "the thread beside the erasure committed nothing"
        if point not in ("random", "none"):
            assert code == 9
        if point == "none":
            assert code == 0, "the writer failed"
        if durability == "power":
            reboot(path)
        outcomes.append(asyncio.run(_check(path, durability, a, b, count, acked)))
        assert verify(path) is None
    assert outcomes[0] is True
    if durability == "power":
        assert outcomes[1] is False
    assert outcomes[-1] is True
