"""What each answer to "process mode under power loss" costs, in one run beside SQLite.

Commits of the ``commit_turn`` shape (an entry and a task replacement per batch) through
``LmdbStorage``, per commit, under:

``power``            the default: LMDB syncs data pages (fdatasync) and then the meta page
                     (an ``O_DSYNC`` write) before ``commit`` returns
``process``          ``MDB_NOSYNC``: no sync per commit. The chosen remedy adds nothing per commit:
                     ``process.unsynced`` is written and synced once per open, removed per close
``process+nometasync``  remedy not taken: ``MDB_NOMETASYNC`` (data pages synced each commit, the
                     meta page not): consistent after any power cut, loses at most the last commit
``process+sync100``  remedy not taken: ``MDB_NOSYNC`` plus ``env.sync()`` every 100 ms of commits:
                     bounds the loss window, but reordered writes still damage the store between syncs

SQLite (pi-durable's backend, WAL) with ``synchronous=NORMAL`` and ``FULL`` runs in the same rounds;
the ratio column is SQLite NORMAL's time over each variant's (paired per round, median), > 1 is
faster. Also the cost of one open + close of a store, per mode (the marker's fsyncs).

Usage: ``python -m tools.bench.durability [--commits 300] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import lmdb
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.bench.report import Store
from tools.bench.workloads import ROOT, conversation, entry, task

VARIANTS = (
    "power",
    "process",
    "process+nometasync",
    "process+sync100",
    "sqlite-normal",
    "sqlite-full",
)
_real_open = lmdb.open


def _lmdb_open_nometasync(*args: Any, **kwargs: Any) -> Any:
    kwargs["sync"] = True
    kwargs["metasync"] = False
    return _real_open(*args, **kwargs)


async def _open(variant: str, path: str) -> Any:
    if variant.startswith("sqlite"):
        store = Store("sqlite", "power" if variant == "sqlite-full" else "process", path)
        await store.open()
        return store.storage
    from pi_durable_lmdb.storage import LmdbStorage

    if variant == "process+nometasync":
        lmdb.open = _lmdb_open_nometasync  # type: ignore[assignment]
        try:
            return await LmdbStorage.open(path, durability="power")
        finally:
            lmdb.open = _real_open  # type: ignore[assignment]
    return await LmdbStorage.open(path, durability="power" if variant == "power" else "process")


async def commits(variant: str, path: str, count: int) -> float:
    """Seconds per commit over ``count`` turn commits on a new store."""

    storage = await _open(variant, path)
    try:
        await storage.commit([conversation(ROOT)], CTX)
        next_id = 10
        last_sync = time.perf_counter()
        started = time.perf_counter()
        for n in range(1, count + 1):
            next_id += 1
            await storage.commit(
                [
                    {"type": "entry", "value": entry(next_id, ROOT, n, 2)},
                    {"type": "task", "value": task(2, ROOT, n, "running" if n % 3 else "sleeping")},
                ],
                CTX,
            )
            if variant == "process+sync100" and time.perf_counter() - last_sync >= 0.1:
                storage._env.sync()
                last_sync = time.perf_counter()
        return (time.perf_counter() - started) / count
    finally:
        await storage.close(CTX)


async def open_close(variant: str, path: str, times: int) -> float:
    from pi_durable_lmdb.storage import LmdbStorage

    storage = await LmdbStorage.open(path, durability=variant)
    await storage.close(CTX)
    started = time.perf_counter()
    for _ in range(times):
        storage = await LmdbStorage.open(path, durability=variant)
        await storage.close(CTX)
    return (time.perf_counter() - started) / times


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base = tempfile.mkdtemp(prefix="bench-durability-")
    per: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    opens: dict[str, list[float]] = {"power": [], "process": []}
    try:
        for round in range(args.rounds):
            order = VARIANTS[round % len(VARIANTS) :] + VARIANTS[: round % len(VARIANTS)]
            for variant in order:
                path = os.path.join(base, f"{variant}-{round}")
                per[variant].append(await commits(variant, path, args.commits))
                shutil.rmtree(path)
            for mode in ("power", "process"):
                path = os.path.join(base, f"open-{mode}-{round}")
                opens[mode].append(await open_close(mode, path, 10))
                shutil.rmtree(path)
            print(f"round {round + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"{args.commits} turn commits per variant per round, {args.rounds} rounds, median per commit; "
        "ratio = SQLite NORMAL's time / the variant's, paired per round"
    )
    print()
    print("| variant | per commit | vs SQLite NORMAL |")
    print("|---|---|---|")
    for variant in VARIANTS:
        ratios = [normal / mine for normal, mine in zip(per["sqlite-normal"], per[variant])]
        print(
            f"| {variant} | {statistics.median(per[variant]) * 1e6:,.0f} µs | {statistics.median(ratios):.2f}x |"
        )
    print()
    print("| open + close of a store | time |")
    print("|---|---|")
    for mode, values in opens.items():
        print(f"| {mode} | {statistics.median(values) * 1e3:.2f} ms |")


if __name__ == "__main__":
    asyncio.run(main())
