"""One LMDB environment per store directory: opening, the writer lock, map growth, durability.

A store is a directory holding LMDB's ``data.mdb`` and ``lock.mdb`` and our ``writer.lock``.
LMDB already serialises write transactions, but a second writer *process* would only queue behind
the first; ``writer.lock`` (``flock``) turns that into a clear error instead. Readers never take it.

Durability modes:

``"power"`` (default)
    An acknowledged commit survives power loss. A writer opened with ``journal=`` options (what
    ``LmdbStorage.open`` does) runs LMDB without syncing and flushes each write transaction's
    log records to a write-ahead journal before LMDB commits it: one device flush per commit or
    group (``log.journal``). Checkpoints sync ``data.mdb`` off the commit path; a read
    transaction pinned on the last checkpoint keeps its pages from reuse; ``power.unsynced``
    (boot id, the writer life's epoch) stays in the store until a clean close. An open that finds
    it writes the checkpoint's meta pages back and leaves the journal's later records for the
    storage to replay (``journal_replay`` then ``finish_replay``); until then a read-only open
    after a reboot, and any other writer, refuses the store (``JournalReplayPending``). Without
    ``journal=`` (replicas, tools) LMDB syncs data and meta pages on every commit.
``"process"``
    ``MDB_NOSYNC``: a commit is in the OS page cache when acknowledged, so it survives the process
    being killed. It does not survive an OS crash or power loss: the OS writes unsynced pages back
    in any order (ext4 and xfs included), so the disk can hold a meta page whose tree was never
    written, and LMDB cannot tell. So a process-mode writer keeps ``process.unsynced`` in the store
    (holding the boot id, made durable before LMDB writes anything) until it has synced and closed;
    any open that finds one from an earlier boot refuses with ``StoreDamagedError``
    (tools/harness/powerloss: docs/reliability.md, "Power loss").
``"replicated"``
    Locally as ``"process"``: a NATS JetStream stream is the durable copy (``log.stream.writer``
    publishes a commit's records before its LMDB transaction commits).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Final, Literal, TypeVar

import lmdb
import msgspec

from . import shared
from .counters import EngineCounters
from ..errors import (
    ForkedEnvironmentError,
    JournalReplayPending,
    StoreClosedError,
    StoreFormatError,
    MapBusyError,
    StoreFullError,
    WrongStoreError,
)
from .journal import Journal, JournalOptions
from .journaled import JournaledWrites
from .pages import MAIN_DB as MAIN_DB, DbPages as DbPages, PageStats as PageStats, tally
from .storeid import STORE_ID_PATTERN as STORE_ID_PATTERN, StoreHeader as StoreHeader, check_store_id as check_store_id, new_store_id as new_store_id
from .storeid import decode_header, encode_header
from .shared import SharedEnv
from .storedir import MAX_DBS as MAX_DBS
from .storedir import UNSYNCED_FILE as UNSYNCED_FILE
from .storedir import POWER_FILE, boot_id, read_power_marker
from .storedir import (
    clear_unsynced,
    create_data_file,
    make_private_dir,
    mark_unsynced,
    refuse_after_crash,
    refuse_links,
    remove_leftover_copy,
    sync_directory,
    take_writer_lock,
)

T = TypeVar("T")


Durability = Literal["power", "process", "replicated"]
"""The one durability type of the package (see the module docstring); only ``"power"`` syncs."""

STORE_FORMAT: Final = 1
DEFAULT_MAP_SIZE: Final = 1 << 30
_META_DB: Final = b"meta"
_HEADER_KEY: Final = b"store"
REMAP_DRAIN: Final = 0.02
"""Seconds a map change keeps new transactions out while waiting for the open ones to end,
before it lets them in again and retries (so a long read stalls the others only briefly)."""
REMAP_PATIENCE: Final = 5.0
"""Seconds a map change retries before giving up (``MapBusyError``): a read transaction of
this process stayed open all that time (held across an ``await``, or on the growing thread)."""


class Environment(JournaledWrites):
    """An open store directory. Use one per process per directory; never across ``fork()``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        durability: Durability = "power",
        map_size: int = DEFAULT_MAP_SIZE,
        store_id: str | None = None,
        journal: JournalOptions | None = None,
    ) -> None:
        if journal is not None and (readonly or durability != "power"):
            raise ValueError("journal= is for power-durability writers")
        if store_id is not None:
            check_store_id(store_id)
        if durability not in ("power", "process", "replicated"):
            raise ValueError(f"durability must be 'power', 'process' or 'replicated', not {durability!r}")
        self.path = os.path.abspath(os.fspath(path))
        self._closed = False
        self.readonly = readonly
        self.counters = EngineCounters()
        """What this handle committed, for a host's metrics (``log.counters``)."""
        self.durability: Durability = durability
        self._pid = os.getpid()
        self._forks = shared.forks
        self._lock_fd: int | None = None
        self._journal: Journal | None = None
        self._pin: lmdb.Transaction[bytes] | None = None
        self._replay_from: int | None = None
        """While a replay after an unclean stop is pending: the segment its records start in."""
        self._epoch = 0
        self._staged: list[tuple[int, bytes]] = []
        self._writing = threading.Lock()
        """Held from a journaled write transaction's begin to its commit, and by a checkpoint
        while it pins a state and copies its meta pages (so they are one state)."""
        self._checkpointing = threading.Lock()
        self._since = (0, 0, time.monotonic())  # commits, journal bytes, time at the last checkpoint
        self._bound = 1
        self._last_page = 0
        self._worker: threading.Thread | None = None
        self._wake = threading.Condition()
        self._wanted = False
        self._stopping = False
        created = False
        if readonly:
            if not os.path.isfile(os.path.join(self.path, "data.mdb")):
                raise FileNotFoundError(f"No store at {self.path} (no data.mdb)")
            refuse_after_crash(self.path)
            marker = read_power_marker(self.path)
            if marker is not None and marker[0] != (boot_id() or b"unknown"):
                raise JournalReplayPending(self.path, "was open in a power-mode writer when the machine stopped")
        else:
            created = make_private_dir(self.path)
            refuse_links(self.path)
            self._lock_fd = take_writer_lock(self.path)
            remove_leftover_copy(self.path)
        handle: SharedEnv | None = None
        try:
            if not readonly:
                refuse_after_crash(self.path)
                shared.refuse_shared_conflict(self.path, durability, journal is not None)  # before the marker: a refused open leaves none
                if journal is None and read_power_marker(self.path) is not None:
                    raise JournalReplayPending(self.path, "holds a power-mode writer's journal not yet replayed")
                if durability != "power":
                    mark_unsynced(self.path)
                if not os.path.exists(os.path.join(self.path, "data.mdb")):
                    create_data_file(self.path, map_size)
                if journal is not None:
                    self._journal = Journal(self.path, journal)
                    self._restore()
            handle = self._shared = shared.acquire(self.path, readonly, durability, map_size, journal is not None)
            if created:
                sync_directory(os.path.dirname(self.path))
            self.env = self._shared.env
            self._dbs = self._shared.dbs
            self._gate = self._shared.gate
            self._held = self._gate.held
            if self._journal is not None:
                if self._replay_from is not None:
                    self._pin = self._begin_pin()  # the restored checkpoint, until the replay is synced
                else:
                    self._start_life()
            self.store_id: str | None = self._check_header(store_id)
            if self._journal is not None and self._replay_from is None:
                self.checkpoint()  # a new store's header and id survive a power cut from now on
        except BaseException:
            self._drop_pin()
            if self._journal is not None:
                if handle is not None and self._replay_from is None and read_power_marker(self.path) is not None:
                    try:  # a refused open (another store's id, say) leaves no marker behind it
                        handle.env.sync(True)
                        clear_unsynced(self.path, POWER_FILE)
                    except OSError:
                        pass
                self._journal.close()
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

        self._enter()
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
            self._enter()
            try:
                txn = self.env.begin(buffers=False)
            except lmdb.MapResizedError:
                self._remap(0, None, None)  # adopt the size the writer's meta page holds (pops held)
                continue
            except BaseException:
                self._held.pop()
                raise
            self._held.pop()
            return txn

    def _enter(self) -> None:
        """Count this thread into the gate's ``held``, waiting while the map changes; the caller
        pops ``held`` once done with the map."""

        gate = self._gate
        while True:
            self._held.append(None)
            if not gate.growing:
                return
            self._held.pop()
            with gate.changed:
                gate.changed.wait_for(lambda: not gate.growing, REMAP_DRAIN)

    def write(self, work: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        """Run ``work`` in one write transaction and commit it, growing the map when it is full.

        ``work`` is run again from the start after a growth, so it must change nothing outside
        the transaction before it returns.
        """

        self.check_open()
        self.check_process()
        if self.readonly:
            raise PermissionError(f"The store at {self.path} is open read-only")
        if self._journal is not None:
            return self._write_journaled(work)
        while True:
            self._enter()  # held from begin to commit: write transactions are not in the reader table
            full = None
            try:
                txn = self.env.begin(write=True)
                try:
                    result = work(txn)
                    began = time.perf_counter()
                    txn.commit()
                    self.counters.flush_seconds.observe(time.perf_counter() - began)
                    return result
                except lmdb.MapFullError:
                    full = txn  # aborted by the growth, once it keeps other transactions out
                except lmdb.Error as error:
                    txn.abort()
                    self._explain(error)
                    raise
                except BaseException:
                    txn.abort()
                    raise
            finally:
                if full is None:
                    self._held.pop()
            self.grow(self.env.info()["map_size"], full)

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

    def grow(self, full: int | None = None, txn: lmdb.Transaction[bytes] | None = None) -> None:
        """Double the map; ``full`` is the size a write found full (if another thread grew it
        meanwhile, there is nothing to do). Called outside any transaction, or by ``write`` with
        ``txn``, its write transaction that found the map full (still counted in ``held``),
        which is aborted here."""

        if txn is None:
            self._enter()
        self._remap(2, full, txn)

    def _remap(self, factor: int, full: int | None, txn: lmdb.Transaction[bytes] | None) -> None:
        """Change the memory map: ``factor`` 2 doubles it, 0 adopts the size another process
        grew it to. ``mdb_env_set_mapsize`` must not run while any transaction of this process
        is open (LMDB does not check; py-lmdb invalidates them, or older versions crash), and
        reads run inline on any thread: so new transactions are kept out (``growing``), those
        open are waited for, at most ``REMAP_DRAIN`` at a time, then the map changes.

        The caller is counted in ``held`` (this pops it). ``txn``, the write transaction that
        found the map full, is aborted here, after ``growing`` is set: py-lmdb's abort of a write
        transaction waits until no thread is inside an LMDB call, which busy readers can put off
        for seconds, unless new transactions are kept out first."""

        gate = self._gate
        deadline = time.monotonic() + REMAP_PATIENCE
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
                if self._journal is not None:
                    if self._checkpointing.acquire(blocking=False):
                        try:
                            if self._drained(time.monotonic() + REMAP_DRAIN):
                                self._remap_journaled(factor)
                                return
                        finally:
                            self._checkpointing.release()
                elif self._drained(time.monotonic() + REMAP_DRAIN):
                    size = 0 if factor == 0 else self.env.info()["map_size"] * factor
                    self.env.set_mapsize(size)
                    return
                self._open_gate()  # let the waiting transactions run meanwhile
                if time.monotonic() >= deadline:
                    raise MapBusyError(self.path, REMAP_PATIENCE)
                time.sleep(REMAP_DRAIN / 4)
        finally:
            self._open_gate()
            gate.lock.release()

    def _remap_journaled(self, factor: int) -> None:
        """A map change of a journaled writer, with every transaction drained and checkpoints
        held off: the pin must end too (LMDB changes the map only with no transaction open), so
        a checkpoint of the current state is made durable first, and pinned once the map has
        changed (nothing can commit meanwhile: the gate is closed)."""

        journal = self._journal
        assert journal is not None
        self._drop_pin()
        meta = self._read_meta()
        segment = self._replay_from if self._replay_from is not None else journal.current_number
        self.env.sync(True)
        journal.checkpoints.write(self._epoch, segment, meta)
        journal.release(segment)
        self._since = (0, journal.written, time.monotonic())
        size = 0 if factor == 0 else self.env.info()["map_size"] * factor
        self.env.set_mapsize(size)
        self._pin = self._begin_pin(entered=True)

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
            if not self._held and self._live_readers() <= (self._pin is not None):
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
            self._enter()
            try:
                self.env.sync(True)
            finally:
                self._held.pop()

    def copy(self, dest: str, compact: bool = False) -> None:
        """LMDB's copy of the store into the directory ``dest``, from one read snapshot."""

        self.check_open()
        self.check_process()
        self._enter()
        try:
            self.env.copy(dest, compact=compact)
        finally:
            self._held.pop()

    def close(self) -> None:
        if os.getpid() != self._pid or self._closed:
            return  # a forked child must not touch the parent's environment
        self._closed = True
        try:
            if self._journal is not None:
                self._close_journal()
            elif not self.readonly:
                self.env.sync(True)
                clear_unsynced(self.path)
        finally:
            self._drop_pin()
            shared.release(self._shared)
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


