"""The Storage contract facade: ``LmdbStorage``, served from projections folded from the log."""

from ..errors import NatsUnavailableError, NotWriterError, ReplicationError
from ..log import Durability
from ..projections import StorageRequestError
from .lmdb_storage import LmdbStorage

__all__ = [
    "Durability",
    "LmdbStorage",
    "NatsUnavailableError",
    "NotWriterError",
    "ReplicationError",
    "StorageRequestError",
]
