"""Projections defined by the store's users: a name, a version and a fold from log records to rows
in databases of their own, kept up to date from the log behind the commits.

Each projection's checkpoint (the last sequence it folded) is written in the same transaction as
its rows, so it never double-counts or skips a record across crashes. A version change drops its
databases and folds the log again from the start. A fold that raises stops only that projection:
it is reported with the sequence and the error, commits and other projections go on.
"""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import ClassVar, Final

import lmdb
import msgspec

from ..errors import ProjectionFailed
from ..log import Commit, Environment, StoreClosedError, WriteLog

from .rebuild import REGISTRY_DB, FOLD_CHUNK

_log = logging.getLogger("pi_durable_lmdb")

_PREFIX = b"user:"


class Projection:
    """A read model of your own, folded from the log: subclass it, set ``name``, ``version`` and
    ``databases``, implement ``fold``, and pass instances to ``LmdbStorage.open(projections=...)``.

    - ``name`` names it in the store (``storage.projections.read(name)``, ``durable-log stats``).
    - ``version``: change it when the fold changes; the store then drops the rows and refolds
      the whole log, so old rows never mix with new ones.
    - ``databases``: the names of its own LMDB databases (stored as ``u.<name>.<database>``).

    See ``tools/task_outcomes.py`` in the repository for a complete example.
    """

    name: ClassVar[str]
    version: ClassVar[int]
    databases: ClassVar[tuple[str, ...]] = ("main",)

    def fold(self, tables: Tables, commit: Commit) -> None:
        """Fold one committed batch into this projection's rows.

        ``tables`` holds only this projection's ``databases``, inside the write transaction that
        also stores its checkpoint, so rows and checkpoint commit together and no record is
        folded twice or skipped across crashes. ``commit.seq`` and ``commit.committed_at`` (Unix
        ms) identify the batch; ``commit.writes`` is the batch as committed, a list of the tagged
        Structs of ``log.records`` (``ConversationWrite``, ``EntryWrite``, ``TaskWrite``,
        ``SubmissionWrite`` with the record in ``.value``; ``DocumentCreateWrite``/``DocumentCopyWrite``
        with ``.record`` and ``.content``/``.source``; ``DocumentChangeWrite`` with ``.id`` and
        ``.content``, a ``BaseContent`` or ``DeltaContent``; ``DocumentRetireWrite`` with
        ``.id``). Match them with ``type(write) is TaskWrite``.

        Folds run in the writer process, on its event loop, in a background task behind the
        commits (a chunk of commits per write transaction): a commit never waits for them, and
        ``await storage.projections.wait(seq)`` waits for them. Read-only opens never fold. An
        exception stops only this projection, at that sequence (``storage.projections.status()``).
        """

        raise NotImplementedError



class _FoldFailed(Exception):
    def __init__(self, seq: int, error: Exception) -> None:
        super().__init__(seq, error)
        self.seq, self.error = seq, error


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
        raise TypeError(f"{label}: databases must be a non-empty tuple of names, not {databases!r:.60}")
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
        raise ValueError(f"{what} {value!r:.60} is not valid Unicode (it holds a lone surrogate)") from None
    if size > _MAX_NAME:
        raise ValueError(f"{what} is {size} bytes long; at most {_MAX_NAME}")


def _unwritable_traceback(error: BaseException) -> str | None:
    """The error's traceback as text that encodes, when the raw one would not (a lone surrogate
    in its message: a log handler writing UTF-8 would drop the line); ``None`` when it does and
    the error can go to the log as ``exc_info``, for handlers that keep exceptions whole."""

    raw = "".join(traceback.format_exception(error)).rstrip()
    safe = raw.encode("utf-8", "backslashreplace").decode("utf-8")
    return None if safe == raw else safe


def _describe(error: BaseException) -> str:
    """An error as stored text: whatever its message holds, it encodes (lone surrogates are
    escaped) and it never raises."""

    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:
        text = f"{type(error).__name__} (its message could not be made)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ProjectionStatus(msgspec.Struct):
    """Stored beside a projection's rows: its version, checkpoint and failure, if any."""

    version: int
    folded_seq: int
    failed_seq: int | None = None
    error: str | None = None


_status_encoder = msgspec.msgpack.Encoder()
_status_decoder = msgspec.msgpack.Decoder(ProjectionStatus)


class Tables:
    """A projection's own databases inside one transaction: writable during ``fold``, read-only
    in ``storage.projections.read(name)``. Keys and values are bytes; keys sort bytewise, so
    encode integers big-endian to keep them in numeric order."""

    def __init__(self, txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database]) -> None:
        self._txn = txn
        self._dbs = dbs

    def _db(self, name: str) -> lmdb._Database:
        try:
            return self._dbs[name]
        except KeyError:
            raise KeyError(f"This projection has no database {name!r}; it declares {sorted(self._dbs)}") from None

    def get(self, db: str, key: bytes) -> bytes | None:
        """The value at ``key`` in database ``db``, or None."""

        return self._txn.get(key, db=self._db(db))

    def put(self, db: str, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` (only inside ``fold``)."""

        self._txn.put(key, value, db=self._db(db))

    def delete(self, db: str, key: bytes) -> None:
        """Remove ``key`` if present (only inside ``fold``)."""

        self._txn.delete(key, db=self._db(db))

    def items(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs whose key starts with ``prefix``, in key order."""

        cursor = self._txn.cursor(db=self._db(db))
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            yield key, value


def stored_statuses(env: Environment) -> dict[str, ProjectionStatus]:
    """The user projections a store holds, by name, as their program last left them (for
    ``durable-log stats``, which runs without that program)."""

    if env.readonly and not env.has_db(REGISTRY_DB):
        return {}
    registry = env.db(REGISTRY_DB)
    found: dict[str, ProjectionStatus] = {}
    with env.read() as txn:
        cursor = txn.cursor(db=registry)
        if cursor.set_range(_PREFIX):
            for key, value in cursor:
                if not key.startswith(_PREFIX):
                    break
                found[key[len(_PREFIX):].decode(errors="replace")] = _status_decoder.decode(value)
    return found


class UserProjections:
    """The registered projections of one open store, and the worker that keeps them level."""

    def __init__(self, env: Environment, log: WriteLog, projections: Sequence[Projection] = ()) -> None:
        for projection in projections:
            _check_definition(projection)
        names = [projection.name for projection in projections]
        if len(set(names)) != len(names):
            raise ValueError(f"Projection names must be unique: {names}")
        tables = [f"u.{p.name}.{db}" for p in projections for db in p.databases]
        if len(set(tables)) != len(tables):
            raise ValueError(f"Projections' databases must have distinct names; these collide: {sorted(tables)}")
        self._env = env
        self._log = log
        self._registry = env.db(REGISTRY_DB)
        self._projections = {projection.name: projection for projection in projections}
        self._dbs = {
            projection.name: {db: env.db(f"u.{projection.name}.{db}") for db in projection.databases}
            for projection in projections
        }
        self._status: dict[str, ProjectionStatus] = {}
        self._closed = False
        self._worker: asyncio.Task[None] | None = None
        self._stopped: Exception | None = None
        """What stopped the last worker outside any fold (a log record it could not read):
        ``wait`` raises it; the next ``kick`` tries again."""
        self._progress = asyncio.Event() if projections else None
        for projection in projections:
            self._status[projection.name] = self._open(projection)

    # ── public ──────────────────────────────────────────────────────────────

    def status(self) -> dict[str, ProjectionStatus]:
        """Each projection's version, checkpoint and failure (copies: the caller cannot alter them)."""

        return {name: msgspec.structs.replace(status) for name, status in self._status.items()}

    @contextmanager
    def read(self, name: str) -> Iterator[Tables]:
        """A short read transaction over one projection's databases."""

        dbs = self._dbs_of(name)
        with self._env.read() as txn:
            yield Tables(txn, dbs)

    async def wait(self, seq: int, name: str | None = None) -> None:
        """Return once the projection (or all) folded ``seq``; raise if one stopped before it."""

        names = [name] if name is not None else list(self._projections)
        for item in names:
            self._dbs_of(item)
        while True:
            if self._closed:
                raise StoreClosedError(
                    f"The store at {self._env.path} was closed before its projections folded sequence {seq}"
                )
            pending = False
            for item in names:
                status = self._status[item]
                if status.error is not None and status.folded_seq < seq:
                    raise ProjectionFailed(item, status.failed_seq or 0, status.error)
                pending |= status.folded_seq < seq
            if not pending:
                return
            self.kick()
            assert self._progress is not None
            self._progress.clear()
            await self._progress.wait()
            if self._stopped is not None:
                raise self._stopped

    def kick(self) -> None:
        """Schedule the worker if it is idle and there is a running loop."""

        if self._closed or not self._projections or (self._worker is not None and not self._worker.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._stopped = None
        self._worker = loop.create_task(self._run())

    def reset_stored(self, name: str) -> None:
        """Forget a projection this program does not define: its program folds it again on open."""

        key = _PREFIX + name.encode()
        with self._env.read() as txn:
            if txn.get(key, db=self._registry) is None:
                raise KeyError(f"The store has no projection {name!r}")
        self._env.write(lambda txn: txn.delete(key, db=self._registry))

    async def close(self) -> None:
        """Stop the worker for good and wake every ``wait``, which then raises ``StoreClosedError``."""

        self._closed = True
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        if self._progress is not None:
            self._progress.set()

    # ── folding ─────────────────────────────────────────────────────────────

    async def _run(self) -> None:
        try:
            while self.step():
                await asyncio.sleep(0)
        except Exception as error:  # a corrupt log record: waiters are told, not left waiting
            _log.error("user projections stopped: %s", error, exc_info=error)
            self._stopped = error
            if self._progress is not None:
                self._progress.set()

    def step(self) -> bool:
        """Fold one chunk into every projection that is behind; True while any still is."""

        if self._closed or self._env.readonly:
            return False
        head = self._log.head()
        behind = False
        for name, projection in self._projections.items():
            status = self._status[name]
            if status.error is not None or status.folded_seq >= head:
                continue
            commits = self._log.take(status.folded_seq + 1, head, FOLD_CHUNK)
            try:
                self._status[name] = self._env.write(lambda txn: self._fold(txn, projection, commits))
            except _FoldFailed as failure:
                before = [commit for commit in commits if commit.seq < failure.seq]
                if before:  # keep what folded cleanly, so the checkpoint stops right before it
                    status = self._env.write(lambda txn: self._fold(txn, projection, before))
                self._status[name] = self._record_failure(name, status, failure.seq, failure.error)
                continue
            behind |= self._status[name].folded_seq < head
        if self._progress is not None:
            self._progress.set()
        return behind

    def _fold(self, txn: lmdb.Transaction[bytes], projection: Projection, commits: list[Commit]) -> ProjectionStatus:
        tables = Tables(txn, self._dbs[projection.name])
        for commit in commits:
            try:
                projection.fold(tables, commit)
            except lmdb.MapFullError:
                raise  # not the fold's fault: the write grows the map and folds the chunk again
            except Exception as error:
                raise _FoldFailed(commit.seq, error) from error
        status = ProjectionStatus(projection.version, commits[-1].seq)
        txn.put(_PREFIX + projection.name.encode(), _status_encoder.encode(status), db=self._registry)
        return status

    def _record_failure(self, name: str, status: ProjectionStatus, seq: int, error: Exception) -> ProjectionStatus:
        failed = msgspec.structs.replace(status, failed_seq=seq, error=_describe(error))
        written = _unwritable_traceback(error)
        if written is None:
            _log.error("user projection %r stopped at record %d: %s", name, seq, failed.error, exc_info=error)
        else:
            _log.error("user projection %r stopped at record %d: %s\n%s", name, seq, failed.error, written)
        key = _PREFIX + name.encode()
        self._env.write(lambda txn: txn.put(key, _status_encoder.encode(failed), db=self._registry))
        return failed

    # ── opening ─────────────────────────────────────────────────────────────

    def _open(self, projection: Projection) -> ProjectionStatus:
        with self._env.read() as txn:
            raw = txn.get(_PREFIX + projection.name.encode(), db=self._registry)
        status = None if raw is None else _status_decoder.decode(raw)
        if status is not None and status.version == projection.version:
            return status
        if self._env.readonly:
            return ProjectionStatus(
                projection.version, 0, 0, "its stored version differs; a writer must rebuild it first"
            )
        return self._drop(projection)

    def _drop(self, projection: Projection) -> ProjectionStatus:
        status = ProjectionStatus(projection.version, 0)

        def drop(txn: lmdb.Transaction[bytes]) -> None:
            for db in self._dbs[projection.name].values():
                txn.drop(db, delete=False)
            txn.put(_PREFIX + projection.name.encode(), _status_encoder.encode(status), db=self._registry)

        self._env.write(drop)
        return status

    def _dbs_of(self, name: str) -> dict[str, lmdb._Database]:
        try:
            return self._dbs[name]
        except KeyError:
            raise KeyError(f"No projection {name!r} is registered; registered: {sorted(self._dbs)}") from None
