"""The read-request error of the contract.

It subclasses pi-durable's own ``StorageRequestError`` when pi-durable is installed, so a Session
recognises it and fails only that read; pi-durable stays an optional dependency.
"""

from __future__ import annotations

try:
    from pi_durable.errors import StorageRequestError as _Base
except ImportError:  # pragma: no cover - exercised only without pi-durable installed

    class _Base(Exception):  # type: ignore[no-redef]
        def __init__(self, message: str) -> None:
            super().__init__(message)
            self.name = "StorageRequestError"


class StorageRequestError(_Base):
    """A read rejected an invalid request (unknown conversation, foreign cursor); no durable effect."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.name = "StorageRequestError"


class CorruptProjectionError(Exception):
    """A projected value does not match its checksum: damaged on disk, never served as data.

    The log still holds the truth: ``durable-log rebuild`` folds it into fresh projections.
    """

    def __init__(self, table: str, key: bytes) -> None:
        super().__init__(
            f"Projection {table!r} holds a damaged value at key {key.hex()}; "
            "run `durable-log rebuild` to fold the log into fresh projections"
        )
        self.table = table
        self.key = key
