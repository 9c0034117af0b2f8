"""What a user projection's refold costs the writer: event-loop stalls and commit latency.

    python -m tools.bench.projection_rebuild --commits 100000
    python -m tools.bench.projection_rebuild --commits 100000 --durability process

Builds a store of typical agent turns (an entry plus a task update per commit) with a user
projection at version 1, then, in one writer process, for each durability:

- *idle*: paced commits (one every ``--interval`` ms) while the projection is level, with a probe
  task that sleeps 1 ms at a time and records how late it wakes (the loop's stall);
- *refold*: the store reopened with version 2 of the projection, which is built beside version 1
  from the whole log, with the same paced commits and probe running until version 2 is swapped in;
- *idle* again, with version 2 level: the two idle phases bracket the refold, so a machine that
  got busier or quieter meanwhile shows.

Prints a table: commits, commit latency p50/p99/max, loop stall p50/p99/max, the time each fold
chunk spent inside its write transaction before its commit (putting the rows it folded beforehand:
what a commit arriving then waits for, with the transaction's commit), and the refold's duration
and rate. The goals: stall p99 at most 5 ms, commit p99 during the refold at most twice
the idle p99. On a machine whose other load already stalls an idle loop, compare the refold's rows
with the idle ones around them.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.log.records import EntryWrite, TaskWrite
from pi_durable_lmdb.projections import userfold
from pi_durable_lmdb.projections.user import Projection, Tables
from pi_durable_lmdb.storage import LmdbStorage

MESSAGE = {"role": "assistant", "content": "word " * 40}
TASK = {
    "id": 2,
    "conversationId": 1,
    "kind": "agent",
    "version": 1,
    "input": None,
    "background": False,
    "abortRequested": False,
}


class TurnIndex(Projection):
    """Entries per conversation and each task's last checkpoint turn: a get and a put or two per write."""

    name = "turns"
    version = 1
    databases = ("entries", "tasks")

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is EntryWrite:
                key = int(write.value["conversationId"]).to_bytes(8, "big")
                count = int.from_bytes(tables.get("entries", key) or b"\0", "big")
                tables.put("entries", key, (count + 1).to_bytes(8, "big"))
            elif type(write) is TaskWrite:
                state: Any = write.value.get("state") or {}
                turn = (state.get("checkpoint") or {}).get("turn", 0)
                tables.put("tasks", int(write.value["id"]).to_bytes(8, "big"), str(turn).encode())


class TurnIndexV2(TurnIndex):
    version = 2


async def fill(path: Path, commits: int) -> float:
    storage = await LmdbStorage.open(path, durability="process", projections=[TurnIndex()])
    started = time.perf_counter()
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    for turn in range(commits - 1):
        await storage.commit(
            [
                {
                    "type": "entry",
                    "value": {
                        "id": 10 + turn,
                        "conversationId": 1,
                        "kind": "message",
                        "model": [MESSAGE],
                    },
                },
                {
                    "type": "task",
                    "value": {**TASK, "state": {"status": "running", "checkpoint": {"turn": turn}}},
                },
            ],
            CTX,
        )
    await storage.projections.wait(storage.log.head())
    elapsed = time.perf_counter() - started
    await storage.close()
    return elapsed


class Load:
    """Paced commits and a loop-stall probe, until ``stop`` is set."""

    def __init__(self, storage: LmdbStorage, interval: float, next_id: int) -> None:
        self.storage, self.interval, self.next_id = storage, interval, next_id
        self.commits: list[float] = []
        self.stalls: list[float] = []
        self.stop = asyncio.Event()

    async def committer(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
            self.next_id += 1
            await self.storage.commit(
                [
                    {
                        "type": "entry",
                        "value": {
                            "id": self.next_id,
                            "conversationId": 1,
                            "kind": "message",
                            "model": [MESSAGE],
                        },
                    },
                ],
                CTX,
            )
            self.commits.append(time.perf_counter() - began)
            await asyncio.sleep(max(0.0, self.interval - (time.perf_counter() - began)))

    async def probe(self) -> None:
        while not self.stop.is_set():
            began = time.perf_counter()
            await asyncio.sleep(0.001)
            self.stalls.append(max(0.0, time.perf_counter() - began - 0.001))

    async def run(self, until: Any) -> float:
        tasks = [asyncio.ensure_future(self.committer()), asyncio.ensure_future(self.probe())]
        began = time.perf_counter()
        await until
        elapsed = time.perf_counter() - began
        self.stop.set()
        await asyncio.gather(*tasks)
        return elapsed


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


CHUNKS: list[float] = []
_fold_in = userfold.Folder._fold_in


def _timed_fold_in(self: Any, *args: Any) -> Any:
    began = time.perf_counter()
    try:
        return _fold_in(self, *args)
    finally:
        CHUNKS.append(time.perf_counter() - began)


userfold.Folder._fold_in = _timed_fold_in  # type: ignore[method-assign]


async def phase(
    path: Path,
    durability: str,
    refold: bool,
    seconds: float,
    interval: float,
    next_id: int,
    after: bool,
) -> dict[str, Any]:
    projection = TurnIndexV2() if refold or after else TurnIndex()
    storage = await LmdbStorage.open(path, durability=durability, projections=[projection])  # type: ignore[arg-type]
    try:
        CHUNKS.clear()
        load = Load(storage, interval, next_id)
        if refold:
            status = storage.projections.status()["turns"]
            assert status.building is not None, "the refold did not start a build"
            records = storage.log.head()

            async def swapped() -> None:
                while storage.projections.status()["turns"].building is not None:
                    await asyncio.sleep(0.05)

            elapsed = await load.run(swapped())
        else:
            await storage.projections.wait(storage.log.head())
            records = 0
            elapsed = await load.run(asyncio.sleep(seconds))
        return {
            "phase": "refold" if refold else "idle",
            "chunk_p99": pct(CHUNKS, 0.99),
            "chunk_max": max(CHUNKS, default=0.0) * 1000,
            "durability": durability,
            "commits": len(load.commits),
            "commit_p50": pct(load.commits, 0.5),
            "commit_p99": pct(load.commits, 0.99),
            "commit_max": max(load.commits) * 1000,
            "stall_p50": pct(load.stalls, 0.5),
            "stall_p99": pct(load.stalls, 0.99),
            "stall_max": max(load.stalls) * 1000,
            "seconds": elapsed,
            "rate": records / elapsed if refold else 0.0,
            "next_id": load.next_id,
        }
    finally:
        await storage.close()


async def main(
    commits: int, durabilities: list[str], seconds: float, interval: float, directory: str | None
) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-projections-", dir=directory) as tmp:
        base = Path(tmp) / "base"
        fill_s = await fill(base, commits)
        print(f"filled {commits:,} commits (version 1 folded) in {fill_s:.1f} s")
        rows = []
        next_id = 10 + commits + 1_000_000
        for durability in durabilities:
            path = Path(tmp) / durability
            shutil.copytree(base, path)
            for refold, after in ((False, False), (True, False), (False, True)):
                row = await phase(path, durability, refold, seconds, interval, next_id, after)
                next_id = row["next_id"] + 1
                rows.append(row)
            shutil.rmtree(path)
        print(
            f"{'durability':<10} {'phase':<7} {'commits':>7} {'commit p50':>10} {'p99':>7} {'max':>7}"
            f" {'stall p50':>9} {'p99':>7} {'max':>7} {'chunk p99':>9} {'max':>7} {'seconds':>7} {'records/s':>9}"
        )
        for row in rows:
            print(
                f"{row['durability']:<10} {row['phase']:<7} {row['commits']:>7} {row['commit_p50']:>8.2f}ms {row['commit_p99']:>5.2f}ms"
                f" {row['commit_max']:>5.1f}ms {row['stall_p50']:>7.2f}ms {row['stall_p99']:>5.2f}ms {row['stall_max']:>5.1f}ms"
                f" {row['chunk_p99']:>7.2f}ms {row['chunk_max']:>5.1f}ms"
                f" {row['seconds']:>7.1f} {row['rate']:>9,.0f}"
            )
        for durability in durabilities:
            before, refold, after = [row for row in rows if row["durability"] == durability]
            idle = max(before["commit_p99"], after["commit_p99"])
            print(
                f"{durability}: refold stall p99 {refold['stall_p99']:.2f} ms (goal <= 5; idle {before['stall_p99']:.2f}"
                f" / {after['stall_p99']:.2f}); commit p99 {refold['commit_p99'] / idle:.2f}x the idle phases' (goal <= 2x)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--commits", type=int, default=100_000)
    parser.add_argument(
        "--durability",
        action="append",
        choices=["power", "process"],
        help="default: power and process",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the idle phase")
    parser.add_argument("--interval", type=float, default=5.0, help="ms between paced commits")
    parser.add_argument(
        "--dir",
        default=None,
        help="where the stores go (default: the system's temporary directory)",
    )
    options = parser.parse_args()
    asyncio.run(
        main(
            options.commits,
            options.durability or ["power", "process"],
            options.seconds,
            options.interval / 1000,
            options.dir,
        )
    )
