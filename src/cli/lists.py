"""``durable-log list``: the records of one kind, filtered by fields, as a table, JSON Lines or CSV
(``audit.listing`` reads them; this module parses the command and prints)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
from typing import Any, Final

from ..audit.listing import LIST_KINDS, MISSING, columns, value_at
from .common import (
    EXIT_OK,
    READ_ONLY,
    add_command,
    as_of_option,
    count,
    readable,
    seq_or_time,
    store_argument,
)

FORMATS: Final = ("table", "json", "csv")
CELL: Final = 40
"""Characters a table cell shows; a longer value is cut, ending in an ellipsis."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "list",
        "the records of one kind, filtered by fields",
        "List the records of KIND as the store serves them, those whose FIELD (a dotted path into "
        "the record: state.status, conversationId, owner.taskId) equals VALUE for every --where; "
        'VALUE is compared as JSON when it parses as JSON (3, true, null, "3"), else as the '
        "string (running). Served from an index where a filter fits one (tasks and submissions by "
        "status, entries by conversationId, conversations by owner), else from a scan; ids "
        "ascending (entries: conversation by conversation). --format json prints one record per "
        f"line; csv a header of the kind's fields, nested values as JSON; {READ_ONLY}.",
    )
    store_argument(sub)
    sub.add_argument("kind", metavar="KIND", choices=LIST_KINDS, help=" | ".join(LIST_KINDS))
    sub.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="keep the records whose FIELD equals VALUE (repeatable: all must hold)",
    )
    sub.add_argument("--limit", type=count, metavar="N", help="at most N records")
    as_of_option(sub)
    sub.add_argument(
        "--format", choices=FORMATS, default="table", help="table (default), json (lines) or csv"
    )
    sub.set_defaults(run=_list)


def _list(args: argparse.Namespace) -> int:
    from ..audit.jsonlines import to_json
    from ..audit.listing import list_records, parse_where

    where = [parse_where(args.kind, text) for text in args.where]
    as_of, as_of_time = seq_or_time(args.as_of)
    shown = columns(args.kind, where, every_field=args.format == "csv")
    paths = [tuple(name.split(".")) for name in shown]
    table = Table(shown, to_json)
    out = csv.writer(sys.stdout, lineterminator="\n") if args.format == "csv" else None
    if out is not None:
        out.writerow(shown)

    async def run() -> None:
        async for record in list_records(
            args.path, args.kind, where, args.limit, as_of=as_of, as_of_time=as_of_time
        ):
            if args.format == "json":
                print(to_json(record))
            elif out is not None:
                out.writerow([_text(value_at(record, path), to_json) for path in paths])
            else:
                table.add([value_at(record, path) for path in paths])

    asyncio.run(run())
    if args.format == "table":
        table.print()
    return EXIT_OK


def _text(value: Any, to_json: Any) -> str:
    """A value as one cell's text: a string as it is, anything else as JSON, nothing if absent."""

    if value is MISSING:
        return ""
    if isinstance(value, str):
        return value
    return str(to_json(value))


def _cell(value: Any, to_json: Any) -> str:
    """A table cell: on one line, at most ``CELL`` characters."""

    text = readable(_text(value, to_json))
    text = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return text if len(text) <= CELL else text[: CELL - 1] + "…"


class Table:
    """Rows aligned in columns as wide as their widest cell; numbers right-aligned, the rest
    left. A row is kept as its cells (at most ``CELL`` characters each), never as the record's
    values, so a long listing holds text of bounded size per row."""

    def __init__(self, header: list[str], to_json: Any) -> None:
        self.header = header
        self._to_json = to_json
        self._cells: list[list[str]] = []
        self._numeric = [True] * len(header)

    def add(self, values: list[Any]) -> None:
        self._cells.append([_cell(value, self._to_json) for value in values])
        for at, value in enumerate(values):
            if not (
                value is MISSING or (isinstance(value, int | float) and not isinstance(value, bool))
            ):
                self._numeric[at] = False

    def print(self) -> None:
        numeric = [right and bool(self._cells) for right in self._numeric]
        widths = [
            max([len(name), *(len(row[at]) for row in self._cells)])
            for at, name in enumerate(self.header)
        ]

        def line(texts: list[str]) -> str:
            return "  ".join(
                text.rjust(width) if right else text.ljust(width)
                for text, width, right in zip(texts, widths, numeric, strict=True)
            ).rstrip()

        print(line(self.header))
        print(line(["-" * width for width in widths]))
        for row in self._cells:
            print(line(row))


__all__ = [
    "CELL",
    "FORMATS",
    "Table",
    "register",
]
