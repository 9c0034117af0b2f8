"""Cursors and pages of the contract's scans: ``{"after": id, "order": ...}``.

A cursor continues the scan that made it: its order is kept, and a query that asks for the other
order is a foreign cursor and is refused, as the reference backends refuse it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any, Literal, NamedTuple

from ..projections import StorageRequestError
from ..projections.readmodel import MAX_SAFE_INTEGER

Order = Literal["ascending", "descending"]
ORDERS = ("ascending", "descending")


class ScanStart(NamedTuple):
    order: Order
    after: int | None


def is_safe_int(value: object) -> bool:
    """An integer the contract accepts as an id or cursor (not a bool, within 2**53 - 1)."""

    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_SAFE_INTEGER


def scan_start(requested: Any, cursor: Any, default: Order) -> ScanStart:
    """Where a scan starts; malformed and conflicting cursors raise ``StorageRequestError``."""

    if requested is not None and requested not in ORDERS:
        raise StorageRequestError(f"Invalid scan order: {requested}")
    if cursor is None:
        return ScanStart(requested or default, None)
    after = cursor.get("after")
    if not is_safe_int(after):
        raise StorageRequestError("Invalid storage cursor")
    stored = cursor.get("order")
    if stored is not None and stored not in ORDERS:
        raise StorageRequestError("Invalid storage cursor")
    order = stored or default
    if requested is not None and requested != order:
        raise StorageRequestError(
            f"The cursor continues a {order} scan; the query asks for {requested}"
        )
    return ScanStart(order, after)


def cursor_after(cursor: Any) -> int | None:
    """The position of a document scan's cursor, whose order is always ascending."""

    if cursor is None:
        return None
    after = cursor.get("after")
    if not is_safe_int(after):
        raise StorageRequestError("Invalid storage cursor")
    if after < 1:
        raise TypeError(f"{after!r} is not a positive ID")  # as the reference's id_from_number
    return after  # type: ignore[no-any-return]


def take_page(
    candidates: Iterable[Any], limit: Any, order: Order, keep: Callable[[Any], bool] | None = None
) -> dict[str, Any]:
    """At most ``limit`` of the candidates ``keep`` accepts, and a cursor when one more exists.

    Any limit the reference accepts gives its page: it compares ``len(page) > limit`` before
    each candidate and slices ``page[:limit]``, so a negative limit is an empty page, a huge one
    is every record, and a limit of another type fails (or not) exactly where it fails there.
    """

    if isinstance(limit, int):
        if limit < 0:
            return {"items": []}
        kept = candidates if keep is None else filter(keep, candidates)
        values = list(islice(kept, limit + 1)) if limit < sys.maxsize else list(kept)
        return page_of(values[:limit], len(values) > limit, order)
    values = []
    for record in candidates:
        if len(values) > limit:
            break
        if keep is None or keep(record):
            values.append(record)
    return reference_page(values, limit, order)


def reference_page(values: list[Any], limit: Any, order: Order) -> dict[str, Any]:
    """The page the reference makes of the records its loop collected, for a limit of any type."""

    if not values:
        return {"items": []}
    items = values[:limit]
    if len(values) <= limit:
        return {"items": items}
    return {"items": items, "next": {"after": items[-1]["id"], "order": order}}


def page_of(items: list[Any], more: bool, order: Order) -> dict[str, Any]:
    """A page, with the cursor that continues it when ``more`` records follow."""

    if not more:
        return {"items": items}
    return {"items": items, "next": {"after": items[-1]["id"], "order": order}}


__all__ = [
    "ORDERS",
    "Order",
    "ScanStart",
    "cursor_after",
    "is_safe_int",
    "page_of",
    "reference_page",
    "scan_start",
    "take_page",
]
