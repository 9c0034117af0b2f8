"""One LMDB environment per store directory: opening, the writer lock, map growth, durability.

A store is a directory holding LMDB's ``data.mdb`` and ``lock.mdb`` and our ``writer.lock``.
LMDB already serialises write transactions, but a second writer *process* would only queue behind
the first; ``writer.lock`` (``flock``) turns that into a clear error instead. Readers never take it.

How a commit is made durable is the handle's ``mode`` (``log.durability``, resolved once from
the durability asked for and the opener's role); a ``Mode.JOURNALED`` writer holds its
``CommitJournal`` as ``journal`` (``log.journaled``), whose hooks the one write loop calls.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Final, TypeVar

import lmdb
import msgspec

from ..errors import (
    ForkedEnvironmentError,
    JournalReplayPending,
    MapBusyError,
    StoreClosedError,
    StoreFormatError,
    StoreFullError,
    WrongStoreError,
)
from . import shared
from .counters import EngineCounters
from .durability import Durability as Durability
from .durability import Mode, Role, mode_for
from .journal import JournalOptions
from .journaled import CommitJournal
from .pages import MAIN_DB as MAIN_DB
from .pages import DbPages as DbPages
from .pages import PageStats as PageStats
from .pages import tally
from .shared import REMAP_DRAIN as REMAP_DRAIN
from .shared import SharedEnv
from .storedir import (
    ALLOCATION_STEP,
    boot_id,
    clear_unsynced,
    create_data_file,
    grow_allocation,
    make_private_dir,
    mark_unsynced,
    read_power_marker,
    refuse_after_crash,
    refuse_links,
    remove_leftover_copy,
    sync_directory,
    take_writer_lock,
    trim_data_file,
)
from .storedir import MAX_DBS as MAX_DBS
from .storedir import UNSYNCED_FILE as UNSYNCED_FILE
from .storeid import (
    STORE_ID_PATTERN as STORE_ID_PATTERN,
)
from .storeid import (
    StoreHeader as StoreHeader,
)
from .storeid import (
    check_store_id as check_store_id,
)
from .storeid import decode_header, encode_header
from .storeid import (
    new_store_id as new_store_id,
)

T = TypeVar("T")

STORE_FORMAT: Final = 1
DEFAULT_MAP_SIZE: Final = 1 << 30
"""``map_size``: the address space a ``power`` writer or a reader maps at first (doubled when a
write finds it full). A writer that writes through the map (``Mode.mapped``) maps its file as it
is instead (``storedir.mapped_size``) and grows it as its writes need."""
_META_DB: Final = b"meta"
_HEADER_KEY: Final = b"store"
GROW_AHEAD_EVERY: Final = 8
"""Writes between two looks at how much of a mapped writer's map is left (``_grow_ahead``):
``ALLOCATION_STEP`` is 64 pages, far more than eight writes of a turn take."""
REMAP_PATIENCE: Final = 5.0
"""Seconds a map change retries before giving up (``MapBusyError``): a read transaction of
this process stayed open all that time (held across an ``await``, or on the growing thread)."""


class WriteTransaction:
    """The effects of one write transaction that wait for its end (``Environment.write``).

    Work run in a write transaction changes nothing outside LMDB before LMDB's commit returns:
    what it would change (a cache, a queue, a thread to wake) it hands to ``on_commit``, and
    ``on_abort`` says what to drop if the transaction does not commit (a map growth runs the
    work again in a fresh transaction; a failed flush, commit or publish aborts it). Callbacks
    run on the committing thread, in the order given, once; ``txn`` is LMDB's transaction."""

    __slots__ = ("_aborted", "_committed", "_held", "_holds", "txn")

    def __init__(self, txn: lmdb.Transaction[bytes]) -> None:
        self.txn = txn
        self._committed: list[Callable[[], None]] = []
        self._aborted: list[Callable[[], None]] = []
        self._holds: list[threading.RLock] = []
        self._held: list[threading.RLock] = []

    def hold(self, lock: threading.RLock) -> None:
        """Hold ``lock`` from just before LMDB's commit until the commit's callbacks ran: what
        the commit makes visible to other threads and what its callbacks do then are one step
        for anyone who takes ``lock`` (an id minter: no id a commit stores is minted between
        the two). Reentrant, so a callback may take it again."""

        self._holds.append(lock)

    def _acquire(self) -> None:
        """Right before LMDB's commit (after the journal's flush): take the held locks."""

        for lock in self._holds:
            lock.acquire()
            self._held.append(lock)

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once this transaction has committed (never if it does not)."""

        self._committed.append(callback)

    def on_abort(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` if this transaction ends without committing."""

        self._aborted.append(callback)

    def _end(self, committed: bool) -> None:
        """Run the callbacks of how the transaction ended; a failure goes on once all ran."""

        callbacks = self._committed if committed else self._aborted
        self._committed, self._aborted = [], []
        try:
            _run_all(callbacks, 0)
        finally:
            held, self._held = self._held, []
            for lock in reversed(held):
                lock.release()


def _run_all(callbacks: list[Callable[[], None]], start: int) -> None:
    """Call ``callbacks[start:]`` in order; each runs even if one before it raised."""

    for at in range(start, len(callbacks)):
        try:
            callbacks[at]()
        except BaseException:
            _run_all(callbacks, at + 1)  # the rest, then the failure goes on
            raise


class Environment:
    """An open store directory. Use one per process per directory; never across ``fork()``.

    ``mode`` (``log.durability``) is how its commits are made durable; without it, ``readonly``
    and ``durability`` give the mode of a reader or of a writer without a journal (a tool's).
    ``journal``: the journal's options in ``Mode.JOURNALED`` (defaults when None); the other
    modes have no journal."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        durability: Durability = "power",
        mode: Mode | None = None,
        map_size: int = DEFAULT_MAP_SIZE,
        store_id: str | None = None,
        journal: JournalOptions | None = None,
    ) -> None:
        if mode is None:
            mode = mode_for(durability, Role.READER if readonly else Role.REPLICA)
        if store_id is not None:
            check_store_id(store_id)
        self.path = os.path.abspath(os.fspath(path))
        self._closed = False
        self.mode = mode
        self.readonly = not mode.writes
        self.counters = EngineCounters()
        """What this handle committed, for a host's metrics (``log.counters``)."""
        self.clock: Callable[[], float] = time.perf_counter
        """What commits' flushes are timed with (a test's manual clock replaces it)."""
        self.on_flush: Callable[[float], None] | None = None
        """Called on the committing thread with the seconds from a journal frame's flush to
        LMDB's commit, after each transaction that wrote a frame (the committer's view of how
        fast the device is now)."""
        self._pid = os.getpid()
        self._forks = shared.forks
        self._lock_fd: int | None = None
        self.journal: CommitJournal | None = None
        """The journal that makes commits durable (``Mode.JOURNALED``), else None."""
        self.writing: WriteTransaction | None = None
        """The write transaction this handle is running, while its work runs (``effects``)."""
        created = False
        if self.readonly:
            if not os.path.isfile(os.path.join(self.path, "data.mdb")):
                raise FileNotFoundError(f"No store at {self.path} (no data.mdb)")
            refuse_after_crash(self.path)
            marker = read_power_marker(self.path)
            if marker is not None and marker[0] != (boot_id() or b"unknown"):
                raise JournalReplayPending(
                    self.path, "was open in a power-mode writer when the machine stopped"
                )
        else:
            created = make_private_dir(self.path)
            refuse_links(self.path)
            self._lock_fd = take_writer_lock(self.path)
            remove_leftover_copy(self.path)
        handle: SharedEnv | None = None
        try:
            if not self.readonly:
                refuse_after_crash(self.path)
                shared.refuse_shared_conflict(
                    self.path, mode
                )  # before the marker: a refused open leaves none
                if not mode.journaled and read_power_marker(self.path) is not None:
                    raise JournalReplayPending(
                        self.path, "holds a power-mode writer's journal not yet replayed"
                    )
                if mode.unsynced:
                    mark_unsynced(self.path)
                if not os.path.exists(os.path.join(self.path, "data.mdb")):
                    create_data_file(self.path, map_size)
                if mode.journaled:
                    self.journal = CommitJournal(
                        self.path, journal or JournalOptions(), self.counters
                    )
            handle = self._shared = shared.acquire(self.path, mode, map_size)
            if created:
                sync_directory(os.path.dirname(self.path))
            self.env = self._shared.env
            self._mapped = self._shared.mapped
            self._page_size = int(self.env.stat()["psize"])
            self._writes = 0
            self._last_pgno = int(self.env.info()["last_pgno"])
            self._dbs = self._shared.dbs
            self._gate = self._shared.gate
            self._held = self._gate.held
            if self.journal is not None:
                self.journal.attach(self._shared)
            self.store_id: str | None = self._check_header(store_id)
            if self.journal is not None and not self.journal.replay_pending:
                self.journal.checkpoint()  # a new store's header and id survive a power cut from now on
        except BaseException:
            if self.journal is not None:
                self.journal.failed_open(None if handle is None else handle.env)
            if handle is not None:  # a failed open leaves nothing open behind it
                shared.release(handle)
            self._release_lock()
            raise

    # ── databases and transactions ──────────────────────────────────────────

    def db(self, name: str) -> lmdb._Database:
        """A named database, created by a writer when missing."""

        key = name.encode()
        db = self._dbs.get(key)
        if db is None:
            self.check_open()
            self.check_process()
            if self.readonly:
                with self.read() as txn:
                    if txn.get(key) is None:
                        raise StoreFormatError(f"The store at {self.path} has no database {name!r}")
                db = self._open_existing(key)
            else:
                # In a write transaction of ours, like any other write: one that fills the map
                # grows it and runs again, and py-lmdb never waits for LMDB's writer lock inside
                # open_db (a bare open_db beside another thread's commit deadlocked once: the
                # power-loss group workload, a rebuild beside user projections on a 64 KiB map).
                db = self.write(lambda txn: self.env.open_db(key, txn=txn, create=True))
            self._dbs[key] = db
        return db

    def _open_existing(self, key: bytes) -> lmdb._Database:
        """Open a database that exists. On a writer's environment (a read-only handle may share
        one) py-lmdb opens it in a write transaction: begun here, so it waits for LMDB's writer
        lock as any commit does; begun inside a bare ``open_db`` it deadlocked beside another
        thread's commit (a ``stats`` thread beside a committing writer, in one process)."""

        self._gate.enter()
        try:
            if self.env.flags()["readonly"]:
                return self.env.open_db(key, create=False)
            txn = self.env.begin(write=True)
            try:
                db = self.env.open_db(key, txn=txn, create=False)
                txn.commit()
                return db
            except BaseException:
                txn.abort()
                raise
        finally:
            self._held.pop()

    def drop_dbs(self, txn: lmdb.Transaction[bytes], names: list[str]) -> None:
        """Delete named databases inside ``txn``. Their handles are opened in it too: LMDB closes
        a dropped handle at once, even if the transaction then aborts and is run again."""

        for name in names:
            key = name.encode()
            if txn.get(key) is not None:
                txn.drop(self.env.open_db(key, txn=txn, create=False), delete=True)

    def forget_dbs(self, names: list[str]) -> None:
        """Drop cached handles of databases a committed transaction deleted."""

        for name in names:
            self._dbs.pop(name.encode(), None)

    def has_db(self, name: str) -> bool:
        with self.read() as txn:
            return txn.get(name.encode()) is not None

    def read(self) -> lmdb.Transaction[bytes]:
        """A short read transaction, used as ``with env.read() as txn:`` (leaving ends it);
        adopts a map grown by the writer in another process.

        Map changes (``_remap``) keep transactions out: the begin is counted in the gate's
        ``held`` while it runs (it reads the meta pages in the map), and the transaction is in
        LMDB's reader table from then on, where a map change looks for it.
        """

        if self._closed:
            self.check_open()
        if shared.forks != self._forks:  # cheaper than os.getpid() on every read
            self.check_process()
        held = self._held
        held.append(None)  # atomic (the GIL); the gate's readers count
        try:
            if not self._gate.growing:
                return self.env.begin(buffers=False)
        except lmdb.MapResizedError:
            pass
        finally:
            held.pop()
        return self._read_slow()

    def _read_slow(self) -> lmdb.Transaction[bytes]:
        """``read()`` while the map changes, or after another process grew it."""

        while True:
            self._gate.enter()
            try:
                txn = self.env.begin(buffers=False)
            except lmdb.MapResizedError:
                self._remap(
                    0, None, None
                )  # adopt the size the writer's meta page holds (pops held)
                continue
            except BaseException:
                self._held.pop()
                raise
            self._held.pop()
            return txn

    def effects(self, txn: lmdb.Transaction[bytes]) -> WriteTransaction:
        """The effects of ``txn``, the write transaction this handle is running: what its work
        changes outside LMDB goes through them (``WriteTransaction``)."""

        writing = self.writing
        if writing is None or writing.txn is not txn:
            raise RuntimeError(f"no write transaction of the store at {self.path} is running here")
        return writing

    def write(self, work: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        """Run ``work`` in one write transaction and commit it, growing the map when it is full.

        ``work`` is run again from the start after a growth, so it must change nothing outside
        the transaction itself: what it would change elsewhere it hands to the transaction's
        ``effects`` (``WriteTransaction.on_commit``), which run only once LMDB's commit returned,
        and are dropped (``on_abort``) when it does not. With a journal, its hooks run around the
        transaction: the records ``work`` staged are flushed as one frame before LMDB commits
        (the only device flush a commit waits for), and the frame is unmade if the commit fails.
        """

        if self._closed:
            self.check_open()
        if shared.forks != self._forks:  # cheaper than os.getpid() on every commit
            self.check_process()
        if self.readonly:
            raise PermissionError(f"The store at {self.path} is open read-only")
        journal = self.journal
        growths = 0
        while True:
            self._gate.enter()  # held from begin to commit: write transactions are not in the reader table
            full = None
            framed = done = False
            result: T
            if journal is not None:
                journal.begin()  # no checkpoint until this transaction ends
            writing: WriteTransaction | None = None
            try:
                txn = self.env.begin(write=True)
                writing = self.writing = WriteTransaction(txn)
                try:
                    result = work(txn)
                    began = self.clock()
                    if journal is not None:
                        framed = (
                            journal.flush()
                        )  # what work staged, one flushed frame: before the commit
                    writing._acquire()
                    txn.commit()
                    seconds = self.clock() - began
                    self.counters.flush_seconds.observe(seconds)  # with a journal, its flush
                    done = True
                except lmdb.MapFullError:
                    full = txn  # aborted by the growth, once it keeps other transactions out
                except lmdb.Error as error:
                    txn.abort()
                    if framed and journal is not None:
                        journal.abandon()
                    self._explain(error)
                    raise
                except BaseException:
                    txn.abort()
                    if framed and journal is not None:
                        journal.abandon()
                    raise
                if framed and done and journal is not None:
                    journal.confirm()  # before end(): the next transaction's frame follows this one
            finally:
                self.writing = None
                if journal is not None:
                    journal.end()
                if full is None:
                    self._held.pop()
                if writing is not None and not done:
                    writing._end(False)  # aborted: by a failure, or to be run again after a growth
            assert writing is not None
            if done:
                try:
                    writing._end(True)  # the effects of what committed, whatever follows
                finally:
                    if framed and journal is not None:
                        if self.on_flush is not None:
                            self.on_flush(seconds)
                        journal.committed()  # a checkpoint when one is due
                    elif journal is not None:
                        journal.wrote()  # its freed pages count toward the next checkpoint too
                if self._mapped:
                    self._grow_ahead()
                return result
            if framed and journal is not None:
                try:
                    journal.abandon()
                except (
                    BaseException
                ):  # the transaction must not stay open and counted: it would wedge every growth
                    try:
                        txn.abort()
                    finally:
                        self._held.pop()
                    raise
            growths += 1
            self.grow(self.env.info()["map_size"], full, growths)

    def _grow_ahead(self) -> None:
        """A mapped writer grows its map ahead, looking every ``GROW_AHEAD_EVERY`` writes while
        they add pages, once less than ``ALLOCATION_STEP`` of it is left: a write that finds the
        map full is aborted and run again after the growth, and a group's write is all its
        batches; ahead of time, a growth costs the remap alone. After the commit, so it can only
        try, and never raises: its caller's write committed, and must not hear of a failure.
        A full disk, an I/O error, or this process's
        transactions still open after one ``REMAP_DRAIN`` leave the growth to the write that
        needs the room, which reports what stops it."""

        self._writes += 1
        if self._writes % GROW_AHEAD_EVERY:
            return
        info = self.env.info()
        size, last = int(info["map_size"]), int(info["last_pgno"])
        if last == self._last_pgno:
            return  # nothing added pages since the last look (the open's writes of nothing)
        self._last_pgno = last
        if size - (last + 1) * self._page_size >= ALLOCATION_STEP:
            return
        self._gate.enter()
        try:
            self._remap(2, size, None, patience=REMAP_DRAIN)
        except Exception:  # noqa: BLE001 - its caller committed; the write that needs the room says why
            pass

    def _explain(self, error: lmdb.Error) -> None:
        """A full disk surfaces from LMDB as an I/O error; say what it is."""

        try:
            stat = os.statvfs(self.path)
        except OSError:
            return
        free = stat.f_bavail * stat.f_frsize
        if free < 1 << 20:
            raise StoreFullError(
                errno.ENOSPC,
                f"No space left for a commit to the store at {self.path} ({free} bytes free); "
                "nothing was written, free some space and commit again",
            ) from error

    def grow(
        self, full: int | None = None, txn: lmdb.Transaction[bytes] | None = None, growths: int = 1
    ) -> None:
        """Grow the map: double it, or for a writer that writes through it (``Mode.mapped``)
        allocate more of the file first (``storedir.grow_allocation``; ``growths``:
        how many times in a row the same write found it full). ``full`` is the size a write
        found full (if another thread grew it meanwhile, there is nothing to do). Called outside
        any transaction, or by ``write`` with ``txn``, its write transaction that found the map
        full (still counted in ``held``), which is aborted here."""

        if txn is None:
            self._gate.enter()
        self._remap(2, full, txn, growths)

    def _remap(
        self,
        factor: int,
        full: int | None,
        txn: lmdb.Transaction[bytes] | None,
        growths: int = 1,
        patience: float | None = None,
    ) -> None:
        """Change the memory map: ``factor`` 2 grows it (``grow``), 0 adopts the size another
        process grew it to; ``patience``: seconds to try for (``REMAP_PATIENCE`` unless given).
        ``mdb_env_set_mapsize`` must not run while any transaction of this process is open (LMDB
        does not check; py-lmdb invalidates them, or older versions crash), and reads run inline
        on any thread: so new transactions are kept out (``growing``), those open are waited
        for, at most ``REMAP_DRAIN`` at a time, then the map changes.

        The caller is counted in ``held`` (this pops it). ``txn``, the write transaction that
        found the map full, is aborted here, after ``growing`` is set: py-lmdb's abort of a write
        transaction waits until no thread is inside an LMDB call, which busy readers can put off
        for seconds, unless new transactions are kept out first."""

        gate = self._gate
        journal = self.journal
        deadline = time.monotonic() + (REMAP_PATIENCE if patience is None else patience)
        locked = gate.lock.acquire(blocking=False)
        try:
            if locked:
                gate.growing = True
            if txn is not None:
                txn.abort()
        finally:
            self._held.pop()
        if not locked:  # another thread is changing the map: wait for it, without holding anything
            gate.lock.acquire()
        try:
            if full is not None and self.env.info()["map_size"] != full:
                return  # grown by another thread meanwhile
            while True:
                gate.growing = True
                if (
                    journal is None or journal.hold_checkpoints()
                ):  # else a checkpoint runs: try again
                    try:
                        if self._drained(time.monotonic() + REMAP_DRAIN):
                            if journal is not None:
                                journal.unpin()
                            self.env.set_mapsize(self._next_map_size(factor, growths))
                            if factor:
                                self.counters.map_growths += 1
                            if journal is not None:
                                journal.pin()
                            return
                    finally:
                        if journal is not None:
                            journal.allow_checkpoints()
                self._open_gate()  # let the waiting transactions run meanwhile
                if time.monotonic() >= deadline:
                    raise MapBusyError(self.path, REMAP_PATIENCE)
                time.sleep(REMAP_DRAIN / 4)
        finally:
            self._open_gate()
            gate.lock.release()

    def _next_map_size(self, factor: int, growths: int) -> int:
        """The size ``_remap`` sets (0: the one the newest meta page holds). A mapped writer's
        file is allocated to it first, and never adopts a size it did not allocate (it is the
        only writer: nobody else grows its map)."""

        size = int(self.env.info()["map_size"])
        if not self._mapped:
            return 0 if factor == 0 else size * factor
        return grow_allocation(self.path, size, growths)  # StoreFullError: the map as it was

    def _open_gate(self) -> None:
        gate = self._gate
        with gate.changed:
            gate.growing = False
            gate.changed.notify_all()

    def _drained(self, until: float) -> bool:
        """Wait (until ``until`` at most) for this process to hold no transaction: none being
        begun or written (``held``), then none live in LMDB's reader table (checked after
        ``held``: a begin is in the table by the time it leaves ``held``)."""

        pause = 0.00005
        while True:
            if not self._held and self._live_readers() <= (
                self.journal is not None and self.journal.pinned
            ):
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.001)

    def _live_readers(self) -> int:
        """How many open read transactions of this process LMDB's reader table holds (a slot
        reset for reuse shows ``-``); a journaled writer's pin is one of them."""

        pid = str(os.getpid())
        live = 0
        for line in self.env.readers().splitlines()[1:]:
            fields = line.split()
            if not fields or fields[0] != pid:
                continue
            if len(fields) < 3 or fields[2] != "-":
                live += 1
        return live

    # ── lifecycle ───────────────────────────────────────────────────────────

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """Refuse use after ``close()`` by name, not with py-lmdb's "closed object" error."""

        if self._closed:
            raise StoreClosedError(f"The store at {self.path} is closed; open it again to use it")

    def check_process(self) -> None:
        """Refuse use in a child forked after the open. ``os.getpid()`` is a system call; it is
        asked only once a fork happened (``shared.forks``), as ``read`` does: every commit
        passes here."""

        if shared.forks != self._forks and os.getpid() != self._pid:
            raise ForkedEnvironmentError(
                f"The store at {self.path} was opened in process {self._pid}; "
                "an LMDB environment must not be used across fork(), open it again in this process"
            )

    def sync(self) -> None:
        self.check_open()
        if not self.readonly:
            self._gate.enter()
            try:
                self.env.sync(True)
            finally:
                self._held.pop()

    def make_durable(self) -> None:
        """A write transaction that holds no log records (the id reservation) must survive a
        power cut before its caller hears back: with a journal, a checkpoint now (LMDB's own
        sync, in the other modes, did what the mode promises at the commit)."""

        if self.journal is not None:
            self.journal.checkpoint()

    def copy(self, dest: str, compact: bool = False) -> None:
        """LMDB's copy of the store into the directory ``dest``, from one read snapshot."""

        self.check_open()
        self.check_process()
        self._gate.enter()
        try:
            self.env.copy(dest, compact=compact)
        finally:
            self._held.pop()

    def close(self) -> None:
        if os.getpid() != self._pid or self._closed:
            return  # a forked child must not touch the parent's environment
        self._closed = True
        used = None
        try:
            if self.journal is not None:
                self.journal.close()
            elif not self.readonly:
                self.env.sync(True)
                if self._mapped:
                    used = (int(self.env.info()["last_pgno"]) + 1) * self._page_size
                clear_unsynced(self.path)
        finally:
            if shared.release(self._shared) and used is not None:
                trim_data_file(self.path, used)  # what the map held beyond LMDB's pages
            self._release_lock()

    def stat_sizes(self) -> dict[str, int]:
        """File size and the bytes each named database uses (pages times page size)."""

        pages = self.page_stats()
        sizes = {name: db.bytes for name, db in pages.dbs.items() if name != MAIN_DB}
        sizes["file"] = pages.file_bytes
        return sizes

    def page_stats(self) -> PageStats:
        """Where the file's pages go (``log.pages``: how free pages are counted)."""

        self.check_open()
        self.check_process()
        with self.read() as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
        handles: dict[str, lmdb._Database] = {}
        for name in names:
            try:
                handles[name.decode(errors="replace")] = self._open_existing(name)
            except lmdb.Error:
                continue  # a key of the main database that is not a database
        with self.read() as txn:
            last_pgno = self.env.info()["last_pgno"]
            dbs = {MAIN_DB: DbPages.of(txn.stat())}
            for label, db in handles.items():
                dbs[label] = DbPages.of(txn.stat(db))
        return tally(dbs, last_pgno, os.path.getsize(os.path.join(self.path, "data.mdb")))

    # ── internals ───────────────────────────────────────────────────────────

    def _check_header(self, store_id: str | None) -> str | None:
        """The store's id, after checking its header (a writer writes one where it is missing,
        or lacks an id); ``store_id``, when given, must be the store's."""

        meta = self.db("meta") if not self.readonly or self.has_db("meta") else None
        if meta is None:
            raise StoreFormatError(f"{self.path} is not a pi-durable-lmdb store (no header)")
        with self.read() as txn:
            raw = txn.get(_HEADER_KEY, db=meta)
        if raw is None:
            if self.readonly:
                raise StoreFormatError(f"{self.path} is not a pi-durable-lmdb store (no header)")
            header = StoreHeader(STORE_FORMAT, int(time.time() * 1000), store_id or new_store_id())
            self.write(lambda txn: txn.put(_HEADER_KEY, encode_header(header), db=meta))
            return header.store_id
        try:
            header = decode_header(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise StoreFormatError(f"{self.path} has an unreadable store header: {error}") from None
        if header.format != STORE_FORMAT:
            raise StoreFormatError(
                f"{self.path} holds store format {header.format}; this version reads {STORE_FORMAT}"
            )
        if store_id is not None and header.store_id is not None and header.store_id != store_id:
            raise WrongStoreError(
                f"The store at {self.path} is store {header.store_id}, not {store_id}; "
                "give its own id, or another directory"
            )
        if header.store_id is None and not self.readonly:
            header.store_id = store_id or new_store_id()
            self.write(lambda txn: txn.put(_HEADER_KEY, encode_header(header), db=meta))
        return header.store_id

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


__all__ = [
    "DEFAULT_MAP_SIZE",
    "REMAP_PATIENCE",
    "STORE_FORMAT",
    "Environment",
    "WriteTransaction",
]
