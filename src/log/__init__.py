"""The sequenced write log: the store's source of truth.

``Environment`` opens a store directory, ``WriteLog`` appends and reads its records, ``records``
holds the persisted shapes and ``codec`` the lossless strict-JSON encoding they use.
"""

from ..errors import (  # the log layer's errors, defined in the one error tree; importable here too
    CorruptRecordError,
    DurabilityConflictError,
    ForkedEnvironmentError,
    JournalDamagedError,
    JournalReplayPending,
    LogError,
    MapBusyError,
    StoreClosedError,
    StoreDamagedError,
    StoreFormatError,
    StoreFullError,
    TruncatedStoreError,
    WriterLockedError,
    WrongStoreError,
)
from .durability import Durability, Mode, Role, mode_for
from .environment import Environment, WriteTransaction
from .records import (
    FORMAT_VERSION,
    Commit,
    EncodedBatch,
    Write,
    check_committed_at,
    decode_batch,
    decode_record,
    encode_batch,
    write_to_builtins,
)
from .writelog import WriteLog, key_seq, seq_key

__all__ = [
    "FORMAT_VERSION",
    "Commit",
    "Durability",
    "EncodedBatch",
    "Environment",
    "Mode",
    "Role",
    "Write",
    "WriteLog",
    "WriteTransaction",
    "check_committed_at",
    "decode_batch",
    "decode_record",
    "encode_batch",
    "key_seq",
    "mode_for",
    "seq_key",
    "write_to_builtins",
]
__all__ += [
    "CorruptRecordError",
    "DurabilityConflictError",
    "ForkedEnvironmentError",
    "JournalDamagedError",
    "JournalReplayPending",
    "LogError",
    "MapBusyError",
    "StoreClosedError",
    "StoreDamagedError",
    "StoreFormatError",
    "StoreFullError",
    "TruncatedStoreError",
    "WriterLockedError",
    "WrongStoreError",
]
