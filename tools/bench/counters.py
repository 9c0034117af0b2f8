"""What the engine's commit counters (``log.counters``, read by ``metrics.register``) cost a commit.

Runs the ``commit_turn`` workload of ``tools/bench/report.py`` in ``process`` mode (the cheapest commit,
where any overhead shows most) on two fresh stores per round: one counting as shipped, one whose
counters are swapped for a class that does nothing. Rounds alternate which goes first; the figure
is the median over rounds of the paired ratio. It also times the counting alone (the calls one
commit makes) to say what share of a commit it is. Writes the table into docs/benchmarks.md
with ``--write``.

    .venv/bin/python -m tools.bench.counters --rounds 7
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import tempfile
import time
from types import SimpleNamespace

from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.counters import EngineCounters

from tools import ROOT
from tools.bench.workloads import measure_turns, populate_turns

DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench_counters: begin -->", "<!-- bench_counters: end -->"


class _Nothing:
    def observe(self, value: float) -> None:
        pass


class NoCounters(EngineCounters):
    """Counters that count nothing: the baseline."""

    def __init__(self) -> None:
        super().__init__()
        self.commit_seconds = self.group_batches = self.flush_seconds = _Nothing()  # type: ignore[assignment]


async def one(path: str, counting: bool, scale: float, round: int) -> float:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        if not counting:
            storage.counters.__class__ = NoCounters
            NoCounters.__init__(storage.counters)
        handle = SimpleNamespace(
            storage=storage, mode="process"
        )  # what bench.py's runner hands a workload
        state = await populate_turns(handle, scale)
        timings = await measure_turns(handle, state, round)
        seconds, operations, _ = next(iter(timings.values()))
        return seconds / operations
    finally:
        await storage.close()


def counting_alone(n: int = 200_000) -> float:
    """Seconds the counting of one commit takes: two clock reads and three observations."""

    counters = EngineCounters()
    began = time.perf_counter()
    for _ in range(n):
        start = time.perf_counter()
        counters.flush_seconds.observe(time.perf_counter() - start)
        counters.group_batches.observe(1)
        counters.commit_seconds.observe(time.perf_counter() - start)
    return (time.perf_counter() - began) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--scale", type=float, default=2.0)
    parser.add_argument(
        "--write", action="store_true", help="put the table into docs/benchmarks.md"
    )
    args = parser.parse_args()
    ratios, with_, without = [], [], []
    with tempfile.TemporaryDirectory() as root:
        for round in range(args.rounds):
            order = [True, False] if round % 2 == 0 else [False, True]
            got = {}
            for counting in order:
                got[counting] = asyncio.run(
                    one(f"{root}/{round}-{counting}", counting, args.scale, round)
                )
            with_.append(got[True])
            without.append(got[False])
            ratios.append(got[False] / got[True])
            print(
                f"round {round + 1}/{args.rounds}: counting {got[True] * 1e6:.1f} µs, not counting {got[False] * 1e6:.1f} µs",
                flush=True,
            )
    alone = counting_alone()
    commit = statistics.median(with_)
    table = "\n".join(
        [
            "| figure | value |",
            "|---|---|",
            f"| `commit_turn` per commit, counting (median of {args.rounds} rounds) | {commit * 1e6:.1f} µs |",
            f"| `commit_turn` per commit, counters that do nothing | {statistics.median(without) * 1e6:.1f} µs |",
            f"| paired ratio not counting / counting (median; 1.00 = no difference) | {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f}) |",
            f"| the counting of one commit alone | {alone * 1e6:.2f} µs ({alone / commit:.1%} of a commit) |",
        ]
    )
    print(table)
    if args.write:
        text = DOCS.read_text()
        block = f"{BEGIN}\n{table}\n{END}"
        if BEGIN in text:
            text = re.sub(
                re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S
            )
        else:
            text += (
                "\n## What counting commits costs (`python -m tools.bench.counters --write`)\n\n"
                "`process` mode, `commit_turn`, one store counting and one with counters that do nothing, "
                "alternating per round, same run.\n\n" + block + "\n"
            )
        DOCS.write_text(text)


if __name__ == "__main__":
    main()
