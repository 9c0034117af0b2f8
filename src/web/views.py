"""What each page shows, read from the store through its read-only handle and the CLI's read
helpers (``stats``, ``Tail``, ``show``): one short read transaction per read, never one held
across a request, so the writer is never blocked."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.types import ConversationId, DocumentId

from ..errors import BadQueryError
from ..projections import StorageRequestError
from ..storage.export import seq_at
from ..storage.lmdb_storage import LmdbStorage
from ..storage.reads import StorageReads

from . import jsondiff
from .text import brief

PAGE: Final = 100
"""Rows of a list page (conversations, documents, log batches)."""
ENTRY_CAP: Final = 2000
"""Entries a conversation page draws (the rest: the JSON of each record, or ``tail``)."""
BRANCH_CAP: Final = 50
"""Entries drawn of each fork under a conversation."""
FORK_DEPTH: Final = 4
"""Forks of forks drawn under a conversation before only a link is shown."""
SCAN_CAP: Final = 5000
"""Conversations scanned to find forks (a bigger store shows a note)."""


class Store:
    """The store behind the pages: one read-only handle, opened on first use and again after a
    failure (a damaged store is reported per request, then read again once repaired)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(path)
        self._storage: LmdbStorage | None = None

    async def storage(self) -> LmdbStorage:
        if self._storage is None:
            self._storage = await LmdbStorage.open(self.path, readonly=True)
        return self._storage

    async def close(self) -> None:
        if self._storage is not None:
            storage, self._storage = self._storage, None
            await storage.close()

    async def forget(self) -> None:
        """After a failed read: drop the handle so the next request opens the store afresh."""

        try:
            await self.close()
        except Exception:  # closing a damaged store may fail too; the next open says why
            self._storage = None

    async def point(self, text: str | None) -> int | None:
        """``?as_of=``: a log sequence (digits) or a time (as the CLI's ``--as-of``); None: now."""

        from ..cli.common import parse_time

        if text is None or not text.strip():
            return None
        storage = await self.storage()
        head = storage.log.head()
        text = text.strip()
        if text.isdigit():
            seq = int(text)
            if seq > head:
                raise BadQueryError(f"as_of={seq}: the log's head is {head}")
            return seq
        try:
            ms = parse_time(text)
        except ValueError as error:
            raise BadQueryError(f"as_of={text!r}: {error}") from None
        return seq_at(storage.log, ms)

    async def reader(self, as_of: int | None) -> StorageReads:
        storage = await self.storage()
        return storage if as_of is None else await storage.as_of(as_of)


# ── conversations ─────────────────────────────────────────────────────────────


async def conversations(reader: StorageReads, after: int | None) -> dict[str, Any]:
    page = await reader.scan_conversations({}, PAGE, None if after is None else {"after": after, "order": "ascending"}, CTX)
    return {"items": page["items"], "after": page["next"]["after"] if "next" in page else None}


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


async def _entries(reader: StorageReads, conversation: int, cap: int) -> tuple[list[Any], bool]:
    """The entries visible in a conversation, oldest first (its ancestors' up to each fork)."""

    found: list[Any] = []
    cursor: Any = None
    while len(found) < cap:
        page = await reader.scan_entries({"conversationId": ConversationId(conversation), "order": "ascending"}, min(500, cap - len(found)), cursor, CTX)
        found.extend(page["items"])
        if "next" not in page:
            return found, False
        cursor = page["next"]
    return found, True


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


async def conversation(reader: StorageReads, id: int) -> dict[str, Any] | None:
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
    entries, more = await _entries(reader, id, ENTRY_CAP)
    nodes = [await _node(reader, entry, entry["conversationId"] != id, forks, line, 1) for entry in entries]
    tasks = (await reader.scan_tasks({"conversationId": ConversationId(id)}, PAGE * 5, None, CTX))["items"]
    submissions = (await reader.scan_submissions({"conversationId": ConversationId(id)}, PAGE * 5, None, CTX))["items"]
    owned = [c for c in everyone if isinstance(c.get("owner"), dict) and c["owner"].get("conversationId") == id]
    return {
        "record": record,
        "nodes": nodes,
        "more": more,
        "tasks": tasks,
        "submissions": submissions,
        "owned": owned,
        "ancestry": line,
        "partial": partial,
    }


def _ancestry(record: Any, by_id: dict[int, Any]) -> list[int]:
    """The conversation and those it was forked from, itself first."""

    line = [record["id"]]
    parent = record.get("parent")
    while isinstance(parent, dict) and parent["conversationId"] not in line:
        line.append(parent["conversationId"])
        parent = by_id.get(parent["conversationId"], {}).get("parent")
    return line


async def _node(reader: StorageReads, entry: Any, inherited: bool, forks: dict[tuple[int, int], list[Any]], line: list[int], depth: int) -> Node:
    node = Node(entry, inherited)
    for child in forks.get((entry["conversationId"], entry["id"]), []):
        if child["id"] in line:
            continue  # the conversation on show (or one it descends from) is the main line
        node.forks.append(await _branch(reader, child, forks, line, depth))
    return node


async def _branch(reader: StorageReads, child: Any, forks: dict[tuple[int, int], list[Any]], line: list[int], depth: int) -> Branch:
    if depth > FORK_DEPTH:
        return Branch(child, [], True, depth)
    entries, more = await _entries(reader, child["id"], ENTRY_CAP)
    own = [entry for entry in entries if entry["conversationId"] == child["id"]]
    nodes = [await _node(reader, entry, False, forks, line, depth + 1) for entry in own[:BRANCH_CAP]]
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
                content = " ".join(str(part.get("text", "")) if isinstance(part, dict) else str(part) for part in content)
            parts.append(f"{message.get('role', '?')}: {brief(content if content is not None else message)}")
        return " | ".join(parts)
    if "data" in entry:
        return brief(entry["data"])
    if "head" in entry:
        return f"head moved to entry {entry['head']}"
    return ""


# ── documents ─────────────────────────────────────────────────────────────────


async def documents(reader: StorageReads, after: int | None) -> dict[str, Any]:
    page = await reader.scan_all_documents(PAGE, after)
    return {"items": page["items"], "after": page["next"]["after"] if "next" in page else None}


async def document(storage: LmdbStorage, reader: StorageReads, number: int, as_of: int | None) -> dict[str, Any] | None:
    """A document at a point (``as_of``, None: now): its record, its versions up to the point,
    the value of the one in force then and the change from the version before it. Picking a
    version is moving the point to the sequence that wrote it."""

    id = DocumentId(number)
    head = storage.log.head()
    at = head if as_of is None else as_of
    page = await reader.scan_all_documents(1, id - 1)
    record = next((item for item in page["items"] if item["id"] == id), None)
    if record is None:
        return None
    versions = [row for row in await storage.document_revisions(id) if row["seq"] <= at]
    for index, row in enumerate(versions, 1):
        row["number"] = index
    picked = versions[-1] if versions else None  # the version in force at the point
    shown, before, error = None, None, None
    if picked is not None:
        try:
            shown = await storage.document(id, picked["seq"], CTX)
            index = versions.index(picked)
            if index > 0:
                before = await storage.document(id, versions[index - 1]["seq"], CTX)
        except StorageRequestError as refused:  # a current-only document keeps no past values
            error = str(refused)
    if shown is None and as_of is None:
        shown = await reader.document(id, "current", CTX)
    diff = jsondiff.changes(None if before is None else before["value"], None if shown is None else shown["value"])
    return {
        "record": record,
        "versions": versions,
        "picked": picked,
        "shown": shown,
        "previous": before,
        "diff": diff,
        "error": error,
        "at": at,
    }


def ids(values: Iterable[Any]) -> list[int]:
    return [value["id"] for value in values]
