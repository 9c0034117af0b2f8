"""The records every benchmark commits: realistic entries (a model message), tasks,
conversations and documents, with ids from a counter of our own (not ``mint_id``), so every
backend stores byte-for-byte the same records."""

from __future__ import annotations

from typing import Any

from tools.bench.sample import MESSAGE

ROOT = 1
"""The root conversation, committed first in every store."""


# ── records ──────────────────────────────────────────────────────────────────


class Ids:
    """Our own id counter: 1 is the root conversation."""

    def __init__(self) -> None:
        self.next = 2

    def __call__(self) -> int:
        value = self.next
        self.next += 1
        return value


def entry(id: int, conversation: int, n: int, task: int | None = None) -> dict[str, Any]:
    """An assistant turn: one model message (~500 B of text plus metadata) and some data."""

    value: dict[str, Any] = {
        "id": id,
        "conversationId": conversation,
        "kind": "message",
        "model": [
            {
                "role": "assistant",
                "content": [{"type": "text", "text": MESSAGE}],
                "api": "messages",
                "provider": "example",
                "model": "example-model-1",
                "usage": {
                    "input": 1834 + n % 97,
                    "output": 117,
                    "cacheRead": 1024,
                    "cacheWrite": 0,
                },
                "stopReason": "stop",
                "timestamp": 1_760_000_000_000 + n,
            }
        ],
        "data": {"turn": n, "latencyMs": 812 + n % 13, "tools": ["read_file", "run_tests"]},
    }
    if task is not None:
        value["byTaskId"] = task
    return value


def task(id: int, conversation: int, n: int, status: str) -> dict[str, Any]:
    """A full live task record; ``n`` varies the checkpoint as a running turn does."""

    state: dict[str, Any] = {
        "status": status,
        "checkpoint": {"step": n, "phase": "tools" if n % 2 else "model", "pendingCalls": n % 3},
    }
    if status == "sleeping":
        state["until"] = 1_760_000_000_000 + n
    return {
        "id": id,
        "conversationId": conversation,
        "kind": "agent.turn",
        "version": 1,
        "input": {"prompt": "Fix the flaky storage test and explain the cause.", "attempt": 1},
        "background": False,
        "abortRequested": False,
        "startedAt": 1_760_000_000_000,
        "state": state,
        "memos": {"model": "example-model-1", "turns": n},
    }


def conversation(id: int, parent: int | None = None, at: int | None = None) -> dict[str, Any]:
    value: dict[str, Any] = {"id": id}
    if parent is not None:
        value["parent"] = {"conversationId": parent, "at": at}
    return {"type": "conversation", "value": value}


def document_create(id: int) -> dict[str, Any]:
    return {
        "type": "document.create",
        "record": {
            "id": id,
            "kind": "notes",
            "scope": {"kind": "conversation", "conversationId": ROOT},
            "history": "rewindable",
            "fork": "asOf",
        },
        "content": {"kind": "base", "version": 1, "value": {"title": "Notes", "text": "Start. "}},
    }


def document_delta(id: int) -> dict[str, Any]:
    return {
        "type": "document.change",
        "id": id,
        "content": {"kind": "delta", "version": 1, "ops": [["a", ["text"], "more text"]]},
    }
