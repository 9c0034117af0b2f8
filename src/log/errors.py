"""The log layer's errors: defined in ``pi_durable_lmdb.errors`` (the one error tree), importable here too."""

from ..errors import (
    CorruptRecordError,
    DurabilityConflictError,
    ForkedEnvironmentError,
    LogError,
    MapBusyError,
    StoreClosedError,
    StoreDamagedError,
    JournalReplayPending,
    StoreFormatError,
    StoreFullError,
    TruncatedStoreError,
    WriterLockedError,
    WrongStoreError,
)

__all__ = [
    "CorruptRecordError",
    "DurabilityConflictError",
    "ForkedEnvironmentError",
    "LogError",
    "MapBusyError",
    "StoreClosedError",
    "StoreDamagedError",
    "JournalReplayPending",
    "StoreFormatError",
    "StoreFullError",
    "TruncatedStoreError",
    "WriterLockedError",
    "WrongStoreError",
]
