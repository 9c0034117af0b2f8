"""The thread that folds the log into user projections, in short chunks, off the event loop.

Each chunk folds as many records as fit in ``FOLD_SLICE`` seconds in a read transaction, outside
the store's write exclusion, keeping the rows it writes aside (``StagedTables``; the fold reads
them back); then one short write transaction, under the exclusion (the committer's lock), puts
those rows and stores the checkpoint with them (a killed process resumes after the last chunk).
A commit arriving meanwhile waits for a few puts and that transaction's commit, not for folds,
and a thread preempted while folding holds up no commit. Folding stops after the record being
folded once a commit is on its way, runs or waits (``Writes.busy``), and such commits go before
each step that takes the lock. A fold that fails, or a row LMDB refuses, is folded again inside the write
transaction, so the rows before the record at fault are kept and that record is named. Between
rounds the thread rests as long as the round took (``FOLD_PAUSE`` at least), so a loop that wants
the interpreter gets it within a slice, and folding takes at most about half the CPU.

A build (another version beside the served one) that reaches the log's head is swapped in inside
the transaction of its last chunk: the served status becomes the build's, and the old slot is
retired. Its databases are dropped by a later transaction, once no reader of this process is
still inside a read transaction that began before the swap.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Final, Protocol

import lmdb
import msgspec

from ..log import Commit, Environment, WriteLog
from ..log.threads import Requests
from . import userstate as us
from .usertables import CoreSource, StagedTables, Tables

_log = logging.getLogger("pi_durable_lmdb")

FOLD_SLICE: Final = 0.0003
"""Seconds of folding per chunk at most (plus the record being folded)."""
FOLD_PAUSE: Final = 0.0003
"""Seconds the thread rests between rounds at least (and as long as the round took): the event
loop's turn at the interpreter and the CPU."""
YIELD_ROUNDS: Final = 60
"""Rests of ``FOLD_PAUSE / 4`` a chunk waits at most for the commits waiting before it takes the lock."""
READ_AHEAD: Final = 32
"""Log records decoded at a time, outside any write transaction."""


class Writes(Protocol):
    """The store's write path as the fold thread needs it (the committer)."""

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold off every other write of the store (a commit meanwhile waits, off the loop)."""

    def yielding(self) -> AbstractContextManager[None]:
        """``exclusive()``, for a holder that lets go as soon as ``contended()``."""

    def contended(self) -> bool:
        """Whether a commit is waiting for the store's writes: a chunk then ends early."""

    def busy(self) -> bool:
        """Whether a commit runs or waits: folding outside the lock then pauses."""


Source = Callable[[], Writes]


class _FoldFailed(Exception):
    def __init__(self, seq: int, error: Exception) -> None:
        super().__init__(seq, error)
        self.seq, self.error = seq, error


def describe(error: BaseException) -> str:
    """An error as stored text: whatever its message holds, it encodes (lone surrogates are
    escaped) and it never raises."""

    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:
        text = f"{type(error).__name__} (its message could not be made)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _unwritable_traceback(error: BaseException) -> str | None:
    """The error's traceback as text that encodes, when the raw one would not (a lone surrogate
    in its message: a log handler writing UTF-8 would drop the line); ``None`` when it does and
    the error can go to the log as ``exc_info``, for handlers that keep exceptions whole."""

    raw = "".join(traceback.format_exception(error)).rstrip()
    safe = raw.encode("utf-8", "backslashreplace").decode("utf-8")
    return None if safe == raw else safe


class Folded(Protocol):
    """A user projection as the fold thread sees it (``user.Projection``)."""

    def fold(self, tables: Tables, commit: Commit) -> None:
        """Fold one committed batch into the projection's rows."""


class Owner(Protocol):
    """The store's user projections as their fold thread needs them (``user.UserProjections``):
    where they are, what to fold into, and where to report a chunk."""

    env: Environment
    log: WriteLog
    path: str
    registry: lmdb._Database | None

    @property
    def projections(self) -> Mapping[str, Folded]: ...
    def notify(self) -> None: ...
    def target(self, name: str) -> tuple[bytes, us.StoredProjection | None]: ...
    def handles(self, name: str, status: us.StoredProjection) -> dict[str, lmdb._Database]: ...
    def open_handles(
        self, name: str, status: us.StoredProjection
    ) -> dict[str, lmdb._Database] | None: ...
    def core_source(self) -> CoreSource | None: ...
    def folded(self, name: str, key: bytes, status: us.StoredProjection, swapped: bool) -> None: ...
    def drop_retired(self, name: str) -> bool: ...


class Folder:
    """The fold thread of one store's user projections (started by ``kick``, ended by ``stop``)."""

    def __init__(self, owner: Owner, writes: Source) -> None:
        self._owner = owner
        self._writes = writes
        self._wake = threading.Condition()
        self._stopping = False
        self._pending: dict[str, list[Commit]] = {}
        self._worker = Requests(
            f"lmdb-projections {owner.path}", self._wake, self._round, lambda: self._stopping
        )
        self.error: Exception | None = None
        """What stopped the last run outside any fold (a log record it could not read): ``wait``
        raises it; the next ``kick`` tries again."""

    def kick(self) -> None:
        """There may be work: start the thread, or wake it (cheap: called after every commit)."""

        if self._stopping:
            return
        if not self._worker.wanted or self._worker.thread is None:
            with self._wake:
                self._worker.want()

    @property
    def thread(self) -> threading.Thread | None:
        """The fold thread, once started."""

        return self._worker.thread

    def stop(self) -> threading.Thread | None:
        """Ask the thread to end after its chunk; returns it, to join."""

        with self._wake:
            self._stopping = True
            self._wake.notify()
        return self.thread

    def _round(self) -> None:
        """On the fold thread: step until no work remains, resting between steps."""

        self.error = None
        try:
            began = time.perf_counter()
            while not self._stopping and self.step():
                self._owner.notify()
                # At least as long as the round took: on a busy machine a round that was
                # preempted holding the interpreter is followed by as long a rest.
                time.sleep(max(FOLD_PAUSE, time.perf_counter() - began))
                began = time.perf_counter()
        except Exception as error:  # a corrupt log record: waiters are told, not left waiting
            _log.error("user projections stopped: %s", error, exc_info=error)
            self.error = error
        self._owner.notify()

    # ── one round: a chunk for each projection that is behind ───────────────

    def step(self) -> bool:
        """Fold one chunk into each projection that is behind, swap a build that is level, drop
        retired slots; True while any work remains."""

        owner = self._owner
        head = owner.log.head()
        busy = False
        for name, projection in owner.projections.items():
            busy |= owner.drop_retired(name)
            key, target = owner.target(name)
            if target is None or target.error is not None:
                continue
            if target.folded_seq >= head and key == us.served_key(name):
                continue
            commits = self._commits(name, target.folded_seq, head)
            self._fold(name, projection, key, target, commits)
            _, after = owner.target(name)
            busy |= (
                after is not None
                and after.error is None
                and (after.folded_seq < head or key != us.served_key(name))
            )
        return busy

    def _commits(self, name: str, folded: int, head: int) -> list[Commit]:
        pending = [commit for commit in self._pending.get(name, ()) if commit.seq > folded]
        if not pending or pending[0].seq != folded + 1:
            pending = self._owner.log.take(folded + 1, head, READ_AHEAD) if folded < head else []
        self._pending[name] = pending
        return pending

    def _fold(
        self,
        name: str,
        projection: Folded,
        key: bytes,
        target: us.StoredProjection,
        commits: list[Commit],
    ) -> None:
        owner = self._owner
        env = owner.env
        writes = self._writes()
        handles = owner.open_handles(name, target)
        if handles is None:
            self._let_commits_go(writes)
            with writes.yielding():
                handles = owner.handles(name, target)
        staged = self._stage(projection, target, handles, commits, writes)
        self._let_commits_go(writes)
        with writes.yielding():
            if owner.target(name) != (key, target):
                return  # dropped, retried or rebuilt meanwhile: the next round starts afresh
            try:
                if staged is not None:
                    try:
                        status, swapped = env.write(
                            lambda txn: self._fold_in(
                                txn,
                                name,
                                projection,
                                key,
                                target,
                                handles,
                                commits,
                                FOLD_SLICE,
                                writes,
                                staged,
                            )
                        )
                    except lmdb.Error:  # a row LMDB refuses: folded again in the transaction, so the record at fault is named
                        staged = None
                if staged is None:
                    status, swapped = env.write(
                        lambda txn: self._fold_in(
                            txn, name, projection, key, target, handles, commits, FOLD_SLICE, writes
                        )
                    )
            except _FoldFailed as failure:
                before = [commit for commit in commits if commit.seq < failure.seq]
                status = target
                if before:  # keep what folded cleanly, so the checkpoint stops right before it
                    status, _ = env.write(
                        lambda txn: self._fold_in(
                            txn, name, projection, key, target, handles, before, None, writes
                        )
                    )
                status = self._record_failure(name, key, status, failure.seq, failure.error)
                swapped = False
        owner.folded(name, key, status, swapped)
        if swapped:
            _log.info(
                "user projection %r: version %d swapped in at sequence %d",
                name,
                status.version,
                status.folded_seq,
            )

    @staticmethod
    def _let_commits_go(writes: Writes) -> None:
        """Commits running or waiting go first (for a while at most): one on its way to a
        direct transaction would otherwise find the lock taken."""

        for _ in range(YIELD_ROUNDS):
            if not writes.busy():
                break
            time.sleep(FOLD_PAUSE / 4)

    def _stage(
        self,
        projection: Folded,
        target: us.StoredProjection,
        handles: dict[str, lmdb._Database],
        commits: list[Commit],
        writes: Writes,
    ) -> tuple[StagedTables, int] | None:
        """Fold records for ``FOLD_SLICE`` seconds at most in a read transaction, outside the
        store's write exclusion, keeping the rows aside; returns them with the sequence they are
        level with, or None when a fold failed (the write transaction folds those records again
        itself, to keep what came before the failure and name the record at fault)."""

        with self._owner.env.read() as txn:
            tables = StagedTables(
                txn, handles, target.version, target.folded_seq, self._owner.core_source()
            )
            deadline = time.perf_counter() + FOLD_SLICE
            folded = target.folded_seq
            for commit in commits:
                tables.at(commit.seq)
                try:
                    projection.fold(tables, commit)
                except Exception:
                    return None
                folded = commit.seq
                if time.perf_counter() >= deadline or writes.busy():
                    break  # a commit runs or waits: it has the interpreter to itself
        return tables, folded

    def _fold_in(
        self,
        txn: lmdb.Transaction[bytes],
        name: str,
        projection: Folded,
        key: bytes,
        target: us.StoredProjection,
        handles: dict[str, lmdb._Database],
        commits: list[Commit],
        budget: float | None,
        writes: Writes,
        staged: tuple[StagedTables, int] | None = None,
    ) -> tuple[us.StoredProjection, bool]:
        """One chunk inside ``txn`` (run again from the start after a map growth): the rows
        ``staged`` if given, else ``commits`` folded here, for ``budget`` seconds at most."""

        owner = self._owner
        tables = Tables(txn, handles, target.version, target.folded_seq, owner.core_source())
        deadline = None if budget is None else time.perf_counter() + budget
        folded = target.folded_seq
        if staged is not None:
            staged[0].apply(txn)
            folded, commits = staged[1], []
        for commit in commits:
            tables.at(commit.seq)
            try:
                projection.fold(tables, commit)
            except lmdb.MapFullError:
                raise  # not the fold's fault: the write grows the map and folds the chunk again
            except Exception as error:
                raise _FoldFailed(commit.seq, error) from error
            folded = commit.seq
            if deadline is not None and (time.perf_counter() >= deadline or writes.contended()):
                break  # a commit waits: it goes first
        status = msgspec.structs.replace(target, folded_seq=folded)
        registry = owner.registry
        assert registry is not None
        if key == us.served_key(name) or folded < owner.log.head(txn):
            us.put(txn, registry, key, status)
            return status, False
        served = us.get(txn, registry, us.served_key(name))
        retired = (
            []
            if served is None
            else [
                *served.retired,
                (served.slot, us.db_names(name, served.slot, served.databases or [])),
            ]
        )
        status = msgspec.structs.replace(status, retired=retired, started_at=None, started_seq=0)
        us.put(txn, registry, us.served_key(name), status)
        txn.delete(key, db=registry)
        return status, True

    def _record_failure(
        self, name: str, key: bytes, status: us.StoredProjection, seq: int, error: Exception
    ) -> us.StoredProjection:
        failed = msgspec.structs.replace(status, failed_seq=seq, error=describe(error))
        written = _unwritable_traceback(error)
        if written is None:
            _log.error(
                "user projection %r stopped at record %d: %s",
                name,
                seq,
                failed.error,
                exc_info=error,
            )
        else:
            _log.error(
                "user projection %r stopped at record %d: %s\n%s", name, seq, failed.error, written
            )
        registry = self._owner.registry
        assert registry is not None
        self._owner.env.write(lambda txn: us.put(txn, registry, key, failed))
        return failed


__all__ = [
    "FOLD_PAUSE",
    "FOLD_SLICE",
    "READ_AHEAD",
    "YIELD_ROUNDS",
    "Folded",
    "Folder",
    "Owner",
    "Source",
    "Writes",
    "describe",
]
