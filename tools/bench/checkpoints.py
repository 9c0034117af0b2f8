"""What checkpoints cost a sequential ``power`` committer, by checkpoint interval.

Usage: ``python -m tools.bench.checkpoints [--commits N] [--rounds R] [--dir DIR]``. Each round
runs ``commit_turn`` (an entry and its task record per commit, ``tools/bench/workloads.py``) on a
fresh store per interval (interleaved), then closes it (a clean close syncs everything, so what
checkpoints left undone is paid there). Per interval, medians over rounds of:

* the median and p99 of one commit;
* the time per commit including the close: what a long run pays, checkpoints and all;
* the block device's bytes written per commit, between two ``sync()`` calls around commits and
  close (``/proc/diskstats``, as ``tools/bench/device.py``: other work on the disk counts too);
* the pages of ``data.mdb`` per commit (its size after the close over the commits);
* the process's CPU per commit (``getrusage``: every thread, the checkpoints' included), user and
  system.

What it shows: between two checkpoints a read transaction pins the last one, so LMDB reuses no
page freed after it and every commit's copy-on-write pages are new pages, all written out by the
next checkpoint; the interval moves that cost around (commit latency, p99, the close) but does
not remove it. ``process`` mode, without the pin, rewrites the same hot pages in the page cache.
The last row is the benchmark report's floor of a ``power`` commit (``report.OneFlush``: the
``process`` commit behind one 1 KiB flush): against the row without checkpoints, what keeping
``data.mdb`` recoverable costs beyond the one flush.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.journal import JournalOptions

from tools.bench.device import device_counters
from tools.bench.report import OneFlush
from tools.bench.workloads import ROOT, Ids, conversation, task, turn_batches

NEVER = 10**9
FIXED: dict[str, Any] = {
    "pinned_share": 1.0,
    "pinned_pages": 1 << 30,
    "checkpoint_bytes": 1 << 40,
    "checkpoint_seconds": 1e9,
}
"""No bound but the commit count (the bound still starts at one commit and doubles)."""
INTERVALS: dict[str, dict[str, Any]] = {
    "every 16 commits at most, adapting to the free pages (default)": {},
    "every 32 commits (fixed)": {**FIXED, "checkpoint_commits": 32, "segment_min": 1 << 20},
    "every 128 commits": {
        **FIXED,
        "checkpoint_commits": 128,
        "segment_size": 8 << 20,
        "segment_min": 8 << 20,
    },
    "none until the close": {
        **FIXED,
        "checkpoint_commits": NEVER,
        "segment_size": 32 << 20,
        "segment_min": 32 << 20,
    },
    "`process` mode (no pin, no flush; reference)": {"process": True},
    "floor: `process` mode + one flush per commit (nothing recoverable)": {"floor": True},
}


async def one(options: dict[str, Any], commits: int, directory: str) -> tuple[float, ...]:
    """``(median, p99, per commit with the close, device bytes, pages, user CPU, system CPU)``,
    each per commit."""

    path = os.path.join(tempfile.mkdtemp(prefix="bench-checkpoints-", dir=directory), "store")
    try:
        if options.get("process"):
            storage = await LmdbStorage.open(path, durability="process")
        elif options.get("floor"):
            storage = OneFlush(await LmdbStorage.open(path, durability="process"), path)
        else:
            storage = await LmdbStorage.open(
                path, durability="power", journal=JournalOptions(**options)
            )
        ids = Ids()
        task_id = ids()
        await storage.commit([conversation(ROOT)], CTX)
        await storage.commit([{"type": "task", "value": task(task_id, ROOT, 0, "pending")}], CTX)
        batches = turn_batches(ids, task_id, commits)
        before_pages = os.path.getsize(os.path.join(path, "data.mdb")) // 4096
        os.sync()
        written, _ = device_counters(path)
        times = []
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        for writes in batches:
            started = time.perf_counter()
            await storage.commit(writes, CTX)
            times.append(time.perf_counter() - started)
        started = time.perf_counter()
        await storage.close()
        closing = time.perf_counter() - started
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)  # every thread's: the checkpoints' too
        os.sync()
        written = device_counters(path)[0] - written
        pages = os.path.getsize(os.path.join(path, "data.mdb")) // 4096 - before_pages
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    times.sort()
    return (
        statistics.median(times),
        times[min(len(times) - 1, int(len(times) * 0.99))],
        (sum(times) + closing) / commits,
        written / commits,
        pages / commits,
        (cpu_after.ru_utime - cpu.ru_utime) / commits,
        (cpu_after.ru_stime - cpu.ru_stime) / commits,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commits", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--dir", default=None, help="where the stores go (default: the system temp dir)"
    )
    args = parser.parse_args()
    results: dict[str, list[tuple[float, ...]]] = {name: [] for name in INTERVALS}
    for round in range(args.rounds):
        names = list(INTERVALS)
        names = (
            names[round % len(names) :] + names[: round % len(names)]
        )  # rotated: drift hits all alike
        for name in names:
            results[name].append(
                await one(INTERVALS[name], args.commits, args.dir or tempfile.gettempdir())
            )
            print(f"round {round} {name}: done", file=sys.stderr, flush=True)
    print(
        f"`commit_turn`, `power`, {args.commits} commits per store, medians of {args.rounds} rounds\n"
    )
    print(
        "| checkpoint | commit median | commit p99 | per commit, close included | device KiB per commit "
        "| data.mdb pages per commit | CPU per commit: user + system |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        median, p99, whole, written, pages, user, system = (
            statistics.median(row[i] for row in rows) for i in range(7)
        )
        print(
            f"| {name} | {median * 1e6:.0f} µs | {p99 * 1e6:.0f} µs | {whole * 1e6:.0f} µs | {written / 1024:.1f} "
            f"| {pages:.2f} | {user * 1e6:.0f} + {system * 1e6:.0f} µs |"
        )


if __name__ == "__main__":
    asyncio.run(main())
