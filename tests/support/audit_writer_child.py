"""Subprocess helper for tests/audit/test_audit.py: a real writer process committing through LmdbStorage.

Usage: python tests/support/audit_writer_child.py PATH --start S --count N [--delay SECONDS]

Opens ``LmdbStorage`` on PATH with ``durability="process"``, commits ``batch(n)`` for
``n`` in ``S .. S+N-1`` (one commit each), printing ``ack SEQ N`` after every commit, then closes
the store and prints ``done HEAD``. Every line is flushed as soon as it is written.

``batch(n)`` is deterministic, so the test process rebuilds the batches to check what ``durable-log
tail`` printed. Batch 0 creates the conversations (1, 2, 3), the tasks (10 in conversation 1, 11 in
conversation 2) and two documents (20: conversation 1, 21: session); batch n >= 1 adds an entry
(id 1000+n) to conversation ``1 + n % 3`` and, depending on n, a task update, a change of
document 20 or 21, and a submission.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

CONVERSATIONS = (1, 2, 3)
TASKS = {10: 1, 11: 2}  # task id -> conversation id
DOCUMENTS = {20: 1, 21: None}  # document id -> conversation id (None: session scope)


def _task(id: int, turn: int) -> dict[str, Any]:
    return {
        "type": "task",
        "value": {
            "id": id,
            "conversationId": TASKS[id],
            "kind": "agent",
            "version": 1,
            "input": {"prompt": "summarise the log"},
            "state": {"status": "running" if turn else "pending", "checkpoint": {"turn": turn}},
            "background": id == 11,
            "abortRequested": False,
        },
    }


def batch(n: int) -> list[dict[str, Any]]:
    if n == 0:
        return [
            *({"type": "conversation", "value": {"id": id}} for id in CONVERSATIONS),
            _task(10, 0),
            _task(11, 0),
            {
                "type": "document.create",
                "record": {
                    "id": 20,
                    "kind": "notes",
                    "scope": {"kind": "conversation", "conversationId": 1},
                    "history": "rewindable",
                    "fork": "current",
                },
                "content": {"kind": "base", "version": 1, "value": {"turn": 0, "log": ""}},
            },
            {
                "type": "document.create",
                "record": {
                    "id": 21,
                    "kind": "settings",
                    "key": "main",
                    "scope": {"kind": "session"},
                },
                "content": {"kind": "base", "version": 1, "value": {"turn": 0}},
            },
        ]
    conversation = 1 + n % 3
    text = f"turn {n}: " + "the quick brown fox jumps over the lazy dog " * 3
    if n % 7 == 0:
        text += "\ud800"  # a lone surrogate: must survive every hop
    entry: dict[str, Any] = {
        "id": 1000 + n,
        "conversationId": conversation,
        "kind": "message",
        "data": {"role": "assistant", "text": text, "n": n, "big": 2**70 + n},
    }
    if n % 4 == 0:
        entry["head"] = 1000 + n
    writes: list[dict[str, Any]] = [{"type": "entry", "value": entry}]
    if n % 2 == 0:
        writes.append(_task(10 if n % 4 == 0 else 11, n))
    if n % 5 == 0:
        writes.append(
            {
                "type": "document.change",
                "id": 20,
                "content": {
                    "kind": "delta",
                    "version": 1,
                    "ops": [["s", ["turn"], n], ["a", ["log"], f"{n};"]],
                },
            }
        )
    if n % 9 == 0:
        writes.append(
            {
                "type": "document.change",
                "id": 21,
                "content": {"kind": "base", "version": 1, "value": {"turn": n}},
            }
        )
    if n % 11 == 0:
        writes.append(
            {
                "type": "submission",
                "value": {
                    "id": 5000 + n,
                    "conversationId": conversation,
                    "type": "input",
                    "status": "queued",
                },
            }
        )
    return writes


def conversation_of(write: dict[str, Any]) -> int | None:
    """Which conversation a write of ``batch()`` belongs to (the tail filter's notion)."""

    kind = write["type"]
    if kind == "conversation":
        return write["value"]["id"]
    if kind in ("entry", "task", "submission"):
        return write["value"]["conversationId"]
    if kind in ("document.create", "document.copy"):
        scope = write["record"]["scope"]
        return scope.get("conversationId") if scope["kind"] == "conversation" else None
    return DOCUMENTS[write["id"]]


async def _run(path: str, start: int, count: int, delay: float) -> None:
    from pi_durable_lmdb.storage import LmdbStorage

    storage = await LmdbStorage.open(path, durability="process")
    try:
        for n in range(start, start + count):
            seq = await storage.commit(batch(n), CTX)
            print(f"ack {seq} {n}", flush=True)
            if delay:
                time.sleep(delay)
        head = storage.log.head()
    finally:
        await storage.close()
    print(f"done {head}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(_run(args.path, args.start, args.count, args.delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
