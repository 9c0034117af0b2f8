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
