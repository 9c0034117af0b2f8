"""A seeded generator of plausible Storage batches, and a snapshot of every read a store answers.

Tests feed the same batches to this engine and to pi-durable's ``MemoryStorage`` and compare
snapshots: equal snapshots mean equal answers to every read, errors included.
"""

from __future__ import annotations

import random
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from .compare import REFUSALS

TEXTS = ["", "a", "héllo", "\ud800", "\ud83d\ude00", "x" * 40, "日本"]


class Workload:
    """Random batches over a small id space, so ids, addresses and forks collide often."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.next_id = 2
        self.conversations: list[int] = []
        self.entries: dict[int, list[int]] = {}
        self.tasks: list[int] = []
        self.submissions: list[int] = []
        self.documents: list[dict[str, Any]] = []

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def batch(self) -> list[dict[str, Any]]:
        rng = self.rng
        if not self.conversations:
            self.conversations.append(1)
            return [{"type": "conversation", "value": {"id": 1}}]
        writes: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(
                [
                    "entry",
                    "entry",
                    "entry",
                    "fork",
                    "task",
                    "task",
                    "submission",
                    "doc",
                    "change",
                    "change",
                    "retire",
                    "copy",
                ]
            )
            writes.append(getattr(self, "_" + kind)())
        return writes

    def _entry(self) -> dict[str, Any]:
        conversation = self.rng.choice(self.conversations)
        id = self._id()
        self.entries.setdefault(conversation, []).append(id)
        value: dict[str, Any] = {
            "id": id,
            "conversationId": conversation,
            "kind": self.rng.choice(TEXTS),
        }
        if self.rng.random() < 0.3:
            value["head"] = id
        if self.rng.random() < 0.5:
            value["data"] = {"text": self.rng.choice(TEXTS), "n": self.rng.randint(-5, 2**70)}
        return {"type": "entry", "value": value}

    def _fork(self) -> dict[str, Any]:
        parent = self.rng.choice(self.conversations)
        id = self._id()
        value: dict[str, Any] = {"id": id}
        entries = self.entries.get(parent) or [0]
        value["parent"] = {"conversationId": parent, "at": max(1, self.rng.choice(entries))}
        if self.tasks and self.rng.random() < 0.5:
            value["owner"] = {"conversationId": parent, "taskId": self.rng.choice(self.tasks)}
        self.conversations.append(id)
        return {"type": "conversation", "value": value}

    def _task(self) -> dict[str, Any]:
        if self.tasks and self.rng.random() < 0.6:
            id = self.rng.choice(self.tasks)
        else:
            id = self._id()
            self.tasks.append(id)
        status = self.rng.choice(
            ["pending", "running", "waiting", "sleeping", "completing", "terminal"]
        )
        return {
            "type": "task",
            "value": {
                "id": id,
                "conversationId": self.rng.choice(self.conversations),
                "kind": self.rng.choice(["a", "b"]),
                "version": 1,
                "input": None,
                "state": {"status": status},
                "background": self.rng.random() < 0.5,
                "abortRequested": self.rng.random() < 0.2,
            },
        }

    def _submission(self) -> dict[str, Any]:
        if self.submissions and self.rng.random() < 0.5:
            id = self.rng.choice(self.submissions)
        else:
            id = self._id()
            self.submissions.append(id)
        value: dict[str, Any] = {
            "id": id,
            "conversationId": self.rng.choice(self.conversations),
            "status": self.rng.choice(["queued", "placed", "done", "unanswered"]),
        }
        if self.rng.random() < 0.7:
            value["requestId"] = self.rng.choice(["r1", "r2", "\ud800"])
        return {"type": "submission", "value": value}

    def _scope(self) -> dict[str, Any]:
        choice = self.rng.random()
        if choice < 0.2:
            return {"kind": "session"}
        if choice < 0.35 and self.tasks:
            return {"kind": "task", "taskId": self.rng.choice(self.tasks)}
        return {"kind": "conversation", "conversationId": self.rng.choice(self.conversations)}

    def _doc(self) -> dict[str, Any]:
        id = self._id()
        scope = self._scope()
        record: dict[str, Any] = {
            "id": id,
            "kind": self.rng.choice(["notes", "plan"]),
            "scope": scope,
        }
        if self.rng.random() < 0.5:
            record["key"] = self.rng.choice(["k", "\ud83d"])
        if scope["kind"] == "conversation":
            record["history"] = self.rng.choice(["latest", "rewindable", "rewindable"])
            record["fork"] = self.rng.choice(
                ["current", "initial"] + (["asOf"] if record["history"] == "rewindable" else [])
            )
        self.documents.append(record)
        value = {"text": self.rng.choice(TEXTS), "items": [1, 2, 3]}
        return {
            "type": "document.create",
            "record": record,
            "content": {"kind": "base", "version": 1, "value": value},
        }

    def _change(self) -> dict[str, Any]:
        if not self.documents:
            return self._doc()
        id = self.rng.choice(self.documents)["id"]
        if self.rng.random() < 0.2:
            content = {
                "kind": "base",
                "version": self.rng.choice([1, 2]),
                "value": {"text": "reset", "items": []},
            }
        else:
            op = self.rng.choice(
                [
                    ["a", ["text"], self.rng.choice(TEXTS)],
                    ["t", ["text"], 1],
                    ["s", ["n"], self.rng.randint(0, 9)],
                    ["p", ["items"], 0, 1, [7]],
                    ["d", ["missing", "deep"]],
                ]
            )
            content = {"kind": "delta", "version": self.rng.choice([1, 1, 1, 2]), "ops": [op]}
        return {"type": "document.change", "id": id, "content": content}

    def _retire(self) -> dict[str, Any]:
        if not self.documents:
            return self._doc()
        return {"type": "document.retire", "id": self.rng.choice(self.documents)["id"]}

    def _copy(self) -> dict[str, Any]:
        if not self.documents:
            return self._doc()
        source = self.rng.choice(self.documents)
        record = {key: value for key, value in source.items() if key != "id"}
        record["id"] = self._id()
        record["scope"] = {
            "kind": "conversation",
            "conversationId": self.rng.choice(self.conversations),
        }
        self.documents.append(record)
        return {
            "type": "document.copy",
            "record": record,
            "source": {"id": source["id"], "at": "current"},
        }


def message(id: int, conversation: int, text: str) -> dict[str, Any]:
    """An entry write: a user's message ``text`` in ``conversation``."""

    return {
        "type": "entry",
        "value": {
            "id": id,
            "conversationId": conversation,
            "kind": "message",
            "message": {"role": "user", "content": text, "timestamp": 1},
        },
    }


async def _call(store: Any, method: str, *args: Any) -> Any:
    try:
        return ("ok", await getattr(store, method)(*args))
    except REFUSALS as error:  # the comparison covers the reference's errors too
        return ("error", type(error).__name__, str(error))


async def _pages(store: Any, method: str, query: dict[str, Any], limit: int) -> list[Any]:
    pages, cursor = [], None
    for _ in range(200):
        result = await _call(store, method, query, limit, cursor, CTX)
        pages.append(result)
        if result[0] != "ok" or "next" not in result[1]:
            break
        cursor = result[1]["next"]
    return pages


async def snapshot(store: Any, work: Workload, seq: int, since: int = 1) -> dict[str, Any]:
    """Every read we know how to ask, over the ids the workload may have used (documents as of
    points from ``since``: a trimmed store keeps none before its point)."""

    out: dict[str, Any] = {}
    ids = list(range(1, work.next_id + 2))
    for id in ids:
        out[f"conversation {id}"] = await _call(store, "conversation", id, CTX)
        out[f"entry {id}"] = await _call(store, "entry", id, CTX)
        out[f"task {id}"] = await _call(store, "task", id, CTX)
        out[f"submission {id}"] = await _call(store, "submission", id, CTX)
        out[f"document {id} current"] = await _call(store, "document", id, "current", CTX)
        for point in range(since, seq + 1, max(1, seq // 6)):
            out[f"document {id} at {point}"] = await _call(store, "document", id, point, CTX)
    for conversation in work.conversations + [999]:
        for order in ("ascending", "descending"):
            out[f"entries {conversation} {order}"] = await _pages(
                store, "scan_entries", {"conversationId": conversation, "order": order}, 3
            )
        out[f"head {conversation}"] = await _call(
            store, "find_latest_head_marker", conversation, None, CTX
        )
        for entry in work.entries.get(conversation, [])[:3]:
            out[f"entry {conversation}/{entry}"] = await _call(
                store, "entry", conversation, entry, CTX
            )
        for request in ("r1", "r2", "\ud800"):
            out[f"request {conversation} {request!r}"] = await _call(
                store, "submission_by_request", conversation, request, CTX
            )
        out[f"conversations owned by {conversation}"] = await _pages(
            store, "scan_conversations", {"ownerConversationId": conversation}, 2
        )
    for order in ("ascending", "descending"):
        out[f"conversations {order}"] = await _pages(
            store, "scan_conversations", {"order": order}, 2
        )
        out[f"tasks {order}"] = await _pages(store, "scan_tasks", {"order": order}, 2)
        out[f"submissions {order}"] = await _pages(store, "scan_submissions", {"order": order}, 2)
    for status in ("pending", "running", "terminal", "sleeping"):
        out[f"tasks {status}"] = await _pages(
            store, "scan_tasks", {"status": status, "background": True}, 2
        )
    for status in ("queued", "done"):
        out[f"submissions {status}"] = await _pages(
            store, "scan_submissions", {"status": status}, 2
        )
    scopes = [{"kind": "session"}] + [
        {"kind": "conversation", "conversationId": c} for c in work.conversations
    ]
    scopes += [{"kind": "task", "taskId": task} for task in work.tasks]
    for scope in scopes:
        for at in ["current"] + list(range(1, seq + 1, max(1, seq // 4))):
            out[f"documents {scope} at {at}"] = await _pages(
                store, "scan_documents", {"scope": scope, "at": at}, 2
            )
    for record in work.documents:
        address = {"kind": record["kind"], "scope": record["scope"]}
        if "key" in record:
            address["key"] = record["key"]
        for at in ["current"] + list(range(1, seq + 1, max(1, seq // 4))):
            out[f"find {address} at {at}"] = await _call(store, "find_document", address, at, CTX)
    return out
