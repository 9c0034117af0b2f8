"""Where a commit's device flush runs: on the caller's thread only while flushes are fast.

A ``power`` commit waits for the journal's flush (an ``fdatasync`` of a segment). On a device
whose flushes take milliseconds, run on the loop's thread, it would stall every other task of the
loop: there the commit goes to the writer thread. While the recent flushes were fast, a lone
commit runs on the caller's thread, saving the two thread hand-offs: while at most ``SLOW_ALLOWED``
of the last ``FLUSH_WINDOW`` flushes were slow, so that a slow one now and then (a scheduler's
wake-up late on a loaded machine) does not cost every commit after it the hand-offs. The flushes are observed at
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
from pi_durable_lmdb.storage.committer import FAST_FLUSH, FLUSH_WINDOW, SLOW_ALLOWED

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
            for n in range(2 * FLUSH_WINDOW):
                seqs.append(await storage.commit([_entry(100 + n)], CTX))
                await asyncio.sleep(0)
        assert len(flushers) >= 2 * FLUSH_WINDOW, f"commits made {len(flushers)} journal flushes"
        assert threading.get_ident() not in flushers, (
            "a journal flush ran on the event loop's thread"
        )
        for n, seq in enumerate(seqs):
            assert (await storage.entry(100 + n, CTX))["commitSeq"] == seq
    finally:
        await storage.close()


FAST_FIRST = FLUSH_WINDOW - SLOW_ALLOWED
"""Fast flushes a new store's committer sees before lone commits run on the caller's thread (it
counts the flushes it has not seen as slow)."""


class Lone:
    """One store's lone sequential commits, each flush taking what the test says (the manual
    clock's step), and the thread each flush ran on."""

    def __init__(self, storage: LmdbStorage) -> None:
        self.storage = storage
        self.clock = ManualClock(0.0)
        storage._env.clock = self.clock
        self.acked: dict[int, int] = {}
        self.next_id = 100

    async def commits(self, seconds: list[float]) -> list[int]:
        """One lone commit per item, whose flush takes that many seconds; the flushing threads."""

        flushers: list[int] = []
        with _flushes_on(flushers):
            for step in seconds:
                self.clock.step = step
                id, self.next_id = self.next_id, self.next_id + 1
                self.acked[id] = await self.storage.commit([_entry(id)], CTX)
        assert len(flushers) == len(seconds), (
            f"{len(seconds)} lone commits made {len(flushers)} flushes"
        )
        return flushers

    async def check(self) -> None:
        for id, seq in self.acked.items():
            assert (await self.storage.entry(id, CTX))["commitSeq"] == seq


FAST, SLOW = 0.0, 2 * FAST_FLUSH


async def test_power_commits_run_on_the_callers_thread_once_the_device_showed_fast_flushes(
    tmp_path: Path,
) -> None:
    """A new store's lone commits go to the writer thread until ``FAST_FIRST`` fast flushes;
    from then on they flush on the caller's thread. Every acknowledged commit is served."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    lone = Lone(storage)
    loop_thread = threading.get_ident()
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        warm = await lone.commits([FAST] * FAST_FIRST)
        assert loop_thread not in warm[: FAST_FIRST - 1], (
            "a flush ran on the loop before it was fast"
        )
        fast = await lone.commits([FAST] * 5)
        assert fast == [loop_thread] * 5, (
            "fast flushes, yet a lone commit went to the writer thread"
        )
        await lone.check()
    finally:
        await storage.close()


async def test_scattered_slow_flushes_keep_power_commits_on_the_callers_thread(
    tmp_path: Path,
) -> None:
    """Slow flushes now and then (every third; or ``SLOW_ALLOWED`` in a row, then fast ones):
    never more than ``SLOW_ALLOWED`` in any ``FLUSH_WINDOW``, so every lone commit stays on the
    caller's thread, the slow ones included (the rule is decided before each flush)."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    lone = Lone(storage)
    loop_thread = threading.get_ident()
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await lone.commits([FAST] * (FAST_FIRST + 1))
        every_third = [SLOW if n % 3 == 2 else FAST for n in range(6 * FLUSH_WINDOW)]
        assert await lone.commits(every_third) == [loop_thread] * len(every_third), (
            "one slow flush in three sent lone commits to the writer thread"
        )
        # The window cleared first (the pattern above ended on a slow flush).
        bursts = [FAST] * FLUSH_WINDOW + ([SLOW] * SLOW_ALLOWED + [FAST] * FAST_FIRST) * 4
        assert await lone.commits(bursts) == [loop_thread] * len(bursts), (
            f"bursts of {SLOW_ALLOWED} slow flushes sent lone commits to the writer thread"
        )
        await lone.check()
    finally:
        await storage.close()


async def test_a_slow_device_sends_power_commits_to_the_writer_thread_and_a_fast_one_brings_them_back(
    tmp_path: Path,
) -> None:
    """Every flush slow from some point on: the commits whose flushes leave at most
    ``SLOW_ALLOWED`` slow in the window still run on the caller's thread, the one after goes to
    the writer thread and so does every one while the device stays slow; once flushes are fast
    again, ``FAST_FIRST`` of them (on the writer thread, still timed) bring lone commits back."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    lone = Lone(storage)
    loop_thread = threading.get_ident()
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await lone.commits([FAST] * (FLUSH_WINDOW + 1))
        slow = await lone.commits([SLOW] * (3 * FLUSH_WINDOW))
        tolerated = SLOW_ALLOWED + 1  # the flush that makes it SLOW_ALLOWED + 1 is on the loop
        assert slow[:tolerated] == [loop_thread] * tolerated, slow
        assert loop_thread not in slow[tolerated:], (
            "a sustained slow device still flushed on the caller's thread"
        )
        back = await lone.commits([FAST] * (FAST_FIRST + 3))
        assert loop_thread not in back[:FAST_FIRST], (
            f"commits came back before {FAST_FIRST} fast flushes"
        )
        assert back[FAST_FIRST:] == [loop_thread] * 3, (
            f"commits did not come back to the caller's thread after {FAST_FIRST} fast flushes"
        )
        await lone.check()
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
            for n in range(2 * FLUSH_WINDOW):
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
        for n in range(FLUSH_WINDOW + 1):
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
