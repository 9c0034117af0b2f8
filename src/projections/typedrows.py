"""Typed rows for user projections: a table declared once with its key encoding and its value
type (a msgspec Struct, or any type msgspec encodes), so a fold reads and writes values, not bytes.

    COUNTS = TypedTable("counts", U64, Count)          # Count: a msgspec.Struct
    COUNTS.put(tables, conversation_id, Count(n=1))
    COUNTS.get(tables, conversation_id)                 # Count | None
    for conversation_id, count in COUNTS.items(tables): ...

Keys encode to bytes that sort as the keys do (``U64``: big-endian unsigned; ``TEXT``: UTF-8, in
code point order); values are msgpack. A stored value that does not decode as the declared type
raises ``CorruptProjectionError`` naming the database and key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, Generic, TypeVar

import msgspec

from ..errors import CorruptProjectionError
from .usertables import Tables

K = TypeVar("K")
V = TypeVar("V")


class KeyCodec(Generic[K]):
    """How a key type becomes bytes (in the same order) and back."""

    def __init__(self, encode: Callable[[K], bytes], decode: Callable[[bytes], K]) -> None:
        self.encode, self.decode = encode, decode


def _u64(value: int) -> bytes:
    if type(value) is not int or not 0 <= value < 2**64:
        raise ValueError(f"A U64 key is an int from 0 to 2**64-1, not {value!r:.60}")
    return value.to_bytes(8, "big")


U64: Final = KeyCodec[int](_u64, lambda raw: int.from_bytes(raw, "big"))
"""Unsigned 64-bit integers (record ids, sequences), big-endian: numeric order."""
TEXT: Final = KeyCodec[str](
    lambda value: value.encode("utf-8", "surrogatepass"),
    lambda raw: raw.decode("utf-8", "surrogatepass"),
)
"""Strings as UTF-8: code point order."""


class TypedTable(Generic[K, V]):
    """One of a projection's databases, with typed keys and values (``databases`` still names it)."""

    def __init__(self, db: str, key: KeyCodec[K], value: type[V]) -> None:
        self.db, self.key, self.value = db, key, value
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(value)

    def _decode(self, key: bytes, raw: bytes) -> V:
        try:
            return self._decoder.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise CorruptProjectionError(self.db, key) from None

    def get(self, tables: Tables, key: K) -> V | None:
        """The value at ``key``, or None."""

        encoded = self.key.encode(key)
        raw = tables.get(self.db, encoded)
        return None if raw is None else self._decode(encoded, raw)

    def put(self, tables: Tables, key: K, value: V) -> None:
        """Set ``key`` to ``value`` (inside ``fold``)."""

        tables.put(self.db, self.key.encode(key), self._encoder.encode(value))

    def delete(self, tables: Tables, key: K) -> None:
        """Remove ``key`` if present (inside ``fold``)."""

        tables.delete(self.db, self.key.encode(key))

    def items(self, tables: Tables) -> Iterator[tuple[K, V]]:
        """Every ``(key, value)``, in key order."""

        for key, raw in tables.items(self.db):
            yield self.key.decode(key), self._decode(key, raw)


__all__ = [
    "TEXT",
    "U64",
    "KeyCodec",
    "TypedTable",
]
