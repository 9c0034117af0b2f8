"""What the store keeps about each user projection, readable without the program that defines it.

The registry database (``projections``) holds, per projection, the status of the version that
serves reads (``user:<name>``) and, while another version is being built beside it, that build's
status (``build:<name>``). Each status names its *slot*: the databases it folds into are
``u.<name>.<database>`` for slot 0 (the layout before builds existed) and
``u<slot>.<name>.<database>`` for the others, so a build never touches the rows being served. A
swap replaces the served status with the build's in one transaction; the slots it retires are
listed in the served status until their databases are dropped, so a crash in between leaks
nothing. Everything here is also what ``durable-log projections`` and ``stats`` read.
"""

from __future__ import annotations

import time
from typing import Final

import lmdb
import msgspec

from ..errors import CorruptProjectionError, StoreFormatError
from ..log import Environment
from .rebuild import REGISTRY_DB

SERVED_PREFIX: Final = b"user:"
BUILD_PREFIX: Final = b"build:"
USER_FORMAT: Final = 2
"""Format of a stored status; a status without the field is of format 1 (slot 0, its databases
not recorded)."""


class StoredProjection(msgspec.Struct):
    """One version of a projection as stored: its checkpoint, its failure, where its rows are."""

    version: int
    folded_seq: int
    failed_seq: int | None = None
    error: str | None = None
    format: int = 1
    slot: int = 0
    databases: list[str] | None = None
    retired: list[tuple[int, list[str]]] = []
    """Slots swapped out whose databases are still to be dropped, each with its database names."""
    started_at: int | None = None
    """A build: Unix ms when it (re)started folding, and the sequence it had folded then (its rate)."""
    started_seq: int = 0


class BuildStatus(msgspec.Struct):
    """A version being built beside the served one (``ProjectionStatus.building``)."""

    version: int
    folded_seq: int
    head: int
    """The log's head when this was taken: the build is level once ``folded_seq`` reaches it."""
    rate: float
    """Records folded per second since the build (re)started."""
    eta: float | None
    """Seconds to reach ``head`` at that rate (``None`` before any progress)."""
    failed_seq: int | None = None
    error: str | None = None


class ProjectionStatus(msgspec.Struct):
    """A projection's state: the version served and its checkpoint, its failure if it stopped,
    the version being built beside it, and ``state``: ``level`` (folded to the head), ``behind``,
    ``building`` (another version is being built), ``failed`` (the served version, or the build,
    stopped at a record: ``retry``), ``retired`` (stored, not defined by this program: ``drop``),
    ``unserved`` (this program's version is not stored: a writer defining it builds it)."""

    version: int
    folded_seq: int
    failed_seq: int | None = None
    error: str | None = None
    state: str = "level"
    lag: int = 0
    building: BuildStatus | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(StoredProjection)


def db_names(name: str, slot: int, databases: list[str] | tuple[str, ...]) -> list[str]:
    """The LMDB database names of slot ``slot`` of projection ``name``."""

    head = "u" if slot == 0 else f"u{slot}"
    return [f"{head}.{name}.{db}" for db in databases]


def encode(status: StoredProjection) -> bytes:
    return _encoder.encode(status)


def decode(key: bytes, raw: bytes) -> StoredProjection:
    """A stored status, checked: an unreadable one is damage, a newer format is refused."""

    try:
        status = _decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise CorruptProjectionError(REGISTRY_DB, key) from None
    if status.format > USER_FORMAT:
        raise StoreFormatError(
            f"User projection status {key.decode(errors='replace')!r} has format {status.format}; "
            f"this version reads {USER_FORMAT} at most: upgrade pi-durable-lmdb"
        )
    return status


def served_key(name: str) -> bytes:
    return SERVED_PREFIX + name.encode()


def build_key(name: str) -> bytes:
    return BUILD_PREFIX + name.encode()


def get(
    txn: lmdb.Transaction[bytes], registry: lmdb._Database, key: bytes
) -> StoredProjection | None:
    raw = txn.get(key, db=registry)
    return None if raw is None else decode(key, raw)


def put(
    txn: lmdb.Transaction[bytes], registry: lmdb._Database, key: bytes, status: StoredProjection
) -> None:
    txn.put(key, encode(status), db=registry)


def _scan(
    txn: lmdb.Transaction[bytes], registry: lmdb._Database, prefix: bytes
) -> dict[str, StoredProjection]:
    found: dict[str, StoredProjection] = {}
    cursor = txn.cursor(db=registry)
    if cursor.set_range(prefix):
        for key, value in cursor:
            if not key.startswith(prefix):
                break
            found[key[len(prefix) :].decode(errors="replace")] = decode(key, value)
    return found


def stored(
    env: Environment,
) -> tuple[dict[str, StoredProjection], dict[str, StoredProjection], int]:
    """The served status and the build status of every user projection the store holds, and the
    log head, all from one snapshot (for ``stats`` and ``durable-log projections``)."""

    from ..log.writelog import LOG_DB, key_seq

    if env.readonly and not env.has_db(REGISTRY_DB):
        return {}, {}, 0
    registry = env.db(REGISTRY_DB)
    log = env.db(LOG_DB) if not env.readonly or env.has_db(LOG_DB) else None
    with env.read() as txn:
        head = 0
        if log is not None:
            cursor = txn.cursor(db=log)
            head = key_seq(cursor.key()) if cursor.last() else 0
        return _scan(txn, registry, SERVED_PREFIX), _scan(txn, registry, BUILD_PREFIX), head


def report(
    served: StoredProjection | None,
    build: StoredProjection | None,
    head: int,
    defined: int | None = None,
    now: float | None = None,
) -> ProjectionStatus:
    """The status of one projection as its stored parts and the log head tell it. ``defined``:
    the version this program defines (``None``: none, the projection is retired here)."""

    building = None
    if build is not None:
        rate = 0.0
        if build.started_at is not None:
            elapsed = (time.time() if now is None else now) - build.started_at / 1000
            rate = (build.folded_seq - build.started_seq) / elapsed if elapsed > 0 else 0.0
        eta = (head - build.folded_seq) / rate if rate > 0 else None
        building = BuildStatus(
            build.version,
            build.folded_seq,
            head,
            round(rate, 1),
            None if eta is None else round(eta, 1),
            build.failed_seq,
            build.error,
        )
    if served is None:
        version = defined if defined is not None else (build.version if build is not None else 0)
        return ProjectionStatus(version, 0, state="unserved", lag=head, building=building)
    if (served.error is not None and (build is None or served.version == defined)) or (
        build is not None and build.error is not None
    ):
        state = "failed"
    elif building is not None:
        state = "building"
    elif defined is None:
        state = "retired"
    elif served.version != defined:
        state = "unserved"
    else:
        state = "level" if served.folded_seq >= head else "behind"
    return ProjectionStatus(
        served.version,
        served.folded_seq,
        served.failed_seq,
        served.error,
        state,
        max(0, head - served.folded_seq),
        building,
    )


def legacy_databases(txn: lmdb.Transaction[bytes], name: str, others: list[str]) -> list[str]:
    """The databases of a format-1 status (slot 0, names not recorded): every ``u.<name>.<db>``
    the store holds that no other stored projection's name claims (``a`` and ``a.b`` share a prefix)."""

    prefix = f"u.{name}.".encode()
    claimed = [
        f"u.{other}.".encode() for other in others if other != name and other.startswith(name + ".")
    ]
    found: list[str] = []
    cursor = txn.cursor()
    if cursor.set_range(prefix):
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                break
            if not any(key.startswith(other) for other in claimed):
                found.append(key[len(prefix) :].decode(errors="replace"))
    return found


def drop_stored(
    env: Environment, txn: lmdb.Transaction[bytes], name: str, others: list[str]
) -> list[str]:
    """Inside ``txn``: delete every database and status of projection ``name`` (served, build,
    retired slots); returns the database names dropped (forget their handles once committed)."""

    registry = env.db(REGISTRY_DB)
    names: list[str] = []
    for key in (served_key(name), build_key(name)):
        status = get(txn, registry, key)
        if status is None:
            continue
        databases = (
            status.databases
            if status.databases is not None
            else legacy_databases(txn, name, others)
        )
        names += db_names(name, status.slot, databases)
        for _, retired in status.retired:
            names += retired
        txn.delete(key, db=registry)
    env.drop_dbs(txn, names)
    return names


__all__ = [
    "BUILD_PREFIX",
    "SERVED_PREFIX",
    "USER_FORMAT",
    "BuildStatus",
    "ProjectionStatus",
    "StoredProjection",
    "build_key",
    "db_names",
    "decode",
    "drop_stored",
    "encode",
    "get",
    "legacy_databases",
    "put",
    "report",
    "served_key",
    "stored",
]
