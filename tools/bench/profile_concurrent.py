"""Where the CPU of many concurrent agents goes, per thread (issue 23, item 3).

Runs the agents of ``tools/bench/concurrent.py`` (N agents on one loop, one store, turns of an
entry and its task) once, and splits the process's CPU per commit between the event loop's thread
(callers: encode, submit, resume) and the committer's writer thread (groups: checks, append,
fold, journal, LMDB commit); "other" is mostly the checkpoint thread. Also: context switches per
commit on each thread (a GIL handed back and forth shows here first), the group sizes, the mean
flush (journal + LMDB commit) per group, the garbage collections and what they cost.

    python -m tools.bench.profile_concurrent                          # 64 agents, power, 6000 commits
    python -m tools.bench.profile_concurrent --agents 8 --mode process
    python -m tools.bench.profile_concurrent --profile /tmp/prof      # + cProfile of each thread

Figures vary with the machine's load (a second core taken by another process changes how the two
threads overlap); compare runs made one after the other, alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from pi_durable_lmdb.log import threads

from tools.bench.concurrent import percentile, run_agents
from tools.bench.report import Store


def _switches() -> int:
    """Context switches of the calling thread so far (voluntary and not)."""

    total = 0
    with open(f"/proc/self/task/{threading.get_native_id()}/status") as status:
        for line in status:
            if "ctxt_switches" in line:
                total += int(line.split(":")[1])
    return total


class _Writer:
    """Wraps the writer thread's loop (``log.threads.Worker._main`` of the committer's worker):
    its CPU, switches and (optionally) profile."""

    def __init__(self, profile: bool) -> None:
        self.cpu = 0.0
        self.switches = 0
        self.profile = cProfile.Profile() if profile else None

    def wrap(self, run: Callable[[Any], None]) -> Callable[[Any], None]:
        def writer(worker: Any) -> None:
            if not worker.name.startswith("lmdb-writer"):
                run(worker)  # the checkpoint or fold thread
                return
            switches, cpu = _switches(), time.thread_time()
            if self.profile is not None:
                self.profile.enable()
            try:
                run(worker)
            finally:
                if self.profile is not None:
                    self.profile.disable()
                self.cpu += time.thread_time() - cpu
                self.switches += _switches() - switches

        return writer


async def measure(agents: int, turns: int, mode: str, profile: str | None) -> None:
    writer = _Writer(profile is not None)
    original = threads.Worker._main
    threads.Worker._main = writer.wrap(original)  # type: ignore[method-assign]
    collections: list[tuple[str, int, float]] = []
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            collections.append(
                (
                    threading.current_thread().name.split()[0],
                    info["generation"],
                    time.perf_counter() - started[0],
                )
            )

    base = tempfile.mkdtemp(prefix="profile-concurrent-")
    store = Store("lmdb", mode, base)
    try:
        await store.open()
        loop_profile = cProfile.Profile() if profile is not None else None
        gc.collect()
        gc.callbacks.append(on_gc)
        switches, cpu, process = _switches(), time.thread_time(), time.process_time()
        if loop_profile is not None:
            loop_profile.enable()
        _elapsed, rest = await run_agents(store.storage, agents, turns)
        if loop_profile is not None:
            loop_profile.disable()
        loop_cpu, loop_switches = time.thread_time() - cpu, _switches() - switches
        counters = store.storage.counters
        await store.close()  # the writer thread ends here: its figures are whole
        gc.callbacks.remove(on_gc)
        total = time.process_time() - process
    finally:
        threads.Worker._main = original  # type: ignore[method-assign]
        shutil.rmtree(base, ignore_errors=True)
    commits = max(1, turns // agents) * agents
    per = 1e6 / commits
    groups = counters.group_batches
    flushes = counters.flush_seconds
    print(
        f"{agents} agents, {mode}, {commits} commits: {rest[0]:,.0f} commits/s, stall p99 {percentile(rest[2:], 0.99) * 1e3:.2f} ms"
    )
    print(
        f"CPU µs per commit: {total * per:.1f} = loop thread {loop_cpu * per:.1f} + writer thread {writer.cpu * per:.1f}"
        f" + other {(total - loop_cpu - writer.cpu) * per:.1f}"
    )
    print(
        f"context switches per commit: loop thread {loop_switches / commits:.2f}, writer thread {writer.switches / commits:.2f}"
    )
    print(
        f"groups: {groups.count}, {groups.sum / max(1, groups.count):.1f} batches each on average; "
        f"flush (journal + LMDB commit) {flushes.sum / max(1, flushes.count) * 1e6:.0f} µs each on average"
    )
    for thread in sorted({name for name, _, _ in collections}):
        for generation in (0, 1, 2):
            spent = [
                seconds
                for name, gen, seconds in collections
                if name == thread and gen == generation
            ]
            if spent:
                print(
                    f"gc generation {generation} on {thread}: {len(spent)} collections, {sum(spent) / len(spent) * 1e6:.0f} µs each, "
                    f"{sum(spent) * per:.2f} µs per commit"
                )
    if profile is not None:
        assert loop_profile is not None and writer.profile is not None
        os.makedirs(profile, exist_ok=True)
        loop_profile.dump_stats(os.path.join(profile, "loop.prof"))
        writer.profile.dump_stats(os.path.join(profile, "writer.prof"))
        print(
            f"cProfile of each thread in {profile}/loop.prof and {profile}/writer.prof (python -m pstats)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--turns", type=int, default=6000, help="commits in all")
    parser.add_argument("--mode", default="power", choices=("power", "process"))
    parser.add_argument(
        "--profile", metavar="DIR", help="also write a cProfile of each thread to DIR"
    )
    args = parser.parse_args(argv)
    asyncio.run(measure(args.agents, args.turns, args.mode, args.profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
