"""Every error of pi-durable-lmdb's own, in one tree.

``DurableLmdbError`` is the root; four families sort them by what the user does next:

- ``DamageError``: something stored is not what was written (a record, a projection row, pages
  an OS crash may have torn, a message on the stream). Never served as data.
- ``OwnershipError``: someone else writes the store (another process, a handle of this process
  opened otherwise, another writer holding the stream's lease), or this handle may not.
- ``ReplicationError``: the NATS JetStream link could not do what was asked.
- ``BadInputError`` (a ``ValueError``): the caller's input names no store of ours, or the wrong one.

and ``StoreStateError`` for a store that cannot serve the request now (closed, full, behind).
The Storage contract's own errors (``StorageRequestError``, pi-durable's delta errors) stay
pi-durable's classes, so a ``Session`` recognises them. This module imports nothing of the
package, so every layer may raise from it.
"""

from __future__ import annotations

import os


class DurableLmdbError(Exception):
    """The root of the package's own errors: ``except DurableLmdbError`` catches them all."""


LogError = DurableLmdbError
"""The root's name before the tree existed (it was the log layer's base): kept for callers."""


# ── families ─────────────────────────────────────────────────────────────────


class DamageError(DurableLmdbError):
    """Stored bytes are not what was written. Nothing damaged is served; the log is the truth:
    ``durable-log verify`` says what is wrong, ``rebuild`` refolds projections, and a store whose
    log is damaged is restored from a backup, a replica or its stream."""


class OwnershipError(DurableLmdbError):
    """Another party writes this store, or this handle may not write it. Close the other writer
    (or wait for it), open read-only, or take over explicitly where that is offered."""


class ReplicationError(DurableLmdbError):
    """The link to the NATS JetStream stream failed. What was acknowledged stays acknowledged;
    the message says whether the operation may be retried."""


class StoreInUseError(OwnershipError):
    """Another process has the store open (a writer or a reader): compacting swaps its file, which
    a process that has it mapped would not see. Close them and compact again."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(
            f"The store at {path} is open{holder}; compacting replaces its file, so it needs the "
            "store closed everywhere: stop its writer and readers, then compact again"
        )
        self.path = path


class BadInputError(DurableLmdbError, ValueError):
    """The input names no store this version reads, or another one than asked. Check the path or
    the id you gave."""


class NumberError(BadInputError):
    """A number or duration given on the command line or in a web view's query is not the number it
    should be (not ASCII digits, out of its stated range, too long to read): ``str()`` says what it
    is and what it must be."""


class NotPiDurableError(BadInputError):
    """``import --from-pi-durable`` was given a source that is not a pi-durable store this version
    can read (another application's SQLite file, an empty file): it is refused and left as it was."""


class BadQueryError(BadInputError):
    """A request to ``durable-log serve`` asks for something its page does not take (a sequence
    past the head, an unknown write kind, a time that does not parse): answered with 400 and what
    is wrong; fix the address."""


class StoreStateError(DurableLmdbError, RuntimeError):
    """The store cannot serve this now (closed, no room, projections behind); nothing was written."""


# ── damage ───────────────────────────────────────────────────────────────────


class CorruptRecordError(DamageError):
    """A stored log record does not decode or does not match its checksum; it is never served as
    data. Restore the store (backup, replica, stream): the log is the source of truth."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"Log record {seq} is corrupt: {reason}")
        self.seq = seq
        self.reason = reason


class CorruptProjectionError(DamageError):
    """A projected value does not match its checksum (or an index points at nothing): damaged on
    disk, never served as data. The log still holds the truth: ``durable-log rebuild`` folds it
    into fresh projections."""

    def __init__(self, table: str, key: bytes) -> None:
        super().__init__(
            f"Projection {table!r} holds a damaged value at key {key.hex()}; "
            "run `durable-log rebuild` to fold the log into fresh projections"
        )
        self.table = table
        self.key = key


# ── bad input ────────────────────────────────────────────────────────────────


class StoreFormatError(BadInputError):
    """The directory holds a store this version cannot read, or something that is not a store:
    give the path of a pi-durable-lmdb store (or upgrade, for a newer format)."""


class WrongStoreError(StoreFormatError):
    """The directory (or a stream's subject) holds another store than the one asked for: give
    the store's own id, or another directory."""


class TruncatedStoreError(StoreFormatError, DamageError):
    """``data.mdb`` is shorter than LMDB's own meta pages say: reading it would fault (SIGBUS) and
    writing to it would build on pages that are gone. Restore the store from a copy."""


class StoreDamagedError(StoreFormatError, DamageError):
    """The machine stopped (OS crash, power loss) while a ``durability="process"`` (or
    ``"replicated"``) writer had the store open: the OS may have written its unsynced pages out of
    order, which LMDB cannot detect. Restore it (copy, replica, stream), or accept the risk by hand
    as the message says."""

    def __init__(self, path: str, marker: str, remedy: str | None = None) -> None:
        remedy = remedy or (
            "Restore the store from a copy or replica; or, accepting the "
            f"risk, delete {marker} and run `durable-log verify {path}` (then `durable-log export` "
            "and `durable-log import` it into a new store to rebuild every page from the log)"
        )
        super().__init__(
            f"The store at {path} was open for writing with durability='process' (or 'replicated', "
            "which syncs no local commit) when the machine stopped (an OS crash or power loss since). Its newest "
            "commits may be lost and, because the OS writes unsynced pages in any order, LMDB's pages "
            f"may be damaged in ways it cannot detect; it is not opened. {remedy}"
        )
        self.path, self.marker = path, marker


class JournalDamagedError(StoreDamagedError):
    """A ``power`` writer's recovery found its journal damaged inside the range it must replay
    (a segment missing or unreadable with later frames after it, a frame that does not continue
    the chain): acknowledged commits would be lost, so the store is not opened. Restore it from
    a copy or replica; the message names what is missing."""

    def __init__(self, path: str, what: str) -> None:
        Exception.__init__(
            self,
            f"The journal of the store at {path} is damaged: {what}. Recovery would lose the "
            "acknowledged commits after it, so the store is not opened; restore it from a copy or "
            "replica (the journal directory is left as it was, for inspection)",
        )
        self.path, self.marker, self.what = path, os.path.join(path, "power.unsynced"), what


# ── ownership ────────────────────────────────────────────────────────────────


class WriterLockedError(OwnershipError):
    """Another process (or another handle in this one) already writes to this store: one writer
    at a time. Open it read-only to read while it runs, or wait for it to close."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(
            f"The store at {path} is already open for writing{holder}; "
            "one writer at a time (open it read-only to read while it runs)"
        )
        self.path = path


class DurabilityConflictError(OwnershipError):
    """A writer asked for a durability the store's environment in this process cannot give.

    LMDB allows one environment per directory per process, and its sync mode is fixed when it
    opens: a handle still open on the store (a read-only one left by an earlier writer, say)
    keeps the sync mode that writer had. Close the store's other handles in this process first,
    or open with the durability they share."""

    def __init__(self, path: str, asked: str, shared: str) -> None:
        super().__init__(
            f"The store at {path} cannot be opened with durability={asked!r} here: this process "
            f"still has it open (a read-only handle, or a replica) in an environment opened for "
            f"durability={shared!r}, and LMDB fixes an environment's sync mode when it opens. "
            f"Close its other handles in this process first, or open it with durability={shared!r}"
        )
        self.path = path
        self.asked = asked
        self.shared = shared


class ForkedEnvironmentError(OwnershipError):
    """An LMDB environment was used in a process forked after it was opened: it belongs to the
    parent. Open the store again in the child."""


class NotWriterError(OwnershipError, ReplicationError, PermissionError):
    """This store does not take commits: it is a replica, or a writer that was deposed (another
    took the store's lease, or its stream moved on without it). Commit to the store's writer, or
    promote this one (``durable-log promote``)."""

    def __init__(self, message: str, store: str | None = None, epoch: int | None = None) -> None:
        super().__init__(message)
        self.store, self.epoch = store, epoch


class LeaseLapsedError(NotWriterError):
    """The lease ran out before this writer renewed it; unless another writer takes it, this one
    takes it again (a new epoch) and goes on. Retry the commit."""


# ── replication ──────────────────────────────────────────────────────────────


class NatsUnavailableError(ReplicationError):
    """No NATS server answered in time (unreachable, or the stream has no quorum): check the
    servers and retry; nothing unacknowledged was kept."""


class OutcomeUnknownError(NatsUnavailableError):
    """A publish got no answer: the records may or may not be in the stream. The writer finds out
    from the stream before it appends anything else; the caller learns nothing more here."""


class StreamMissingError(ReplicationError):
    """The named stream does not exist, or does not carry the store's subject: create it (open a
    writer with ``nats=`` and ``stream=``) or name the right one."""


class StreamMovedError(ReplicationError):
    """A conditional append was refused: the subject holds messages this writer has not seen
    (another writer appended, or fenced it)."""

    def __init__(self, subject: str, expected: int, found: int | None) -> None:
        where = "unknown" if found is None else str(found)
        super().__init__(
            f"The stream refused an append to {subject}: this writer expected its last message at "
            f"stream sequence {expected}, the stream has it at {where} (another writer appended or "
            "fenced this one)"
        )
        self.subject, self.expected, self.found = subject, expected, found


class ForeignMessageError(ReplicationError, DamageError):
    """A message on a store's subject is not a valid record of that store; nothing of it is
    applied. Find who publishes on the subject; the store's own records are untouched."""

    def __init__(self, stream: str, stream_seq: int, reason: str) -> None:
        super().__init__(
            f"Message {stream_seq} of stream {stream} is refused: {reason}; nothing of it was applied"
        )
        self.stream, self.stream_seq, self.reason = stream, stream_seq, reason


class SnapshotUnsoundError(DamageError):
    """A snapshot in a stream's snapshot bucket does not verify (cut short, damaged, or not the
    store it is named for): nothing is ever restored from it; an older one, or the log, is used."""


# ── the store's state ────────────────────────────────────────────────────────


class StoreClosedError(StoreStateError):
    """A store, or a handle on it (its log, a view, a projection), was used after ``close()``:
    open it again."""


class StoreFullError(OSError, StoreStateError):
    """The disk holding the store has no room for a commit; nothing was written. Free some space
    and commit again."""


class MapBusyError(StoreStateError):
    """The map was full and could not grow: a read transaction of this process stayed open the
    whole time (LMDB cannot change the map under an open transaction); nothing was written. End
    the read (do not hold one across an await) and commit again."""

    def __init__(self, path: str, seconds: float) -> None:
        super().__init__(
            f"The store at {path} needs a bigger map, and a read transaction of this process stayed "
            f"open for {seconds:g} s, so the map could not change under it (a read held across an "
            "await, or by the committing thread itself?); nothing was written, commit again once "
            "it ends"
        )
        self.path = path


class JournalReplayPending(StoreStateError):
    """A ``power`` writer stopped (power cut, OS crash, killed) with commits its journal holds and
    ``data.mdb`` may not: only a ``power`` writer's open replays them (``LmdbStorage.open``).
    Until then a read-only open after a reboot, and any other writer, refuses the store."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            f"The store at {path} {why}: its last power-mode writer stopped without closing, and "
            "commits it acknowledged may be only in its journal; open it for writing with "
            "durability='power' (LmdbStorage.open) once to replay them"
        )
        self.path = path


class ProofError(DamageError):
    """A Merkle proof, a signed checkpoint or a stored tree does not verify: the history is not the
    one that was proved or signed (``pi_durable_lmdb.tlog``, docs/audit.md). The message names
    what does not hold."""


class CheckpointRefusedError(ProofError):
    """A checkpoint was not published to a witness bucket: the last checkpoint there is not
    signed by the same key, or the store's tree does not extend it (a forked or rewritten
    history, or a store behind it). The message names the bucket, the key and what does not
    hold (``audit.witness``)."""


class NoteError(BadInputError):
    """A signing key, verifier key, signed note or checkpoint is not well formed (C2SP
    signed-note and tlog-checkpoint): the message names what is wrong."""


class ProjectionsBehind(StoreStateError):
    """A read-only open found projections that only a writer can bring up to date: open the store
    for writing once (or let its writer run)."""


class ProjectionFailed(StoreStateError):
    """A user projection's fold raised: it stopped at that record (its rows stay as they were
    before it) while the store and the other projections go on. Fix the fold and reopen, or
    ``durable-log rebuild --projection NAME``."""

    def __init__(self, name: str, seq: int, error: str) -> None:
        super().__init__(f"Projection {name!r} stopped at log sequence {seq}: {error}")
        self.name, self.seq, self.error = name, seq, error


class HistoryTrimmed(StoreStateError):
    """A read as of a point the store no longer keeps: its history before sequence ``point`` was
    trimmed (``durable-log trim``, ``keep_history=``) into the log's base, so the state right
    after ``asked`` is gone. Read as of ``point`` or later, or now."""

    def __init__(self, point: int, asked: int) -> None:
        super().__init__(
            f"The store's history before sequence {point} was trimmed: it cannot be read as of "
            f"sequence {asked} (read as of {point} or later)"
        )
        self.point, self.asked = point, asked


class SearchIndexError(StoreStateError):
    """The store's word index (``search.index``) cannot be used as it is: its header is
    unreadable, or other processes keep resetting it. It is only a projection of the log: delete
    the directory and the next ``durable-log search`` builds it again."""


class ProjectionNotReady(StoreStateError):
    """``storage.projections.read(name, version=N)`` while version N of the projection is not the
    one serving reads: it is being built beside the served one (wait for it: ``wait``), it
    failed (``retry``), or no writer defining it has run yet. ``served`` is the version served
    (``None``: none)."""

    def __init__(self, name: str, version: int, served: int | None, why: str) -> None:
        serves = "serves no version yet" if served is None else f"serves version {served}"
        super().__init__(f"Projection {name!r} {serves}, not version {version}: {why}")
        self.name, self.version, self.served = name, version, served


def install_hint(extra: str) -> str:
    """How a refusal that needs an optional extra says to install it, in one form everywhere:
    from a checkout, or from the wheel (the package is on no index; ``VERSION`` stands for the
    wheel's version)."""

    return (
        f"from a checkout, pip install '/path/to/pi-durable-lmdb[{extra}]'; "
        f"from a wheel, pip install 'pi_durable_lmdb-VERSION-py3-none-any.whl[{extra}]'"
    )


__all__ = [
    "BadInputError",
    "BadQueryError",
    "CorruptProjectionError",
    "CorruptRecordError",
    "DamageError",
    "DurabilityConflictError",
    "DurableLmdbError",
    "ForeignMessageError",
    "ForkedEnvironmentError",
    "HistoryTrimmed",
    "JournalReplayPending",
    "LeaseLapsedError",
    "LogError",
    "MapBusyError",
    "NatsUnavailableError",
    "NotPiDurableError",
    "NotWriterError",
    "NoteError",
    "NumberError",
    "OutcomeUnknownError",
    "OwnershipError",
    "ProjectionFailed",
    "ProjectionNotReady",
    "ProjectionsBehind",
    "ProofError",
    "ReplicationError",
    "SearchIndexError",
    "SnapshotUnsoundError",
    "StoreClosedError",
    "StoreDamagedError",
    "StoreFormatError",
    "StoreFullError",
    "StoreInUseError",
    "StoreStateError",
    "StreamMissingError",
    "StreamMovedError",
    "TruncatedStoreError",
    "WriterLockedError",
    "WrongStoreError",
]
