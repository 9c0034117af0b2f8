"""One LMDB environment per store directory: opening, the writer lock, map growth, durability.

A store is a directory holding LMDB's ``data.mdb`` and ``lock.mdb`` and our ``writer.lock``.
LMDB already serialises write transactions, but a second writer *process* would only queue behind
the first; ``writer.lock`` (``flock``) turns that into a clear error instead. Readers never take it.

Durability modes:

``"power"`` (default)
    LMDB syncs data and meta pages on every commit: an acknowledged commit survives power loss.
``"process"``
    ``MDB_NOSYNC``: a commit is in the OS page cache when acknowledged, so it survives the process
    being killed. It does not survive an OS crash or power loss: the OS writes unsynced pages back
    in any order (ext4 and xfs included), so the disk can hold a meta page whose tree was never
    written, and LMDB cannot tell. So a process-mode writer keeps ``process.unsynced`` in the store
    (holding the boot id, made durable before LMDB writes anything) until it has synced and closed;
    any open that finds one from an earlier boot refuses with ``StoreDamagedError``
    (tools/powerloss: docs/reliability.md, "Power loss").
``"replicated"``
    Locally as ``"process"``: a NATS JetStream stream is the durable copy (``storage.replication``
    publishes a commit's records before its LMDB transaction commits).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import shutil
import struct
import threading
import time
from collections.abc import Callable
from typing import Final, Literal, TypeVar

import lmdb
import msgspec

from .errors import (
    DurabilityConflictError,
    ForkedEnvironmentError,
    StoreClosedError,
    StoreDamagedError,
    StoreFormatError,
    MapBusyError,
    StoreFullError,
    TruncatedStoreError,
    WriterLockedError,
    WrongStoreError,
)

T = TypeVar("T")

Durability = Literal["power", "process", "replicated"]
"""The one durability type of the package (see the module docstring); only ``"power"`` syncs."""

STORE_FORMAT: Final = 1
DEFAULT_MAP_SIZE: Final = 1 << 30
MAX_DBS: Final = 256
_META_DB: Final = b"meta"
_HEADER_KEY: Final = b"store"
_WRITER_LOCK: Final = "writer.lock"
_STAGING: Final = "creating"
UNSYNCED_FILE: Final = "process.unsynced"
"""Present while a ``process``-mode writer may have commits the disk does not hold in order."""
_BOOT_ID: Final = "/proc/sys/kernel/random/boot_id"
REMAP_DRAIN: Final = 0.02
"""Seconds a map change keeps new transactions out while waiting for the open ones to end,
before it lets them in again and retries (so a long read stalls the others only briefly)."""
REMAP_PATIENCE: Final = 5.0
"""Seconds a map change retries before giving up (``MapBusyError``): a read transaction of
this process stayed open all that time (held across an ``await``, or on the growing thread)."""


class StoreHeader(msgspec.Struct):
    """Written once when a store is created; refuses stores of another format. ``store_id`` names
    the store wherever its log travels (its subject on a NATS stream); stores made before ids
    existed get one from their next writer."""

    format: int
    created_at: int
    store_id: str | None = None


STORE_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A store id is one NATS subject token: no dots, no wildcards, no spaces."""


def new_store_id() -> str:
    """A fresh store id: 16 hex digits (64 random bits)."""

    return secrets.token_hex(8)


def check_store_id(value: object) -> str:
    if not isinstance(value, str) or not STORE_ID_PATTERN.fullmatch(value):
        raise ValueError(
            f"A store id is 1 to 64 letters, digits, '-' or '_' (one NATS subject token), not {value!r:.80}"
        )
    return value


_header_encoder: Final = msgspec.msgpack.Encoder()
_header_decoder: Final = msgspec.msgpack.Decoder(StoreHeader)


class Environment:
    """An open store directory. Use one per process per directory; never across ``fork()``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        durability: Durability = "power",
        map_size: int = DEFAULT_MAP_SIZE,
        store_id: str | None = None,
    ) -> None:
        if store_id is not None:
            check_store_id(store_id)
        if durability not in ("power", "process", "replicated"):
            raise ValueError(f"durability must be 'power', 'process' or 'replicated', not {durability!r}")
        self.path = os.path.abspath(os.fspath(path))
        self._closed = False
        self.readonly = readonly
        self.durability: Durability = durability
        self._pid = os.getpid()
        self._forks = _forks
        self._lock_fd: int | None = None
        created = False
        if readonly:
            if not os.path.isfile(os.path.join(self.path, "data.mdb")):
                raise FileNotFoundError(f"No store at {self.path} (no data.mdb)")
            _refuse_after_crash(self.path)
        else:
            created = _make_private_dir(self.path)
            _refuse_links(self.path)
            self._lock_fd = _take_writer_lock(self.path)
        shared: _SharedEnv | None = None
        try:
            if not readonly:
                _refuse_after_crash(self.path)
                _refuse_shared_conflict(self.path, durability)  # before the marker: a refused open leaves none
                if durability != "power":
                    _mark_unsynced(self.path)
                if not os.path.exists(os.path.join(self.path, "data.mdb")):
                    _create_data_file(self.path, map_size)
            shared = self._shared = _acquire(self.path, readonly, durability, map_size)
            if created:
                _sync_directory(os.path.dirname(self.path))
            self.env = self._shared.env
            self._dbs = self._shared.dbs
            self._gate = self._shared.gate
            self._held = self._gate.held
            self.store_id: str | None = self._check_header(store_id)
        except BaseException:
            if shared is not None:  # a failed open leaves nothing open behind it
                _release(shared)
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
            self._enter()  # open_db runs a transaction of its own
            try:
                db = self.env.open_db(key, create=not self.readonly)
            finally:
                self._held.pop()
            self._dbs[key] = db
        return db

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
        if _forks != self._forks:  # cheaper than os.getpid() on every read
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
        while True:
            self._enter()  # held from begin to commit: write transactions are not in the reader table
            full = None
            try:
                txn = self.env.begin(write=True)
                try:
                    result = work(txn)
                    txn.commit()
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
                if self._drained(time.monotonic() + REMAP_DRAIN):
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
            if not self._held and not self._live_readers():
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.001)

    def _live_readers(self) -> bool:
        """Whether LMDB's reader table holds an open read transaction of this process (a slot
        reset for reuse shows ``-``)."""

        pid = str(os.getpid())
        for line in self.env.readers().splitlines()[1:]:
            fields = line.split()
            if not fields or fields[0] != pid:
                continue
            if len(fields) < 3 or fields[2] != "-":
                return True
        return False

    # ── lifecycle ───────────────────────────────────────────────────────────

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        """Refuse use after ``close()`` by name, not with py-lmdb's "closed object" error."""

        if self._closed:
            raise StoreClosedError(f"The store at {self.path} is closed; open it again to use it")

    def check_process(self) -> None:
        if os.getpid() != self._pid:
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
            if not self.readonly:
                self.env.sync(True)
                _clear_unsynced(self.path)
        finally:
            _release(self._shared)
            self._release_lock()

    def stat_sizes(self) -> dict[str, int]:
        """File size and the bytes each named database uses (pages times page size)."""

        self.check_open()
        self.check_process()
        sizes: dict[str, int] = {}
        with self.read() as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
        for name in names:
            self._enter()
            try:
                db = self.env.open_db(name, create=False)
            except lmdb.Error:
                continue
            finally:
                self._held.pop()
            with self.read() as txn:
                stat = txn.stat(db)
            pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
            sizes[name.decode(errors="replace")] = pages * stat["psize"]
        sizes["file"] = os.path.getsize(os.path.join(self.path, "data.mdb"))
        return sizes

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
            self.write(lambda txn: txn.put(_HEADER_KEY, _header_encoder.encode(header), db=meta))
            return header.store_id
        try:
            header = _header_decoder.decode(raw)
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
            self.write(lambda txn: txn.put(_HEADER_KEY, _header_encoder.encode(header), db=meta))
        return header.store_id

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _make_private_dir(path: str) -> bool:
    """Create the store directory; True when it did not exist."""

    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(f"{path} exists and is not a directory") from None
        return False
    return True


def _create_data_file(path: str, map_size: int) -> None:
    """Make a new data.mdb appear whole or not at all. LMDB writes a new file's two meta pages
    without syncing them, so a power cut right after leaves a file no open accepts
    (``MDB_INVALID``); here it is made in a staging directory, synced, renamed in, and the
    directory synced (fsync of a file does not make its name durable: fsync(2))."""

    staging = os.path.join(path, _STAGING)
    shutil.rmtree(staging, ignore_errors=True)  # left by a cut during an earlier creation
    os.mkdir(staging, 0o700)
    env = lmdb.open(staging, map_size=map_size, max_dbs=MAX_DBS, mode=0o600, lock=False)
    try:
        env.sync(True)
    finally:
        env.close()
    os.rename(os.path.join(staging, "data.mdb"), os.path.join(path, "data.mdb"))
    _sync_directory(path)
    shutil.rmtree(staging, ignore_errors=True)


def _boot_id() -> bytes | None:
    try:
        with open(_BOOT_ID, "rb") as file:
            return file.read().strip()
    except OSError:
        return None


def _refuse_after_crash(path: str) -> None:
    """Refuse a store a ``process``-mode writer had open when the machine stopped."""

    marker = os.path.join(path, UNSYNCED_FILE)
    try:
        with open(marker, "rb") as file:
            boot = file.read().strip()
    except FileNotFoundError:
        return
    current = _boot_id()
    if current is not None and boot != current:
        raise StoreDamagedError(path, marker)


def _mark_unsynced(path: str) -> None:
    """Write the boot id to ``process.unsynced`` and make it durable before LMDB writes a page."""

    marker = os.path.join(path, UNSYNCED_FILE)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(marker, flags, 0o600)
    try:
        os.write(fd, (_boot_id() or b"unknown") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    _sync_directory(path)


def _clear_unsynced(path: str) -> None:
    """After the final sync: the disk holds every commit, in order."""

    try:
        os.unlink(os.path.join(path, UNSYNCED_FILE))
    except FileNotFoundError:
        return
    _sync_directory(path)


def _sync_directory(path: str) -> None:
    """Make the directory's entries durable: fsync of a file does not persist the file's name
    (fsync(2)), so without this a power cut can drop a new data.mdb with every commit in it."""

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _take_writer_lock(path: str) -> int:
    lock_path = os.path.join(path, _WRITER_LOCK)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(lock_path, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        holders = _lock_holders(fd)
        os.close(fd)
        named = ", ".join(str(pid) for pid in holders)
        raise WriterLockedError(path, f" by process {named}" if holders else "") from None
    os.pwrite(fd, f"{os.getpid():<20}".encode(), 0)  # fixed width: no truncate, which can cost ms
    return fd


def _lock_holders(fd: int) -> list[int]:
    """The processes holding ``flock`` on the file ``fd`` opens, as the kernel lists them.

    ``writer.lock`` holds the pid of the writer that last took it, which goes stale (a writer that
    forked, one that died before another wrote over it); the kernel's lock table does not. Where
    it cannot be read, the pid in the file is named only if that process is alive.
    """

    stat = os.fstat(fd)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open("/proc/locks") as table:
            lines = table.read().splitlines()
    except OSError:
        lines = None
    if lines is not None:
        holders = []
        for line in lines:
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
                holders.append(int(fields[4]))  # waiters are listed as "->", so they never match
        if holders:
            return sorted(set(holders))
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    if not text.isdigit():
        return []
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [int(text)]


class _Gate:
    """Keeps this process's transactions out of the memory map while it changes (one per LMDB
    environment, shared by its handles): ``held`` has an item per begin, write transaction or
    other map use in flight (list ``append``/``pop`` are atomic under the GIL, so the read
    path takes no lock); ``growing`` is set by ``Environment._remap`` while it waits for them
    and changes the map. A thread adds to ``held`` and then checks ``growing``; ``_remap``
    sets ``growing`` and then checks ``held``: one of them always sees the other."""

    __slots__ = ("held", "growing", "lock", "changed")

    def __init__(self) -> None:
        self.held: list[None] = []
        self.growing = False
        self.lock = threading.Lock()
        self.changed = threading.Condition()


class _SharedEnv:
    """py-lmdb allows one environment per directory per process; handles share it. Its sync mode
    is fixed when it opens (py-lmdb cannot change ``MDB_NOSYNC`` later), so ``durability`` is the
    only durability a writer sharing it can be given."""

    def __init__(self, env: lmdb.Environment, readonly: bool, durability: Durability) -> None:
        self.env = env
        self.readonly = readonly
        self.durability = durability
        self.users = 0
        self.dbs: dict[bytes, lmdb._Database] = {}
        self.gate = _Gate()


_open_envs: dict[str, _SharedEnv] = {}


def _refuse_links(path: str) -> None:
    """LMDB would follow a planted link and write the store (or its lock table) elsewhere."""

    for name in ("data.mdb", "lock.mdb", _WRITER_LOCK):
        file = os.path.join(path, name)
        if os.path.islink(file):
            raise StoreFormatError(
                f"{file} is a symbolic link; refusing to follow it out of the store directory"
            )


_META_OFFSET: Final = 16
"""LMDB's page header; ``MDB_meta`` follows it on each of the two meta pages (64-bit layout)."""
_META = struct.Struct("=II8x8xI44x48xQQ")
"""magic, version, (address, map size), the free DB's ``md_pad`` (the page size), (the rest of
both DB records), ``mm_last_pg``, ``mm_txnid``."""
_MAGIC: Final = 0xBEEFC0DE


def check_not_truncated(path: str) -> None:
    """Refuse a ``data.mdb`` shorter than the last page its newest meta page names.

    LMDB maps the file and trusts it: a reader touching a page past the end dies from SIGBUS, and
    a writer would commit on top of pages that are gone. So the meta pages are read with plain
    file reads first, and the damage is named before LMDB maps anything.
    """

    file = os.path.join(path, "data.mdb")
    try:
        handle = open(file, "rb")
    except FileNotFoundError:
        return  # a new store: LMDB creates it
    with handle:
        head = handle.read(_META_OFFSET + _META.size)
        if not head:
            return  # LMDB initialises an empty file (a store whose creation never got further)
        if len(head) < _META_OFFSET + _META.size:
            size = os.fstat(handle.fileno()).st_size
            raise TruncatedStoreError(
                f"{file} is truncated: {size} bytes cannot hold LMDB's meta pages; "
                "restore the store from a copy"
            )
        magic, _, page_size, _, _ = _META.unpack_from(head, _META_OFFSET)
        if magic != _MAGIC or page_size < 512 or page_size & (page_size - 1):
            return  # not an LMDB file, or one this layout does not describe: LMDB says so itself
        metas = []
        for page in (0, 1):
            handle.seek(page * page_size)
            data = handle.read(_META_OFFSET + _META.size)
            if len(data) == _META_OFFSET + _META.size:
                magic, _, _, last_page, txnid = _META.unpack_from(data, _META_OFFSET)
                if magic == _MAGIC:
                    metas.append((txnid, last_page))
        # Only now the size: a writer elsewhere writes a commit's pages before its meta page and
        # never shrinks the file, so a size taken after the metas were read covers them.
        size = os.fstat(handle.fileno()).st_size
    if len(metas) < 2:
        raise TruncatedStoreError(
            f"{file} is truncated: {size} bytes cannot hold LMDB's two meta pages of "
            f"{page_size} bytes; restore the store from a copy"
        )
    _, last_page = max(metas)  # the meta LMDB will use: the newest transaction's
    needed = (last_page + 1) * page_size
    if size < needed:
        raise TruncatedStoreError(
            f"{file} is truncated: it holds {size} bytes, but its last page ({last_page}, "
            f"{page_size} bytes each) ends at {needed}; {needed - size} bytes are missing. "
            "Restore the store from a copy (opening it would read past the end of the file)"
        )


def _acquire(path: str, readonly: bool, durability: Durability, map_size: int) -> _SharedEnv:
    real = os.path.realpath(path)
    shared = _open_envs.get(real)
    if shared is None:
        _refuse_links(path)
        check_not_truncated(path)
        env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=MAX_DBS,
            readonly=readonly,
            sync=durability == "power",
            metasync=True,
            mode=0o600,
            create=not readonly,
            max_spare_txns=4,
        )
        env.reader_check()
        shared = _open_envs[real] = _SharedEnv(env, readonly, durability)
    elif not readonly:
        _refuse_shared_conflict(path, durability)
    shared.users += 1
    return shared


def _refuse_shared_conflict(path: str, durability: Durability) -> None:
    """A writer cannot share an environment this process opened read-only, or for another
    durability (its sync mode is fixed when it opens)."""

    shared = _open_envs.get(os.path.realpath(path))
    if shared is None:
        return
    if shared.readonly:
        raise WriterLockedError(path, " read-only by this process; close those readers first")
    if (shared.durability == "power") != (durability == "power"):
        raise DurabilityConflictError(path, durability, shared.durability)


def _release(shared: _SharedEnv) -> None:
    shared.users -= 1
    if shared.users == 0:
        for key, value in list(_open_envs.items()):
            if value is shared:
                del _open_envs[key]
        shared.env.close()


_forks = 0
"""Forks this process descends from since the module loaded (``read`` checks it, not the pid)."""


def _forget_after_fork() -> None:
    global _forks
    _forks += 1
    _open_envs.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
