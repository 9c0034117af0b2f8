"""What the disk is asked to do per ``power`` commit: this store against pi-durable's SQLite FULL.

Usage: ``python -m tools.bench.device [--commits N] [--rounds R] [--dir DIR]``. For each backend,
``commit_turn`` (``tools/bench/workloads.py``) on a fresh store in DIR, between two ``sync()``
calls, reading the block device's counters (``/proc/diskstats``: sectors and write requests) of
the file system DIR is on. Other work on the same disk counts too: run it on a quiet machine and
compare the two backends of the same round. What it shows: a one-flush design is bounded by the
bytes each commit dirties as much as by its flush (LMDB copies every page it changes, ~14 pages
of 4 KiB in six sub-databases per turn; SQLite's WAL takes its changed pages once).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time

from tools.bench.report import Store
from tools.bench.workloads import measure_turns, populate_turns


def device_counters(path: str) -> tuple[int, int]:
    """(bytes written, write requests completed) of the block device holding ``path``."""

    dev = os.stat(path).st_dev
    major, minor = os.major(dev), os.minor(dev)
    with open("/proc/diskstats", encoding="ascii") as stats:
        for line in stats:
            fields = line.split()
            if int(fields[0]) == major and int(fields[1]) == minor:
                return int(fields[9]) * 512, int(fields[7])
    raise SystemExit(
        f"no /proc/diskstats line for device {major}:{minor} (the file system of {path})"
    )


async def one(backend: str, commits: int, directory: str) -> str:
    path = tempfile.mkdtemp(prefix=f"bench-device-{backend}-", dir=directory)
    store = Store(backend, "power", path)
    await store.open()
    state = await populate_turns(store, commits / 150)
    os.sync()
    written, requests = device_counters(path)
    started = time.perf_counter()
    await measure_turns(store, state, 0)
    elapsed = time.perf_counter() - started
    await store.close()
    os.sync()
    written_after, requests_after = device_counters(path)
    shutil.rmtree(path, ignore_errors=True)
    n = state.count
    return (
        f"| {backend} | {n} | {elapsed / n * 1e6:,.0f} µs | {(written_after - written) / n / 1024:.1f} KiB "
        f"| {(requests_after - requests) / n:.1f} |"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    print(
        "| backend (power / FULL) | commits | per commit | device bytes per commit (with the close) | write requests per commit |"
    )
    print("|---|---:|---:|---:|---:|")
    for _ in range(args.rounds):
        for backend in ("lmdb", "sqlite"):
            print(await one(backend, args.commits, args.dir), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
