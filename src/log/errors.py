"""Errors of the log layer, each naming what it is about (a path, a sequence)."""

from __future__ import annotations


class LogError(Exception):
    """Base of the log's own errors."""


class CorruptRecordError(LogError):
    """A stored record does not decode or does not match its checksum; it is never served as data."""

    def __init__(self, seq: int, reason: str) -> None:
        super().__init__(f"Log record {seq} is corrupt: {reason}")
        self.seq = seq
        self.reason = reason


class WriterLockedError(LogError):
    """Another process (or another handle in this one) already writes to this store."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(
            f"The store at {path} is already open for writing{holder}; "
            "one writer at a time (open it read-only to read while it runs)"
        )
        self.path = path


class DurabilityConflictError(LogError):
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


class StoreFormatError(LogError):
    """The directory holds a store this version cannot read, or something that is not a store."""


class ForkedEnvironmentError(LogError):
    """An LMDB environment was used in a process forked after it was opened."""


class StoreFullError(LogError, OSError):
    """The disk holding the store has no room for a commit; nothing was written."""


class MapBusyError(LogError, RuntimeError):
    """The map was full and could not grow: a read transaction of this process stayed open the
    whole time (LMDB cannot change the map under an open transaction); nothing was written."""

    def __init__(self, path: str, seconds: float) -> None:
        super().__init__(
            f"The store at {path} needs a bigger map, and a read transaction of this process stayed "
            f"open for {seconds:g} s, so the map could not change under it (a read held across an "
            "await, or by the committing thread itself?); nothing was written, commit again once "
            "it ends"
        )
        self.path = path


class StoreClosedError(LogError, RuntimeError):
    """A store, or a handle on it (its log, a view, a projection), was used after ``close()``."""


class TruncatedStoreError(StoreFormatError):
    """``data.mdb`` is shorter than LMDB's own meta pages say: reading it would fault (SIGBUS) and
    writing to it would build on pages that are gone."""


class StoreDamagedError(StoreFormatError):
    """The machine stopped (OS crash, power loss) while a ``durability="process"`` writer had the
    store open: the OS may have written its unsynced pages out of order, which LMDB cannot detect."""

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


class WrongStoreError(StoreFormatError):
    """The directory (or a stream's subject) holds another store than the one asked for."""
