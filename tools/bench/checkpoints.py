"""What checkpoints cost a sequential ``power`` committer, by checkpoint interval.

Usage: ``python -m tools.bench.checkpoints [--workload W] [--commits N] [--rounds R] [--dir DIR]``.
Each round runs ``commit_turn`` (an entry and its task record per commit,
``tools/bench/workloads.py``), or with ``--workload host`` the report's Session host turn (an
entry and one more line of a growing document, ``tools/bench/host.py``), on a fresh store per
interval (interleaved), then closes it (a clean close syncs everything, so what
checkpoints left undone is paid there). Per interval, medians over rounds of:

* the median and p99 of one commit;
* the mean of one commit, the close left out: what the benchmark report's host rows time (a
  loop of turns, then an untimed close);
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
The row after it is the benchmark report's floor of a ``power`` commit (``report.OneFlush``: the
``process`` commit behind one 1 KiB flush): against the row without checkpoints, what keeping
``data.mdb`` recoverable costs beyond the one flush. The last rows put an emulated checkpoint
on that floor (``FloorWithPages``): a side file takes 16, 12, 8 or 4 pages of 4 KiB per commit and a
thread flushes them every 16 commits. If the 16-page row costs what the default row does, the
gap between ``power`` and its floor is those bytes on the device, and the 8- and 4-page rows say
what fewer pages per commit would buy.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.journal import JournalOptions

from tools.bench.device import device_counters
from tools.bench.host import turn as host_turn
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
    **{
        f"floor + {pages} pages per commit flushed every 16 commits by another thread": {
            "floor": True,
            "pages": pages,
        }
        for pages in (16, 12, 8, 4)
    },
}
"""The last rows emulate a checkpoint on the floor: what ``power`` would cost if a commit left
``pages`` new pages for a checkpoint to write out (16 is what a turn leaves: ``device KiB per
commit`` of the default row over 4 KiB), with no pin, no journal and no LMDB in that part."""

CHECKPOINT_EVERY = 16
"""Commits between the emulated checkpoints (the default bound's most)."""


class FloorWithPages(OneFlush):
    """The floor (``report.OneFlush``) with an emulated checkpoint: every ``CHECKPOINT_EVERY``
    commits a thread of its own writes ``pages`` pages of 4 KiB per commit since the last one at
    fresh offsets of a side file (as a pinned LMDB leaves every copy-on-write page at a page no
    earlier checkpoint holds) and flushes them (``fdatasync``), as the checkpoint thread flushes
    ``data.mdb``. The writes are one call on that thread: the commits' own page writes are in
    the floor already (LMDB writes the same pages in ``process`` mode, to pages it reuses)."""

    FILE = 64 << 20

    def __init__(self, storage: Any, path: str, pages: int) -> None:
        super().__init__(storage, path)
        self._side = os.open(os.path.join(path, "side.mdb"), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(self._side, bytes(self.FILE), 0)
        os.fsync(self._side)
        self._at = 0
        self._commits = 0
        self._pages = os.urandom(4096 * pages * CHECKPOINT_EVERY)
        self._pool = concurrent.futures.ThreadPoolExecutor(1)

    def _checkpoint(self) -> None:
        os.pwrite(self._side, self._pages, self._at)
        os.fdatasync(self._side)
        self._at = (self._at + len(self._pages)) % (self.FILE - len(self._pages))

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        seq = await super().commit(*args, **kwargs)
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY == 0:
            self._pool.submit(self._checkpoint)
        return seq

    async def close(self, *args: Any, **kwargs: Any) -> Any:
        self._pool.shutdown()
        os.close(self._side)
        return await super().close(*args, **kwargs)


async def _prepare(storage: Any, workload: str, commits: int) -> Callable[[int], Awaitable[object]]:
    """The untimed start of ``workload`` on ``storage``; then commit ``n`` (1 to ``commits``):
    a ``commit_turn`` batch, or a ``Session`` host turn (``tools.bench.host.turn``)."""

    await storage.commit([conversation(ROOT)], CTX)
    if workload == "host":
        session = create_session(storage)
        return lambda n: session.commit(lambda tx: host_turn(tx, n), CTX)
    ids = Ids()
    task_id = ids()
    await storage.commit([{"type": "task", "value": task(task_id, ROOT, 0, "pending")}], CTX)
    batches = turn_batches(ids, task_id, commits)
    return lambda n: storage.commit(batches[n - 1], CTX)


async def one(
    options: dict[str, Any], commits: int, directory: str, workload: str = "commit_turn"
) -> tuple[float, ...]:
    """``(median, p99, mean, per commit with the close, device bytes, pages, user CPU, system
    CPU)``, each per commit."""

    path = os.path.join(tempfile.mkdtemp(prefix="bench-checkpoints-", dir=directory), "store")
    try:
        unsynced = options.get("process") or options.get("floor")

        async def open_store() -> Any:
            if unsynced:
                return await LmdbStorage.open(path, durability="process")
            return await LmdbStorage.open(
                path, durability="power", journal=JournalOptions(**options)
            )

        # A new store, closed: the pages LMDB uses (a process writer's open file holds more,
        # given back at its close).
        await (await open_store()).close()
        before_pages = os.path.getsize(os.path.join(path, "data.mdb")) // 4096
        storage = await open_store()
        if options.get("floor"):
            storage = (
                FloorWithPages(storage, path, options["pages"])
                if "pages" in options
                else OneFlush(storage, path)
            )
        step = await _prepare(storage, workload, commits)
        os.sync()
        written, _ = device_counters(path)
        times = []
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        for n in range(1, commits + 1):
            started = time.perf_counter()
            await step(n)
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
        sum(times) / commits,
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
    parser.add_argument("--workload", choices=("commit_turn", "host"), default="commit_turn")
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
                await one(
                    INTERVALS[name], args.commits, args.dir or tempfile.gettempdir(), args.workload
                )
            )
            print(f"round {round} {name}: done", file=sys.stderr, flush=True)
    print(
        f"`{args.workload}`, `power`, {args.commits} commits per store, medians of {args.rounds} rounds\n"
    )
    print(
        "| checkpoint | commit median | commit p99 | commit mean | per commit, close included "
        "| device KiB per commit | data.mdb pages per commit | CPU per commit: user + system |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, rows in results.items():
        median, p99, mean, whole, written, pages, user, system = (
            statistics.median(row[i] for row in rows) for i in range(8)
        )
        print(
            f"| {name} | {median * 1e6:.0f} µs | {p99 * 1e6:.0f} µs | {mean * 1e6:.0f} µs "
            f"| {whole * 1e6:.0f} µs | {written / 1024:.1f} "
            f"| {pages:.2f} | {user * 1e6:.0f} + {system * 1e6:.0f} µs |"
        )


if __name__ == "__main__":
    asyncio.run(main())
