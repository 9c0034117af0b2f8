"""What each page shows, read from the store through its read-only handle and the CLI's read
helpers (``stats``, ``Tail``, ``show``): one short read transaction per read, never one held
across a request, so the writer is never blocked."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.types import ConversationId, DocumentId, Seq

from ..audit.export import seq_at
from ..audit.unreadable import Unreadable, document_record, read_document
from ..errors import BadQueryError, HistoryTrimmed
from ..projections import StorageRequestError
from ..storage.lmdb_storage import LmdbStorage
from ..storage.reads import StorageReads
from . import jsondiff
from .lists import ListPage
from .text import brief

PAGE: Final = 100
"""Rows of a list page (conversations, documents, log batches)."""
ENTRY_CAP: Final = 2000
"""Entries a conversation page draws; the page links to the older and newer ones."""
BRANCH_CAP: Final = 50
"""Entries drawn of each fork under a conversation."""
FORK_DEPTH: Final = 4
"""Forks of forks drawn under a conversation before only a link is shown."""
SCAN_CAP: Final = 5000
"""Conversations scanned to find forks (a bigger store shows a note)."""


_HELD: ContextVar[list[LmdbStorage] | None] = ContextVar("held", default=None)
"""The handles the running request has used (each request runs in its own task, with its own
copy of the context)."""


class Store:
    """The store behind the pages: one read-only handle shared by every request, opened on first
    use and again after a failure (a damaged store is reported per request, then read again once
    repaired). A handle a failed request gives up is closed only once no request still uses it:
    one request's error never closes what another is reading."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(path)
        self._storage: LmdbStorage | None = None
        self._opening = asyncio.Lock()
        self._users: dict[int, int] = {}
        """Requests using each handle (by ``id``)."""
        self._retired: list[LmdbStorage] = []
        """Handles given up while requests still used them: closed when the last one ends."""

    @contextlib.asynccontextmanager
    async def request(self) -> AsyncIterator[None]:
        """Around one request: the handles it takes are counted as used until it ends."""

        held: list[LmdbStorage] = []
        token = _HELD.set(held)
        try:
            yield
        finally:
            _HELD.reset(token)
            for storage in held:
                self._users[id(storage)] -= 1
                if not self._users[id(storage)]:
                    del self._users[id(storage)]
                    if storage in self._retired:
                        self._retired.remove(storage)
                        await _close_quietly(storage)

    async def storage(self) -> LmdbStorage:
        async with self._opening:
            if self._storage is None:
                self._storage = await LmdbStorage.open(self.path, readonly=True)
            storage = self._storage
        held = _HELD.get()
        if held is not None and not any(storage is mine for mine in held):
            held.append(storage)
            self._users[id(storage)] = self._users.get(id(storage), 0) + 1
        return storage

    async def close(self) -> None:
        """When the server stops: every handle."""

        handles = [*self._retired, *([self._storage] if self._storage is not None else [])]
        self._storage, self._retired = None, []
        for storage in handles:
            await storage.close()

    async def forget(self) -> None:
        """After a failed read: the next request opens the store afresh; this handle is closed
        now if no other request uses it, else when the last one that does ends."""

        storage, self._storage = self._storage, None
        if storage is None:
            return
        held = _HELD.get() or []
        mine = 1 if any(storage is handle for handle in held) else 0
        if self._users.get(id(storage), 0) > mine:
            self._retired.append(storage)
            return
        if mine:
            held.remove(storage)
            del self._users[id(storage)]
        await _close_quietly(storage)

    async def head(self) -> int:
        """The log's head (one short read)."""

        return (await self.storage()).log.head()

    async def point(self, found: tuple[str, int] | None) -> int | None:
        """The log sequence of ``?as_of=`` as ``query.parameter`` read it (a sequence, or a time
        as the CLI's ``--as-of``); None: now."""

        if found is None:
            return None
        storage = await self.storage()
        kind, value = found
        if kind == "time":
            value = seq_at(storage.log, value)
        head = storage.log.head()
        if value > head:
            raise BadQueryError(f"as_of: {value} is after the log's head, {head}")
        trimmed = storage.log.trimmed_before()
        if value < trimmed:  # a request for what the store no longer keeps: the request's fault
            raise BadQueryError(f"as_of: {HistoryTrimmed(trimmed, value)}")
        return value

    async def reader(self, as_of: int | None) -> StorageReads:
        storage = await self.storage()
        return storage if as_of is None else await storage.as_of(as_of)


async def _close_quietly(storage: LmdbStorage) -> None:
    try:
        await storage.close()
    except Exception:  # closing a damaged store may fail too; the next open says why
        pass


# ── the overview at a point ───────────────────────────────────────────────────

COUNT_CAP: Final = 10_000
"""Records of each kind the overview counts at a past point (more: shown as "10,000+")."""


class PointCounts(msgspec.Struct, frozen=True):
    """What the store held right after log sequence ``asOf``: when that commit was made, and
    the records of each kind (counted up to ``COUNT_CAP``; ``capped`` names the kinds with
    more)."""

    asOf: int
    head: int
    committedAt: int | None
    conversations: int
    tasks: int
    documents: int
    capped: list[str]


async def counts_at(storage: LmdbStorage, reader: StorageReads, as_of: int) -> PointCounts:
    """The overview's cards at a past point: counted through the store's ``as_of`` reads, a
    page at a time (each page one short read)."""

    async def count(scan: Any) -> tuple[int, bool]:
        found, cursor = 0, None
        while found < COUNT_CAP:
            page = await scan(cursor)
            found += len(page["items"])
            if "next" not in page:
                return found, False
            cursor = page["next"]
        return COUNT_CAP, True

    conversations = await count(lambda cursor: reader.scan_conversations({}, 500, cursor, CTX))
    tasks = await count(lambda cursor: reader.scan_tasks({}, 500, cursor, CTX))
    documents = await count(
        lambda cursor: reader.scan_all_documents(500, None if cursor is None else cursor["after"])
    )
    commit = storage.log.get(as_of) if as_of >= 1 else None
    found = {"conversations": conversations, "tasks": tasks, "documents": documents}
    return PointCounts(
        asOf=as_of,
        head=storage.log.head(),
        committedAt=None if commit is None else commit.committed_at,
        conversations=conversations[0],
        tasks=tasks[0],
        documents=documents[0],
        capped=[name for name, (_, capped) in found.items() if capped],
    )


# ── conversations ─────────────────────────────────────────────────────────────


async def conversations(reader: StorageReads, after: int | None) -> ListPage:
    page = await reader.scan_conversations(
        {}, PAGE, None if after is None else {"after": after, "order": "ascending"}, CTX
    )
    return ListPage(items=page["items"], after=page["next"]["after"] if "next" in page else None)


async def _all_conversations(reader: StorageReads) -> tuple[list[Any], bool]:
    found: list[Any] = []
    cursor: Any = None
    while len(found) < SCAN_CAP:
        page = await reader.scan_conversations({}, 500, cursor, CTX)
        found.extend(page["items"])
        if "next" not in page:
            return found, False
        cursor = page["next"]
    return found, True


async def _entries(
    reader: StorageReads,
    conversation: int,
    cap: int,
    after: int | None = None,
    before: int | None = None,
) -> tuple[list[Any], bool]:
    """Up to ``cap`` entries visible in a conversation (its ancestors' up to each fork), oldest
    first, and whether there are more: the first ones, those after entry ``after``, or the last
    ones before entry ``before``."""

    query: dict[str, Any] = {"conversationId": ConversationId(conversation)}
    if before is not None:
        query.update(order="descending", maxEntryId=before - 1)
    else:
        query.update(order="ascending", minEntryId=(after or 0) + 1)
    found: list[Any] = []
    cursor: Any = None
    more = True
    while len(found) < cap:
        page = await reader.scan_entries(query, min(500, cap - len(found)), cursor, CTX)  # type: ignore[arg-type]
        found.extend(page["items"])
        if "next" not in page:
            more = False
            break
        cursor = page["next"]
    if more and len(found) >= cap:
        more = bool((await reader.scan_entries(query, 1, cursor, CTX))["items"])  # type: ignore[arg-type]
    return (found[::-1], more) if before is not None else (found, more)


async def _has_entry(reader: StorageReads, conversation: int, **bound: int) -> bool:
    query: Any = {"conversationId": ConversationId(conversation), **bound}
    return bool((await reader.scan_entries(query, 1, None, CTX))["items"])


class Paging(msgspec.Struct, frozen=True):
    """The links of a conversation page: the entry ids that the older and newer pages start
    from (None: none), and ``newest``: the ``before`` of the last page (None: this is it)."""

    older: int | None
    newer: int | None
    newest: int | None


async def _paging(
    reader: StorageReads, id: int, entries: list[Any], more: bool, before: int | None
) -> Paging:
    """The links of a conversation page: the entry ids that the older and newer pages start
    from (None: none), and ``newest``: the ``before`` of the last page (None: this is it)."""

    if not entries:
        return Paging(older=None, newer=None, newest=None)
    first, last = entries[0]["id"], entries[-1]["id"]
    older = (
        first
        if (more if before is not None else await _has_entry(reader, id, maxEntryId=first - 1))
        else None
    )
    newer = (
        last
        if (await _has_entry(reader, id, minEntryId=last + 1) if before is not None else more)
        else None
    )
    newest = None
    if newer is not None:
        top = (
            await reader.scan_entries(
                {"conversationId": ConversationId(id), "order": "descending"}, 1, None, CTX
            )
        )["items"]
        newest = top[0]["id"] + 1 if top else None
    return Paging(older=older, newer=newer, newest=newest)


@dataclass
class Node:
    """One entry of the tree, with the forks made right after it."""

    entry: Any
    inherited: bool
    forks: list[Branch] = field(default_factory=list)


@dataclass
class Branch:
    """A fork: the conversation, its own entries (each with its forks), how many were cut."""

    conversation: Any
    nodes: list[Node]
    more: bool
    depth: int


class ConversationView(msgspec.Struct, frozen=True):
    """A conversation's page: its record (as the store reads it), its entries as a tree, the
    links beside it, its tasks, submissions, the conversations it owns, the conversations it
    descends from (itself first), and ``partial``: the forks were looked for among the first
    ``SCAN_CAP`` conversations only."""

    record: Any
    nodes: list[Node]
    paging: Paging
    tasks: list[Any]
    submissions: list[Any]
    owned: list[Any]
    ancestry: list[int]
    partial: bool


async def conversation(
    reader: StorageReads, id: int, after: int | None = None, before: int | None = None
) -> ConversationView | None:
    """A conversation's page: its record, a page of ``ENTRY_CAP`` entries drawn as a tree with the
    forks made after each (the first, those after entry ``after``, or the last before entry
    ``before``), links to the pages beside it, its tasks, submissions and the conversations it owns."""

    record = await reader.conversation(ConversationId(id), CTX)
    if record is None:
        return None
    everyone, partial = await _all_conversations(reader)
    forks: dict[tuple[int, int], list[Any]] = {}
    for other in everyone:
        parent = other.get("parent")
        if isinstance(parent, dict):
            forks.setdefault((parent["conversationId"], parent["at"]), []).append(other)
    line = _ancestry(record, {c["id"]: c for c in everyone})
    entries, more = await _entries(reader, id, ENTRY_CAP, after, before)
    paging = await _paging(reader, id, entries, more, before)
    nodes = [
        await _node(reader, entry, entry["conversationId"] != id, forks, line, 1)
        for entry in entries
    ]
    tasks = (await reader.scan_tasks({"conversationId": ConversationId(id)}, PAGE * 5, None, CTX))[
        "items"
    ]
    submissions = (
        await reader.scan_submissions({"conversationId": ConversationId(id)}, PAGE * 5, None, CTX)
    )["items"]
    owned = [
        c
        for c in everyone
        if isinstance(c.get("owner"), dict) and c["owner"].get("conversationId") == id
    ]
    return ConversationView(
        record=record,
        nodes=nodes,
        paging=paging,
        tasks=tasks,
        submissions=submissions,
        owned=owned,
        ancestry=line,
        partial=partial,
    )


def _ancestry(record: Any, by_id: dict[int, Any]) -> list[int]:
    """The conversation and those it was forked from, itself first."""

    line = [record["id"]]
    parent = record.get("parent")
    while isinstance(parent, dict) and parent["conversationId"] not in line:
        line.append(parent["conversationId"])
        parent = by_id.get(parent["conversationId"], {}).get("parent")
    return line


async def _node(
    reader: StorageReads,
    entry: Any,
    inherited: bool,
    forks: dict[tuple[int, int], list[Any]],
    line: list[int],
    depth: int,
) -> Node:
    node = Node(entry, inherited)
    for child in forks.get((entry["conversationId"], entry["id"]), []):
        if child["id"] in line:
            continue  # the conversation on show (or one it descends from) is the main line
        node.forks.append(await _branch(reader, child, forks, line, depth))
    return node


async def _branch(
    reader: StorageReads,
    child: Any,
    forks: dict[tuple[int, int], list[Any]],
    line: list[int],
    depth: int,
) -> Branch:
    if depth > FORK_DEPTH:
        return Branch(child, [], True, depth)
    entries, more = await _entries(reader, child["id"], ENTRY_CAP)
    own = [entry for entry in entries if entry["conversationId"] == child["id"]]
    nodes = [
        await _node(reader, entry, False, forks, line, depth + 1) for entry in own[:BRANCH_CAP]
    ]
    return Branch(child, nodes, more or len(own) > BRANCH_CAP, depth)


def entry_text(entry: Any) -> str:
    """What an entry says, in one line: its messages' text, else its data."""

    model = entry.get("model")
    if isinstance(model, list) and model:
        parts = []
        for message in model:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(
                    str(part.get("text", "")) if isinstance(part, dict) else str(part)
                    for part in content
                )
            parts.append(
                f"{message.get('role', '?')}: {brief(content if content is not None else message)}"
            )
        return " | ".join(parts)
    if "data" in entry:
        return brief(entry["data"])
    if "head" in entry:
        return f"head moved to entry {entry['head']}"
    return ""


# ── documents ─────────────────────────────────────────────────────────────────


async def documents(reader: StorageReads, after: int | None) -> ListPage:
    page = await reader.scan_all_documents(PAGE, after)
    return ListPage(items=page["items"], after=page["next"]["after"] if "next" in page else None)


class Version(msgspec.Struct, frozen=True):
    """A stored version of a document as its page lists it: numbered from 1, oldest first."""

    number: int
    seq: Seq
    version: int
    kind: str
    body: Any


class DocumentView(msgspec.Struct, frozen=True):
    """A document's page at a point: its record, its versions up to the point (numbered), the
    one in force then (``picked``), its value (``shown``) and the one before (``previous``), the
    change between them, why a past value is missing (``error``), and the point (``at``)."""

    record: Any
    versions: list[Version]
    picked: Version | None
    shown: Any
    previous: Any
    diff: Any
    error: str | None
    at: int
    unreadable: Unreadable | None = None
    """Set when the value at the point cannot be read (a stored change fails to apply): why."""
    changes: list[int] = []
    """Every point its stored versions were written at, those after the point too: where the
    history control steps."""


async def document(
    storage: LmdbStorage, reader: StorageReads, number: int, as_of: int | None
) -> DocumentView | None:
    """A document at a point (``as_of``, None: now): its record, its versions up to the point,
    the value of the one in force then and the change from the version before it. Picking a
    version is moving the point to the sequence that wrote it."""

    id = DocumentId(number)
    head = storage.log.head()
    at = head if as_of is None else as_of
    record = await document_record(reader, id)
    if record is None:
        return None
    revisions = await storage.document_revisions(id)
    stored = [row for row in revisions if row.seq <= at]
    versions = [
        Version(number=index, seq=row.seq, version=row.version, kind=row.kind, body=row.body)
        for index, row in enumerate(stored, 1)
    ]
    picked = versions[-1] if versions else None  # the version in force at the point
    shown, before, error, unreadable = None, None, None, None
    if picked is not None:
        try:
            found = await read_document(storage, id, picked.seq)
        except StorageRequestError as refused:  # a current-only document keeps no past values
            error = str(refused)
        else:
            unreadable, shown = (found, None) if isinstance(found, Unreadable) else (None, found)
        index = versions.index(picked)
        if shown is not None and index > 0:
            before = await read_document(storage, id, versions[index - 1].seq)
            if isinstance(before, Unreadable):  # the version before is one that fails
                before = None
    if shown is None and unreadable is None and as_of is None:
        found = await read_document(reader, id, "current")
        unreadable, shown = (found, None) if isinstance(found, Unreadable) else (None, found)
    diff = jsondiff.changes(
        None if before is None else before["value"], None if shown is None else shown["value"]
    )
    return DocumentView(
        record=record,
        versions=versions,
        picked=picked,
        shown=shown,
        previous=before,
        diff=diff,
        error=error,
        at=at,
        unreadable=unreadable,
        changes=[int(row.seq) for row in revisions],
    )


def ids(values: Iterable[Any]) -> list[int]:
    return [value["id"] for value in values]


__all__ = [
    "BRANCH_CAP",
    "ENTRY_CAP",
    "FORK_DEPTH",
    "PAGE",
    "SCAN_CAP",
    "Branch",
    "ConversationView",
    "DocumentView",
    "Node",
    "Paging",
    "Store",
    "Version",
    "conversation",
    "conversations",
    "document",
    "documents",
    "entry_text",
    "ids",
]
