"""An example user projection, to copy: an audit index of tasks by kind and final outcome.

    python tools/task_outcomes.py PATH      # prints the index of a store

It opens the store as its writer (folding writes the projection's rows), lets the projection
catch up and prints the table. In your own code:

    storage = await open_lmdb_storage(path, projections=[TaskOutcomes()])
    await storage.projections.wait(storage.log.head())
    print(outcome_counts(storage.projections))   # {("summarize", "completed"): 12, ...}

It lives beside the engine, not in it: the engine's own folds are ``pi_durable_lmdb.projections``;
a user projection is the host's code (``pi_durable_lmdb.projections.user.Projection``).
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


class TaskOutcomes(Projection):
    """``outcomes``: (kind, outcome) -> count; ``settled``: task id -> its (kind, outcome), so a
    task rewritten after it settled is counted once."""

    name = "task_outcomes"
    version = 1
    databases = ("outcomes", "settled")

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is not TaskWrite:
                continue
            task: Any = write.value
            state = task.get("state") or {}
            if state.get("status") != "terminal":
                continue
            task_key = _COUNT.pack(task["id"])
            if tables.get("settled", task_key) is not None:
                continue
            outcome = (state.get("outcome") or {}).get("status", "unknown")
            key = _key_encoder.encode((str(task.get("kind")), str(outcome)))
            tables.put("settled", task_key, key)
            count = tables.get("outcomes", key)
            tables.put("outcomes", key, _COUNT.pack(1 + (0 if count is None else _COUNT.unpack(count)[0])))


def outcome_counts(projections: UserProjections) -> dict[tuple[str, str], int]:
    """The index as a dict; ``projections`` is an open store's ``storage.projections``."""

    with projections.read(TaskOutcomes.name) as tables:
        return {
            _key_decoder.decode(key): _COUNT.unpack(value)[0] for key, value in tables.items("outcomes")
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
