"""Walking a range of keys ``prefix + u64(id)`` of one table, in either direction: the scans
the read model, the projector and the document path share."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import lmdb

from . import tables as t

_U64_FROM = struct.Struct(">Q").unpack_from


def rows_in_range(
    txn: lmdb.Transaction[bytes],
    db: lmdb._Database,
    prefix: bytes,
    low: int,
    high: int,
    descending: bool,
) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` for keys ``prefix + u64(id)`` with ``low <= id <= high``, in key order.

    Keys of one table share a shape and their prefixes are prefix-free, so the range is just
    ``prefix + u64(low) <= key <= prefix + u64(high)``: a byte comparison per row.
    """

    bounds = key_range(prefix, low, high)
    if bounds is None:
        return
    first, last = bounds
    cursor = txn.cursor(db=db)
    found = seek(cursor, first, last, descending)
    step = cursor.prev if descending else cursor.next
    key_of, value_of = cursor.key, cursor.value
    while found:
        key = key_of()
        if key < first or key > last:
            return
        yield key, value_of()
        found = step()


def key_range(prefix: bytes, low: int, high: int) -> tuple[bytes, bytes] | None:
    """The first and last key of ``prefix + u64(id)`` for ``low <= id <= high``; None if empty."""

    low = max(low, 0)
    high = min(high, t.MAX_ID)
    if low > high:
        return None
    return prefix + t.u64(low), prefix + t.u64(high)


def seek(cursor: lmdb.Cursor[bytes], first: bytes, last: bytes, descending: bool) -> bool:
    """Put ``cursor`` on the range's first row in scan order (if any row is there, the caller
    checks the bounds)."""

    if not descending:
        return cursor.set_range(first)
    if hasattr(cursor, "seek_at_or_before"):  # a view's cursor walks down by itself
        return cursor.seek_at_or_before(last)  # type: ignore[no-any-return]
    if cursor.set_range(last):
        return cursor.key() == last or cursor.prev()
    return cursor.last()


def ids_in_range(
    txn: lmdb.Transaction[bytes],
    db: lmdb._Database,
    prefix: bytes,
    low: int,
    high: int,
    descending: bool,
) -> Iterator[tuple[int, bytes]]:
    """``(id, value)``: ``rows_in_range`` with the trailing id of each key."""

    for key, value in rows_in_range(txn, db, prefix, low, high, descending):
        yield _U64_FROM(key, len(key) - 8)[0], value


__all__ = [
    "ids_in_range",
    "key_range",
    "rows_in_range",
    "seek",
]
