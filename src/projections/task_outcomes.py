"""An example user projection, shipped so it can be imported and copied: an audit index of
tasks by kind and final outcome.

    from pi_durable_lmdb import open_lmdb_storage
    from pi_durable_lmdb.projections.task_outcomes import TaskOutcomes, outcome_counts

    storage = await open_lmdb_storage(path, projections=[TaskOutcomes()])
    ...
    await storage.projections.wait(storage.log.head())
    print(outcome_counts(storage.projections))   # {("summarize", "completed"): 12, ...}

``python tools/task_outcomes.py PATH`` prints the table of a store (it opens the store as its
writer, since folding writes the projection's rows).
"""

from __future__ import annotations

import struct
from typing import Any

import msgspec

from ..log import Commit
from ..log.records import TaskWrite

from .user import Projection, Tables, UserProjections

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
