"""Building a store from elsewhere: a ``durable-log export`` (every batch replayed through the
normal commit path, so everything is validated again), or a pi-durable SQLite or JSONL store read
through its own ``Storage`` API (which shows final states, not the history that led to them).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT

from .lmdb_storage import LmdbStorage

_BATCH = 256
"""Records per commit when a source has no commit grouping of its own."""


@dataclass
class ImportReport:
    commits: int = 0
    records: dict[str, int] = field(default_factory=dict)
    renumbered: bool = False
    lacking: list[str] = field(default_factory=list)

    def count(self, kind: str, n: int = 1) -> None:
        self.records[kind] = self.records.get(kind, 0) + n

    def __str__(self) -> str:
        counts = ", ".join(f"{n} {kind}" for kind, n in self.records.items()) or "nothing"
        lines = [f"imported {self.commits} commits ({counts})"]
        if self.renumbered:
            lines.append("note: the export did not start at sequence 1; sequences were renumbered")
        lines.extend(f"not carried over: {what}" for what in self.lacking)
        return "\n".join(lines)


async def _open_empty(target: str | os.PathLike[str], durability: Any) -> LmdbStorage:
    storage = await LmdbStorage.open(target, durability=durability)
    if storage.log.head() != 0:
        await storage.close()
        raise ValueError(f"The store at {storage.path} is not empty; import only into a new store")
    return storage


async def import_export(
    lines: Iterable[str], target: str | os.PathLike[str], durability: Any = "power"
) -> ImportReport:
    """Replay an export's batches, keeping their commit times; sequences match from 1 on."""

    storage = await _open_empty(target, durability)
    report = ImportReport()
    try:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                batch = json.loads(line)
                writes, committed_at, seq = batch["writes"], batch["committedAt"], batch["seq"]
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"Line {number} of the export is not a batch: {error}") from None
            new_seq = await storage.commit(writes, BACKGROUND_CONTEXT, committed_at=committed_at)
            report.renumbered |= new_seq != seq
            report.commits += 1
            for write in writes:
                report.count(write["type"])
    finally:
        await storage.close()
    return report


async def open_pi_durable_store(path: str) -> Any:
    """A pi-durable SQLite file or JSONL directory, through pi-durable's own backends."""

    if os.path.isdir(path):
        from pi_durable.env.posix import PosixExecutionEnv
        from pi_durable.storage.jsonl import JsonlStorage

        return await JsonlStorage.open(path, PosixExecutionEnv(), BACKGROUND_CONTEXT)
    from pi_durable.storage.sqlite.posix import open_posix_sqlite_storage

    if not os.path.isfile(path):
        raise FileNotFoundError(f"No pi-durable store at {path}")
    return await open_posix_sqlite_storage(path)


async def _pages(scan: Any, query: dict[str, Any], limit: int = 500) -> AsyncIterator[Any]:
    cursor = None
    while True:
        page = await scan(query, limit, cursor, None)
        for item in page["items"]:
            yield item
        cursor = page.get("next")
        if cursor is None:
            return


async def import_pi_durable(
    source: Any, target: str | os.PathLike[str], durability: Any = "power"
) -> ImportReport:
    """Copy what a pi-durable ``Storage`` exposes: conversations, entries grouped by their original
    commits, tasks and submissions in their final state, and live documents' current values."""

    storage = await _open_empty(target, durability)
    report = ImportReport(
        lacking=[
            "the order of commits other than entries' (tasks and submissions keep only their final state)",
            "document history: each live document starts at its current value; retired documents are dropped",
            "commit sequences and times: the new store numbers its own commits",
        ]
    )
    try:
        conversations = [record async for record in _pages(source.scan_conversations, {})]
        for start in range(0, len(conversations), _BATCH):
            chunk = conversations[start : start + _BATCH]
            await storage.commit([{"type": "conversation", "value": record} for record in chunk], BACKGROUND_CONTEXT)
            report.commits += 1
            report.count("conversation", len(chunk))

        by_commit: dict[int, list[Any]] = {}
        for conversation in conversations:
            async for entry in _pages(
                source.scan_entries, {"conversationId": conversation["id"], "order": "ascending"}
            ):
                if entry["conversationId"] != conversation["id"]:
                    continue
                lookup = await source.entry(entry["id"], None)
                by_commit.setdefault(lookup["commitSeq"], []).append(entry)
        for seq in sorted(by_commit):
            await storage.commit([{"type": "entry", "value": entry} for entry in by_commit[seq]], BACKGROUND_CONTEXT)
            report.commits += 1
            report.count("entry", len(by_commit[seq]))

        tasks = [record async for record in _pages(source.scan_tasks, {})]
        submissions = [record async for record in _pages(source.scan_submissions, {})]
        for kind, records in (("task", tasks), ("submission", submissions)):
            for start in range(0, len(records), _BATCH):
                chunk = records[start : start + _BATCH]
                await storage.commit([{"type": kind, "value": record} for record in chunk], BACKGROUND_CONTEXT)
                report.commits += 1
                report.count(kind, len(chunk))

        scopes = [{"kind": "session"}]
        scopes += [{"kind": "conversation", "conversationId": c["id"]} for c in conversations]
        scopes += [{"kind": "task", "taskId": task["id"]} for task in tasks]
        for scope in scopes:
            async for record in _pages(source.scan_documents, {"scope": scope, "at": "current"}):
                stored = await source.document(record["id"], "current", None)
                if stored is None:
                    continue
                create = {k: v for k, v in record.items() if k not in ("createdAt", "retiredAt")}
                content = {"kind": "base", "version": stored["version"], "value": stored["value"]}
                await storage.commit([{"type": "document.create", "record": create, "content": content}], BACKGROUND_CONTEXT)
                report.commits += 1
                report.count("document")
    finally:
        await storage.close()
    return report
