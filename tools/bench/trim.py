"""What trimming old history gives back on disk, for the Session host of ``tools/bench/host.py``.

A store of N turns (each an entry, a model message with usage data, and one more line in a
conversation document never checkpointed, through a pi-durable ``Session``; ``process``
durability) is closed, compacted (free pages are no trim's doing) and measured, trimmed to its last N/10 records with ``durable-log trim``
(which compacts the file), and measured again: every file of the store directory, and where the
bytes went (the ``stats`` footprint's largest databases).

Usage::

    python -m tools.bench.trim                   # 20,000 turns
    python -m tools.bench.trim --turns 100000
    python -m tools.bench.trim --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from typing import Any

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit.stats import stats
from pi_durable_lmdb.cli import main as durable_log
from pi_durable_lmdb.log.compact import compact

from tools.bench.host import Transcript, summary
from tools.bench.workloads import ROOT, conversation, entry


def directory_bytes(path: str) -> int:
    """Every file of a store directory, in bytes."""

    return sum(
        os.path.getsize(os.path.join(folder, name))
        for folder, _, names in os.walk(path)
        for name in names
    )


async def build(path: str, turns: int) -> None:
    """A Session host's store of ``turns`` turns."""

    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit([conversation(ROOT)], CTX)
        session = create_session(storage)
        for n in range(1, turns + 1):

            async def turn(tx: Any, n: int = n) -> None:
                value = entry(0, ROOT, n)
                await tx.append_entry(ROOT, {key: value[key] for key in ("kind", "model", "data")})
                transcript = await tx.doc(Transcript, ROOT)
                transcript["text"] += summary(n)

            await session.commit(turn, CTX)
    finally:
        await storage.close()


def largest(path: str, count: int = 6) -> dict[str, int]:
    """The store's largest databases, in bytes (``stats``' footprint)."""

    tables = stats(path).footprint.databases
    ranked = sorted(tables.items(), key=lambda item: -item[1].bytes)[:count]
    return {name: pages.bytes for name, pages in ranked}


def measure(turns: int) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="durable-trim-bench-")
    try:
        path = os.path.join(folder, "store")
        started = time.monotonic()
        asyncio.run(build(path, turns))
        built = time.monotonic() - started
        compact(path)  # the untrimmed store without free pages: only the trim's share is counted
        before, where_before = directory_bytes(path), largest(path)
        head = turns + 1
        started = time.monotonic()
        code = durable_log(["trim", path, "--before", str(head - turns // 10 + 1)])
        if code != 0:
            raise SystemExit(f"durable-log trim exited {code}")
        trimmed = time.monotonic() - started
        after, where_after = directory_bytes(path), largest(path)
        return {
            "turns": turns,
            "kept": turns // 10,
            "bytesBefore": before,
            "bytesAfter": after,
            "ratio": round(before / after, 2),
            "buildSeconds": round(built, 1),
            "trimSeconds": round(trimmed, 1),
            "largestBefore": where_before,
            "largestAfter": where_after,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20_000, help="turns of the host's store")
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args()
    result = measure(args.turns)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['turns']:,} turns trimmed to the last {result['kept']:,}: "
        f"{result['bytesBefore']:,} bytes before, {result['bytesAfter']:,} after "
        f"({result['ratio']}x smaller; built in {result['buildSeconds']} s, "
        f"trimmed and compacted in {result['trimSeconds']} s)"
    )
    for label, where in (("before", result["largestBefore"]), ("after", result["largestAfter"])):
        print(f"  largest {label}: " + ", ".join(f"{k} {v:,}" for k, v in where.items()))


if __name__ == "__main__":
    main()
