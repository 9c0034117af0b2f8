"""An example user projection, to copy: an index of tasks by kind and final outcome.

    python examples/task_outcomes.py PATH      # prints the index of a store

``TaskOutcomes`` (version 1) counts settled tasks by (kind, outcome). ``TaskOutcomesV2`` is the
same projection after a schema change: it also counts them by the kind of conversation they ran
in (a top-level conversation, or one owned by a task: a sub-agent's), looked up in the store's
own records as they stood when the task settled (``tables.core``). docs/projections.md walks
through deploying that change in production.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from typing import Any

import msgspec
from pi_durable_lmdb import open_lmdb_storage
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.log.records import TaskWrite
from pi_durable_lmdb.projections.user import Projection, Tables, UserProjections

_COUNT = struct.Struct(">Q")
_key_encoder = msgspec.msgpack.Encoder()
_key_decoder = msgspec.msgpack.Decoder(tuple[str, str])


def _add(tables: Tables, db: str, key: bytes) -> None:
    count = tables.get(db, key)
    tables.put(db, key, _COUNT.pack(1 + (0 if count is None else _COUNT.unpack(count)[0])))


def _settled(tables: Tables, write: TaskWrite) -> tuple[Any, str] | None:
    """The task and its outcome if this write settles it for the first time, else None."""

    task: Any = write.value
    state = task.get("state") or {}
    if state.get("status") != "terminal":
        return None
    task_key = _COUNT.pack(task["id"])
    if tables.get("settled", task_key) is not None:
        return None  # a task rewritten after it settled is counted once
    outcome = str((state.get("outcome") or {}).get("status", "unknown"))
    tables.put("settled", task_key, _key_encoder.encode((str(task.get("kind")), outcome)))
    return task, outcome


class TaskOutcomes(Projection):
    """``outcomes``: (kind, outcome) -> count; ``settled``: task id -> its (kind, outcome)."""

    name = "task_outcomes"
    version = 1
    databases = ("outcomes", "settled")

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is TaskWrite and (found := _settled(tables, write)) is not None:
                task, outcome = found
                _add(tables, "outcomes", _key_encoder.encode((str(task.get("kind")), outcome)))


class TaskOutcomesV2(TaskOutcomes):
    """Version 2 adds ``by_conversation``: (top-level or sub-agent, outcome) -> count."""

    version = 2
    databases = ("outcomes", "settled", "by_conversation")

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is TaskWrite and (found := _settled(tables, write)) is not None:
                task, outcome = found
                _add(tables, "outcomes", _key_encoder.encode((str(task.get("kind")), outcome)))
                conversation = tables.core.conversation(task["conversationId"]) or {}
                where = "sub-agent" if conversation.get("owner") else "top-level"
                _add(tables, "by_conversation", _key_encoder.encode((where, outcome)))


def outcome_counts(
    projections: UserProjections, db: str = "outcomes"
) -> dict[tuple[str, str], int]:
    """One of the index's tables as a dict; ``projections`` is an open store's ``storage.projections``."""

    with projections.read(TaskOutcomes.name) as tables:
        return {
            _key_decoder.decode(key): _COUNT.unpack(value)[0] for key, value in tables.items(db)
        }


async def main(path: str) -> None:
    storage = await open_lmdb_storage(path, projections=[TaskOutcomes()])
    try:
        await storage.projections.wait(storage.log.head())
        for (kind, outcome), count in sorted(outcome_counts(storage.projections).items()):
            print(f"{count:>8}  {kind}  {outcome}")
    finally:
        await storage.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
