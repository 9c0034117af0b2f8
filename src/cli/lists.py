"""``durable-log list``: the records of one kind, filtered by fields, as a table, JSON Lines or CSV
(``audit.listing`` reads them; this module parses the command and prints)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import shutil
import sys
from typing import Any, Final

from ..audit.listing import MISSING, check_field, columns, value_at
from .common import (
    EXIT_OK,
    KIND_HELP,
    READ_ONLY,
    add_command,
    as_of_option,
    cell_text,
    count,
    json_option,
    plural_kind,
    readable,
    seq_or_time,
    store_argument,
    usage,
)

FORMATS: Final = ("table", "json", "csv")
CELL: Final = 40
"""Characters a table cell shows; a longer value is cut, ending in an ellipsis. The last column
(an entry's text) is cut at the terminal's width instead."""
TEXT: Final = "text"
"""An entry's column of what its messages say (``role: content``, one line), else its data."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "list",
        "the records of one kind, filtered by fields",
        "List the records of KIND as the store serves them, those whose FIELD (a dotted path: "
        "state.status, conversationId, owner.taskId) equals VALUE for every --where (VALUE is read "
        "as JSON when it parses, else as the string). A table shows the fields a person scans by, "
        "times in ISO 8601, an entry's text cut at the terminal's width, and leaves out columns "
        f"no record fills; --columns picks them. --json: one record per line; --format csv; {READ_ONLY}.",
        example="durable-log list demo-store tasks --where state.status=terminal",
    )
    store_argument(sub)
    sub.add_argument("kind", metavar="KIND", type=plural_kind, help=KIND_HELP)
    sub.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="keep the records whose FIELD equals VALUE (repeatable: all must hold)",
    )
    sub.add_argument(
        "--columns",
        metavar="FIELD,...",
        help=f"the columns of the table or CSV, dotted fields (entries: also {TEXT})",
    )
    sub.add_argument("--limit", type=count, metavar="N", help="at most N records")
    as_of_option(sub)
    json_option(sub, "one record per line (JSON Lines), as --format json")
    sub.add_argument(
        "--format", choices=FORMATS, default="table", help="table (default), json (lines) or csv"
    )
    sub.set_defaults(run=_list)


def _list(args: argparse.Namespace) -> int:
    from ..audit.jsonlines import to_json
    from ..audit.listing import list_records, parse_where

    form = "json" if args.json else args.format
    where = [parse_where(args.kind, text) for text in args.where]
    as_of, as_of_time = seq_or_time(args.as_of)
    if args.columns is not None:
        shown = _chosen(args.kind, args.columns)
    else:
        shown = columns(args.kind, where, every_field=form == "csv")
        if args.kind == "entries" and form == "table":
            shown.append(TEXT)
    table = Table(shown, shutil.get_terminal_size().columns, keep_empty=args.columns is not None)
    out = csv.writer(sys.stdout, lineterminator="\n") if form == "csv" else None
    if out is not None:
        out.writerow(shown)

    async def run() -> None:
        async for record in list_records(
            args.path, args.kind, where, args.limit, as_of=as_of, as_of_time=as_of_time
        ):
            if form == "json":
                print(to_json(record))
                continue
            values = [_value(record, name) for name in shown]
            if out is not None:
                out.writerow(
                    ["" if v is MISSING else cell_text(n, v) for n, v in zip(shown, values)]
                )
            else:
                table.add(values)

    asyncio.run(run())
    if form == "table":
        table.print()
    return EXIT_OK


def _chosen(kind: str, text: str) -> list[str]:
    """``--columns``: each a field of ``kind``'s records (refused naming those there are)."""

    chosen = [name.strip() for name in text.split(",")]
    if not all(chosen):
        raise usage(f"--columns {text!r} names an empty column: write id,kind,state.status")
    for name in chosen:
        if not (kind == "entries" and name == TEXT):
            check_field(kind, name)
    return chosen


def _value(record: Any, name: str) -> Any:
    if name == TEXT and "." not in name:
        said = entry_said(record)
        return MISSING if said is None else said
    return value_at(record, tuple(name.split(".")))


def entry_said(entry: Any) -> str | None:
    """What an entry says on one line: each message as ``role: text`` (a message's parts
    joined), ``|`` between them; else its data as JSON; None when it has neither."""

    from ..audit.jsonlines import to_json

    messages = entry.get("model") if isinstance(entry, dict) else None
    if isinstance(messages, list) and messages:
        said = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else message
            if isinstance(content, list):
                content = " ".join(
                    p.get("text", "") if isinstance(p, dict) else str(p) for p in content
                )
            role = message.get("role", "?") if isinstance(message, dict) else "?"
            said.append(f"{role}: {content if isinstance(content, str) else to_json(content)}")
        return " | ".join(said)
    if isinstance(entry, dict) and "data" in entry:
        return to_json(entry["data"])
    return None


def _cell(name: str, value: Any, limit: int) -> str:
    """A table cell: on one line, at most ``limit`` characters."""

    text = "" if value is MISSING else readable(cell_text(name, value))
    text = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Table:
    """Rows aligned in columns as wide as their widest cell; numbers right-aligned, the rest
    left; columns no row fills left out (unless ``keep_empty``, or there is no row); an entry's text, the last column,
    cut to end within ``width``. A row is kept as its cells (at most ``CELL`` characters each,
    ``width`` for an entry's text), never as the record's values, so a long listing holds text of
    bounded size per row."""

    def __init__(self, header: list[str], width: int, keep_empty: bool = False) -> None:
        self.header = header
        self.width = width
        self.keep_empty = keep_empty
        self._cells: list[list[str]] = []
        self._numeric = [True] * len(header)

    def add(self, values: list[Any]) -> None:
        self._cells.append(
            [
                _cell(name, value, self.width if name == TEXT else CELL)
                for name, value in zip(self.header, values, strict=True)
            ]
        )
        for at, value in enumerate(values):
            if not (
                value is MISSING or (isinstance(value, int | float) and not isinstance(value, bool))
            ):
                self._numeric[at] = False

    def print(self) -> None:

        kept = [
            at
            for at, name in enumerate(self.header)
            if self.keep_empty or not self._cells or any(row[at] for row in self._cells)
        ]
        header = [self.header[at] for at in kept]
        rows = [[row[at] for at in kept] for row in self._cells]
        numeric = [self._numeric[at] and bool(rows) for at in kept]
        widths = [max([len(name), *(len(row[i]) for row in rows)]) for i, name in enumerate(header)]
        if header[-1] == TEXT:
            room = self.width - sum(widths[:-1]) - 2 * (len(widths) - 1)
            widths[-1] = min(widths[-1], max(room, len(TEXT), 20))
            rows = [
                row[:-1]
                + [row[-1] if len(row[-1]) <= widths[-1] else row[-1][: widths[-1] - 1] + "…"]
                for row in rows
            ]

        def line(texts: list[str]) -> str:
            return "  ".join(
                text.rjust(size) if right else text.ljust(size)
                for text, size, right in zip(texts, widths, numeric, strict=True)
            ).rstrip()

        print(line(header))
        print(line(["-" * size for size in widths]))
        for row in rows:
            print(line(row))


__all__ = [
    "CELL",
    "FORMATS",
    "TEXT",
    "Table",
    "entry_said",
    "register",
]
