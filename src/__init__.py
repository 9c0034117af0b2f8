"""pi-durable-lmdb: an embedded, event-sourced LMDB engine for pi-durable's ``Storage`` contract.

Layers, each using only the ones below it: ``log`` (the sequenced write log, the source of
truth), ``projections`` (read models folded from it), ``storage`` (the contract facade),
``audit`` (the operator functions: tail, stats, verify, export, import, restore ...), and on top
the ``durable-log`` command (``cli``) and its web view (``web``), which nothing here imports.
The public names are re-exported here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .errors import (
    BadInputError,
    BadQueryError,
    CheckpointRefusedError,
    CorruptProjectionError,
    CorruptRecordError,
    DamageError,
    DurabilityConflictError,
    DurableLmdbError,
    ForeignMessageError,
    ForkedEnvironmentError,
    HistoryTrimmed,
    JournalDamagedError,
    JournalReplayPending,
    LeaseLapsedError,
    LogError,
    MapBusyError,
    NatsUnavailableError,
    NoteError,
    NotPiDurableError,
    NotWriterError,
    NumberError,
    OutcomeUnknownError,
    OwnershipError,
    ProjectionFailed,
    ProjectionNotReady,
    ProjectionsBehind,
    ProofError,
    ReplicationError,
    SearchIndexError,
    SnapshotUnsoundError,
    StoreClosedError,
    StoreDamagedError,
    StoreFormatError,
    StoreFullError,
    StoreInUseError,
    StoreStateError,
    StreamMissingError,
    StreamMovedError,
    TruncatedStoreError,
    WriterLockedError,
    WrongStoreError,
)

if TYPE_CHECKING:
    from .audit.tail import Tail, TailFilter
    from .projections import StorageRequestError
    from .projections.user import Projection
    from .storage import Durability, LmdbStorage

__version__ = "0.2.0"


def __getattr__(name: str) -> Any:
    """The names whose modules load the engine (LMDB, msgspec, pi-durable), imported when first
    used: importing the package (as ``durable-log --version`` does) then costs next to nothing."""

    if name in ("Durability", "LmdbStorage"):
        from . import storage as module
    elif name == "Projection":
        from .projections import user as module  # type: ignore[no-redef]
    elif name == "StorageRequestError":
        from . import projections as module  # type: ignore[no-redef]
    elif name in ("Tail", "TailFilter"):
        from .audit import tail as module  # type: ignore[no-redef]
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


async def open_lmdb_storage(path: str | os.PathLike[str], **options: Any) -> LmdbStorage:
    """Open or create an LMDB store at directory ``path``; ``options`` are ``LmdbStorage.open``'s.

    Shaped like pi-durable's ``open_posix_sqlite_storage``, so a host swaps one line.
    """

    from .storage import LmdbStorage

    return await LmdbStorage.open(path, **options)


__all__ = [
    "BadInputError",
    "BadQueryError",
    "CheckpointRefusedError",
    "CorruptProjectionError",
    "CorruptRecordError",
    "DamageError",
    "Durability",
    "DurabilityConflictError",
    "DurableLmdbError",
    "ForeignMessageError",
    "ForkedEnvironmentError",
    "HistoryTrimmed",
    "JournalDamagedError",
    "JournalReplayPending",
    "LeaseLapsedError",
    "LmdbStorage",
    "LogError",
    "MapBusyError",
    "NatsUnavailableError",
    "NotPiDurableError",
    "NotWriterError",
    "NoteError",
    "NumberError",
    "OutcomeUnknownError",
    "OwnershipError",
    "Projection",
    "ProjectionFailed",
    "ProjectionNotReady",
    "ProjectionsBehind",
    "ProofError",
    "ReplicationError",
    "SearchIndexError",
    "SnapshotUnsoundError",
    "StorageRequestError",
    "StoreClosedError",
    "StoreDamagedError",
    "StoreFormatError",
    "StoreFullError",
    "StoreInUseError",
    "StoreStateError",
    "StreamMissingError",
    "StreamMovedError",
    "Tail",
    "TailFilter",
    "TruncatedStoreError",
    "WriterLockedError",
    "WrongStoreError",
    "__version__",
    "open_lmdb_storage",
]
