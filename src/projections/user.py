"""Projections defined by the store's users: a name, a version and a fold from log records to rows
in databases of their own, kept up to date from the log behind the commits.

Each projection's checkpoint (the last sequence it folded) is written in the same transaction as
its rows, so it never double-counts or skips a record across crashes. A version change builds
the new version in databases of its own beside the served one, which keeps serving reads, whole
and at its position, until the new version is level with the log; then one transaction swaps
them and the old databases are dropped (``userstate``). Folds run on a thread of their own, in
short chunks (``userfold``). A fold that raises stops only that projection: it is reported with
the sequence and the error, commits and other projections go on, and ``retry`` resumes it there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import ClassVar, Final

import lmdb
import msgspec

from ..errors import ProjectionFailed, ProjectionNotReady
from ..log import Commit, Environment, StoreClosedError, WriteLog
from ..log.threads import Waiters
from . import userstate as us
from .readmodel import ReadModel
from .rebuild import REGISTRY_DB
from .userfold import Folder, Source, Writes
from .userstate import ProjectionStatus as ProjectionStatus
from .usertables import CoreSource, CoreView, Tables

__all__ = [
    "CoreView",
    "Projection",
    "ProjectionFailed",
    "ProjectionStatus",
    "Tables",
    "UserProjections",
]


class Projection:
    """A read model of your own, folded from the log: subclass it, set ``name``, ``version`` and
    ``databases``, implement ``fold``, and pass instances to ``LmdbStorage.open(projections=...)``.

    - ``name`` names it in the store (``storage.projections.read(name)``, ``durable-log projections``).
    - ``version``: change it when the fold changes; the store then builds the new version from
      the whole log beside the old one, which serves reads until the new one is level and swapped in.
    - ``databases``: the names of its own LMDB databases.

    See docs/projections.md for a complete example and a schema change in production.
    """

    name: ClassVar[str]
    version: ClassVar[int]
    databases: ClassVar[tuple[str, ...]] = ("main",)

    def fold(self, tables: Tables, commit: Commit) -> None:
        """Fold one committed batch into this projection's rows.

        ``tables`` holds only this projection's ``databases``, inside the write transaction that
        also stores its checkpoint, so rows and checkpoint commit together and no record is
        folded twice or skipped across crashes. ``tables.core`` reads the store's own records as
        they stood right after this batch (``CoreView``). ``commit.seq`` and ``commit.committed_at``
        (Unix ms) identify the batch; ``commit.writes`` is the batch as committed, a list of the
        tagged Structs of ``log.records`` (``ConversationWrite``, ``EntryWrite``, ``TaskWrite``,
        ``SubmissionWrite`` with the record in ``.value``; ``DocumentCreateWrite``/``DocumentCopyWrite``
        with ``.record`` and ``.content``/``.source``; ``DocumentChangeWrite`` with ``.id`` and
        ``.content``, a ``BaseContent`` or ``DeltaContent``; ``DocumentRetireWrite`` with
        ``.id``). Match them with ``type(write) is TaskWrite``.

        Folds run in the writer process on a thread of their own, behind the commits, in chunks
        of a few milliseconds: a commit never waits for them, and ``await
        storage.projections.wait(seq)`` waits for them. Read-only opens never fold. An exception
        stops only this projection, at that sequence (``storage.projections.status()``).
        """

        raise NotImplementedError


_MAX_NAME: Final = 200
"""Bytes of a projection's or database's name: LMDB names databases by keys of at most 511."""


def _check_definition(projection: Projection) -> None:
    """Refuse a definition whose name, version or databases the store could not write and read
    back (its status is stored under its name, with its version)."""

    name, version, databases = (
        getattr(projection, "name", None),
        getattr(projection, "version", None),
        getattr(projection, "databases", None),
    )
    label = f"Projection {name!r:.60}"
    _check_name(name, f"{label}: its name")
    if isinstance(version, bool) or not isinstance(version, int) or not -(2**63) <= version < 2**63:
        raise TypeError(f"{label}: its version must be a 64-bit int, not {version!r:.60}")
    if not isinstance(databases, (tuple, list)) or not databases:
        raise TypeError(
            f"{label}: databases must be a non-empty tuple of names, not {databases!r:.60}"
        )
    for db in databases:
        _check_name(db, f"{label}: database name")
    if len(set(databases)) != len(databases):
        raise ValueError(f"{label}: database names must be unique: {list(databases)}")


def _check_name(value: object, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} must be a non-empty str, not {value!r:.60}")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValueError(
            f"{what} {value!r:.60} is not valid Unicode (it holds a lone surrogate)"
        ) from None
    if size > _MAX_NAME:
        raise ValueError(f"{what} is {size} bytes long; at most {_MAX_NAME}")


class _OwnLock(Writes):
    """Write exclusion for a store without a committer (tools, tests): a lock of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._lock:
            yield

    def yielding(self) -> AbstractContextManager[None]:
        return self.exclusive()

    def contended(self) -> bool:
        return False

    def busy(self) -> bool:
        return False


class UserProjections:
    """The registered projections of one open store, and the thread that keeps them level.

    ``writes`` gives the store's write path (the committer: its lock keeps other writes out
    while a chunk is written, and a commit meanwhile goes to its writer thread, never blocking
    an event loop); ``core``
    gives the core read model folds read through ``tables.core``."""

    def __init__(
        self,
        env: Environment,
        log: WriteLog,
        projections: Sequence[Projection] = (),
        writes: Source | None = None,
        core: Callable[[], ReadModel] | None = None,
    ) -> None:
        for projection in projections:
            _check_definition(projection)
        names = [projection.name for projection in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"Projection names must be unique: {names}")
        tables = [f"u.{p.name}.{db}" for p in projections for db in p.databases]
        if len(set(tables)) != len(tables):
            raise ValueError(
                f"Projections' databases must have distinct names; these collide: {sorted(tables)}"
            )
        self.env = env
        self.log = log
        self.path = env.path
        self.projections = {projection.name: projection for projection in projections}
        self.registry: lmdb._Database | None = None
        if not env.readonly or env.has_db(REGISTRY_DB):
            self.registry = env.db(REGISTRY_DB)
        self._core = core
        self._handles: dict[tuple[str, int], dict[str, lmdb._Database]] = {}
        self._served: dict[str, us.StoredProjection | None] = {}
        self._builds: dict[str, us.StoredProjection | None] = {}
        self._reading = threading.Lock()
        self._readers: Counter[tuple[str, int]] = Counter()
        self._waiters = Waiters()
        self._closed = False
        own = _OwnLock()
        self._writes: Source = writes or (lambda: own)
        self._folder = None if env.readonly or not projections else Folder(self, self._writes)
        self._load()
        if self._folder is not None:
            for projection in projections:
                self._open(projection)

    @property
    def _worker(self) -> threading.Thread | None:
        return None if self._folder is None else self._folder.thread

    # ── public ──────────────────────────────────────────────────────────────

    def status(self) -> dict[str, ProjectionStatus]:
        """Each projection's served version, checkpoint, lag and failure, and the version being
        built with its position, rate and ETA: the projections this program defines and those
        the store holds that it does not (``retired``)."""

        self._check_open()
        served, builds, head = us.stored(self.env)
        names = sorted(set(self.projections) | set(served) | set(builds))
        now = time.time()
        return {
            name: us.report(
                served.get(name),
                builds.get(name),
                head,
                None if name not in self.projections else self.projections[name].version,
                now,
            )
            for name in names
        }

    @contextmanager
    def read(self, name: str, version: int | None = None) -> Iterator[Tables]:
        """A short read transaction over the version of projection ``name`` that serves reads:
        whole, at its position (``tables.version``, ``tables.folded_seq``). With ``version``,
        ``ProjectionNotReady`` unless that version is the one served."""

        self._check_open()
        while True:
            with self._reading:
                txn = self.env.read()
                try:
                    status = (
                        None
                        if self.registry is None
                        else us.get(txn, self.registry, us.served_key(name))
                    )
                    ready = status is not None and (version is None or status.version == version)
                    handles = None if status is None else self._handles.get((name, status.slot))
                    if ready and handles is not None:
                        assert status is not None
                        self._readers[(name, status.slot)] += 1
                        break
                    build = (
                        None
                        if self.registry is None
                        else us.get(txn, self.registry, us.build_key(name))
                    )
                    databases = None if status is None else self._databases(txn, name, status)
                except BaseException:
                    txn.abort()
                    raise
                txn.abort()
            if not ready:
                raise self._not_ready(name, version, status, build)
            assert status is not None and databases is not None
            self._open_handles(name, status.slot, databases)
        try:
            yield Tables(txn, handles, status.version, status.folded_seq)
        finally:
            txn.abort()
            with self._reading:
                self._readers[(name, status.slot)] -= 1

    async def wait(self, seq: int, name: str | None = None) -> None:
        """Return once the projection (or all), in the version this program defines, serves
        reads level with ``seq``; raise ``ProjectionFailed`` if it stopped before it."""

        names = [name] if name is not None else list(self.projections)
        for item in names:
            if item not in self.projections:
                raise KeyError(
                    f"No projection {item!r} is registered; registered: {sorted(self.projections)}"
                )
        while True:
            self._check_open()
            waiter = self._waiters.add()  # before the check: a fold that ends after it wakes it
            try:
                if self._folder is None:
                    self._load()
                elif self._folder.error is not None:
                    raise self._folder.error
                if self._level(names, seq):
                    return
                self.kick()
                if self._folder is None:  # read-only: the writer is another process
                    await asyncio.sleep(0.05)
                else:
                    await waiter
            finally:
                self._waiters.discard(waiter)

    def _level(self, names: list[str], seq: int) -> bool:
        level = True
        for item in names:
            served, build = self._served.get(item), self._builds.get(item)
            target = build if build is not None else served
            if target is not None and target.error is not None and target.folded_seq < seq:
                raise ProjectionFailed(item, target.failed_seq or 0, target.error)
            version = self.projections[item].version
            level &= served is not None and served.version == version and served.folded_seq >= seq
        return level

    def kick(self) -> None:
        """Wake the fold thread (start it the first time): there may be records to fold."""

        if not self._closed and self._folder is not None:
            self._folder.kick()

    async def retry(self, name: str) -> ProjectionStatus:
        """Resume a failed projection from the record it stopped at, with this program's current
        fold (its rows and checkpoint stay as they were before that record). For a projection
        this program does not define, the failure is cleared in the store: the program that
        defines it resumes on its next open."""

        self._check_open()
        if self.env.readonly:
            raise PermissionError(
                f"The store at {self.path} is open read-only: only its writer folds"
            )
        if name in self.projections:
            key, target = self.target(name)
        else:
            served, builds, _ = us.stored(self.env)
            if name not in served and name not in builds:
                raise KeyError(
                    f"The store has no projection {name!r}; it has: {sorted(set(served) | set(builds))}"
                )
            build = builds.get(name)
            key, target = (
                (us.build_key(name), build)
                if build is not None and build.error is not None
                else (us.served_key(name), served.get(name))
            )
        if target is not None and target.error is not None:
            cleared = msgspec.structs.replace(target, failed_seq=None, error=None)
            registry = self.registry
            assert registry is not None

            def clear() -> None:
                with self._writes().exclusive():
                    self.env.write(lambda txn: us.put(txn, registry, key, cleared))

            await asyncio.to_thread(clear)
            if name in self.projections:
                self._remember(name, key, cleared)
                self.kick()
        return self.status()[name]

    async def drop(self, name: str) -> list[str]:
        """Delete a projection the program no longer defines: its databases (their pages become
        free), every version of it and its status; returns the database names dropped."""

        self._check_open()
        if name in self.projections:
            raise ValueError(
                f"Projection {name!r} is defined by this program: remove it from projections= before dropping it"
            )
        if self.env.readonly:
            raise PermissionError(f"The store at {self.path} is open read-only")
        served, builds, _ = us.stored(self.env)
        if name not in served and name not in builds:
            raise KeyError(
                f"The store has no projection {name!r}; it has: {sorted(set(served) | set(builds))}"
            )
        others = sorted(set(served) | set(builds))

        def drop() -> list[str]:
            with (
                self._writes().exclusive(),
                self._reading,
            ):  # no reader of this process is inside its databases
                if any(count for (item, _), count in self._readers.items() if item == name):
                    raise RuntimeError(
                        f"Projection {name!r} is being read in this process; drop it once the reads end"
                    )
                names = self.env.write(lambda txn: us.drop_stored(self.env, txn, name, others))
                self.env.forget_dbs(names)
                for slot in [slot for item, slot in self._handles if item == name]:
                    del self._handles[(name, slot)]
                return names

        return await asyncio.to_thread(drop)

    async def close(self) -> None:
        """Stop the fold thread for good and wake every ``wait``, which then raises ``StoreClosedError``."""

        self._closed = True
        thread = None if self._folder is None else self._folder.stop()
        while thread is not None and thread.is_alive():
            await asyncio.sleep(0.001)
        self.notify()

    # ── for the fold thread ─────────────────────────────────────────────────

    def notify(self) -> None:
        """Wake every ``wait``, from any thread: the statuses changed."""

        self._waiters.wake()

    def target(self, name: str) -> tuple[bytes, us.StoredProjection | None]:
        """What the fold thread folds into for projection ``name``: the build, if any, else the
        served version (``None`` when that is not this program's version)."""

        build = self._builds.get(name)
        if build is not None:
            return us.build_key(name), build
        served = self._served.get(name)
        if served is not None and served.version != self.projections[name].version:
            served = None
        return us.served_key(name), served

    def handles(self, name: str, status: us.StoredProjection) -> dict[str, lmdb._Database]:
        """The open databases of ``status``'s slot (opened on first use, outside any write)."""

        found = self._handles.get((name, status.slot))
        if found is None:
            found = self._open_handles(name, status.slot, status.databases or [])
        return found

    def open_handles(
        self, name: str, status: us.StoredProjection
    ) -> dict[str, lmdb._Database] | None:
        """The databases of ``status``'s slot if already open (no write exclusion needed), else None."""

        return self._handles.get((name, status.slot))

    def core_source(self) -> CoreSource | None:
        """What ``tables.core`` reads through in a chunk: the core read model current now (a
        core rebuild swaps it, never during a chunk: both hold the store's write exclusion)."""

        core = self._core
        if core is None:
            return None
        model = core()
        return lambda txn, seq: CoreView(txn, model, seq)

    def folded(self, name: str, key: bytes, status: us.StoredProjection, swapped: bool) -> None:
        """A chunk committed: remember where it left ``name``."""

        if swapped:
            self._served[name], self._builds[name] = status, None
        else:
            self._remember(name, key, status)

    def drop_retired(self, name: str) -> bool:
        """Drop the databases of slots ``name`` swapped out that no reader of this process is
        still inside; True while some wait for their readers."""

        served = self._served.get(name)
        if served is None or not served.retired:
            return False
        with self._reading:
            free = [
                (slot, names) for slot, names in served.retired if not self._readers[(name, slot)]
            ]
        if not free:
            return True
        registry = self.registry
        assert registry is not None

        def drop(txn: lmdb.Transaction[bytes]) -> us.StoredProjection:
            current = us.get(txn, registry, us.served_key(name))
            assert current is not None
            kept = [(slot, names) for slot, names in current.retired if (slot, names) not in free]
            self.env.drop_dbs(txn, [db for _, names in free for db in names])
            status = msgspec.structs.replace(current, retired=kept)
            us.put(txn, registry, us.served_key(name), status)
            return status

        with self._writes().exclusive():
            status = self.env.write(drop)
            self.env.forget_dbs([db for _, names in free for db in names])
            for slot, _ in free:
                self._handles.pop((name, slot), None)
            self._served[name] = status
        return bool(status.retired)

    # ── opening ─────────────────────────────────────────────────────────────

    def _load(self) -> None:
        served, builds, _ = us.stored(self.env)
        for name in set(self.projections) | set(served):
            self._served[name], self._builds[name] = served.get(name), builds.get(name)

    def _open(self, projection: Projection) -> None:
        """At a writer's open: start, resume or drop the build ``projection``'s version needs,
        and drop what a swap left to drop (no reader of this process exists yet)."""

        name, version, databases = projection.name, projection.version, list(projection.databases)
        registry = self.registry
        assert registry is not None
        served, build = self._served.get(name), self._builds.get(name)
        now = int(time.time() * 1000)
        if (
            served is not None and served.databases is None
        ):  # a format-1 status: slot 0, names not recorded
            with self.env.read() as txn:
                found = self._databases(txn, name, served)
            served = msgspec.structs.replace(served, format=us.USER_FORMAT, databases=found)
        if served is None:  # a new projection serves from the start: empty, at sequence 0
            if build is not None:
                self._abandon(name, build)
                build = None
            served = us.StoredProjection(version, 0, format=us.USER_FORMAT, databases=databases)
            stale = self._open_handles(
                name, 0, databases
            )  # rows an older version of the store left

            def empty(txn: lmdb.Transaction[bytes]) -> None:
                for db in stale.values():
                    txn.drop(db, delete=False)

            self.env.write(empty)
        elif served.version == version:
            if build is not None:
                self._abandon(name, build)
                build = None
            if set(databases) - set(served.databases or []):  # databases added: made empty
                served = msgspec.structs.replace(
                    served, databases=sorted(set(served.databases or []) | set(databases))
                )
        elif build is None or build.version != version or build.databases != databases:
            if build is not None:
                self._abandon(name, build)
            slots = [
                served.slot,
                *(slot for slot, _ in served.retired),
                0 if build is None else build.slot,
            ]
            build = us.StoredProjection(
                version,
                0,
                format=us.USER_FORMAT,
                slot=max(slots) + 1,
                databases=databases,
                started_at=now,
            )
        else:  # a build of this version was under way: it resumes where it stopped
            build = msgspec.structs.replace(build, started_at=now, started_seq=build.folded_seq)
        self._open_handles(name, served.slot, served.databases or [])
        if build is not None:
            self._open_handles(name, build.slot, databases)
        keep_served, keep_build = served, build

        def store(txn: lmdb.Transaction[bytes]) -> None:
            us.put(txn, registry, us.served_key(name), keep_served)
            if keep_build is not None:
                us.put(txn, registry, us.build_key(name), keep_build)

        self.env.write(store)
        self._served[name], self._builds[name] = served, build

    def _abandon(self, name: str, build: us.StoredProjection) -> None:
        names = us.db_names(name, build.slot, build.databases or [])
        self._handles.pop((name, build.slot), None)

        def drop(txn: lmdb.Transaction[bytes]) -> None:
            self.env.drop_dbs(txn, names)
            if self.registry is not None:
                txn.delete(us.build_key(name), db=self.registry)

        self.env.write(drop)
        self.env.forget_dbs(names)

    def _open_handles(
        self, name: str, slot: int, databases: list[str]
    ) -> dict[str, lmdb._Database]:
        names = us.db_names(name, slot, databases)
        handles = {db: self.env.db(full) for db, full in zip(databases, names)}
        self._handles[(name, slot)] = handles
        return handles

    def _databases(
        self, txn: lmdb.Transaction[bytes], name: str, status: us.StoredProjection
    ) -> list[str]:
        if status.databases is not None:
            return status.databases
        assert self.registry is not None
        others = [
            key[len(us.SERVED_PREFIX) :].decode(errors="replace")
            for key, _ in _keys(txn, self.registry, us.SERVED_PREFIX)
        ]
        return us.legacy_databases(txn, name, others)

    def _remember(self, name: str, key: bytes, status: us.StoredProjection) -> None:
        if key == us.build_key(name):
            self._builds[name] = status
        else:
            self._served[name] = status

    def _not_ready(
        self,
        name: str,
        version: int | None,
        status: us.StoredProjection | None,
        build: us.StoredProjection | None,
    ) -> Exception:
        if status is None and build is None and name not in self.projections:
            return KeyError(
                f"The store has no projection {name!r}; registered here: {sorted(self.projections)}"
            )
        wanted = (
            version
            if version is not None
            else (build.version if build is not None else self.projections[name].version)
        )
        if build is not None and build.version == wanted:
            why = (
                f"it is being built (folded to sequence {build.folded_seq} of {self.log.head()})"
                if build.error is None
                else f"its build stopped at sequence {build.failed_seq}: {build.error}"
            )
        else:
            why = "no writer defining it has built it yet"
        return ProjectionNotReady(name, wanted, None if status is None else status.version, why)

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(
                f"The store at {self.path} is closed: its projections are no longer served"
            )


def _keys(
    txn: lmdb.Transaction[bytes], db: lmdb._Database, prefix: bytes
) -> Iterator[tuple[bytes, bytes]]:
    cursor = txn.cursor(db=db)
    if cursor.set_range(prefix):
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            yield key, value
