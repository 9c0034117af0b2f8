"""Group commit: the write transactions of one store's commits, shared by whoever commits at once.

Callers on any thread and any event loop hand their encoded batch to the ``Committer`` and await
it. A loop's commits made in the same turn of that loop are gathered first (a ``call_soon``), then
run as one *group*: one LMDB write transaction, so one commit and, in ``power`` mode, one pair of
syncs for all of them. Inside the group each batch is checked against the state the batches
before it left, then appended and folded; a batch the checks reject is skipped (it wrote nothing)
and gets the same error it gets alone, its neighbours are unaffected. Each batch gets its own
sequence, in log order. A future resolves only after the group's transaction committed, so an
acknowledged commit is durable in the mode's sense and visible to every later read.

Where a commit runs:

- **directly**, on the caller's thread, when nothing else is being committed (no other task of
  the loop, no other thread): in ``process`` mode always, and in ``power`` mode while at most
  ``SLOW_ALLOWED`` of the last ``FLUSH_WINDOW`` journal flushes took more than ``FAST_FLUSH``
  (a tolerance, not a run of fast ones: a busy machine's scheduler delays a flush now and then,
  and one such delay must not send a fast device's commits to the writer thread, whose two
  hand-offs then cost every commit more than the delay did once). One sequential committer keeps
  its speed, since the two thread hand-offs would cost more than the commit (or, in ``power``,
  than its fast flush). A run of direct commits yields to the loop every 2 ms; if another commit
  showed up meanwhile, the loop's commits go to groups for a while (``CONTENDED``); a ``power``
  one yields before each commit, so the loop is held for one commit and its flush at most.
- **in a group on the writer thread** otherwise: concurrent commits, and every ``power`` commit
  while the device's flushes are slow. Each ``power`` transaction waits for the journal frame's
  flush before it commits, and a slow wait must not stall the caller's event loop. The flush
  cannot move to another thread on its own: py-lmdb binds a write transaction to the thread that
  began it, and the flush sits between the transaction's work and its commit. So the whole
  transaction runs on the writer thread, where commits that arrive during one flush share the
  next (group commit). Each group's transaction begins and ends there; the thread is started on
  the first group and stopped by ``close()``. Groups go on timing their flushes, so a device that
  is fast again brings lone commits back to their callers' threads.

A direct commit awaits nothing between taking ``_lock`` and its transaction's commit, so a
cancelled caller never leaves part of one, and its journal frame is flushed before LMDB commits
as on the writer thread (``Environment.write``).

Either way ``_lock`` is held while a write transaction runs, so commits never interleave, and
anything else that must not overlap a group (a projection rebuild swapping tables) takes it too.
A user projection's fold chunk takes it through ``yielding()`` only to put the rows it folded
beforehand (it lets waiting commits go first, ``contended()``), and a direct commit waits for
that (at most ``YIELD_WAIT``) rather than going to the writer thread.
Should something other than a rejection go wrong inside a group (a bug, a full disk), the group is
aborted and each of its batches is run again alone, so only the batch at fault fails; but when the
map needs to grow and cannot (``MapBusyError``: a read transaction of this process stayed open),
every batch of the group fails with it at once, since alone each would only wait as long again.

With replicated durability (a ``StreamWriter``), every commit goes through groups on the writer
thread (no direct path: a commit waits on the network), each group first settles with the stream
and publishes its records before its transaction commits (``log.stream.writer``); a publish
that fails fails the whole group at once, since running its batches alone would fail the same way.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import lmdb

from ..errors import ReplicationError
from ..log import (
    Environment,
    MapBusyError,
    StoreClosedError,
    Write,
    WriteLog,
    WriteTransaction,
)
from ..log.stream.writer import StreamWriter
from ..log.threads import Worker
from ..projections import Projector

MAX_GROUP: Final = 64
"""Batches per write transaction at most: bounds how long one group holds the writer (and the
GIL) before its callers hear back."""
DIRECT_RUN: Final = 0.002
"""Seconds a loop may spend in back-to-back direct ``process`` commits before one of them yields
(a direct ``power`` commit yields before each: its flush already holds the loop)."""
CONTENDED: Final = 0.05
"""Seconds a loop gathers its commits into groups after seeing others commit beside it."""
YIELD_WAIT: Final = 0.002
"""Seconds a direct commit waits for a ``yielding()`` holder of the lock before it goes to the
writer thread instead (the holder normally lets go within a few puts)."""
FAST_FLUSH: Final = 0.001
"""Seconds from a ``power`` commit's journal flush to LMDB's commit at most, for the flush to
count as fast: a commit on the caller's thread holds its event loop that long."""
FLUSH_WINDOW: Final = 8
"""The last journal flushes the direct-path rule looks at (``SLOW_ALLOWED``)."""
SLOW_ALLOWED: Final = 3
"""Slow flushes (over ``FAST_FLUSH``) among the last ``FLUSH_WINDOW`` with which ``power``
commits still run on the caller's thread: scattered slow ones (a scheduler's wake-up late on a
loaded machine) keep the direct path; a device slow more often than that sends commits to the
writer thread, and they come back once the window holds no more than this many again. A store
opens as if its window were all slow: ``FLUSH_WINDOW - SLOW_ALLOWED`` fast flushes first."""
_WINDOW_MASK: Final = (1 << FLUSH_WINDOW) - 1
RESOLVE_CHUNK: Final = 8
"""Callers resumed per turn of their loop: a big group's callers must not all run before the
loop's other tasks get a turn."""


class _Job:
    """One caller's batch (or plain write) waiting for its group."""

    __slots__ = ("batch", "committed_at", "error", "future", "loop", "payload", "result", "work")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        payload: bytes | None,
        batch: list[Write] | None,
        committed_at: int | None,
        work: Callable[[lmdb.Transaction[bytes]], Any] | None,
    ) -> None:
        self.loop = loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.payload, self.batch, self.committed_at, self.work = payload, batch, committed_at, work
        self.result: Any = None
        self.error: BaseException | None = None


class _DirectRun:
    """One loop's run of direct commits (``Committer._uncontended``)."""

    __slots__ = ("contended_until", "started")

    def __init__(self) -> None:
        self.started = 0.0
        self.contended_until = 0.0


class Committer:
    """The one path of a store's commits and other durable writes (see the module docstring)."""

    def __init__(
        self,
        env: Environment,
        log: WriteLog,
        projector: Projector,
        on_commit: Callable[[int], None],
        stream: StreamWriter | None = None,
        hold: threading.RLock | None = None,
    ) -> None:
        self._env = env
        self._hold = hold
        """Held by each transaction of batches from LMDB's commit until ``on_commit`` ran
        (``WriteTransaction.hold``): the id minter's lock, so no id a commit stores is minted
        while its batches are visible and the floor not raised yet."""
        self._log = log
        self.projector = projector
        self._on_commit = on_commit
        """Called with the highest id of the batches a transaction committed, on the committing
        thread, as soon as it committed: a batch in the log has all its effects (the id floor,
        followers woken) whatever became of its caller (cancelled, timed out, its loop closed).
        Once per transaction: it raises a floor, so the group's highest id is all it needs."""
        """Swapped by a rebuild, under ``exclusive()``."""
        self.stream = stream
        self._direct = stream is None and env.mode.unsynced
        """Commits may run on the caller's thread (``process``): not when each waits for the
        network (a stream), which must not stall the caller's loop."""
        self._journaled = stream is None and env.journal is not None and env.journal.background
        """``power`` commits may run on the caller's thread while the device's flushes are fast
        (``_fast``); not when checkpoints run on the committing thread (their two
        flushes would hold the caller's loop)."""
        self._slow_flushes = _WINDOW_MASK
        """The last ``FLUSH_WINDOW`` journal flushes, one bit each (1: slow), newest lowest
        (``_flushed``); all slow until the device has shown itself."""
        self._fast = False
        """``power`` commits may run on the caller's thread: at most ``SLOW_ALLOWED`` bits set."""
        if self._journaled:
            env.on_flush = self._flushed
        self._lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._state = threading.Condition(self._state_lock)
        """Guards ``_queue``, ``_closed`` and ``_unresolved``; a caller takes its lock alone (no
        ``Condition.__enter__`` frame per commit) where it waits for nothing and wakes nobody."""
        self._queue: list[_Job] = []
        self._gathering: dict[asyncio.AbstractEventLoop, list[_Job]] = {}
        self._runs: dict[asyncio.AbstractEventLoop, _DirectRun] = {}
        self._commits = 0
        """Commits begun, any path, any thread (a hint of contention: not locked)."""
        self._unresolved = 0
        self._closed = False
        self._writer = Worker(
            f"lmdb-writer {env.path}", self._state, self._take_group, self._run_group, self._done
        )
        self._wanting = False
        """The writer thread waits for ``_lock`` (``contended``)."""
        self._yielding = False
        """``_lock`` is held through ``yielding()``: its holder lets go when ``contended()``."""
        self._waiting_direct = False
        """A direct commit waits for a ``yielding()`` holder (``_take_direct``)."""
        self._direct_commits: list[None] = []
        """One item per commit between its start and its direct transaction's end (``busy``)."""

    def replicate(self, stream: StreamWriter) -> None:
        """From now on every group settles with ``stream`` and publishes to it (before any
        commit); a deposed writer keeps it, so whatever it still had queued fails."""

        self.stream = stream
        self._direct = self._journaled = False

    # ── callers ─────────────────────────────────────────────────────────────

    async def commit(
        self, payload: bytes, batch: list[Write], committed_at: int | None
    ) -> tuple[int, int]:
        """Append and fold one encoded batch; returns its sequence and the highest id it wrote."""

        loop = asyncio.get_running_loop()
        if (self._direct or (self._journaled and self._fast)) and loop not in self._gathering:
            direct_commits = self._direct_commits
            direct_commits.append(None)  # atomic (the GIL), like its pop
            try:
                run = self._runs.get(loop)
                now = time.perf_counter()
                if run is not None and now < run.contended_until:
                    direct = False  # what _uncontended would answer, without a coroutine per commit
                elif run is None or not self._direct or now - run.started >= DIRECT_RUN:
                    direct = await self._uncontended(loop, now)
                else:
                    direct = True
                if direct and not self._queue and self._take_direct():
                    try:
                        if not self._closed and not self._queue and loop not in self._gathering:
                            self._commits += 1
                            result = self._env.write(
                                lambda txn: self._commit_one(txn, payload, batch, committed_at)
                            )
                            self._env.counters.direct_commits += 1
                            return result
                    finally:
                        self._lock.release()
            finally:
                direct_commits.pop()
        return await self._submit(payload, batch, committed_at, None, loop)  # type: ignore[no-any-return]

    def _flushed(self, seconds: float) -> None:
        """After a transaction's journal frame was flushed and LMDB committed (any thread, under
        ``_lock``): ``seconds`` it took, so whether ``power`` commits may run on the caller's
        thread, where the next flush holds the caller's loop."""

        window = ((self._slow_flushes << 1) | (seconds > FAST_FLUSH)) & _WINDOW_MASK
        self._slow_flushes = window
        self._fast = window.bit_count() <= SLOW_ALLOWED

    def _take_direct(self) -> bool:
        """``_lock`` for a direct commit: at once, or, while a holder that yields to commits
        has it (``yielding``: a user projection's fold chunk), after waiting at most
        ``YIELD_WAIT`` for it to end its chunk: one hand-off instead of the writer thread's two."""

        if self._lock.acquire(blocking=False):
            return True
        if not self._yielding:
            return False
        self._waiting_direct = True
        try:
            return self._lock.acquire(timeout=YIELD_WAIT)
        finally:
            self._waiting_direct = False

    async def _uncontended(self, loop: asyncio.AbstractEventLoop, now: float) -> bool:
        """Whether a commit may run directly on the caller's thread: one sequential committer
        then keeps its speed (a thread hand-off costs more than a ``process`` commit). A run of
        direct commits yields to the loop every ``DIRECT_RUN`` seconds; if anything committed
        meanwhile, the loop's commits are gathered into groups (on the writer thread) for the
        next ``CONTENDED`` seconds."""

        run = self._runs.get(loop)
        if run is None:
            run = self._runs[loop] = _DirectRun()
        if now < run.contended_until:
            return False
        before = self._commits
        await asyncio.sleep(0)
        run.started = now = time.perf_counter()
        if self._commits != before or loop in self._gathering:
            run.contended_until = now + CONTENDED
            return False
        return True

    def _commit_one(
        self,
        txn: lmdb.Transaction[bytes],
        payload: bytes,
        batch: list[Write],
        committed_at: int | None,
    ) -> tuple[int, int]:
        """A direct commit's transaction: check, append, fold; a refusal is the caller's error."""

        outcome = self.projector.admit(
            txn, batch, lambda: self._log.append(txn, payload, committed_at)
        )
        if isinstance(outcome, Exception):
            raise outcome
        self._effects(txn).on_commit(lambda: self._committed([outcome]))
        return outcome

    async def write(self, work: Callable[[lmdb.Transaction[bytes]], Any]) -> Any:
        """Run ``work(txn)`` in a group's transaction (durable writes that are not log records,
        such as the id reservation); it must change nothing outside the transaction."""

        return await self._submit(None, None, None, work)

    def _submit(
        self,
        payload: bytes | None,
        batch: list[Write] | None,
        committed_at: int | None,
        work: Callable[[lmdb.Transaction[bytes]], Any] | None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> asyncio.Future[Any]:
        self._env.check_process()
        if loop is None:
            loop = asyncio.get_running_loop()
        job = _Job(loop, payload, batch, committed_at, work)
        self._commits += 1
        with self._state_lock:
            if self._closed:
                raise StoreClosedError("LmdbStorage is closed")
            self._unresolved += 1
        gathering = self._gathering.get(loop)
        if gathering is None:
            gathering = self._gathering[loop] = []
            loop.call_soon(self._flush, loop)
        gathering.append(job)
        return job.future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's turn ended: its gathered commits go as one group (or more)."""

        jobs = self._gathering.pop(loop)
        if self._direct and len(jobs) == 1 and self._lock.acquire(blocking=False):
            try:
                with self._state:
                    idle = not self._queue
                if idle:
                    self._run(jobs)
            finally:
                self._lock.release()
            if idle:
                self._resolve(jobs)
                return
        with self._state:
            self._queue.extend(jobs)
            self._writer.wake()

    # ── the writer thread ───────────────────────────────────────────────────

    @property
    def _thread(self) -> threading.Thread | None:
        """The writer thread, once started."""

        return self._writer.thread

    def _done(self) -> bool:
        """Under ``_state``: the writer thread ends (closed, and every accepted commit resolved)."""

        return not self._queue and self._closed and self._unresolved == 0

    def _take_group(self) -> list[_Job] | None:
        """Under ``_state``: the next group, ``MAX_GROUP`` batches at most."""

        if not self._queue:
            return None
        jobs, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
        return jobs

    def _run_group(self, jobs: list[_Job]) -> None:
        """On the writer thread: one group, then its callers resumed on their loops."""

        self._wanting = True
        with self._lock:
            self._wanting = False
            self._run(jobs)
        loop = jobs[0].loop
        by_loop: dict[asyncio.AbstractEventLoop, list[_Job]] = {loop: jobs}
        if any(job.loop is not loop for job in jobs):  # callers of several loops (threads)
            by_loop = {}
            for job in jobs:
                by_loop.setdefault(job.loop, []).append(job)
        for loop, resolved in by_loop.items():
            try:
                loop.call_soon_threadsafe(self._resolve, resolved)
            except RuntimeError:  # that loop is closed: nobody awaits these any more
                self._settle(len(resolved))

    # ── running a group ─────────────────────────────────────────────────────

    def _run(self, jobs: list[_Job]) -> None:
        """One transaction for ``jobs``; on anything but a rejection, each alone instead."""

        stream = self.stream
        try:
            self._attempt(jobs, stream)
        finally:
            if stream is not None:
                stream.landed = frozenset()

    def _attempt(self, jobs: list[_Job], stream: StreamWriter | None) -> None:
        try:
            self._env.write(lambda txn: self._group(txn, jobs, stream))
            self._durable(jobs)
            return
        except ReplicationError as error:  # the stream refused or did not answer: all alike
            for job in jobs:
                job.result, job.error = None, error
            return
        except MapBusyError as error:  # the map cannot grow for now: alone, each would wait again
            for job in jobs:
                job.result, job.error = None, error
            return
        except BaseException as error:
            if len(jobs) == 1:
                jobs[0].result, jobs[0].error = None, error
                return
        for job in jobs:
            try:
                self._env.write(lambda txn, alone=[job]: self._group(txn, alone, stream))  # type: ignore[misc]
                self._durable([job])
            except BaseException as error:
                job.result, job.error = None, error

    def _durable(self, jobs: list[_Job]) -> None:
        """After a transaction with plain writes committed (the id reservation): they hold no log
        record for the journal, so a journaled ``power`` store makes them durable now, before
        their callers hear back; if it cannot, those callers get the error (the batches beside
        them are in the journal, durable)."""

        if not any(job.work is not None and job.error is None for job in jobs):
            return
        try:
            self._env.make_durable()
        except BaseException as error:
            for job in jobs:
                if job.work is not None:
                    job.result, job.error = None, error

    def _committed(
        self, results: list[tuple[int, int]], stream: StreamWriter | None = None
    ) -> None:
        """Right after a transaction holding ``results`` (sequence, highest id) committed (its
        ``on_commit``), on the committing thread: the effects every batch in the log has, whether or not its caller
        still waits for it. A group that settled with a ``stream`` may have taken in another
        writer's records: ``on_commit(0)`` lets the store raise its floor past them too."""

        if results:
            self._log.committed()
            self._env.counters.group_batches.observe(len(results))
            # Once, with the highest: all ``on_commit`` does with an id is raise a floor to it.
            self._on_commit(
                results[0][1] if len(results) == 1 else max(max_id for _, max_id in results)
            )
        elif stream is not None:
            self._on_commit(0)

    def _group(
        self, txn: lmdb.Transaction[bytes], jobs: list[_Job], stream: StreamWriter | None = None
    ) -> None:
        """Check, append and fold each batch in order, inside ``txn`` (run again from the start
        after a map growth, so outcomes are set afresh); with a ``stream``, settle first and
        publish before the transaction commits."""

        projector = self.projector
        landed: frozenset[int] = frozenset()
        if stream is not None:
            stream.settle(txn, projector)
            landed = stream.landed
        records: list[tuple[int, bytes]] = []
        seq: int | None = None  # the last sequence appended in this transaction
        for job in jobs:
            if (
                landed
                and job.batch is not None
                and job.result is not None
                and job.result[0] in landed
            ):
                continue  # published by an earlier run of this group, taken in from the stream just now
            job.result = job.error = None
            if job.work is not None:
                job.result = job.work(txn)
                continue
            payload, committed_at = job.payload, job.committed_at
            assert job.batch is not None and payload is not None
            if stream is not None:
                try:
                    stream.check_size(payload)
                except Exception as error:
                    job.error = error
                    continue
            outcome = projector.admit(
                txn, job.batch, lambda: self._log.append(txn, payload, committed_at, seq)
            )
            if isinstance(outcome, Exception):  # a refusal wrote nothing; its neighbours go on
                job.error = outcome
                continue
            job.result = outcome
            seq = outcome[0]
            records.append((seq, payload))
        if stream is not None and records:
            # The stream decides the order: the transaction commits only once it holds them.
            stream.publish(txn, [seq for seq, _ in records])
        self._effects(txn).on_commit(lambda: self._group_committed(jobs, stream))

    def _effects(self, txn: lmdb.Transaction[bytes]) -> WriteTransaction:
        """The effects of a transaction of batches, holding ``hold`` across its commit."""

        effects = self._env.effects(txn)
        if self._hold is not None:
            effects.hold(self._hold)
        return effects

    def _group_committed(self, jobs: list[_Job], stream: StreamWriter | None) -> None:
        """A group's transaction committed: its publish is settled, and its batches have the
        effects of ``_committed``."""

        if stream is not None:
            stream.committed()
        self._committed(
            [job.result for job in jobs if job.batch is not None and job.error is None], stream
        )

    def _resolve(self, jobs: list[_Job]) -> None:
        """On the jobs' loop: hand each caller its outcome, ``RESOLVE_CHUNK`` callers per turn
        of the loop, so a big group's callers do not all run before the loop's other tasks."""

        if len(jobs) > RESOLVE_CHUNK:
            jobs[0].loop.call_soon(self._resolve, jobs[RESOLVE_CHUNK:])
            jobs = jobs[:RESOLVE_CHUNK]
        for job in jobs:
            if job.future.done():  # the caller was cancelled; its commit stands regardless
                continue
            if job.error is not None:
                job.future.set_exception(job.error)
            else:
                job.future.set_result(job.result)
        self._settle(len(jobs))

    def _settle(self, count: int) -> None:
        """``count`` accepted commits resolved. Only a closed committer's writer waits on this
        count (to stop once it is 0); an open one's waits for the queue alone, and waking it
        at each chunk a loop resolved cost it a futile wake-up (and a wait for the GIL) each."""

        with self._state:
            self._unresolved -= count
            if self._closed:  # set under this lock: a close after this notifies by itself
                self._state.notify_all()

    # ── lifecycle ───────────────────────────────────────────────────────────

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No group runs while this is held (a rebuild swapping the projector, a user
        projection's chunk)."""

        with self._lock:
            yield

    @contextmanager
    def yielding(self) -> Iterator[None]:
        """``exclusive()`` for a holder that lets go as soon as ``contended()`` says a commit
        waits: a direct commit then waits for it (briefly) rather than going to the writer thread."""

        with self._lock:
            self._yielding = True
            try:
                yield
            finally:
                self._yielding = False

    def contended(self) -> bool:
        """Whether a commit waits to run (queued, gathering, waiting for ``_lock`` on the writer
        thread or directly): whoever holds ``_lock`` for long work should let it go soon."""

        return self._wanting or self._waiting_direct or bool(self._queue) or bool(self._gathering)

    def busy(self) -> bool:
        """Whether a commit runs or waits to (one on its way to a direct transaction, ``_lock``
        held, or ``contended()``): work that
        shares the interpreter with commits but needs no lock (a user projection's fold) pauses,
        since a commit that lets go of the interpreter for LMDB may not get it back for a while."""

        return bool(self._direct_commits) or self._lock.locked() or self.contended()

    async def close(self) -> None:
        """Refuse new commits, wait for every accepted one, stop the writer thread."""

        with self._state:
            self._closed = True
            self._state.notify_all()
        while True:
            with self._state:
                if self._unresolved == 0:
                    break
            await asyncio.sleep(0.001)
        with self._lock:  # a direct commit on another thread finishes before the store closes
            self._runs.clear()
        self._writer.join()


__all__ = [
    "CONTENDED",
    "DIRECT_RUN",
    "FAST_FLUSH",
    "FLUSH_WINDOW",
    "MAX_GROUP",
    "RESOLVE_CHUNK",
    "SLOW_ALLOWED",
    "YIELD_WAIT",
    "Committer",
]
