"""A ``power`` writer's checkpoint thread (``log.journaled``).

When a commit asks it for a checkpoint, the commits that end while that checkpoint has not yet
pinned its state are in it, so they ask for no other: a second one would come right after it
with a commit or two since, and cost its two device flushes for nothing. And what a checkpoint
keeps open (the descriptor it reads LMDB's meta pages through) lives as long as the writer."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.journal import JournalOptions
from pi_durable_lmdb.log.journaled import CommitJournal

from ..support.polling import until_async

PATIENCE = 60.0
"""Seconds a wait for the checkpoint thread may take: a bound no load crosses."""


def conversation(id: int) -> dict[str, object]:
    return {
        "type": "conversation",
        "value": {"id": id, "createdAt": 1, "ownerTaskId": None, "metadata": {}},
    }


async def _until(predicate: Callable[[], object], what: str) -> None:
    await until_async(predicate, timeout=PATIENCE, what=what, interval=0.002)


async def _every_commit_checkpoints(tmp_path: Path) -> tuple[LmdbStorage, CommitJournal]:
    storage = await LmdbStorage.open(
        tmp_path / "store", durability="power", journal=JournalOptions(checkpoint_commits=1)
    )
    journal = storage._env.journal
    assert isinstance(journal, CommitJournal)
    await _until(  # what the open wrote asked for its checkpoint: let it end
        lambda: not journal._requested and not journal._checkpointing.locked(), "a quiet writer"
    )
    return storage, journal


async def test_commits_before_a_requested_checkpoint_pins_its_state_ask_for_no_other(
    tmp_path: Path,
) -> None:
    storage, journal = await _every_commit_checkpoints(tmp_path)
    try:
        held = journal._checkpointing
        held.acquire()  # the checkpoint thread's next run waits here, before it pins anything
        try:
            before = storage.counters.checkpoints
            await storage.commit([conversation(1)], CTX)  # asks for a checkpoint
            await _until(lambda: not journal._worker.wanted, "the thread to take the request")
            for id in (2, 3, 4):  # each reaches the bound of one commit
                await storage.commit([conversation(id)], CTX)
            assert not journal._worker.wanted, "a second checkpoint was asked for"
        finally:
            held.release()
        await _until(lambda: storage.counters.checkpoints == before + 1, "the checkpoint")
        await _until(lambda: not journal._checkpointing.locked(), "the checkpoint to end")
        assert journal._since[0] == 0, "the checkpoint left commits out"
        assert not journal._worker.wanted
        assert storage.counters.checkpoints == before + 1

        # The next commit asks again: a request ends with the checkpoint it asked for.
        await storage.commit([conversation(5)], CTX)
        await _until(lambda: storage.counters.checkpoints == before + 2, "the next checkpoint")
    finally:
        await storage.close()


async def test_a_checkpoint_that_fails_leaves_the_next_commit_free_to_ask_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    storage, journal = await _every_commit_checkpoints(tmp_path)
    try:
        failed: list[int] = []
        real = journal._checkpoint

        def fail_once() -> None:
            if not failed:
                failed.append(1)
                raise OSError(5, "an injected checkpoint failure")
            real()

        monkeypatch.setattr(journal, "_checkpoint", fail_once)
        before = storage.counters.checkpoints
        await storage.commit([conversation(1)], CTX)
        await _until(lambda: bool(failed), "the failing checkpoint")
        await _until(lambda: not journal._requested, "the failed request to end")
        assert storage.counters.checkpoints == before
        await storage.commit([conversation(2)], CTX)
        await _until(lambda: storage.counters.checkpoints == before + 1, "the checkpoint after it")
        assert "an injected checkpoint failure" in caplog.text
    finally:
        await storage.close()
    reopened = await LmdbStorage.open(tmp_path / "store", durability="power")
    try:
        assert [await reopened.conversation(id, CTX) is not None for id in (1, 2)] == [True, True]
    finally:
        await reopened.close()


def _descriptors_of(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == str(path)
        except OSError:
            pass  # closed meanwhile
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
async def test_checkpoints_read_the_meta_pages_through_one_descriptor_closed_with_the_writer(
    tmp_path: Path,
) -> None:
    storage, journal = await _every_commit_checkpoints(tmp_path)
    data = (tmp_path / "store" / "data.mdb").resolve()
    try:
        before = storage.counters.checkpoints
        await storage.commit([conversation(1)], CTX)
        await _until(lambda: storage.counters.checkpoints > before, "a checkpoint")
        await _until(lambda: not journal._requested, "its end")
        open_now = _descriptors_of(data)
        for id in range(2, 12):
            await storage.commit([conversation(id)], CTX)
            await _until(lambda: not journal._requested, "each checkpoint")
        assert storage.counters.checkpoints >= before + 5
        assert _descriptors_of(data) == open_now, "a checkpoint left a descriptor open"
    finally:
        await storage.close()
    assert _descriptors_of(data) == 0, "the closed writer left data.mdb open"
