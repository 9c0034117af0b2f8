"""What the log's Merkle tree costs: on each commit, and to build for a long log.

    python -m tools.bench.tlog commit [--rounds 9] [--count 400]
    python -m tools.bench.tlog build [--records 1000000] [--synthetic 1000000]

``commit``: ``commit_turn`` in ``process`` mode (tools/bench/workloads.py's turns: an entry and
the task's new state per commit), A/B in this one process: each round opens two fresh stores, one
as shipped and one whose log appends as before the tree (no leaf hash, no tree rows), and commits
to them alternately, one commit each in turn, so the machine's other load falls on both alike.
Prints the median over rounds of each store's mean per-commit time (wall and CPU) and the overhead.

``build``: the tree for a log of ``records`` records, built from the log by ``TreeStore.rebuild``
(read each record, verify and decompress it, hash its leaf, store the hashes): records/s. The log
is written with ``WriteLog.append`` directly (typical turn batches, no projections: only the log
is read). ``synthetic``: the same count of random leaf hashes through ``TreeBuilder`` alone (the
hashing of the tree, no store).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log import Environment, WriteLog, encode_batch
from pi_durable_lmdb.tlog import TreeBuilder

from tools.bench.log import turn_batch
from tools.bench.workloads import ROOT, Ids, conversation, task, turn_batches


def _no_leaf(txn: Any, seq: int, committed_at: int, payload: bytes) -> None:
    """The tree's per-commit step left out: a store with it is the log as it was before the tree."""


async def _pair(base: str, count: int) -> dict[bool, tuple[float, float]]:
    """Two fresh stores, with and without the tree, committing turns alternately (one commit on
    each in turn, the first alternating too), so load from elsewhere falls on both alike."""

    stores = {
        on: await LmdbStorage.open(os.path.join(base, str(on)), durability="process")
        for on in (True, False)
    }
    stores[False].log.tree.append_writes = _no_leaf  # type: ignore[method-assign]
    try:
        batches: dict[bool, list[list[dict[str, Any]]]] = {}
        for on, storage in stores.items():
            ids = Ids()
            task_id = ids()
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit(
                [{"type": "task", "value": task(task_id, ROOT, 0, "pending")}], CTX
            )
            batches[on] = turn_batches(ids, task_id, count)
        wall = {True: 0.0, False: 0.0}
        cpu = {True: 0.0, False: 0.0}
        for n in range(count):
            for on in (True, False) if n % 2 else (False, True):
                started, cpu_started = time.perf_counter(), time.process_time()
                await stores[on].commit(batches[on][n], CTX)
                wall[on] += time.perf_counter() - started
                cpu[on] += time.process_time() - cpu_started
        return {on: (wall[on] / count, cpu[on] / count) for on in (True, False)}
    finally:
        for storage in stores.values():
            await storage.close()


def commit(rounds: int, count: int, parent: str | None) -> None:
    times: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    base = tempfile.mkdtemp(prefix="bench-tlog-", dir=parent)
    try:
        asyncio.run(_pair(os.path.join(base, "warm"), count))
        for round in range(rounds):
            measured = asyncio.run(_pair(os.path.join(base, f"r{round}"), count))
            for on, (wall, cpu) in measured.items():
                times[on].append(wall)
                cpus[on].append(cpu)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    off, on_ = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"commit_turn, process mode, {rounds} rounds x {count} commits on each of two stores, alternating commit by commit"
    )
    print(
        f"  without the tree: {off * 1e6:7.1f} us/commit (rounds: {', '.join(f'{t * 1e6:.1f}' for t in times[False])})"
    )
    print(
        f"  with the tree:    {on_ * 1e6:7.1f} us/commit (rounds: {', '.join(f'{t * 1e6:.1f}' for t in times[True])})"
    )
    print(f"  overhead: {(on_ / off - 1) * 100:+.1f}% (median of each)")
    cpu_off, cpu_on = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(
        f"  CPU time of this process: {cpu_off * 1e6:.1f} -> {cpu_on * 1e6:.1f} us/commit, {(cpu_on / cpu_off - 1) * 100:+.1f}%"
    )


def build(records: int, synthetic: int, parent: str | None) -> None:
    if synthetic:
        leaves = [os.urandom(32) for _ in range(synthetic)]
        builder = TreeBuilder()
        started = time.perf_counter()
        for leaf in leaves:
            builder.add(leaf)
        elapsed = time.perf_counter() - started
        print(
            f"synthetic: {synthetic:,} leaf hashes through TreeBuilder in {elapsed:.2f} s: {synthetic / elapsed:,.0f} leaves/s"
        )
    if not records:
        return
    base = tempfile.mkdtemp(prefix="bench-tlog-", dir=parent)
    try:
        env = Environment(os.path.join(base, "store"), durability="process", map_size=8 << 30)
        log = WriteLog(env)
        payloads = [encode_batch(turn_batch(n)).payload for n in range(1, 257)]
        started = time.perf_counter()
        written = 0
        while written < records:
            n = min(10_000, records - written)

            def append(txn: Any, first: int = written, n: int = n) -> None:
                seq = None
                for at in range(first, first + n):
                    seq = log.append(txn, payloads[at % len(payloads)], 1_760_000_000_000 + at, seq)

            env.write(append)
            written += n
        print(
            f"log: {records:,} records appended (with the tree) in {time.perf_counter() - started:.1f} s; "
            f"data.mdb {os.path.getsize(os.path.join(base, 'store', 'data.mdb')) / 1e6:,.0f} MB"
        )
        root = log.root()
        started = time.perf_counter()
        log.tree.rebuild(log)
        elapsed = time.perf_counter() - started
        assert log.root() == root
        print(
            f"build: the tree of {records:,} records rebuilt from the log in {elapsed:.1f} s: {records / elapsed:,.0f} records/s"
        )
        env.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = parser.add_subparsers(dest="what", required=True)
    one = sub.add_parser("commit")
    one.add_argument("--rounds", type=int, default=9)
    one.add_argument("--count", type=int, default=400)
    one.add_argument("--dir", default=None)
    two = sub.add_parser("build")
    two.add_argument("--records", type=int, default=1_000_000)
    two.add_argument("--synthetic", type=int, default=1_000_000)
    two.add_argument("--dir", default=None)
    args = parser.parse_args()
    if args.what == "commit":
        commit(args.rounds, args.count, args.dir)
    else:
        build(args.records, args.synthetic, args.dir)


if __name__ == "__main__":
    main()
