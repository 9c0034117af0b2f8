"""Replication through NATS JetStream: commit latency, replica lag, catch-up, restore, failover.

Starts its own 3-node JetStream cluster (``nats-server`` from the venv, default server settings,
routes on 127.0.0.1, free ports, store directories in a temporary directory; the servers are
killed at exit, and die with this process should it be killed) and measures, in one run, each
round doing a share of every part:

1. ``durability="replicated"`` commits (R3 stream) beside local ``power`` LMDB and pi-durable's
   SQLite WAL ``synchronous=FULL`` (``tools/bench/report.py``'s ``Store``): per-commit latency p50/p99
   and throughput with 1 sequential committer and with 64 concurrent ones (the ``commit_turn``
   shape of ``tools/bench/concurrent.py``: an entry and its task per commit), fresh stores each
   run, backends rotated per round; ratios paired per round.
2. Replica lag under a paced writer (``--lag-rate`` commits/s, open loop: commit ``i`` starts at
   ``i / rate`` s whatever the earlier ones do): for each commit, from ``commit()`` returning on
   the writer to ``replica.wait(seq)`` returning on a replica (``open_replica``, same process,
   its own directory); beside it the event loop's stalls and the full GCs meanwhile.
3. With ``--records`` records of one store on the stream, each into a fresh directory: catch-up
   (``open_replica`` until its log holds them all), restore (``audit.restore.restore()``, when
   the tree has it), and a replicated writer ``open``ed on the store id (it takes the stream in
   before it returns: a failover to a machine without a replica).
4. Failover: a writer in a child process commits in a loop and is SIGKILLed; a new writer in
   this process opens with ``take_over=True, lease_ttl=2`` (fresh directory) and commits once:
   the time from the kill to that commit returning.

For context also: raw nats-py ``js.publish`` of a record-sized message to an R3 stream on the
same cluster (one at a time, awaited), p50/p99. Every replicated writer holds a lease (renewed
every ``ttl / 3`` s, checked before each publish), so "with lease" and "without lease" are not
separable: the replicated figures include it. ``--breakdown`` adds instrumented runs after the
rounds (they wrap private methods, so they are kept out of the measured ones): a replicated
group split into its publish and the rest, catch-up split into its stages, replica lag with a
``power`` and a ``process`` replica.

Usage::

    python -m tools.bench.replication --quick            # ~30 s smoke run
    python -m tools.bench.replication --breakdown        # 5 rounds, 20 failovers (~3 minutes)
    python -m tools.bench.replication --rounds 7 --commits 2000 --failovers 28 --lag-seconds 42 --breakdown
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Any

from tools.bench.cluster import NATS_SERVER, Cluster, kill_started, progress
from tools.bench.concurrent import percentile
from tools.bench.replication_breakdown import breakdown
from tools.bench.replication_commits import (
    BACKENDS,
    COMMITTERS,
    LABEL,
    measure_commits,
    measure_lag,
    raw_publish,
)
from tools.bench.replication_recovery import (
    RECOVERY,
    child_writer,
    fill,
    measure_failover,
    snapshot_restore,
)
from tools.bench.replication_report import render
from tools.bench.report import rotated, source_version

PARTS = ("commits", "lag", "recovery", "failover", "snapshot")


# ── the run ──────────────────────────────────────────────────────────────────


def _spread(total: int, rounds: int, round: int) -> int:
    return total // rounds + (1 if round < total % rounds else 0)


async def main_async(args: argparse.Namespace, base: str) -> dict[str, Any]:
    cluster = Cluster(os.path.join(base, "cluster"))
    os.makedirs(cluster.base)
    cluster.start()
    try:
        await cluster.ready()
        progress(f"cluster up at {', '.join(cluster.urls)}")
        urls = cluster.urls
        results: dict[str, Any] = {
            "commits": {},
            "raw": [],
            "lag": [],
            "failover": [],
            "urls": urls,
            "source": source_version(),
            **{key: [] for key in RECOVERY},
        }
        parts = args.parts
        store = ""
        if parts & {
            "commits",
            "recovery",
        }:  # the store recovered, and the record size of the raw publishes
            progress(f"filling a store with {args.records:,} records (64 committers)")
            store, rate, size = await fill(urls, base, args.records)
            results["fill_rate"], results["record_size"] = rate, size
            progress(f"  {rate:,.0f} commits/s")
        load = os.getloadavg()[0]
        started = time.perf_counter()
        for round in range(args.rounds):
            for committers in COMMITTERS if "commits" in parts else ():
                for backend in rotated(BACKENDS, round):
                    figures = await measure_commits(backend, committers, args.commits, base, urls)
                    results["commits"].setdefault((backend, committers), []).append(figures)
                    progress(
                        f"round {round} {LABEL[backend]:>16} committers={committers:<3} {figures['rate']:>8,.0f}/s "
                        f"p50 {figures['p50'] * 1e3:6.2f} ms p99 {figures['p99'] * 1e3:6.2f} ms"
                    )
            if "commits" in parts:
                raw = await raw_publish(urls, args.raw, size)
                results["raw"].extend(raw)
                progress(f"round {round} raw js.publish p50 {percentile(raw, 0.5) * 1e3:.2f} ms")
            if "lag" in parts:
                lag = await measure_lag(urls, base, args.lag_seconds / args.rounds, args.lag_rate)
                results["lag"].append(lag)
                progress(
                    f"round {round} lag at {lag['achieved']:,.0f}/s: p50 {percentile(lag['lags'], 0.5) * 1e3:.2f} ms "
                    f"p99 {percentile(lag['lags'], 0.99) * 1e3:.2f} ms ({len(lag['errors'])} errors); loop stall p99 "
                    f"{percentile(lag['stalls'], 0.99) * 1e3:.2f} ms max {max(lag['stalls'], default=0) * 1e3:.1f} ms; "
                    f"load {os.getloadavg()[0]:.1f}"
                )
            for key in rotated(tuple(RECOVERY), round) if "recovery" in parts else ():
                cpu, servers = time.process_time(), cluster.cpu()
                seconds = await RECOVERY[key][0](urls, base, store, args.records)
                cpu, servers = time.process_time() - cpu, cluster.cpu() - servers
                results[key].append(seconds)
                results.setdefault(f"{key}_cpu", []).append((cpu, servers))
                progress(
                    f"round {round} {key}: {args.records / seconds:,.0f} records/s; CPU per record "
                    f"{cpu / args.records * 1e6:.1f} µs here, {servers / args.records * 1e6:.1f} µs in the servers"
                )
            for _ in range(
                _spread(args.failovers, args.rounds, round) if "failover" in parts else 0
            ):
                figures = await measure_failover(
                    urls, base, args.lease_ttl, len(results["failover"])
                )
                results["failover"].append(figures)
                progress(
                    f"round {round} failover {figures['total']:.2f} s (open {figures['open']:.2f} s, "
                    f"commit {figures['commit'] * 1e3:.1f} ms, {figures['taken_in']} records taken in)"
                )
        results["elapsed"] = time.perf_counter() - started
        if "snapshot" in parts:
            progress(
                f"a store of {args.snapshot_records:,} records with a snapshot {args.snapshot_tail:,} records before its end"
            )
            results["snapshot"] = await snapshot_restore(
                urls, base, args.snapshot_records, args.snapshot_tail, args.rounds
            )
        if args.breakdown:
            results["breakdown"] = await breakdown(urls, base, store, args)
        results["source_end"] = source_version()
        results["load"] = (load, os.getloadavg()[0])
        return results
    finally:
        cluster.stop()


# ── command line ─────────────────────────────────────────────────────────────


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 rounds, 300 commits, 3 failovers"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 5; --quick 2)"
    )
    parser.add_argument(
        "--commits",
        type=int,
        default=None,
        help="commits per latency run (default 1500; --quick 300)",
    )
    parser.add_argument(
        "--failovers", type=int, default=None, help="failover runs in all (default 20; --quick 3)"
    )
    parser.add_argument(
        "--records",
        type=int,
        default=None,
        help="records for catch-up/restore (default 20000; --quick 5000)",
    )
    parser.add_argument(
        "--lag-seconds",
        type=float,
        default=None,
        help="paced-writer seconds in all (default 20; --quick 4)",
    )
    parser.add_argument(
        "--lag-rate", type=float, default=1000.0, help="paced writer commits/s (default 1000)"
    )
    parser.add_argument(
        "--lease-ttl", type=int, default=2, help="lease TTL in the failover runs (default 2)"
    )
    parser.add_argument(
        "--raw", type=int, default=None, help="raw publishes per round (default 500; --quick 200)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="also instrumented runs: where the time goes"
    )
    parser.add_argument(
        "--snapshot-records",
        type=int,
        default=None,
        help="records of the store restored from a snapshot (default 100000; --quick 20000)",
    )
    parser.add_argument(
        "--snapshot-tail",
        type=int,
        default=1000,
        help="records committed after its snapshot was taken (default 1000)",
    )
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)",
    )
    parser.add_argument(
        "--dir", help="parent of the temporary directory (default: the system temp dir)"
    )
    parser.add_argument(
        "--child-writer", nargs=3, metavar=("PATH", "URLS", "TTL"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    args.parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if not args.parts or not args.parts <= set(PARTS):
        parser.error(f"--parts takes a comma-separated list of {', '.join(PARTS)}")
    if args.child_writer:
        path, urls, ttl = args.child_writer
        child_writer(path, urls, int(ttl))
        return 0
    quick = args.quick
    for name, full, short in (
        ("rounds", 5, 2),
        ("commits", 1500, 300),
        ("failovers", 20, 3),
        ("records", 20_000, 5_000),
        ("lag_seconds", 20.0, 4.0),
        ("raw", 500, 200),
        ("snapshot_records", 100_000, 20_000),
    ):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    if not os.path.exists(NATS_SERVER):
        parser.error(f"no nats-server at {NATS_SERVER}")
    signal.signal(signal.SIGTERM, _terminate)
    base = tempfile.mkdtemp(prefix="bench-replication-", dir=args.dir)
    try:
        results = asyncio.run(main_async(args, base))
    finally:
        kill_started()
        shutil.rmtree(base, ignore_errors=True)
    command = "python -m tools.bench.replication" + (
        ""
        if argv is None and len(sys.argv) == 1
        else " " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    print(render(results, args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
