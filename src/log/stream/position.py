"""Where a store's log stands against its stream, and the errors of a store that does not write.

``StreamPosition`` is kept in the store's ``meta`` database, written in the same LMDB transaction
as the records it counts, so it is never ahead of or behind the local log.
"""

from __future__ import annotations

from typing import Final

import lmdb
import msgspec

from ...errors import NotWriterError as NotWriterError  # re-exported: imported from here by users
from ...errors import ReplicationError

POSITION_FORMAT: Final = 1
POSITION_KEY: Final = b"replication.position"


class StreamPosition(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The last message of the store's subject this store has taken in (record or control)."""

    format: int
    stream: str
    stream_seq: int
    """That message's stream sequence (0: none yet)."""
    seq: int
    """The log head it left (the records up to it are the stream's)."""
    epoch: int = 0
    """The highest writer epoch seen on the subject (a fence or a record)."""
    ids_reserved: int = 0
    """The highest id block reservation seen on the subject: no writer mints below it again."""


_position_encoder: Final = msgspec.msgpack.Encoder()
_position_decoder: Final = msgspec.msgpack.Decoder(StreamPosition)


def read_position(
    txn: lmdb.Transaction[bytes], meta: lmdb._Database, stream: str
) -> StreamPosition:
    """The position against ``stream``; a store never replicated (or to another stream) is at 0."""

    raw = txn.get(POSITION_KEY, db=meta)
    if raw is None:
        return StreamPosition(POSITION_FORMAT, stream, 0, 0)
    try:
        position = _position_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ReplicationError(
            f"The store's replication position is unreadable ({error})"
        ) from None
    if position.format != POSITION_FORMAT:
        raise ReplicationError(
            f"The store's replication position has format {position.format}, not {POSITION_FORMAT}"
        )
    if position.stream != stream:
        return StreamPosition(POSITION_FORMAT, stream, 0, 0, position.epoch, position.ids_reserved)
    return position


def put_position(
    txn: lmdb.Transaction[bytes], meta: lmdb._Database, position: StreamPosition
) -> None:
    txn.put(POSITION_KEY, _position_encoder.encode(position), db=meta)


def stored_position(txn: lmdb.Transaction[bytes], meta: lmdb._Database) -> StreamPosition | None:
    """The position as stored, whatever its stream (``stats``)."""

    raw = txn.get(POSITION_KEY, db=meta)
    return None if raw is None else _position_decoder.decode(raw)


__all__ = [
    "POSITION_FORMAT",
    "POSITION_KEY",
    "StreamPosition",
    "put_position",
    "read_position",
    "stored_position",
]
