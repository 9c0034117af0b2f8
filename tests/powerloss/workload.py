"""What the recorded writer and the checker share: the user projection and the batch form."""

from __future__ import annotations

import json
import struct
from typing import Any

from pi_durable_lmdb import Projection
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.log.records import EntryWrite
from pi_durable_lmdb.projections.user import Tables

_COUNT = struct.Struct(">Q")


def canonical(writes: Any) -> str:
    """One comparable string for a batch: sorted keys, ASCII (lone surrogates escaped)."""

    return json.dumps(writes, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


class EntryCounts(Projection):
    """Entries per conversation: a user projection folded behind the commits."""

    name = "entry_counts"
    version = 1
    databases = ("counts",)

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is EntryWrite:
                key = _COUNT.pack(write.value["conversationId"])
                raw = tables.get("counts", key)
                tables.put("counts", key, _COUNT.pack((0 if raw is None else _COUNT.unpack(raw)[0]) + 1))


def counts_of(commits: Any) -> dict[int, int]:
    """What ``EntryCounts`` holds after folding ``commits``."""

    counts: dict[int, int] = {}
    for commit in commits:
        for write in commit.writes:
            if type(write) is EntryWrite:
                counts[write.value["conversationId"]] = counts.get(write.value["conversationId"], 0) + 1
    return counts


def read_counts(tables: Tables) -> dict[int, int]:
    return {_COUNT.unpack(key)[0]: _COUNT.unpack(value)[0] for key, value in tables.items("counts")}
