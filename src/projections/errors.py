"""The read-request error of the contract (and, re-exported, ``CorruptProjectionError`` from the
package's error tree).

It subclasses pi-durable's own ``StorageRequestError`` when pi-durable is installed, so a Session
recognises it and fails only that read; pi-durable stays an optional dependency.
"""

from __future__ import annotations

from ..errors import CorruptProjectionError

__all__ = ["CorruptProjectionError", "StorageRequestError"]

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

