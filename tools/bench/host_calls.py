"""Which Storage calls a Session host turn makes, and what each costs, this store and SQLite in
the same run.

Usage: ``python -m tools.bench.host_calls [--fill 2000] [--turns 500] [--windows 6]
[--modes process,power] [--dir DIR]``. Per durability class, two stores side by side: this store
(``process`` or ``power``) and pi-durable's SQLite backend (NORMAL or FULL, as ``tools.bench``
opens it). Each is filled with ``--fill`` of ``host.py``'s turns (an entry, one more line in a
conversation document never checkpointed) through a Session, then ``--windows`` alternated
windows of ``--turns`` turns each run on the two. Per store, medians over windows of:

* each Storage method the Session called: calls per turn and the calling thread's CPU per turn
  inside it (``host_growth.MethodTimes``: a ``power`` commit that went to the writer thread
  leaves its CPU out of this column, and its share is printed);
* per turn: wall time, the calling thread's CPU (the Session's part included) and the whole
  process's CPU (this store's checkpoint and writer threads included).

Counts and CPU rather than wall time: they hold on a shared, loaded machine.
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
from dataclasses import dataclass, field
from typing import Any

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.bench.host import turn
from tools.bench.host_growth import MethodTimes
from tools.bench.report import Store
from tools.bench.workloads import ROOT, conversation

SQLITE_NAMES = {"process": "SQLite NORMAL", "power": "SQLite FULL"}


@dataclass
class Side:
    """One store of a class, its stopwatch and Session, and what each window measured."""

    name: str
    store: Store
    timed: MethodTimes
    session: Any
    next: int = 1
    calls: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    totals: dict[str, list[float]] = field(default_factory=dict)

    async def turns(self, count: int) -> None:
        for n in range(self.next, self.next + count):
            await self.session.commit(lambda tx, n=n: turn(tx, n), CTX)
        self.next += count

    async def window(self, count: int) -> None:
        """``count`` turns, measured."""

        self.timed.inside.clear()
        self.timed.calls.clear()
        counters = getattr(self.store.storage, "counters", None)
        direct = counters.direct_commits if counters is not None else 0
        wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
        await self.turns(count)
        measured = {
            "wall": time.perf_counter() - wall,
            "calling thread": time.thread_time() - thread,
            "process": time.process_time() - process,
        }
        for name, seconds in measured.items():
            self.totals.setdefault(name, []).append(seconds / count * 1e6)
        if counters is not None:
            share = (counters.direct_commits - direct) / max(1, self.timed.calls["commit"])
            self.totals.setdefault("commits on the calling thread %", []).append(share * 100)
        for name, calls in self.timed.calls.items():
            self.calls.setdefault(name, []).append(calls / count)
            self.cpu.setdefault(name, []).append(self.timed.inside[name] / count * 1e6)


async def open_side(name: str, backend: str, mode: str, directory: str) -> Side:
    store = Store(backend, mode, directory)
    await store.open()
    await store.storage.commit([conversation(ROOT)], CTX)
    timed = MethodTimes(store.storage)
    return Side(name, store, timed, create_session(timed))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def print_class(mode: str, sides: list[Side], turns: int, windows: int) -> None:
    lmdb, sqlite = sides
    print(
        f"\n{mode}: {lmdb.name} and {sqlite.name}, {windows} alternated windows of {turns:,} turns "
        f"after {lmdb.next - 1 - turns * windows:,}; medians over windows, per turn\n"
    )
    print(
        f"| Storage method | {lmdb.name} calls | {lmdb.name} CPU µs | {sqlite.name} calls "
        f"| {sqlite.name} CPU µs | {sqlite.name} / {lmdb.name} CPU |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name in sorted(set(lmdb.calls) | set(sqlite.calls)):
        ours, theirs = _median(lmdb.cpu.get(name, [])), _median(sqlite.cpu.get(name, []))
        ratio = f"{theirs / ours:.2f}x" if ours > 0 else "—"
        print(
            f"| {name} | {_median(lmdb.calls.get(name, [])):.2f} | {ours:.1f} "
            f"| {_median(sqlite.calls.get(name, [])):.2f} | {theirs:.1f} | {ratio} |"
        )
    inside = [sum(side.cpu[name][w] for name in side.cpu) for side in sides for w in range(windows)]
    ours, theirs = _median(inside[:windows]), _median(inside[windows:])
    print(
        f"| all Storage methods | | {ours:.1f} | | {theirs:.1f} | "
        f"{theirs / ours if ours else 0:.2f}x |"
    )
    for name in ("wall", "calling thread", "process"):
        ours, theirs = _median(lmdb.totals[name]), _median(sqlite.totals[name])
        label = "wall µs" if name == "wall" else f"{name} CPU µs"
        print(f"| whole turn: {label} | | {ours:.1f} | | {theirs:.1f} | {theirs / ours:.2f}x |")
    share = lmdb.totals.get("commits on the calling thread %")
    if share:
        print(
            f"\n{lmdb.name}: {_median(share):.1f}% of commits ran on the calling thread "
            "(the rest on the writer thread, their CPU outside the commit column)"
        )


async def run(args: argparse.Namespace) -> None:
    base = tempfile.mkdtemp(prefix="host-calls-", dir=args.dir)
    try:
        for mode in args.modes.split(","):
            sides = [
                await open_side(f"lmdb ({mode})", "lmdb", mode, os.path.join(base, f"lmdb-{mode}")),
                await open_side(
                    SQLITE_NAMES[mode], "sqlite", mode, os.path.join(base, f"sqlite-{mode}")
                ),
            ]
            try:
                for side in sides:
                    await side.turns(args.fill)
                for window in range(args.windows):
                    for side in sides if window % 2 == 0 else sides[::-1]:
                        await side.window(args.turns)
                print_class(mode, sides, args.turns, args.windows)
            finally:
                for side in sides:
                    await side.store.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.host_calls", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--fill", type=int, default=2_000, help="turns before the first window")
    parser.add_argument("--turns", type=int, default=500, help="turns per window")
    parser.add_argument("--windows", type=int, default=6, help="alternated windows per store")
    parser.add_argument("--modes", default="process,power", help="durability classes")
    parser.add_argument("--dir", help="parent of the temporary stores")
    args = parser.parse_args(argv)
    for mode in args.modes.split(","):
        if mode not in SQLITE_NAMES:
            parser.error(f"--modes: {mode!r} is neither process nor power")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
