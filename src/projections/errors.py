"""The read-request error of the contract (and, re-exported, ``CorruptProjectionError`` from the
package's error tree).

``StorageRequestError`` is pi-durable's own class, not a copy or a subclass: a Session recognises
it and fails only that read, and a host catches the same class from every backend.
"""

from __future__ import annotations

from pi_durable.errors import StorageRequestError

from ..errors import CorruptProjectionError

__all__ = ["CorruptProjectionError", "StorageRequestError"]
