"""The web view's query parameters and path numbers, every one parsed by ``parameter``: by the
rules of the command line's own parsers (ASCII digits, a stated range, a text too long to be a
number refused unread), a bad value is a ``BadQueryError`` naming the parameter (a 400 page)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..audit.numbers import INT64_MAX, Whole, parse_time, point, whole
from ..errors import BadQueryError, NumberError
from ..log.records import WRITE_TYPES

NUMBERS: Final = {
    "after": Whole("a cursor (an id)", 0),
    "before": Whole("a log sequence or an entry id", 1),
    "conversation": Whole("a conversation id", 1),
    "id": Whole("an id", 0, INT64_MAX),
    "seq": Whole("a log sequence", 0),
    "skip": Whole("a count of rows to skip", 0),
    "versions": Whole("a version number", 1),
}
"""Whole-number parameters (and path parts: ``id``, ``seq``) and their rules."""
TIMES: Final = ("since", "until")
"""ISO 8601 times (as ``tail --since``)."""
POINTS: Final = ("as_of",)
"""Points of the log: a sequence or a time (as ``show --as-of``)."""
KINDS: Final = ("kind",)
"""Write kinds, repeatable (as ``tail --type``)."""


def parameter(query: Mapping[str, str], name: str) -> Any:
    """The value of parameter ``name`` of ``query`` (a request's query or its path's parts),
    None when it is absent or empty: an ``int`` for a number, Unix ms for a time, ``("seq", n)``
    or ``("time", ms)`` for a point, a frozenset of kinds (None: every kind)."""

    if name in KINDS:
        getall = getattr(query, "getall", None)
        values = [
            value
            for value in (getall(name, []) if getall is not None else [query.get(name, "")])
            if value
        ]
        unknown = [value for value in values if value not in WRITE_TYPES]
        if unknown:
            raise BadQueryError(
                f"{name}: unknown write kind(s) {unknown}; known: {', '.join(WRITE_TYPES)}"
            )
        return frozenset(values) if values else None
    text = query.get(name, "").strip()
    if not text:
        return None
    try:
        if name in NUMBERS:
            return whole(text, NUMBERS[name])
        if name in TIMES:
            return parse_time(text)
        if name in POINTS:
            return point(text)
    except NumberError as error:
        raise BadQueryError(f"{name}: {error}") from None
    raise KeyError(
        f"no rule for the query parameter {name!r}"
    )  # a bug of the view, never a request's


__all__ = [
    "KINDS",
    "NUMBERS",
    "POINTS",
    "TIMES",
    "parameter",
]
