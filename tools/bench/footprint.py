"""Store size against pi-durable's SQLite for the same work (issue 24: at most 2x).

For each commit workload of ``tools/bench/workloads.py`` (``commit_turn``, ``commit_doc_delta``:
the same records and batches; ``short_turn``: ``commit_turn`` with a one-line message), N commits go to a fresh LmdbStorage (``durability="process"``) and
to a fresh SQLite store (WAL, ``synchronous=NORMAL``); both are closed, SQLite's WAL is
checkpointed (``wal_checkpoint(TRUNCATE)``) and every file of each store directory is counted.
The LMDB store's ``stats`` footprint (where its bytes go) is printed too.

Usage::

    python -m tools.bench.footprint                          # 9,000 commits per workload
    python -m tools.bench.footprint --commits 9000 --commits 100000
    python -m tools.bench.footprint --markdown               # tables for docs/benchmarks.md
    python -m tools.bench.footprint --json                   # one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.bench.report import Store
from tools.bench.workloads import (
    ROOT,
    Ids,
    conversation,
    document_create,
    document_delta,
    entry,
    task,
)

Batches = Callable[[int], list[list[dict[str, Any]]]]
"""The workload's batches for commits [start, start + count): ``(start, count)``."""


def turn_batches() -> tuple[list[list[dict[str, Any]]], Callable[[int], list[dict[str, Any]]]]:
    """``commit_turn``: the conversation and the task, then one entry + the task per commit."""

    ids = Ids()
    task_id = ids()
    setup = [[conversation(ROOT)], [{"type": "task", "value": task(task_id, ROOT, 0, "pending")}]]

    def commit(n: int) -> list[dict[str, Any]]:
        status = "running" if n % 3 else "sleeping"
        return [
            {"type": "entry", "value": entry(ids(), ROOT, n, task_id)},
            {"type": "task", "value": task(task_id, ROOT, n, status)},
        ]

    return setup, commit


def short_turn_batches() -> tuple[
    list[list[dict[str, Any]]], Callable[[int], list[dict[str, Any]]]
]:
    """``short_turn``: as ``commit_turn``, but the entry's model message is one short line (a
    tool-call turn), so the task record and the indexes, not the text, are most of each commit."""

    ids = Ids()
    task_id = ids()
    setup = [[conversation(ROOT)], [{"type": "task", "value": task(task_id, ROOT, 0, "pending")}]]

    def commit(n: int) -> list[dict[str, Any]]:
        value = entry(ids(), ROOT, n, task_id)
        value["model"][0]["content"] = [{"type": "text", "text": f"Running the tests again ({n})."}]
        status = "running" if n % 3 else "sleeping"
        return [
            {"type": "entry", "value": value},
            {"type": "task", "value": task(task_id, ROOT, n, status)},
        ]

    return setup, commit


def doc_batches() -> tuple[list[list[dict[str, Any]]], Callable[[int], list[dict[str, Any]]]]:
    """``commit_doc_delta``: one rewindable document, then one delta per commit."""

    doc = Ids()()
    return [[conversation(ROOT)], [document_create(doc)]], lambda n: [document_delta(doc)]


WORKLOADS = {
    "commit_turn": turn_batches,
    "short_turn": short_turn_batches,
    "commit_doc_delta": doc_batches,
}


async def fill(backend: str, path: str, workload: str, commits: int) -> tuple[int, float]:
    """N commits of ``workload`` into a fresh store at ``path``; its size once closed, seconds."""

    store = Store(backend, "process", path)
    await store.open()
    setup, commit = WORKLOADS[workload]()
    started = time.perf_counter()
    for writes in setup:
        await store.storage.commit(writes, CTX)
    for n in range(1, commits - len(setup) + 1):
        await store.storage.commit(commit(n), CTX)
    elapsed = time.perf_counter() - started
    await store.close()
    if backend == "sqlite":
        connection = sqlite3.connect(os.path.join(path, "durable.sqlite"))
        try:
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            connection.close()
    return store.disk_bytes(), elapsed


def footprint(path: str) -> dict[str, Any]:
    from pi_durable_lmdb.audit.stats import stats

    info = stats(path)
    import msgspec

    return {
        "fileBytes": info.file_bytes,
        "records": info.records,
        **msgspec.to_builtins(info.footprint),
    }


async def measure(workload: str, commits: int, base: str) -> dict[str, Any]:
    out: dict[str, Any] = {"workload": workload, "commits": commits}
    for backend in ("lmdb", "sqlite"):
        path = os.path.join(base, f"{workload}-{commits}-{backend}")
        size, elapsed = await fill(backend, path, workload, commits)
        out[backend] = {
            "bytes": size,
            "bytesPerCommit": round(size / commits, 1),
            "seconds": round(elapsed, 2),
        }
        if backend == "lmdb":
            out["footprint"] = footprint(path)
        shutil.rmtree(path, ignore_errors=True)
    out["ratio"] = round(out["lmdb"]["bytes"] / out["sqlite"]["bytes"], 2)
    return out


def _mb(size: float) -> str:
    return f"{size / 1e6:.2f} MB"


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | commits | this store | SQLite (NORMAL) | ratio | B/commit (this / SQLite) |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| `{r['workload']}` | {r['commits']:,} | {_mb(r['lmdb']['bytes'])} | {_mb(r['sqlite']['bytes'])} | "
            f"{r['ratio']:.2f}x | {r['lmdb']['bytesPerCommit']:,.0f} / {r['sqlite']['bytesPerCommit']:,.0f} |"
        )
    for r in results:
        foot = r["footprint"]
        lines += [
            "",
            f"`{r['workload']}`, {r['commits']:,} commits: file {_mb(foot['fileBytes'])}, "
            f"free pages {foot['freePages']:,} ({foot['freeShare']:.1%} of the file), "
            f"log {foot['logBytesPerRecord']:,.0f} B per record",
            "",
            "| database | entries | branch | leaf | overflow | bytes | B/commit |",
            "|---|---|---|---|---|---|---|",
        ]
        rows = [(name, db) for name, db in foot["databases"].items() if db["bytes"] > 4096]
        for name, db in sorted(rows, key=lambda row: -row[1]["bytes"]):
            lines.append(
                f"| {name} | {db['entries']:,} | {db['branchPages']:,} | {db['leafPages']:,} | "
                f"{db['overflowPages']:,} | {_mb(db['bytes'])} | {db['bytes'] / r['commits']:,.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--commits",
        type=int,
        action="append",
        help="commits per workload (repeatable; default 9000)",
    )
    parser.add_argument(
        "--only", action="append", choices=sorted(WORKLOADS), help="only this workload (repeatable)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bench-footprint-")
    results = []
    try:
        for commits in args.commits or [9000]:
            for workload in args.only or list(WORKLOADS):
                result = asyncio.run(measure(workload, commits, base))
                results.append(result)
                print(
                    f"{workload:<18} {commits:>8,} commits: this store {_mb(result['lmdb']['bytes'])}, "
                    f"SQLite {_mb(result['sqlite']['bytes'])}, ratio {result['ratio']:.2f}x",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    elif args.markdown:
        print(markdown(results))


if __name__ == "__main__":
    main()
