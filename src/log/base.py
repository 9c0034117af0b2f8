"""The log's base: what a trim folded its dropped prefix into.

A trim (``storage.trim``) drops the log's records before a sequence, its *point*, and keeps in
their place the state they folded to: the rows of the core projections right after record
``point - 1``, in the ``base`` database beside the log. A fold of the log starts from the base
and goes on with the records from ``point``: the log and its base stay the source of truth, and
every rebuild, verify and catch-up folds them into the same tables.

The log layer keeps the rows opaque, ``(table, key, value)`` triples in the order the
projections gave them, a ``BaseChunk`` of up to ``CHUNK_BYTES`` per value (zstd, or plain when
that does not pay), keyed ``b"c"`` + the chunk's number (8 bytes big-endian); the ``BaseHeader``
(key ``b"h"``) names the point, the chunks and the rows. Trims write a whole new base in the one
transaction that drops the records, so a base is always whole and always the one of its point.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Final

import lmdb
import msgspec

from ..errors import CorruptRecordError
from . import zstd
from .environment import Environment

BASE_DB: Final = "base"
"""The LMDB database holding the log's base."""
BASE_FORMAT: Final = 1
"""The format of ``BaseHeader`` and ``BaseChunk``."""
CHUNK_BYTES: Final = 1 << 20
"""Rows' bytes per stored chunk, about."""
_HEADER_KEY: Final = b"h"
_CHUNK_PREFIX: Final = b"c"
_U64 = struct.Struct(">Q")
_PLAIN: Final = b"p"
_ZSTD: Final = b"z"

Row = tuple[str, bytes, bytes]
"""``(table, key, value)``: one row of the state the base holds."""


class BaseHeader(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The base's description: records before ``point`` are folded into its ``rows`` rows, in
    ``chunks`` chunks; ``committed_at``: the commit time (Unix ms) of record ``point - 1``;
    ``trimmed_at``: when the trim ran (Unix ms); ``shape``: the version of the rows' shape,
    opaque here (the projections' schema that wrote them: a fold reading rows of another shape
    must convert them, or refuse)."""

    format: int
    point: int
    chunks: int
    rows: int
    committed_at: int
    trimmed_at: int
    shape: int


class BaseChunk(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One stored chunk of the base's rows."""

    format: int
    rows: list[tuple[str, bytes, bytes]]


_header_decoder: Final = msgspec.msgpack.Decoder(BaseHeader)
_chunk_decoder: Final = msgspec.msgpack.Decoder(BaseChunk)
_encoder: Final = msgspec.msgpack.Encoder()


def base_db(env: Environment, create: bool = False) -> lmdb._Database | None:
    """The base's database (``create``: made when missing, by a writer); ``None`` when the log
    was never trimmed. Call it outside any transaction of this thread: it may open one."""

    if not create and not env.has_db(BASE_DB):
        return None
    return env.db(BASE_DB)


def read_header(db: lmdb._Database | None, txn: lmdb.Transaction[bytes]) -> BaseHeader | None:
    """The base's header as ``txn`` sees it (``db``: ``base_db``'s); ``None``: never trimmed."""

    raw = None if db is None else txn.get(_HEADER_KEY, db=db)
    if raw is None:
        return None
    try:
        header = _header_decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CorruptRecordError(0, f"the log's base header does not decode ({error})") from None
    if header.format != BASE_FORMAT or header.point < 2 or header.chunks < 0:
        raise CorruptRecordError(
            0, f"the log's base header is of format {header.format} or names point {header.point}"
        )
    return header


def point(env: Environment) -> int:
    """The first sequence the log keeps after a trim; 0 when it was never trimmed."""

    db = base_db(env)
    if db is None:
        return 0
    with env.read() as txn:
        header = read_header(db, txn)
    return 0 if header is None else header.point


def _encode_chunk(rows: list[Row]) -> bytes:
    plain = _encoder.encode(BaseChunk(BASE_FORMAT, rows))
    packed = zstd.compress(plain)
    if packed is None or zstd.dense(packed, len(plain)):
        return _PLAIN + plain
    return _ZSTD + _U64.pack(len(plain)) + packed


def _decode_chunk(number: int, raw: bytes) -> list[Row]:
    try:
        kind = raw[:1]
        if kind == _PLAIN:
            plain = raw[1:]
        elif kind == _ZSTD:
            plain = zstd.decompress(raw[9:], _U64.unpack_from(raw, 1)[0])
        else:
            raise ValueError(f"an unknown chunk kind {kind!r}")
        chunk = _chunk_decoder.decode(plain)
    except (ValueError, struct.error, msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CorruptRecordError(
            0, f"chunk {number} of the log's base is damaged ({error})"
        ) from None
    if chunk.format != BASE_FORMAT:
        raise CorruptRecordError(0, f"chunk {number} of the log's base is of format {chunk.format}")
    return chunk.rows


def chunked(rows: Iterable[Row]) -> Iterator[bytes]:
    """``rows`` as stored chunks, about ``CHUNK_BYTES`` each."""

    batch: list[Row] = []
    size = 0
    for row in rows:
        batch.append(row)
        size += len(row[1]) + len(row[2]) + 16
        if size >= CHUNK_BYTES:
            yield _encode_chunk(batch)
            batch, size = [], 0
    if batch:
        yield _encode_chunk(batch)


def write(
    db: lmdb._Database,
    txn: lmdb.Transaction[bytes],
    point: int,
    chunks: list[bytes],
    rows: int,
    committed_at: int,
    trimmed_at: int,
    shape: int,
) -> BaseHeader:
    """Inside ``txn``: the base replaced by ``chunks`` (from ``chunked``), of the records before
    ``point`` (``db``: ``base_db(env, create=True)``'s), rows of version ``shape``."""

    txn.drop(db, delete=False)
    for number, chunk in enumerate(chunks):
        txn.put(_CHUNK_PREFIX + _U64.pack(number), chunk, db=db)
    header = BaseHeader(BASE_FORMAT, point, len(chunks), rows, committed_at, trimmed_at, shape)
    txn.put(_HEADER_KEY, _encoder.encode(header), db=db)
    return header


def rows(env: Environment, header: BaseHeader) -> Iterator[list[Row]]:
    """The base's rows a chunk at a time, each chunk read in a short transaction of its own
    (a trim replaces the base only with a whole new one; the caller holds ``header``'s)."""

    db = base_db(env)
    for number in range(header.chunks):
        with env.read() as txn:
            raw = None if db is None else txn.get(_CHUNK_PREFIX + _U64.pack(number), db=db)
            if raw is None:
                raise CorruptRecordError(0, f"chunk {number} of the log's base is missing")
            data = bytes(raw)
        yield _decode_chunk(number, data)


__all__ = [
    "BASE_DB",
    "BASE_FORMAT",
    "CHUNK_BYTES",
    "BaseChunk",
    "BaseHeader",
    "Row",
    "base_db",
    "chunked",
    "point",
    "read_header",
    "rows",
    "write",
]
