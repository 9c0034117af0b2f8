"""The tests' own reading of what erasing a conversation removes (``docs/forgetting.md``), worked
out from the committed batches alone, and the ``MemoryStorage`` that folds what is left: the
reference an erased store is compared with."""

from __future__ import annotations

import copy
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage import MemoryStorage

Batches = dict[int, list[dict[str, Any]]]


def _owner(write: dict[str, Any]) -> set[int]:
    value = write.get("value") or {}
    return {
        (value.get(field) or {}).get("conversationId")
        for field in ("parent", "owner")
        if (value.get(field) or {}).get("conversationId") is not None
    }


def erased_with(batches: Batches, conversation: int) -> set[int]:
    """``conversation`` and every conversation that reads through it (forked from it or owned
    by it), in turn: closed over the whole log, whatever order the records came in."""

    through: dict[int, set[int]] = {}
    for writes in batches.values():
        for write in writes:
            if write["type"] == "conversation":
                through.setdefault(write["value"]["id"], set()).update(_owner(write))
    erased = {conversation}
    while True:
        more = {id for id, origins in through.items() if origins & erased} - erased
        if not more:
            return erased
        erased |= more


def is_conversation(batches: Batches, conversation: int) -> bool:
    """Whether any kept write is conversation ``conversation``'s record."""

    return any(
        write["type"] == "conversation" and write["value"]["id"] == conversation
        for writes in batches.values()
        for write in writes
    )


def _scope_in(record: dict[str, Any], conversations: set[int], tasks: set[int]) -> bool:
    scope = record.get("scope", {})
    if scope.get("kind") == "conversation":
        return scope.get("conversationId") in conversations
    return scope.get("kind") == "task" and scope.get("taskId") in tasks


def erased_tasks(batches: Batches, conversations: set[int]) -> set[int]:
    """The tasks whose record names one of ``conversations``, anywhere in the log."""

    return {
        write["value"]["id"]
        for writes in batches.values()
        for write in writes
        if write["type"] == "task" and write["value"].get("conversationId") in conversations
    }


def without(batches: Batches, conversations: set[int]) -> tuple[Batches, list[str]]:
    """The batches without the writes of ``conversations`` (every sequence kept, perhaps empty),
    and the copies the erasure must refuse: a kept document copied from an erased one."""

    tasks = erased_tasks(batches, conversations)
    documents: set[int] = set()
    kept: Batches = {}
    refused: list[str] = []
    for seq, writes in sorted(batches.items()):
        kept[seq] = []
        for write in writes:
            kind, value = write["type"], write.get("value", {})
            if kind == "conversation":
                gone = value["id"] in conversations
            elif kind in ("entry", "submission", "task"):
                gone = value["conversationId"] in conversations
            elif kind in ("document.create", "document.copy"):
                gone = _scope_in(write["record"], conversations, tasks)
                if gone:
                    documents.add(write["record"]["id"])
                elif kind == "document.copy" and write["source"]["id"] in documents:
                    refused.append(f"Document {write['record']['id']} (record {seq})")
            else:
                gone = write["id"] in documents
            if not gone:
                kept[seq].append(write)
    return kept, refused


async def memory_of(batches: Batches, upto: int) -> MemoryStorage:
    """A ``MemoryStorage`` that committed ``batches`` (an empty batch where one is missing) up to
    sequence ``upto``: the reference as of ``upto``."""

    memory = MemoryStorage()
    for seq in range(1, upto + 1):
        assert await memory.commit(copy.deepcopy(batches.get(seq, [])), CTX) == seq
    return memory


__all__ = ["Batches", "erased_tasks", "erased_with", "is_conversation", "memory_of", "without"]
