"""Every page as data: a list page's path plus ``.json`` or ``.csv`` (``/tasks.json``,
``/conversations.csv``), a record page's plus ``.json`` (``/conversations/1.json``). The same
handler answers both: it reads what the HTML page shows, with the same query parameters and the
same refusals (a bad parameter is a 400 naming it, in the format asked), and hands the rows here.

JSON of a list: the rows as the store reads them and the address of the next (and, where the page
has one, the previous) page in the same format, so a client pages by following links. CSV: one
header row (every key any row has, in the order first seen) and one line per row; a nested value is
written as its JSON text, a missing one as an empty cell.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import Any, Final
from urllib.parse import urlencode

import msgspec
from aiohttp import web

from ..audit.jsonlines import to_json
from ..projections.search_index import Activity
from .lists import FilteredPage, ListPage
from .text import utf8_safe

SUFFIXES: Final = {".json": "json", ".csv": "csv"}
"""What a data path ends with, and the format it asks for."""


class ListData(msgspec.Struct, frozen=True):
    """A list page as JSON: its rows, the addresses of the pages beside it (None: none), the
    point it was read at (None: now) and the log's head."""

    rows: list[Any]
    next: str | None
    previous: str | None
    asOf: int | None
    head: int


def asked(request: web.Request) -> str | None:
    """``"json"`` or ``"csv"`` when the path asks for data, else None (the HTML page)."""

    for suffix, name in SUFFIXES.items():
        if request.path.endswith(suffix):
            return name
    return None


def link(request: web.Request, **changes: int | None) -> str:
    """This address (data suffix kept) with some query parameters changed (None: left out), the
    token never."""

    query = {
        key: value for key, value in request.query.items() if key != "token" and key not in changes
    }
    query.update({key: str(value) for key, value in changes.items() if value is not None})
    return request.path + ("?" + urlencode(query) if query else "")


def rows(
    request: web.Request,
    found: Iterable[Any],
    *,
    as_of: int | None,
    head: int,
    next: str | None = None,
    previous: str | None = None,
) -> web.Response:
    """A list page's rows as the data its path asks for (``asked`` must not be None)."""

    builtins = [msgspec.to_builtins(row) for row in found]
    if asked(request) == "csv":
        return web.Response(
            text=utf8_safe(table(builtins)), content_type="text/csv", charset="utf-8"
        )
    return record(ListData(builtins, next, previous, as_of, head))


def by_cursor(
    request: web.Request, page: ListPage | FilteredPage, as_of: int | None, head: int
) -> web.Response:
    """A list paged by ``?after=`` (an id) as data: its rows and the next page's address."""

    next = None if page.after is None else link(request, after=page.after)
    return rows(request, page.items, as_of=as_of, head=head, next=next)


def active(
    request: web.Request,
    found: list[tuple[Activity, Any]],
    skip: int,
    count: int,
    total: int,
    head: int,
) -> web.Response:
    """Conversations by newest activity as data (paged by ``?skip=``): each record with its
    entry count and the sequence and time of its last activity."""

    return rows(
        request,
        [
            {
                **(record or {"id": activity.conversationId}),
                "entries": activity.entries,
                "lastSeq": activity.lastSeq,
                "lastAt": activity.lastAt,
            }
            for activity, record in found
        ],
        as_of=None,
        head=head,
        next=link(request, skip=skip + count) if skip + count < total else None,
        previous=link(request, skip=max(skip - count, 0)) if skip else None,
    )


def record(value: Any, status: int = 200) -> web.Response:
    """One value as JSON (as ``durable-log show`` and ``tail --json`` write it). A page's Struct
    is made builtins first: a string the fast encoder refuses (a lone surrogate an agent wrote)
    is then written by ``to_json``'s own writer, which knows only builtins."""

    return web.Response(
        text=utf8_safe(to_json(msgspec.to_builtins(value))),
        content_type="application/json",
        status=status,
    )


def refusal(request: web.Request, status: int, message: str) -> web.Response | None:
    """A refused data request in its own format (None: the path asks for HTML): JSON
    ``{"error": ...}`` for ``.json``, the message as plain text for ``.csv``."""

    wanted = asked(request)
    if wanted is None:
        return None
    if wanted == "json":
        return record({"error": message}, status)
    return web.Response(text=utf8_safe(message + "\n"), content_type="text/plain", status=status)


def table(found: list[Any]) -> str:
    """CSV of rows (each a mapping, or one value): a header of every key in the order first
    seen, a line per row; strings as they are, other values as their JSON text."""

    columns: dict[str, None] = {}
    for row in found:
        columns.update(dict.fromkeys(row if isinstance(row, dict) else ["value"]))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(columns)
    for row in found:
        values = row if isinstance(row, dict) else {"value": row}
        writer.writerow([_cell(values[name]) if name in values else "" for name in columns])
    return out.getvalue()


def _cell(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else to_json(value)


__all__ = [
    "SUFFIXES",
    "ListData",
    "active",
    "asked",
    "by_cursor",
    "link",
    "record",
    "refusal",
    "rows",
    "table",
]
