"""Where a long Session host's store time per turn grows: ``host.py``'s turns (an entry and one
more line in a conversation document never checkpointed) on one store, timed window by window.

Usage: ``python -m tools.bench.host_growth [--turns 20000] [--window 1000] [--mode process]
[--line 60] [--profile 3] [--dir DIR]``. Per window of turns it reports the store's own time per
turn (a stopwatch around each of the store's async methods, as ``host.py``'s ``.in_store``),
split by method; the document's size; and the depth and pages of the B-trees that grow (the
log, the document revisions). With ``--profile K``, the store's calls in the first K windows
and the last K are profiled (cProfile, the store's calls only) and the functions whose time per
turn grew the most are listed: whether the growth is LMDB's (deeper trees, more pages touched)
or this engine's code (work proportional to the document or the log).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

from tools.bench.host import Transcript
from tools.bench.workloads import ROOT, conversation, entry


class MethodTimes:
    """A Storage seen through a stopwatch per method (``TimedStorage``, split by name), with a
    profiler switched on around the store's calls while ``profiler`` is set."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage
        self.inside: dict[str, float] = defaultdict(float)
        """Seconds of this thread's CPU inside each method (``process`` commits run on the
        caller's thread: a loaded machine's waits are left out)."""
        self.calls: dict[str, int] = defaultdict(int)
        self.profiler: cProfile.Profile | None = None

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._storage, name)
        if not callable(value) or name.startswith("_"):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            profiler = self.profiler
            started = time.thread_time()
            if profiler is not None:
                profiler.enable()
            try:
                result = value(*args, **kwargs)
            finally:
                if profiler is not None:
                    profiler.disable()
            if not hasattr(result, "__await__"):
                self.inside[name] += time.thread_time() - started
                self.calls[name] += 1
                return result

            async def waited() -> Any:
                if profiler is not None:
                    profiler.enable()
                try:
                    return await result
                finally:
                    if profiler is not None:
                        profiler.disable()
                    self.inside[name] += time.thread_time() - started
                    self.calls[name] += 1

            return waited()

        return timed


def tree_shape(storage: LmdbStorage) -> dict[str, tuple[int, int]]:
    """(depth, pages) of every database with more than one page."""

    env = storage._env.env
    out: dict[str, tuple[int, int]] = {}
    with env.begin(buffers=False) as txn:
        for name, db in storage._env._dbs.items():
            stat = txn.stat(db)
            pages = (
                int(stat["branch_pages"]) + int(stat["leaf_pages"]) + int(stat["overflow_pages"])
            )
            if pages > 1:
                out[name.decode(errors="replace")] = (int(stat["depth"]), pages)
    return out


def _by_function(profile: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profile)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    return {
        f"{os.path.basename(file)}:{line}({function})": value[2]  # tottime
        for (file, line, function), value in raw.items()
    }


async def run(args: argparse.Namespace) -> None:
    base = tempfile.mkdtemp(prefix="host-growth-", dir=args.dir)
    storage = await LmdbStorage.open(os.path.join(base, "store"), durability=args.mode)
    try:
        await storage.commit([conversation(ROOT)], CTX)
        timed = MethodTimes(storage)
        session = create_session(timed)
        pad = "x" * max(0, args.line - 40)

        async def turn(tx: Any, n: int) -> None:
            value = entry(0, ROOT, n)
            await tx.append_entry(ROOT, {key: value[key] for key in ("kind", "model", "data")})
            transcript = await tx.doc(Transcript, ROOT)
            transcript["text"] += f"Turn {n}: ran the tests, {1834 + n % 97} tokens.{pad}\n"

        windows = args.turns // args.window
        early = cProfile.Profile(time.thread_time) if args.profile else None
        late = cProfile.Profile(time.thread_time) if args.profile else None
        print(
            "| turns | store CPU µs / turn | by method (CPU µs / turn) | whole turn CPU µs "
            "| whole turn wall µs | document KiB | deepest trees (depth, pages) |"
        )
        print("|---:|---:|---|---:|---:|---:|---|")
        text_bytes = 0
        for window in range(windows):
            timed.profiler = (
                early
                if window < args.profile
                else late
                if window >= windows - args.profile
                else None
            )
            timed.inside.clear()
            timed.calls.clear()
            started, cpu = time.perf_counter(), time.thread_time()
            for n in range(window * args.window + 1, (window + 1) * args.window + 1):
                await session.commit(lambda tx, n=n: turn(tx, n), CTX)
            whole, whole_cpu = time.perf_counter() - started, time.thread_time() - cpu
            timed.profiler = None
            text_bytes = sum(
                len(f"Turn {n}: ran the tests, {1834 + n % 97} tokens.{pad}\n")
                for n in range(1, (window + 1) * args.window + 1)
            )
            inside = sum(timed.inside.values())
            methods = ", ".join(
                f"{name} {seconds / args.window * 1e6:.0f}"
                for name, seconds in sorted(timed.inside.items(), key=lambda item: -item[1])
            )
            shape = tree_shape(storage)
            deepest = sorted(shape.items(), key=lambda item: (-item[1][0], -item[1][1]))[:4]
            print(
                f"| {(window + 1) * args.window:,} | {inside / args.window * 1e6:.0f} | {methods} "
                f"| {whole_cpu / args.window * 1e6:.0f} | {whole / args.window * 1e6:.0f} "
                f"| {text_bytes / 1024:,.0f} "
                f"| {', '.join(f'{name} {depth}/{pages}' for name, (depth, pages) in deepest)} |",
                flush=True,
            )
        if early is not None and late is not None:
            turns = args.profile * args.window
            first, last = _by_function(early), _by_function(late)
            grown = sorted(
                (
                    (last.get(name, 0.0) - first.get(name, 0.0), name)
                    for name in set(first) | set(last)
                ),
                reverse=True,
            )
            print(
                f"\nFunctions whose own CPU time per turn grew most, first {turns:,} turns against "
                f"the last {turns:,} (cProfile timed by the thread's CPU clock, store calls only; "
                "µs per turn, profiler overhead included alike):\n"
            )
            print("| function | first | last | grown by |")
            print("|---|---:|---:|---:|")
            for delta, name in grown[: args.top]:
                print(
                    f"| {name} | {first.get(name, 0.0) / turns * 1e6:.1f} "
                    f"| {last.get(name, 0.0) / turns * 1e6:.1f} | {delta / turns * 1e6:+.1f} |"
                )
    finally:
        await storage.close()
        shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench.host_growth", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--turns", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=1_000)
    parser.add_argument("--mode", default="process", choices=("process", "power"))
    parser.add_argument(
        "--line", type=int, default=75, help="bytes the document grows by per turn (default 75)"
    )
    parser.add_argument("--profile", type=int, default=0, help="windows profiled at each end")
    parser.add_argument("--top", type=int, default=15, help="functions listed (default 15)")
    parser.add_argument("--dir", help="parent of the temporary store")
    args = parser.parse_args(argv)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
