"""Many agents on one store: throughput and event-loop stalls, LmdbStorage beside pi-durable's SQLite.

Each of N agents (1, 8, 64 by default) owns a conversation and a task and commits turns (an entry
and its task record, as ``commit_turn`` in ``tools/bench/report.py``) one after another, all on one
event loop and one store. A ticker task sleeps 1 ms at a time and records how late it woke: that
lateness is how long something held the loop (a "no store" row gives the floor: the agents' own
work and the machine's noise, with commits only encoded). Backends run interleaved per round (rotated), so a
noisy machine slows all alike; ratios are taken per round and the median is reported.

Classes, compared only within a class: ``power`` = LMDB ``power`` | SQLite WAL ``synchronous=FULL``;
``process`` = LMDB ``process`` | SQLite WAL ``synchronous=NORMAL``, beside pi-durable's
``MemoryStorage``: it stores nothing, so its ratio is the ceiling of any store's on these agents.

With both classes, a last line gives the power class's ceiling: ``process`` mode, which flushes
nothing, against SQLite FULL. ``--raw-records`` adds a row per class for the same store with every
log record stored as it is, not compressed (``log.zstd``'s threshold raised for that run only;
the record format allows it): what compressing the log costs a busy store, in the same rounds.

Usage::

    python -m tools.bench.concurrent                       # 1, 8, 64 agents, 3 rounds
    python -m tools.bench.concurrent --agents 64 --rounds 5 --turns 3000
    python -m tools.bench.concurrent --agents 64 --raw-records
    python -m tools.bench.concurrent --agents 64 --rounds 7 --write   # into docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import lmdb
import msgspec
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.log import zstd

from tools import ROOT
from tools.bench.report import LABELS, Store, source_version
from tools.bench.report_markdown import write_marked
from tools.bench.workloads import Ids, conversation, entry, task

DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench_concurrent: begin -->", "<!-- bench_concurrent: end -->"
"""The lines around the report ``--write`` puts into ``DOCS``."""

RAW = "lmdb-raw"
"""The ``--raw-records`` backend: ``lmdb`` with no log record compressed."""

TICK = 0.001
"""The ticker's sleep: a wake later than this is a stall of the loop."""


async def run_agents(storage: Any, agents: int, turns: int) -> tuple[float, list[float]]:
    """``turns`` commits in all, spread over ``agents`` concurrent agents; returns the seconds
    they took and the ticker's stalls (seconds) meanwhile."""

    ids = Ids()
    owned = []
    for _ in range(agents):
        conversation_id, task_id = ids(), ids()
        await storage.commit(
            [
                conversation(conversation_id),
                {"type": "task", "value": task(task_id, conversation_id, 0, "pending")},
            ],
            CTX,
        )
        owned.append((conversation_id, task_id))
    per_agent = max(1, turns // agents)
    stalls: list[float] = []
    done = False

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        while not done:
            before = loop.time()
            await asyncio.sleep(TICK)
            stalls.append(max(0.0, loop.time() - before - TICK))

    async def agent(conversation_id: int, task_id: int) -> None:
        for n in range(1, per_agent + 1):
            status = "running" if n % 3 else "sleeping"
            await storage.commit(
                [
                    {"type": "entry", "value": entry(ids(), conversation_id, n, task_id)},
                    {"type": "task", "value": task(task_id, conversation_id, n, status)},
                ],
                CTX,
            )

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(TICK * 2)
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(agent(c, t) for c, t in owned))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    done = True
    await tick
    return elapsed, [per_agent * agents / elapsed, cpu / (per_agent * agents)] + stalls


BACKENDS = ("lmdb", "sqlite", "memory", "none")
"""The rows of a run, each round in this order or its reverse. ``memory`` (pi-durable's
``MemoryStorage``, process class only) stores nothing: its ratio is the ceiling of any store's
on the same agents, the work of checking and copying each commit and of the loop."""


class NoStore:
    """The floor: the same agents and ticker, each commit only encoded (``encode_batch``) and
    followed by a yield. Its stalls are the machine's and the agents' own, not a store's."""

    async def commit(self, writes: Any, context: Any = None) -> int:
        from pi_durable_lmdb.log import encode_batch

        encode_batch(writes)
        await asyncio.sleep(0)
        return 0


def log_formats(path: str) -> set[int]:
    """The record formats a closed store's log holds (read with py-lmdb, not the engine; the
    old-store tests use it too)."""

    env = lmdb.open(path, max_dbs=64, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            log = env.open_db(b"log", txn=txn, create=False)
            return {msgspec.msgpack.decode(value)[0] for _, value in txn.cursor(db=log)}
    finally:
        env.close()


def _label(backend: str, mode: str) -> str:
    if backend == RAW:
        return f"lmdb ({mode}, log records raw)"
    return LABELS.get((backend, mode), "no store (floor)")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(backend: str, mode: str, agents: int, turns: int, base: str) -> dict[str, float]:
    if backend == "none":
        _elapsed, rest = await run_agents(NoStore(), agents, turns)
        return {
            "rate": rest[0],
            "cpu": rest[1],
            "p99": percentile(rest[2:], 0.99),
            "max": max(rest[2:], default=0.0),
        }
    path = tempfile.mkdtemp(dir=base)
    store = Store("lmdb" if backend == RAW else backend, mode, path)
    threshold = zstd.MIN_SIZE
    if backend == RAW:
        zstd.MIN_SIZE = 1 << 62  # every record is shorter: stored as it is
    try:
        await store.open()
        try:
            gc.collect()
            _elapsed, rest = await run_agents(store.storage, agents, turns)
        finally:
            await store.close()
        if backend in ("lmdb", RAW):  # the two rows stored what their labels say
            formats = log_formats(path)
            if (backend == RAW) != (formats == {1}):
                raise SystemExit(
                    f"concurrent: the {_label(backend, mode)} store's log holds record formats {sorted(formats)}"
                )
    finally:
        zstd.MIN_SIZE = threshold
        shutil.rmtree(path, ignore_errors=True)
    rate, cpu, stalls = rest[0], rest[1], rest[2:]
    return {
        "rate": rate,
        "cpu": cpu,
        "p99": percentile(stalls, 0.99),
        "max": max(stalls, default=0.0),
    }


async def main_async(args: argparse.Namespace) -> str:
    base = tempfile.mkdtemp(prefix="bench-concurrent-")
    backends = ("lmdb", RAW, *BACKENDS[1:]) if args.raw_records else BACKENDS
    results: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    try:
        for round in range(args.rounds):
            for agents in args.agents:
                for mode in args.modes:
                    order = backends if round % 2 == 0 else backends[::-1]
                    for backend in order:
                        if backend == "memory" and mode != "process":
                            continue  # it stores nothing: a row of the process class only
                        turns = args.turns if mode == "process" else args.power_turns
                        figures = await measure(backend, mode, agents, max(turns, agents), base)
                        results.setdefault((backend, mode, agents), []).append(figures)
                        print(
                            f"round {round} {_label(backend, mode):>16} agents={agents:<3} "
                            f"{figures['rate']:>9,.0f}/s cpu {figures['cpu'] * 1e6:6.1f} µs stall p99 {figures['p99'] * 1e3:6.2f} ms "
                            f"max {figures['max'] * 1e3:6.2f} ms",
                            file=sys.stderr,
                        )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    lines = [
        "| class | agents | backend | commits/s (median) | range over rounds | x SQLite (median of paired) "
        "| CPU µs per commit (median) | stall p99 (median) | stall max (worst) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for mode in args.modes:
        for agents in args.agents:
            sqlite = results[("sqlite", mode, agents)]
            for backend in backends:
                if (backend, mode, agents) not in results:
                    continue
                runs = results[(backend, mode, agents)]
                rates = [run["rate"] for run in runs]
                ratios = [run["rate"] / other["rate"] for run, other in zip(runs, sqlite)]
                lines.append(
                    f"| {mode} | {agents} | {_label(backend, mode)} | {statistics.median(rates):,.0f} "
                    f"| {min(rates):,.0f}–{max(rates):,.0f} "
                    f"| {'—' if backend not in ('lmdb', RAW, 'memory') else f'{statistics.median(ratios):.2f}x'} "
                    f"| {statistics.median(run['cpu'] for run in runs) * 1e6:.1f} "
                    f"| {statistics.median(run['p99'] for run in runs) * 1e3:.2f} ms "
                    f"| {max(run['max'] for run in runs) * 1e3:.1f} ms |"
                )
    if "power" in args.modes and "process" in args.modes:
        lines.append("")
        for agents in args.agents:
            bound = [
                run["rate"] / full["rate"]
                for run, full in zip(
                    results[("lmdb", "process", agents)], results[("sqlite", "power", agents)]
                )
            ]
            lines.append(
                f"Ceiling of the power class, {agents} agents: lmdb (process), which flushes nothing, does "
                f"{statistics.median(bound):.2f}x SQLite FULL's commits/s (median of rounds): a power commit "
                "does the same work and waits for a flush as well."
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--agents", type=int, action="append", help="agents per run (repeatable; default 1, 8, 64)"
    )
    parser.add_argument("--modes", default="power,process", help="durability classes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--turns", type=int, default=4000, help="commits per run in the process class"
    )
    parser.add_argument(
        "--power-turns", type=int, default=1500, help="commits per run in the power class"
    )
    parser.add_argument(
        "--raw-records",
        action="store_true",
        help="also the store with its log records not compressed",
    )
    parser.add_argument(
        "--write",
        nargs="?",
        const=str(DOCS),
        metavar="PATH",
        help=f"put the report into PATH (default {DOCS.relative_to(ROOT)}), between the lines "
        f"{BEGIN} and {END}",
    )
    args = parser.parse_args(argv)
    args.agents = args.agents or [1, 8, 64]
    args.modes = [mode for mode in args.modes.split(",") if mode]
    command = (
        f"python -m tools.bench.concurrent {' '.join(argv if argv is not None else sys.argv[1:])}"
    )
    report = asyncio.run(main_async(args))
    print(f"$ {command}\n{report}")
    if args.write:
        block = f"{BEGIN}\n`{command}` on {source_version()}:\n\n{report}\n{END}"
        write_marked(args.write, block, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
