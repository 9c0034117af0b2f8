"""The Storage contract facade: ``LmdbStorage``, served from projections folded from the log."""

from ..log.jetstream import NatsUnavailableError, ReplicationError
from ..log.replication import NotWriterError
from ..projections import StorageRequestError

from .lmdb_storage import Durability, LmdbStorage

__all__ = ["Durability", "LmdbStorage", "NatsUnavailableError", "NotWriterError", "ReplicationError", "StorageRequestError"]
