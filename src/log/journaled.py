"""How a journaled ``power`` writer makes its commits durable: each write transaction's log records
go to the journal as one flushed frame before LMDB commits (the one device flush a commit waits
for); checkpoints make ``data.mdb`` durable and move the pin that keeps their pages from reuse;
after a power cut the open restores the last checkpoint's meta pages and the store replays the
journal past it. Why it is built so: ``log.journal`` and docs/reliability.md section 7.

When to checkpoint (``committed``, ``_adapt``): the pin keeps every page freed after the
checkpoint from reuse, so each commit until the next one writes new pages, and the file's high
water mark rises by pages per commit times commits per checkpoint (the file never shrinks). A
fixed commit bound made a small store many times its ``process`` size, so the bound adapts to
what the file shows at each checkpoint, its free pages (counted as ``stats`` counts them): when
the interval grew the file and they are above ``pinned_share`` of it (and ``pinned_pages``), the
bound halves; else it grows (doubles after an interval that did not grow the file, else one more
commit). The file "grew" only when its free pages grew with it: free pages the commits are
reusing (a file that grew in one step, a dropped database) are no waste, and a store whose
records grow it (the log only grows) must not shorten its intervals for that. It starts at one
commit. Why this and not an estimate of the pages a commit writes: what a commit takes from the
free pages cannot be told from outside LMDB (py-lmdb shows no free list), and an estimate from
file growth counts growth that comes from contiguous runs for long values as if the free pages
had run out. Why not a trigger on file
growth alone: each growth-ended interval leaves its pages free for the next, so intervals
lengthen up to the commit bound and the file grows as far as it did without one. A bound by
journal bytes (half the segment in use) keeps two segments taking turns. A commit that reaches
a bound while the checkpoint already asked of the thread has not yet pinned its state asks for
no other (``_requested``): it is in that one, and a second would follow it with a commit or two
since, two device flushes for nothing (a third of a host's checkpoints were such).

``CommitJournal`` is what an ``Environment`` of ``Mode.JOURNALED`` holds as ``journal`` (None in
every other mode): its one write loop (``Environment.write``) calls the hooks here around each
write transaction, and ``WriteLog.append`` stages each record it appends (``stage``).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time

import lmdb

from ..errors import StoreFormatError
from .counters import EngineCounters
from .journal import Journal, JournalOptions, planted
from .shared import Gate, SharedEnv
from .storedir import (
    POWER_FILE,
    boot_id,
    clear_markers,
    clear_unsynced,
    mark_power,
    read_power_marker,
)
from .threads import Requests

_log = logging.getLogger("pi_durable_lmdb")


def pages(stat: lmdb._StatDict) -> int:
    """The pages one database holds."""

    return int(stat["branch_pages"]) + int(stat["leaf_pages"]) + int(stat["overflow_pages"])


class CommitJournal:
    """A journaled writer's commits made durable (see the module docstring): each write
    transaction's records staged, then flushed as one frame before LMDB commits it; checkpoints
    and the pin that keeps their pages from reuse; recovery after an unclean stop.

    Made before LMDB maps the file (a recovery writes the checkpoint's meta pages back first),
    then ``attach``-ed to the environment once it is open."""

    def __init__(
        self, path: str, options: JournalOptions, counters: EngineCounters | None = None
    ) -> None:
        self.path = path
        self._journal = Journal(path, options, counters)
        self.counters = self._journal.counters
        """The environment's counters: checkpoints here, flushes and segments in the journal."""
        self._env: lmdb.Environment | None = None  # these three are the environment's (``attach``)
        self._gate = Gate()
        self._dbs: dict[bytes, lmdb._Database] = {}
        self._closed = False
        self._pin: lmdb.Transaction[bytes] | None = None
        self._replay_from: int | None = None
        """While a replay after an unclean stop is pending: the segment its records start in."""
        self._epoch = 0
        self._staged: list[tuple[int, bytes]] = []
        self._writing = threading.Lock()
        """Held from a write transaction's begin to its commit, and by a checkpoint while it pins
        a state and copies its meta pages (so they are one state)."""
        self._checkpointing = threading.Lock()
        self._since = (
            0,
            0,
            time.monotonic(),
        )  # commits, journal bytes, time at the last checkpoint
        self._bound = 1
        """Journaled commits between checkpoints now (``_adapt``)."""
        self._last_page = 0
        """``data.mdb``'s last page number at the last checkpoint."""
        self._last_free: int | None = 0
        """Its free pages then (``_adapt``); None when they were not counted (the file had not
        grown, so nothing needed them then), to be counted in the pin of that checkpoint once a
        later one finds the file grown."""
        self._meta_file: tuple[int, int] | None = None
        """``data.mdb`` open for ``_read_meta``, and the bytes of its two meta pages."""
        self._wake = threading.Condition()
        self._requested = False
        """A checkpoint was asked of the thread and has not yet pinned its state: the commits
        that end meanwhile are in it, so they ask for no other (``committed``)."""
        self._stopping = False
        self._worker = Requests(
            f"lmdb-checkpoint {path}", self._wake, self._checkpoint_now, lambda: self._stopping
        )
        try:
            self._restore()
        except BaseException:
            self._journal.close()
            raise

    @property
    def env(self) -> lmdb.Environment:
        assert self._env is not None, "the journal is not attached to its environment yet"
        return self._env

    def attach(self, shared: SharedEnv) -> None:
        """The environment is open: pin the restored checkpoint until the replay is synced, or
        begin a new writer life."""

        self._env, self._gate, self._dbs = shared.env, shared.gate, shared.dbs
        if self._replay_from is not None:
            self._pin = self._begin_pin()
        else:
            self._start_life()

    @property
    def background(self) -> bool:
        """Checkpoints run on a thread of their own, not on the committing thread."""

        return self._journal.options.background

    @property
    def bound(self) -> int:
        """Journaled commits between checkpoints now (``_adapt``)."""

        return self._bound

    @property
    def pinned(self) -> bool:
        """A read transaction of the writer is pinned on the last checkpoint."""

        return self._pin is not None

    # ── the write loop's hooks (``Environment.write``) ─────────────────────

    def stage(self, seq: int, data: bytes) -> None:
        """Inside a write transaction: one of its log records (sequence, stored bytes); they go
        to the journal as one flushed frame right before the transaction commits."""

        self._staged.append((seq, data))

    def begin(self) -> None:
        """A write transaction begins: checkpoints wait until it ends; nothing is staged yet."""

        self._writing.acquire()
        self._staged = []

    def flush(self) -> bool:
        """Right before LMDB commits: the staged records as one frame, flushed (the only device
        flush a commit waits for). Whether a frame was written; one written even in part is
        unmade before a failure here is raised."""

        if not self._staged:
            return False
        try:
            self._journal.write(self._staged)
        except BaseException:
            self._journal.abandon()
            raise
        return True

    def confirm(self) -> None:
        """The transaction of the frame committed (before ``end``: the next one's frame follows)."""

        self._journal.confirm()

    def abandon(self) -> None:
        """The transaction of the frame did not commit: unmake the frame, durably."""

        self._journal.abandon()

    def end(self) -> None:
        """The write transaction ended (committed or not)."""

        self._staged = []
        self._writing.release()

    def committed(self) -> None:
        """A commit with a frame, after ``end``: take a checkpoint when the options' bounds are
        reached (on the checkpoint thread, or here)."""

        journal = self._journal
        commits, written, since = self._since
        commits += 1
        self._since = (commits, written, since)
        options = journal.options
        segment = journal.current
        half = (
            segment.size // 2
            if segment is not None and options.checkpoint_half_segment
            else options.checkpoint_bytes
        )
        if not (
            commits >= self._bound
            or journal.written - written >= min(options.checkpoint_bytes, half)
            or time.monotonic() - since >= options.checkpoint_seconds
        ):
            return
        if not options.background:
            try:
                self.checkpoint()
            except Exception:  # the commit is done and durable in the journal: it must not fail now
                _log.exception(
                    "checkpoint of the store at %s failed; commits go on in the journal", self.path
                )
            return
        with self._wake:
            if not self._requested:  # else the one asked for, not begun yet, holds this commit
                self._requested = True
                self._worker.want()

    def wrote(self) -> None:
        """A write transaction without a frame committed (a user projection's chunk, a
        rebuild's, a status row), after ``end``: it counts toward the next checkpoint as a
        commit does. The pages it freed are reused only once a checkpoint moves the pin; a long
        run of such transactions (a projection's build) with no checkpoint left every page it
        freed unused, and the file grew by several times what the build wrote. Not during a
        replay: its checkpoint is the one ``finish_replay`` makes."""

        if self._replay_from is None:
            self.committed()

    # ── checkpoints ─────────────────────────────────────────────────────────

    def _checkpoint_now(self) -> None:
        """On the checkpoint thread: a checkpoint that fails is logged, not raised."""

        try:
            self.checkpoint()
        except (
            Exception
        ):  # commits stay durable in the journal, which grows; the next trigger retries
            _log.exception(
                "checkpoint of the store at %s failed; commits go on in the journal", self.path
            )
        finally:
            self._requested = False  # however it ended (it may have failed before its pin)

    def checkpoint(self) -> None:
        """Make every commit so far durable in ``data.mdb`` and record it as the checkpoint that
        recovery starts from. The pin moves to it once it is durable; segments it no longer
        needs are released."""

        if self._closed:
            return
        with self._checkpointing:
            self._checkpoint()

    def checkpoint_rewrite(self) -> None:
        """After a write transaction that rewrote records in place and staged no frame (an
        erasure, which took a ``checkpoint`` right before it): the journal moves to a new
        segment and a checkpoint makes the rewrite durable in ``data.mdb``. A power cut before
        that checkpoint is durable restores the one before the rewrite, with no frame after it:
        the rewrite is undone whole. Raises what the checkpoint raised."""

        with self._writing:
            self._journal.roll()
        self.checkpoint()

    def _checkpoint(self) -> None:
        """A checkpoint, holding ``_checkpointing``: a state pinned and its meta pages copied
        with no write transaction open (``_writing``), then synced off the commit path."""

        journal = self._journal
        self._gate.enter()  # the map stays as it is while the pin begins
        try:
            with self._writing:
                pin = self._begin_pin(entered=True)
                meta = self._read_meta()
                segment = (
                    self._replay_from if self._replay_from is not None else journal.current_number
                )
                commits = self._since[0]
                self._since = (0, journal.written, time.monotonic())
                self._requested = False  # commits from here on are not in this checkpoint
                last = int(self.env.info()["last_pgno"])
        finally:
            self._gate.held.pop()
        try:
            self.env.sync(True)
            journal.checkpoints.write(self._epoch, segment, meta)
        except BaseException:
            if pin is not None:
                pin.abort()
            raise
        self.counters.checkpoints += 1
        old, self._pin = self._pin, pin
        try:
            if pin is not None:
                try:
                    self._adapt(pin, old, commits, last)
                except (
                    lmdb.Error
                ):  # a handle a swap dropped meanwhile: the bound stays until the next one
                    pass
        finally:
            if old is not None:  # the state before: its pages may be reused from now on
                old.abort()
        journal.release(segment)
        self._prepare()

    def _prepare(self) -> None:
        """After a checkpoint released segments: the journal's next segment made ready now, off
        the commit path (``Journal.prepare``). A failure is logged, not raised: the commit that
        fills the segment in use makes the next one itself, and reports what goes wrong then."""

        try:
            self._journal.prepare()
        except Exception:
            _log.warning(
                "the next journal segment of the store at %s could not be made ahead; the commit "
                "that needs it makes it",
                self.path,
                exc_info=True,
            )

    def _adapt(
        self,
        pin: lmdb.Transaction[bytes],
        old: lmdb.Transaction[bytes] | None,
        commits: int,
        last: int,
    ) -> None:
        """The commit bound until the next checkpoint (see the module docstring), from the
        state ``pin`` holds (``last``: its last page number), the one ``old`` held (the
        checkpoint before, still pinned) and the ``commits`` since the checkpoint before.

        Free pages are counted only when the file grew since the checkpoint before (a ``stat``
        of every database, twice when that checkpoint's count was skipped: then in ``old``):
        only then do they decide anything, and most checkpoints of a store find the file as
        it was (its commits reuse the pages the checkpoint before let go)."""

        options = self._journal.options
        grew = False
        free: int | None = None
        if self._last_page > 0 and last > self._last_page:
            if self._last_free is None:
                self._last_free = (
                    self._free_pages(old, self._last_page, earlier=True)
                    if old is not None
                    else None
                )
            free = self._free_pages(pin, last)
            # Grown by more than its data: new records alone (the log only grows) are not pages
            # the pin kept from reuse, and counting them halved the bound of every growing store.
            grew = self._last_free is not None and free > self._last_free
        self._last_page, self._last_free = last, free
        if (
            grew
            and free is not None
            and free > max(options.pinned_pages, options.pinned_share * (last + 1))
        ):
            self._bound = max(1, self._bound // 2)
        elif commits >= self._bound:
            self._bound = min(
                options.checkpoint_commits, self._bound + (1 if grew else self._bound)
            )

    def _free_pages(self, txn: lmdb.Transaction[bytes], last: int, earlier: bool = False) -> int:
        """The pages of the state ``txn`` holds that no database uses (``last``: its last page
        number), counted as ``stats`` counts them. ``earlier``: a state pinned before some of
        the databases were made (the checkpoint before's): those held no page in it."""

        used = 2 + pages(txn.stat())
        for db in list(self._dbs.values()):
            try:
                used += pages(txn.stat(db))
            except lmdb.InvalidParameterError:
                if not earlier:
                    raise
        return max(0, last + 1 - used)

    # ── map changes (``Environment._remap``) ────────────────────────────────

    def hold_checkpoints(self) -> bool:
        """Keep checkpoints off while the map changes; False when one is running (try later)."""

        return self._checkpointing.acquire(blocking=False)

    def allow_checkpoints(self) -> None:
        self._checkpointing.release()

    def unpin(self) -> None:
        """Before a map change, with every transaction drained and checkpoints held off: the pin
        must end too (LMDB changes the map only with no transaction open), so a checkpoint of
        the current state is made durable first (nothing can commit meanwhile: the gate is
        closed)."""

        journal = self._journal
        self._drop_pin()
        meta = self._read_meta()
        segment = self._replay_from if self._replay_from is not None else journal.current_number
        self.env.sync(True)
        journal.checkpoints.write(self._epoch, segment, meta)
        self.counters.checkpoints += 1
        journal.release(segment)
        self._since = (0, journal.written, time.monotonic())

    def pin(self) -> None:
        """After a map change (``unpin`` before it): pin the checkpoint it made."""

        self._pin = self._begin_pin(entered=True)

    def _begin_pin(self, entered: bool = False) -> lmdb.Transaction[bytes] | None:
        """The read transaction that keeps a checkpoint's pages from reuse (LMDB reuses a page
        only once every reader is newer than the transaction that freed it)."""

        if planted("skip-pin"):  # planted: the explorer must fail without it
            return None
        if entered:
            return self.env.begin(buffers=False)
        self._gate.enter()
        try:
            return self.env.begin(buffers=False)
        finally:
            self._gate.held.pop()

    def _drop_pin(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            pin.abort()

    def _read_meta(self) -> bytes:
        """LMDB's two meta pages as the file holds them now (no write transaction is open).

        One ``pread`` of a descriptor kept open for the writer's life (``_meta_file``): a
        checkpoint reads them holding ``_writing``, so every commit waits for this, and each
        system call here is a hand-back of the GIL the committing thread may keep busy."""

        if self._meta_file is None:
            size = 2 * int(self.env.stat()["psize"])
            fd = os.open(
                os.path.join(self.path, "data.mdb"), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
            )
            self._meta_file = (fd, size)
        fd, size = self._meta_file
        try:
            meta = os.pread(fd, size, 0)
        except BaseException:
            self._close_meta_file()  # the next checkpoint opens the file afresh
            raise
        if len(meta) != size:
            raise StoreFormatError(f"{self.path}/data.mdb is shorter than its two meta pages")
        return meta

    def _close_meta_file(self) -> None:
        meta_file, self._meta_file = self._meta_file, None
        if meta_file is not None:
            os.close(meta_file[0])

    # ── recovery and writer lives ───────────────────────────────────────────

    def _restore(self) -> None:
        """Before LMDB maps the file: after a power cut or OS crash (``power.unsynced`` names
        another boot, or none can be read), write the last checkpoint's meta pages back (its
        pages were synced and kept from reuse, so they name a whole tree) and remember where its
        journal records start (``records``)."""

        journal = self._journal
        marker = read_power_marker(self.path)
        if marker is None or marker[1] is None:
            return  # a clean stop, or a cut while a life began: no page was written unsynced since
        current = boot_id()
        if current is not None and marker[0] == current:
            # The writer died, the machine did not: the page cache holds LMDB's last commit whole
            # (every acknowledged one; readers may have seen it), so nothing is rolled back;
            # ``_start_life`` syncs it. A frame flushed for a transaction that never committed
            # was never acknowledged.
            return
        epoch = marker[1]
        record = journal.checkpoints.newest(epoch)
        if record is None:
            raise StoreFormatError(
                f"{os.path.join(self.path, POWER_FILE)} names writer life {epoch:x}, but no whole "
                f"checkpoint of it is in {journal.directory}: the journal is damaged"
            )
        fd = os.open(os.path.join(self.path, "data.mdb"), os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            os.pwrite(fd, record.meta, 0)
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._epoch = epoch
        self._replay_from = record.segment

    @property
    def replay_pending(self) -> bool:
        """An unclean stop left journal records to replay (``records``, ``finish_replay``)."""

        return self._replay_from is not None

    def records(self, head: int) -> list[tuple[int, bytes]]:
        """The journal's records after ``head`` (the restored checkpoint's log head), in order:
        the caller appends and folds each, then calls ``finish_replay``."""

        if self._replay_from is None:
            return []
        return self._journal.records(self._replay_from, head)

    def finish_replay(self) -> None:
        """The replayed records are committed: sync them and begin a new writer life."""

        if self._replay_from is None:
            return
        self._start_life()

    def _start_life(self) -> None:
        """A new writer life: everything synced, a checkpoint of it (new epoch) durable, then the
        marker naming that epoch; from then on LMDB may be written unsynced."""

        journal = self._journal
        with self._checkpointing:
            old, self._pin = self._pin, None
            pin = self._begin_pin()
            if old is not None:
                old.abort()
            self._pin = pin
            meta = self._read_meta()
            self.env.sync(True)
            clear_markers(
                self.path
            )  # the disk holds every commit now (a killed process writer's too)
            epoch = secrets.randbits(63) | 1
            segment = journal.begin()  # no marker now: no recovery can read an earlier segment
            journal.checkpoints.write(epoch, segment, meta)
            self.counters.checkpoints += 1
            mark_power(self.path, epoch)
            self._epoch, self._replay_from = epoch, None
            journal.release(segment)
            self._since = (0, journal.written, time.monotonic())

    def failed_open(self, env: lmdb.Environment | None) -> None:
        """The environment's open failed (``env``: LMDB's, if it was mapped): a refused open
        (another store's id, say) leaves no marker behind it, and nothing open."""

        self._drop_pin()
        if (
            env is not None
            and self._replay_from is None
            and read_power_marker(self.path) is not None
        ):
            try:
                env.sync(True)
                clear_unsynced(self.path, POWER_FILE)
            except OSError:
                pass
        self._close_meta_file()
        self._journal.close()

    def close(self) -> None:
        """Stop the checkpoint thread; on a clean close sync everything and remove the marker
        (a close with a replay still pending keeps it: the next open replays again)."""

        self._closed = True
        try:
            with self._wake:
                self._stopping = True
                self._wake.notify_all()
            self._worker.join()
            with self._checkpointing:
                self._drop_pin()
                if self._replay_from is None:
                    self.env.sync(True)
                    clear_markers(self.path)
                    self._journal.trim()  # nothing reads the journal of a cleanly closed store
                else:
                    self._journal.close()
        finally:
            self._drop_pin()
            self._close_meta_file()


__all__ = [
    "CommitJournal",
    "pages",
]
