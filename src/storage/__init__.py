"""The Storage contract facade: ``LmdbStorage``, served from projections folded from the log."""

from ..projections import StorageRequestError

from .lmdb_storage import LmdbStorage

__all__ = ["LmdbStorage", "StorageRequestError"]
