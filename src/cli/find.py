"""``durable-log search``: entries, documents and tasks by their words, now or as of a point.

The first search of a store builds its word index (``search.index`` in the store directory,
a projection of the log like the others: delete it and the next search builds it again)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import TYPE_CHECKING

import msgspec

from ..audit.export import read_as_of, seq_at
from ..audit.numbers import format_time
from ..audit.search import SearchResults, catch_up, index_exists, remove_index, search
from ..audit.stats import require_store
from ..storage.lmdb_storage import LmdbStorage

if TYPE_CHECKING:
    from ..projections.search_index import SearchIndex
from .common import (
    EXIT_OK,
    READ_ONLY,
    add_command,
    as_of_option,
    json_option,
    note,
    print_json,
    readable,
    seq_or_time,
    sequence,
    store_argument,
    usage,
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "search",
        "find entries by their text, documents by their value, tasks by kind and state",
        f"Find what holds every word of TEXT: entries by what their messages say, documents by their "
        f"value, tasks by their kind and state (words are letters and digits, case ignored); the store is "
        f"{READ_ONLY}. The first search builds the store's word index "
        f"in PATH/search.index (delete it to reclaim its bytes: the next search builds it again).",
        example="durable-log search demo-store 'writer killed'",
    )
    store_argument(sub)
    sub.add_argument(
        "text",
        nargs="+",
        metavar="TEXT",
        help="the words to find (all of them), as one argument or several",
    )
    as_of_option(sub)
    sub.add_argument(
        "--before",
        type=sequence,
        metavar="SEQ",
        help="entries written at or before this sequence (the next page)",
    )
    json_option(sub, '{"words", "asOf", "head", "entries", "documents", "tasks", ...}')
    sub.set_defaults(run=_search)


def _search(args: argparse.Namespace) -> int:
    require_store(args.path)
    args.text = " ".join(args.text)  # the words as typed, quoted or not
    if not args.text.strip():
        raise usage("TEXT is empty: give the words to find")
    from ..projections.search_index import all_words

    if not all_words(args.text):
        raise usage(f"{args.text!r} holds no word to find: words are letters and digits")
    results = asyncio.run(_run(args))
    if args.json:
        print_json(msgspec.to_builtins(results))
    else:
        print(readable(format_results(results)))
    return EXIT_OK


async def _run(args: argparse.Namespace) -> SearchResults:
    fresh = not index_exists(args.path)
    if fresh:
        note(
            f"durable-log: building the word index of {os.path.abspath(args.path)} (once; later "
            "searches fold only new records)"
        )
    index = _built_index(args.path, fresh)
    try:
        if fresh:
            print(
                f"durable-log: the index takes {index.size():,} bytes in {index.path}",
                file=sys.stderr,
            )
        storage = await LmdbStorage.open(args.path, readonly=True)
        try:
            as_of, as_of_time = seq_or_time(args.as_of)
            if as_of_time is not None:
                as_of = seq_at(storage.log, as_of_time)
            reader = await read_as_of(storage, as_of)
            return await search(index, storage, reader, args.text, as_of, args.before)
        finally:
            await storage.close()
    finally:
        index.close()


def _built_index(path: str, fresh: bool) -> SearchIndex:
    """The store's word index, level with its log. Folded on this thread, not a worker's: Ctrl-C
    stops the fold where it is (a worker would fold on while the index closes under it); a
    first build it stops is removed, so the next search builds it whole."""

    from ..projections.search_index import SearchIndex

    index: SearchIndex | None = None
    try:
        index = SearchIndex(path, create=True)
        catch_up(path, index)
        if fresh:
            index.compact()
        return index
    except BaseException:
        if index is not None:
            index.close()
        if fresh:
            remove_index(path)
        raise


def format_results(results: SearchResults) -> str:
    """The readable form: a section per kind, one line per result, with what ``show`` takes."""

    point = "now" if results.asOf is None else f"as of log sequence {results.asOf}"
    lines = [f"{' '.join(results.words)!r} {point} (log head {results.head}):"]
    lines.append(
        f"entries ({len(results.entries)}{'+' if results.moreEntriesBefore is not None else ''}):"
    )
    for hit in results.entries:
        roles = "/".join(hit.roles) or "-"
        lines.append(
            f"  entry {hit.id}  conversation {hit.conversationId}  seq {hit.seq}  {format_time(hit.committedAt)}  {roles}: {hit.text}"
        )
    if results.moreEntriesBefore is not None:
        lines.append(f"  … older ones: --before {results.moreEntriesBefore}")
    lines.append(f"documents ({len(results.documents)}):")
    for doc in results.documents:
        which = (
            f"in the version in force, since seq {doc.seq}"
            if doc.current
            else f"in an earlier version, written at seq {doc.seq}"
        )
        said = f": {doc.text}"
        if doc.unreadable is not None:  # the version in force cannot be read: why, and if an
            which = f"unreadable now: {doc.unreadable.describe()}"  # earlier one holds the words
            said = f"; in the version written at seq {doc.seq}: {doc.text}" if doc.text else ""
        lines.append(f"  document {doc.id}  {doc.kind}  {which}{said}")
    lines.append(f"tasks ({len(results.tasks)}):")
    for task in results.tasks:
        where = "" if task.conversationId is None else f"  conversation {task.conversationId}"
        lines.append(f"  task {task.id}  {task.kind}  {task.status}{where}")
    if results.capped:
        lines.append(
            "(some word is very common: documents and tasks were looked for among its newest postings only)"
        )
    return "\n".join(lines)


__all__ = [
    "format_results",
    "register",
]
