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
                tables.put(
                    "counts", key, _COUNT.pack((0 if raw is None else _COUNT.unpack(raw)[0]) + 1)
                )


def counts_of(commits: Any) -> dict[int, int]:
    """What ``EntryCounts`` holds after folding ``commits``."""

    counts: dict[int, int] = {}
    for commit in commits:
        for write in commit.writes:
            if type(write) is EntryWrite:
                counts[write.value["conversationId"]] = (
                    counts.get(write.value["conversationId"], 0) + 1
                )
    return counts


def engine_tools() -> tuple[Any, Any, Any]:
    """``(verify, export_lines, durable_log_main)`` wherever this version of the package keeps
    them (the command line is moving out of ``pi_durable_lmdb.storage``: issue 22)."""

    import importlib

    def find(name: str, modules: tuple[str, ...]) -> Any:
        for module in modules:
            try:
                found = getattr(importlib.import_module(module), name, None)
            except ImportError:
                continue
            if found is not None:
                return found
        raise ImportError(f"{name} is in none of {', '.join(modules)}")

    audits = (
        "pi_durable_lmdb.audit",
        "pi_durable_lmdb.cli.inspect",
        "pi_durable_lmdb.cli.move",
        "pi_durable_lmdb.cli.common",
        "pi_durable_lmdb",
    )
    return (
        find("verify", audits),
        find("export_lines", audits),
        find("main", ("pi_durable_lmdb.cli", "pi_durable_lmdb.storage.cli")),
    )


def read_counts(tables: Tables) -> dict[int, int]:
    return {_COUNT.unpack(key)[0]: _COUNT.unpack(value)[0] for key, value in tables.items("counts")}
