"""Where a commit's device flush runs: on the caller's thread only while flushes are fast.

A ``power`` commit waits for the journal's flush (an ``fdatasync`` of a segment). On a device
whose flushes take milliseconds, run on the loop's thread, it would stall every other task of the
loop: there the commit goes to the writer thread. While the recent flushes were fast, a lone
commit runs on the caller's thread, saving the two thread hand-offs. The flushes are observed at
the ``os`` seam the I/O-fault tooling wraps (``tools/iofaults/inject.py``), by the thread that
makes each one; how long a flush took is read from the environment's clock, which these tests
replace with a manual one (a loaded machine's flushes could be fast or slow).
"""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.log.journal import JournalOptions
from pi_durable_lmdb.storage import LmdbStorage
from pi_durable_lmdb.storage.committer import FAST_FLUSH, FAST_RUN

from tools.harness.iofaults.inject import Injector


def _entry(id: int) -> dict[str, Any]:
    return {"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "message"}}


class ManualClock:
    """The environment's flush clock: each reading ``step`` seconds after the one before, so
    every flush (two readings) seems to take ``step``."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def _flushes_on(threads: list[int]) -> Any:
    def observe(kind: str) -> None:
        if kind == "flush":
            threads.append(threading.get_ident())

    return Injector("flush", 0, errno.EIO, observe=observe)  # nth 0: observes, fails nothing


async def test_a_lone_power_commit_flushes_the_journal_off_the_event_loop_thread_on_a_slow_device(
    tmp_path: Path,
) -> None:
    """Sequential commits with nothing else about, every flush slow: each is acknowledged after
    its frame's flush, and no flush ran on the loop's thread."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    try:
        storage._env.clock = ManualClock(10 * FAST_FLUSH)
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        flushers: list[int] = []
        with _flushes_on(flushers):
            seqs = []
            for n in range(2 * FAST_RUN):
                seqs.append(await storage.commit([_entry(100 + n)], CTX))
                await asyncio.sleep(0)
        assert len(flushers) >= 2 * FAST_RUN, f"commits made {len(flushers)} journal flushes"
        assert threading.get_ident() not in flushers, (
            "a journal flush ran on the event loop's thread"
        )
        for n, seq in enumerate(seqs):
            assert (await storage.entry(100 + n, CTX))["commitSeq"] == seq
    finally:
        await storage.close()


async def test_power_commits_run_on_the_callers_thread_only_while_flushes_are_fast(
    tmp_path: Path,
) -> None:
    """After ``FAST_RUN`` fast flushes a lone commit flushes on the caller's thread; one slow
    flush sends the next commits back to the writer thread until ``FAST_RUN`` fast ones again.
    Every acknowledged commit is in the log and served, whichever thread made it."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    clock = ManualClock(0.0)
    storage._env.clock = clock
    loop_thread = threading.get_ident()
    acked: dict[int, int] = {}

    async def commits(count: int, first: int) -> list[int]:
        flushers: list[int] = []
        with _flushes_on(flushers):
            for n in range(first, first + count):
                acked[n] = await storage.commit([_entry(n)], CTX)
        assert len(flushers) == count, f"{count} lone commits made {len(flushers)} flushes"
        return flushers

    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        warm = await commits(FAST_RUN, 100)
        assert loop_thread not in warm[: FAST_RUN - 1], "a flush ran on the loop before a fast run"
        fast = await commits(5, 200)
        assert fast == [loop_thread] * 5, (
            "fast flushes, yet a lone commit went to the writer thread"
        )

        clock.step = 2 * FAST_FLUSH  # the device slows down: the next flush is slow
        slow = await commits(3, 300)
        assert slow[0] == loop_thread and loop_thread not in slow[1:], (
            "after a slow flush a commit still flushed on the caller's thread"
        )
        clock.step = 0.0
        back = await commits(FAST_RUN + 2, 400)
        assert loop_thread not in back[: FAST_RUN - 1] and back[-2:] == [loop_thread] * 2, (
            f"commits did not come back to the caller's thread after {FAST_RUN} fast flushes"
        )
        for id, seq in acked.items():
            assert (await storage.entry(id, CTX))["commitSeq"] == seq
    finally:
        await storage.close()


async def test_power_commits_stay_off_the_loop_when_checkpoints_run_on_the_committing_thread(
    tmp_path: Path,
) -> None:
    """With ``background=False`` a commit may take a checkpoint (two more flushes) itself: even
    with fast flushes, lone commits stay on the writer thread."""

    storage = await LmdbStorage.open(
        tmp_path / "store", durability="power", journal=JournalOptions(background=False)
    )
    storage._env.clock = ManualClock(0.0)
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        flushers: list[int] = []
        with _flushes_on(flushers):
            for n in range(2 * FAST_RUN):
                await storage.commit([_entry(100 + n)], CTX)
        assert flushers and threading.get_ident() not in flushers, (
            "a commit that may checkpoint inline flushed on the event loop's thread"
        )
    finally:
        await storage.close()


async def test_concurrent_power_commits_still_share_groups_while_flushes_are_fast(
    tmp_path: Path,
) -> None:
    """The caller's-thread path is for a lone committer: many concurrent ones still go to the
    writer thread in groups, one flush for many commits."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    storage._env.clock = ManualClock(0.0)
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for n in range(FAST_RUN + 1):
            await storage.commit([_entry(10 + n)], CTX)
        flushers: list[int] = []
        with _flushes_on(flushers):
            seqs = await asyncio.gather(
                *(storage.commit([_entry(100 + n)], CTX) for n in range(64))
            )
        assert len(set(seqs)) == 64
        assert len(flushers) < 32, f"64 concurrent commits made {len(flushers)} flushes"
    finally:
        await storage.close()


async def test_a_lone_process_commit_keeps_the_direct_path(tmp_path: Path) -> None:
    """``process`` commits flush nothing: one sequential committer runs them on its own thread
    (no writer thread is started), the hand-off costing more than the commit."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for n in range(20):
            await storage.commit([_entry(100 + n)], CTX)
        assert storage._committer._thread is None, (
            "a lone process-mode committer went to the writer thread"
        )
    finally:
        await storage.close()
