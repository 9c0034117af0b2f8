"""Finding things in a store by their words: entries by what their messages say, documents by their
values, tasks by their kind and state, now or as of an earlier log sequence.

The word index (``projections.search_index``) is brought level with the log before each query and
gives candidates newest first; each is then read from the store at the point asked, so a result
is what the store holds there, never what the index remembers.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from typing import Any, Final

import msgspec
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.errors import StorageRequestError
from pi_durable.types import DocumentId, TaskId

from ..errors import SearchIndexError
from ..log import Environment, WriteLog
from ..projections.rebuild import Following
from ..projections.search_index import (
    CHUNK,
    DOCUMENT,
    ENTRY,
    TASK,
    SearchIndex,
    all_words,
    holds,
    strings_of,
    task_words,
)
from ..storage.reads import StorageReads
from .unreadable import UNREADABLE_ERRORS, Unreadable, document_record, read_document

LIMIT: Final = 50
"""Entries a query returns per page (tasks: up to this many too)."""
DOCUMENT_LIMIT: Final = 20
"""Documents a query returns: each is read and its words checked at the point asked."""
CANDIDATES: Final = 5000
"""Postings of one word read to find documents or tasks (the newest); more: the note says so."""


class EntryHit(msgspec.Struct):
    id: int
    conversationId: int
    seq: int
    committedAt: int
    roles: list[str]
    text: str


class DocumentHit(msgspec.Struct):
    id: int
    kind: str
    seq: int
    """The sequence by which the document held every word (the version it wrote holds them)."""
    current: bool
    """True: the version in force at the point asked holds them; False: only an earlier one did."""
    text: str
    unreadable: Unreadable | None = None
    """Set when the version in force cannot be read (a stored change fails to apply): why."""


class TaskHit(msgspec.Struct):
    id: int
    kind: str
    status: str
    conversationId: int | None


class SearchResults(msgspec.Struct):
    query: str
    words: list[str]
    asOf: int | None
    head: int
    entries: list[EntryHit]
    moreEntriesBefore: int | None
    """The ``before`` of the next page of entries (None: no more)."""
    documents: list[DocumentHit]
    tasks: list[TaskHit]
    capped: bool
    """Some word is so common that only its newest postings were looked at for documents/tasks."""


Progress = Callable[[int, int], None]


def index_exists(path: str | os.PathLike[str]) -> bool:
    from ..projections.search_index import INDEX_DIR

    return os.path.isfile(os.path.join(os.fspath(path), INDEX_DIR, "data.mdb"))


def remove_index(path: str | os.PathLike[str]) -> None:
    """Delete the store's word index, with what a compaction of it left beside it (the next
    search builds it again)."""

    from ..projections.search_index import INDEX_DIR

    where = os.path.join(os.path.abspath(path), INDEX_DIR)
    for leftover in (where, where + ".compacting", where + ".retired"):
        shutil.rmtree(leftover, ignore_errors=True)


def catch_up(
    path: str | os.PathLike[str], index: SearchIndex, progress: Progress | None = None
) -> int:
    """Fold the records the index lacks (all of them for a new index, or one of another store
    or format); returns how many."""

    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        head = log.head()
        for _ in range(3):  # another process may be resetting it too: at most a few rounds
            header = index.header()
            if (
                header is not None
                and header.foreign() is None  # this format, words split by this Unicode
                and header.store_id == env.store_id
                and header.folded_seq <= head
            ):
                break
            index.reset(env.store_id, header)  # of another store, format, Unicode, or ahead
        else:
            raise SearchIndexError(
                f"The search index at {index.path} keeps being reset by other processes; try again"
            )
        core = Following(env, log)  # a rebuild elsewhere may swap generations meanwhile

        def document_at(id: int, seq: int) -> Any:
            txn, model = core.read()
            try:
                with txn:
                    found = model.materialize(txn, id, seq)
            except (
                StorageRequestError
            ):  # a current-only document keeps no past values: nothing to index
                return None
            return None if found is None else found["value"]

        folded, done = header.folded_seq, 0
        while folded < head:
            commits = log.take(folded + 1, head, CHUNK)
            if not commits:
                break
            if not index.fold(commits, folded, env.store_id, document_at):
                header = index.header()  # another process folded these: go on from its checkpoint
                if header is None or header.foreign() is not None:
                    raise SearchIndexError(  # a process of another Python reset it meanwhile
                        f"The search index at {index.path} was reset meanwhile by another "
                        "program or Python; try again"
                    )
                folded = header.folded_seq
                continue
            folded = commits[-1].seq
            done += len(commits)
            if progress is not None:
                progress(folded, head)
        return done
    finally:
        env.close()


async def search(
    index: SearchIndex,
    storage: Any,
    reader: StorageReads,
    query: str,
    as_of: int | None,
    before: int | None = None,
    limit: int = LIMIT,
) -> SearchResults:
    """What ``query``'s words (all of them) find at ``as_of`` (None: now); entries newest first,
    from ``before`` (a sequence) down when paging. ``storage`` is the open store (its log gives
    commit times, its documents earlier versions); ``reader`` reads it at the point."""

    terms = all_words(query)
    head = storage.log.head()
    at = head if as_of is None else as_of
    results = SearchResults(query, terms, as_of, head, [], None, [], [], False)
    if not terms:
        return results
    start = at if before is None else min(at, before)
    with index.env.begin() as txn:
        index.check(txn)  # words split as this Python splits them, or a refusal saying why
        found: list[tuple[int, int, bytes]] = []
        for seq, id, value in index.join(txn, terms, ENTRY, start):
            if len(found) >= limit and seq != found[-1][0]:
                results.moreEntriesBefore = seq
                break
            found.append((seq, id, value))
        documents, capped_documents = _candidates(index, txn, terms, DOCUMENT, at)
        tasks, capped_tasks = _candidates(index, txn, terms, TASK, at)
        # the index knows each task's words at any point: only the tasks that match then are read
        tasks = [
            (seq, id) for seq, id in tasks if set(terms) <= (index.task_words(txn, id, at) or set())
        ][:limit]
    results.capped = capped_documents or capped_tasks
    times: dict[int, int] = {}
    for seq, id, _value in found:
        lookup = await storage.entry(id, CTX)  # written at seq <= the point, never changed since
        if lookup is None:
            continue
        entry = lookup["entry"]
        if seq not in times:
            commit = storage.log.get(seq)
            times[seq] = 0 if commit is None else commit.committed_at
        results.entries.append(
            EntryHit(
                id, int(entry["conversationId"]), seq, times[seq], roles_of(entry), said(entry)
            )
        )
    wanted = set(terms)
    for seq, id in documents:
        if len(results.documents) >= min(limit, DOCUMENT_LIMIT):
            break
        hit = await _document_hit(storage, reader, id, seq, wanted)
        if hit is not None:
            results.documents.append(hit)
    for _, id in tasks:
        if len(results.tasks) >= limit:
            break
        task = await reader.task(TaskId(id), CTX)
        if task is None:
            continue
        kind_words, state_words = task_words(task)
        if wanted <= kind_words | state_words:
            state: Any = task.get("state", {})
            conversation = task.get("conversationId")
            results.tasks.append(
                TaskHit(
                    id,
                    str(task.get("kind", "")),
                    str(state.get("status", "")),
                    conversation if isinstance(conversation, int) else None,
                )
            )
    return results


def _candidates(
    index: SearchIndex, txn: Any, terms: list[str], kind: bytes, at: int
) -> tuple[list[tuple[int, int]], bool]:
    """``(seq, id)`` of the records that posted every word at or before ``at``, newest first
    (``seq``: the latest of their words' postings), and whether a word had too many to read."""

    newest: dict[int, int] | None = None
    capped = False
    for word in terms:
        seen: dict[int, int] = {}
        for count, (seq, id, _) in enumerate(index.walk(txn, word, kind, at)):
            if count >= CANDIDATES:
                capped = True
                break
            seen.setdefault(id, seq)
        if newest is None:
            newest = seen
        else:
            newest = {id: max(seq, seen[id]) for id, seq in newest.items() if id in seen}
        if not newest:
            break
    ordered = sorted(((seq, id) for id, seq in (newest or {}).items()), reverse=True)
    return ordered, capped


async def _document_hit(
    storage: Any, reader: StorageReads, id: int, seq: int, wanted: set[str]
) -> DocumentHit | None:
    """The document if its version in force at the point holds every word, else the version
    written at ``seq`` (when every word had been added) if that one does."""

    current = await read_document(reader, DocumentId(id), "current")
    if current is None:
        return None  # not created yet at the point, or retired
    unreadable = current if isinstance(current, Unreadable) else None
    if unreadable is None:
        kind = str(current.get("record", {}).get("kind", ""))
        if holds(current.get("value"), wanted):
            return DocumentHit(id, kind, seq, True, _around(current.get("value"), wanted))
    else:  # listed all the same, saying why its value cannot be shown
        kind = str((await document_record(reader, id) or {}).get("kind", ""))
    earlier = await _earlier(storage, id, seq)
    if earlier is not None and holds(earlier.get("value"), wanted):
        return DocumentHit(id, kind, seq, False, _around(earlier.get("value"), wanted), unreadable)
    return None if unreadable is None else DocumentHit(id, kind, seq, False, "", unreadable)


async def _earlier(storage: Any, id: int, seq: int) -> Any:
    """The document's version written at ``seq``, or None if it keeps no past values or that
    one cannot be read either."""

    try:
        return await storage.document(DocumentId(id), seq, CTX)
    except (StorageRequestError, *UNREADABLE_ERRORS):  # current-only, or unreadable there
        return None


def roles_of(entry: Any) -> list[str]:
    """The roles of an entry's messages (user, assistant, tool...), in order, once each."""

    model = entry.get("model") if isinstance(entry, dict) else None
    if not isinstance(model, list):
        return []
    return list(
        dict.fromkeys(
            str(message["role"])
            for message in model
            if isinstance(message, dict) and "role" in message
        )
    )


def said(entry: Any, limit: int = 300) -> str:
    """An entry's words in one line: its messages' text, else its data."""

    parts = [
        text
        for name in ("model", "data")
        if name in entry
        for text in strings_of(entry[name], frozenset({"role", "type"}))
    ]
    return _cut(" ".join(reversed(parts)), limit)


def _around(value: Any, wanted: set[str], limit: int = 300) -> str:
    """The part of a value's text around the first of ``wanted``'s words (its start if none)."""

    texts = list(reversed(list(strings_of(value))))
    for text in texts:
        lowered = text.lower()
        found = [
            match.start()
            for word in wanted
            if (match := re.search(r"(?<!\w)" + re.escape(word), lowered))
        ]
        if found:
            start = max(0, min(found) - limit // 3)
            return ("…" if start else "") + _cut(text[start : start + 2 * limit], limit)
    return _cut(" ".join(text[: 2 * limit] for text in texts)[: 2 * limit], limit)


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = [
    "CANDIDATES",
    "DOCUMENT_LIMIT",
    "LIMIT",
    "DocumentHit",
    "EntryHit",
    "Progress",
    "SearchResults",
    "TaskHit",
    "catch_up",
    "index_exists",
    "roles_of",
    "said",
    "search",
]
