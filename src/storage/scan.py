"""Cursors and pages of the contract's scans: ``{"after": id, "order": ...}``.

A cursor continues the scan that made it: its order is kept, and a query that asks for the other
order is a foreign cursor and is refused, as the reference backends refuse it.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any, Literal, NamedTuple

from ..projections import StorageRequestError
from ..projections.readmodel import MAX_SAFE_INTEGER

Order = Literal["ascending", "descending"]
ORDERS = ("ascending", "descending")


class ScanStart(NamedTuple):
    order: Order
    after: int | None


def _is_safe_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_SAFE_INTEGER


def scan_start(requested: Any, cursor: Any, default: Order) -> ScanStart:
    """Where a scan starts; malformed and conflicting cursors raise ``StorageRequestError``."""

    if requested is not None and requested not in ORDERS:
        raise StorageRequestError(f"Invalid scan order: {requested}")
    if cursor is None:
        return ScanStart(requested or default, None)
    after = cursor.get("after")
    if not _is_safe_int(after):
        raise StorageRequestError("Invalid storage cursor")
    stored = cursor.get("order")
    if stored is not None and stored not in ORDERS:
        raise StorageRequestError("Invalid storage cursor")
    order = stored or default
    if requested is not None and requested != order:
        raise StorageRequestError(f"The cursor continues a {order} scan; the query asks for {requested}")
    return ScanStart(order, after)


def cursor_after(cursor: Any) -> int | None:
    """The position of a document scan's cursor, whose order is always ascending."""

    if cursor is None:
        return None
    after = cursor.get("after")
    if not _is_safe_int(after):
        raise StorageRequestError("Invalid storage cursor")
    if after < 1:
        raise TypeError(f"{after!r} is not a positive ID")  # as the reference's id_from_number
    return after  # type: ignore[no-any-return]


def take_page(records: Iterable[Any], limit: int, order: Order) -> dict[str, Any]:
    """At most ``limit`` records, and a cursor when one more exists (it pulls ``limit + 1``)."""

    values = list(islice(records, limit + 1)) if limit >= 0 else []
    return page_of(values[:limit], len(values) > limit, order)


def page_of(items: list[Any], more: bool, order: Order) -> dict[str, Any]:
    """A page, with the cursor that continues it when ``more`` records follow."""

    if not more:
        return {"items": items}
    return {"items": items, "next": {"after": items[-1]["id"], "order": order}}

