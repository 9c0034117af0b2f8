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

``--paired SMALL``: the same question asked of two stores side by side instead of one store
over time, so that a noisy machine's drift cancels: one store filled with SMALL turns and one
with ``--turns``, then ``--rounds`` windows of turns on each, alternated (small, big, big,
small, ...), timed by the thread's CPU clock; the big store's time over the small one's is
taken per round. With ``--profile K`` K more alternated rounds are profiled, and the functions
whose time per turn is larger on the big store are listed.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
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


def print_growth(
    first: cProfile.Profile,
    second: cProfile.Profile,
    turns: int,
    title: str,
    columns: tuple[str, str, str],
    top: int,
) -> None:
    """The ``top`` functions whose own time per turn is larger in ``second`` than in ``first``
    (each profiled over ``turns`` turns), and the difference over all functions."""

    one, two = _by_function(first), _by_function(second)
    grown = sorted(
        ((two.get(name, 0.0) - one.get(name, 0.0), name) for name in set(one) | set(two)),
        reverse=True,
    )
    print(f"\n{title.format(turns=turns)}:\n")
    print(f"| function | {' | '.join(columns)} |")
    print("|---|---:|---:|---:|")
    for delta, name in grown[:top]:
        print(
            f"| {name} | {one.get(name, 0.0) / turns * 1e6:.1f} "
            f"| {two.get(name, 0.0) / turns * 1e6:.1f} | {delta / turns * 1e6:+.1f} |"
        )
    total = (sum(two.values()) - sum(one.values())) / turns * 1e6
    print(f"| all functions | | | {total:+.1f} |")


def _line(n: int, pad: str) -> str:
    return f"Turn {n}: ran the tests, {1834 + n % 97} tokens.{pad}\n"


async def _turn(tx: Any, n: int, pad: str) -> None:
    """One host turn (``host.py``'s): an entry and one more line in the transcript."""

    value = entry(0, ROOT, n)
    await tx.append_entry(ROOT, {key: value[key] for key in ("kind", "model", "data")})
    transcript = await tx.doc(Transcript, ROOT)
    transcript["text"] += _line(n, pad)


@dataclass
class Host:
    """One store of a paired run, its stopwatch and Session, and the next turn's number."""

    storage: LmdbStorage
    timed: MethodTimes
    session: Any
    next: int
    profile: cProfile.Profile

    async def turns(self, count: int, pad: str) -> None:
        for n in range(self.next, self.next + count):
            await self.session.commit(lambda tx, n=n: _turn(tx, n, pad), CTX)
        self.next += count


async def paired(args: argparse.Namespace) -> None:
    base = tempfile.mkdtemp(prefix="host-growth-", dir=args.dir)
    pad = "x" * max(0, args.line - 40)
    hosts: list[Host] = []
    try:
        for index, turns in enumerate((args.paired, args.turns)):
            storage = await LmdbStorage.open(
                os.path.join(base, f"store-{index}"), durability=args.mode
            )
            await storage.commit([conversation(ROOT)], CTX)
            timed = MethodTimes(storage)
            host = Host(
                storage, timed, create_session(timed), 1, cProfile.Profile(time.thread_time)
            )
            hosts.append(host)
            await host.turns(turns, pad)
            print(f"filled a store with {turns:,} turns", file=sys.stderr, flush=True)
        small, big = hosts
        times: dict[int, list[float]] = {0: [], 1: []}
        methods: dict[int, dict[str, list[float]]] = {0: defaultdict(list), 1: defaultdict(list)}
        for round in range(args.rounds + args.profile):
            profiling = round >= args.rounds
            for index in (0, 1) if round % 2 == 0 else (1, 0):
                host = hosts[index]
                host.timed.inside.clear()
                host.timed.profiler = host.profile if profiling else None
                await host.turns(args.window, pad)
                host.timed.profiler = None
                if not profiling:
                    times[index].append(sum(host.timed.inside.values()) / args.window)
                    for name, seconds in host.timed.inside.items():
                        methods[index][name].append(seconds / args.window)
        print(
            f"Two stores side by side ({args.mode}), {args.rounds} alternated windows of "
            f"{args.window:,} turns each; store CPU per turn (thread CPU clock), median [min–max] "
            "over windows:\n"
        )
        print(
            "| store | turns at the start | document KiB | store CPU µs / turn | by method (median µs / turn) | deepest trees (depth, pages) |"
        )
        print("|---|---:|---:|---:|---|---|")
        for index, host in enumerate(hosts):
            filled = (args.paired, args.turns)[index]
            document = sum(len(_line(n, pad)) for n in range(1, host.next))
            values = times[index]
            shape = tree_shape(host.storage)
            deepest = sorted(shape.items(), key=lambda item: (-item[1][0], -item[1][1]))[:4]
            by = ", ".join(
                f"{name} {statistics.median(v) * 1e6:.0f}"
                for name, v in sorted(methods[index].items(), key=lambda item: -sum(item[1]))
            )
            print(
                f"| {'small' if index == 0 else 'big'} | {filled:,} | {document / 1024:,.0f} "
                f"| {statistics.median(values) * 1e6:.0f} [{min(values) * 1e6:.0f}–{max(values) * 1e6:.0f}] "
                f"| {by} | {', '.join(f'{name} {d}/{p}' for name, (d, p) in deepest)} |"
            )
        ratios = [b / a for a, b in zip(times[0], times[1]) if a > 0]
        print(
            f"\nbig / small, per round: median {statistics.median(ratios):.2f}x "
            f"[{min(ratios):.2f}x–{max(ratios):.2f}x] over {len(ratios)} rounds"
        )
        if args.profile:
            print_growth(
                small.profile,
                big.profile,
                args.profile * args.window,
                "Functions whose own CPU time per turn is larger on the big store ({turns:,} "
                "profiled turns on each, alternated; µs per turn, profiler overhead included "
                "alike)",
                ("small", "big", "difference"),
                args.top,
            )
    finally:
        for host in hosts:
            await host.storage.close()
        shutil.rmtree(base, ignore_errors=True)


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
            print_growth(
                early,
                late,
                args.profile * args.window,
                "Functions whose own CPU time per turn grew most, the first {turns:,} turns "
                "against the last {turns:,} (cProfile timed by the thread's CPU clock, store "
                "calls only; µs per turn, profiler overhead included alike)",
                ("first", "last", "grown by"),
                args.top,
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
    parser.add_argument(
        "--paired",
        type=int,
        metavar="SMALL",
        help="compare a store of SMALL turns with one of --turns, in alternated windows",
    )
    parser.add_argument(
        "--rounds", type=int, default=10, help="alternated windows of each store (--paired)"
    )
    args = parser.parse_args(argv)
    asyncio.run(paired(args) if args.paired is not None else run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
