"""The markdown report of ``tools.bench.replication``: a table per part, then the targets."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from typing import Any

from tools.bench.cluster import nats_version
from tools.bench.concurrent import percentile
from tools.bench.replication_commits import BACKENDS, COMMITTERS, LABEL, REPLICATED
from tools.bench.replication_recovery import RECOVERY
from tools.bench.report_markdown import fmt_time

# ── reporting ────────────────────────────────────────────────────────────────


def _ms(seconds: float) -> str:
    return fmt_time(seconds)


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(results: dict[str, Any], args: argparse.Namespace, command: str) -> str:
    lines = [
        f"Command: `{command}`  ",
        f"Engine: git {results['source']}"
        + (
            ""
            if results["source_end"] == results["source"]
            else f" at the start, {results['source_end']} at the end"
        )
        + "  ",
        f"Machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}; 3 nats-server "
        f"({nats_version()}) on loopback, same machine; {args.rounds} rounds, {args.commits} commits per run; "
        f"rounds took {results['elapsed']:.0f} s; load average {results['load'][0]:.1f} at the start, "
        f"{results['load'][1]:.1f} at the end (other work shares the machine)",
    ]
    targets: list[tuple[str, str, str, bool]] = []
    if "commits" in args.parts:
        lines += render_commits(results, targets)
    if "lag" in args.parts:
        lines += render_lag(results, args, targets)
    if "recovery" in args.parts:
        lines += render_recovery(results, args, targets)
    if "failover" in args.parts:
        lines += render_failover(results, args, targets)
    if "snapshot" in args.parts:
        lines += render_snapshot(results)
    if "commits" in args.parts:
        lines += render_context(results, args)
    if "breakdown" in results:
        lines += render_breakdown(results, args)
    lines += [
        "### Targets",
        "",
        "| target | goal | measured | met |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {goal} | {measured} | {_met(ok)} |" for name, goal, measured, ok in targets
    ]
    return "\n".join(lines) + "\n"


def render_commits(results: dict[str, Any], targets: list[tuple[str, str, str, bool]]) -> list[str]:
    commits = results["commits"]
    lines = [
        "",
        "### Commits (turn: an entry + its task per commit; fresh store per run)",
        "",
        "Median over rounds of each run's p50 / p99 / commits/s; range = min–max over rounds of commits/s.",
        "",
        "| committers | backend | p50 | p99 | commits/s | range |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for committers in COMMITTERS:
        for backend in BACKENDS:
            runs = commits[(backend, committers)]
            rates = [run["rate"] for run in runs]
            lines.append(
                f"| {committers} | {LABEL[backend]} | {_ms(statistics.median(r['p50'] for r in runs))} "
                f"| {_ms(statistics.median(r['p99'] for r in runs))} | {statistics.median(rates):,.0f} "
                f"| {min(rates):,.0f}–{max(rates):,.0f} |"
            )

    def paired(backend: str, other: str, committers: int, key: str) -> list[float]:
        return [
            mine[key] / theirs[key]
            for mine, theirs in zip(commits[(backend, committers)], commits[(other, committers)])
        ]

    for committers in COMMITTERS:
        ratios = paired(REPLICATED, "lmdb", committers, "p50")
        median = statistics.median(ratios)
        targets.append(
            (
                f"replicated p50 vs local power p50, {committers} committer{'s' if committers > 1 else ''}",
                "<= 2x",
                f"{median:.2f}x [{min(ratios):.2f}–{max(ratios):.2f}]",
                median <= 2.0,
            )
        )
    ratios = paired(REPLICATED, "sqlite", 64, "rate")
    median = statistics.median(ratios)
    targets.append(
        (
            "replicated commits/s vs SQLite FULL, 64 committers",
            ">= 2x",
            f"{median:.2f}x [{min(ratios):.2f}–{max(ratios):.2f}]",
            median >= 2.0,
        )
    )
    ratios = paired(REPLICATED, "sqlite", 1, "rate")
    lines += [
        "",
        f"(Paired per round, median [min–max]. For reference, 1 committer: replicated commits/s vs "
        f"SQLite FULL {statistics.median(ratios):.2f}x; replicated vs local power "
        f"{statistics.median(paired(REPLICATED, 'lmdb', 1, 'rate')):.2f}x.)",
    ]
    return lines


def render_lag(
    results: dict[str, Any], args: argparse.Namespace, targets: list[tuple[str, str, str, bool]]
) -> list[str]:
    lag_all = [value for lag in results["lag"] for value in lag["lags"]]
    commit_all = [value for lag in results["lag"] for value in lag["commit_latency"]]
    errors = [error for lag in results["lag"] for error in lag["errors"]]
    per_round_p99 = [percentile(lag["lags"], 0.99) for lag in results["lag"]]
    gcs = [pause for lag in results["lag"] for pause in lag["gc"]]
    stall_all = [stall for lag in results["lag"] for stall in lag["stalls"]]
    lines = [
        "",
        f"### Replica lag (paced writer, {args.lag_rate:,.0f} commits/s offered, open loop; replica in the same process)",
        "",
        "From `commit()` returning on the writer to `replica.wait(seq)` returning; all rounds pooled. Loop stall: "
        "how late a task sleeping 1 ms at a time woke on the event loop that runs the commits and the waits "
        "(`tools/bench/concurrent.py`'s ticker); full GCs: generation-2 collections meanwhile (`gc.callbacks`).",
        "",
        "| commits | offered | achieved | writer commit p50 / p99 | lag p50 | lag p99 | lag max | p99 per round "
        "| loop stall p99 / max | full GCs meanwhile (count, longest) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        f"| {sum(lag['commits'] for lag in results['lag']):,} "
        f"| {statistics.median(lag['offered'] for lag in results['lag']):,.0f}/s "
        f"| {statistics.median(lag['achieved'] for lag in results['lag']):,.0f}/s "
        f"| {_ms(percentile(commit_all, 0.5))} / {_ms(percentile(commit_all, 0.99))} "
        f"| {_ms(percentile(lag_all, 0.5))} | {_ms(percentile(lag_all, 0.99))} | {_ms(max(lag_all, default=0))} "
        f"| {', '.join(_ms(v) for v in per_round_p99)} (median {_ms(statistics.median(per_round_p99))}) "
        f"| {_ms(percentile(stall_all, 0.99))} / {_ms(max(stall_all, default=0.0))} "
        f"| {len(gcs)}, {_ms(max(gcs, default=0.0))} |",
    ]
    if errors:
        lines += ["", f"{len(errors)} waits failed, first: {errors[0]}"]
    lag_p99 = percentile(lag_all, 0.99)
    targets.append(
        (
            f"replica lag p99 at {args.lag_rate:,.0f} commits/s (all rounds pooled)",
            "<= 50 ms",
            f"{_ms(lag_p99)} (per round: median {_ms(statistics.median(per_round_p99))}, "
            f"worst {_ms(max(per_round_p99))})",
            lag_p99 <= 0.050 and not errors,
        )
    )
    return lines


def render_recovery(
    results: dict[str, Any], args: argparse.Namespace, targets: list[tuple[str, str, str, bool]]
) -> list[str]:
    n = args.records
    lines = [
        "",
        f"### Catch-up and restore ({n:,} records of one store on the stream; fresh directory each time)",
        "",
        "CPU per record: this process's CPU time (user + system, every thread) and the three servers' "
        "(from /proc), divided by the records, median over runs: on a shared machine a steadier measure "
        "of the work than the wall-clock rate.",
        "",
        "| what | runs | seconds (median) | records/s (median) | range | CPU per record: here / servers |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, (_measure, what, target) in RECOVERY.items():
        if not results[key]:
            continue
        rates = [n / seconds for seconds in results[key]]
        cpu = results.get(f"{key}_cpu", [(0.0, 0.0)])
        lines.append(
            f"| {what} | {len(rates)} | {statistics.median(results[key]):.2f} | "
            f"{statistics.median(rates):,.0f} | {min(rates):,.0f}–{max(rates):,.0f} "
            f"| {statistics.median(c for c, _ in cpu) / n * 1e6:.1f} µs / "
            f"{statistics.median(s for _, s in cpu) / n * 1e6:.1f} µs |"
        )
        if target:
            targets.append(
                (
                    f"{key.replace('_', '-')} rate",
                    ">= 50,000 records/s",
                    f"{statistics.median(rates):,.0f}/s",
                    statistics.median(rates) >= 50_000,
                )
            )
    lines.append("")
    return lines


def render_snapshot(results: dict[str, Any]) -> list[str]:
    out = results["snapshot"]
    snap, restores = out["snapshot"], out["restores"]
    return [
        "",
        f"### Restore from a snapshot ({out['records']:,} records; the snapshot holds all but the last {out['tail']:,})",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| filling the store (replicated, 64 committers) | {out['fill_rate']:,.0f} commits/s |",
        f"| taking the snapshot (compacting copy, zstd, upload to the R3 object store) | {snap['seconds']:.1f} s |",
        f"| snapshot: the copy / the object | {snap['size'] / 1e6:,.1f} MB / {snap['stored'] / 1e6:,.1f} MB |",
        f"| `restore()`: newest snapshot that verifies + the log after it, {len(restores)} runs, median (min–max) "
        f"| {statistics.median(restores):.2f} s ({min(restores):.2f}–{max(restores):.2f} s) |",
        "",
    ]


def render_failover(
    results: dict[str, Any], args: argparse.Namespace, targets: list[tuple[str, str, str, bool]]
) -> list[str]:
    runs = results["failover"]
    totals = [run["total"] for run in runs]
    lines = [
        "",
        f"### Failover (writer SIGKILLed in a child process -> first commit on a new writer, take_over=True, "
        f"lease_ttl={args.lease_ttl})",
        "",
        "| runs | p50 | max | min | open (lease wait + fence + take-in) p50 | first commit p50 | records taken in (median) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(runs)} | {statistics.median(totals):.2f} s | {max(totals):.2f} s | {min(totals):.2f} s "
        f"| {statistics.median(run['open'] for run in runs):.2f} s | {_ms(statistics.median(run['commit'] for run in runs))} "
        f"| {statistics.median(run['taken_in'] for run in runs):,.0f} |",
    ]
    limit = args.lease_ttl + 1
    targets.append(
        (
            f"failover (kill -> first commit), max of {len(runs)}",
            f"<= {limit} s (TTL + 1 s)",
            f"p50 {statistics.median(totals):.2f} s, max {max(totals):.2f} s",
            max(totals) <= limit,
        )
    )
    return lines


def render_context(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    n = args.records
    raw = results["raw"]
    lines = [
        "",
        "### Context",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| raw nats-py `await js.publish()` to an R3 stream, {results['record_size']:,} B, one at a time: p50 / p99 "
        f"({len(raw):,} publishes) | {_ms(percentile(raw, 0.5))} / {_ms(percentile(raw, 0.99))} |",
        f"| filling the {n:,}-record store, replicated, 64 committers | {results['fill_rate']:,.0f} commits/s |",
        "",
        "Every replicated writer holds the store's lease (renewed every ttl / 3 s on the link's loop, "
        "checked before each publish): there is no replicated writer without one, so the cost of the "
        "lease is inside the replicated figures and is not reported separately.",
        "",
    ]
    return lines


def render_breakdown(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    n = args.records
    parts = results["breakdown"]
    lines = ["### Where the time goes (`--breakdown`: instrumented runs after the rounds)", ""]
    if parts["groups"]:
        lines += [
            "| committers | commit p50 | commits/s | groups | batches per group (median) | group on the writer thread p50 "
            "| of which publish (`_send`) p50 | rest of the group (checks, fold, LMDB commit + 2 syncs) p50 |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for committers, group in parts["groups"].items():
            lines.append(
                f"| {committers} | {_ms(group['commit_p50'])} | {group['rate']:,.0f} | {group['groups']:,} | {group['size']:.0f} "
                f"| {_ms(group['group'])} | {_ms(group['publish'])} | {_ms(group['local'])} |"
            )
        lines.append("")
    if "consume" in parts:

        def stage(key: str) -> str:
            wall, cpu = parts[key]
            return f"{wall * 1e6:.1f} µs ({cpu * 1e6:.1f} µs CPU)"

        lines += [
            f"Catch-up per record ({n:,} records), each stage alone, wall-clock (this process's CPU): "
            f"nats-py ordered consumer alone (callback, headers parsed) {stage('consume')}; nats-py's `msg.metadata` + "
            f"`parse_message` (headers, CRC, decompress, decode) {stage('parse')}; the fold (`Follower._apply`, chunks "
            f"of 1,024, one transaction each) {stage('apply_power')} (`power` replica), {stage('apply_process')} (`process`)."
            + (
                f" Batched pull requests alone (`link.messages.fetch`, 4,096 a batch) {stage('fetch')}; `parse_message` of what "
                f"they return, each decoded record dropped at once {stage('parse_raw')}; checked and folded as a catch-up "
                f"does (`Follower._take_raw`: each message checked just before it is folded, 4,096 a transaction) "
                f"{stage('take_raw')} (`process`). The stages with a decoded batch held whole (the first two) pay for "
                "the garbage collector walking it."
                if "fetch" in parts
                else ""
            )
            + " 50,000 records/s is 20 µs a record.",
            "",
        ]
    if any(parts["lag"].values()):
        lines += [
            f"Replica lag by the replica's durability (3 s segments at {args.lag_rate:,.0f} commits/s, alternating "
            "power/process, 3 each; a transaction = one chunk the replica took in):",
            "",
            "| replica | lag p50 | lag p99 | lag max | transactions | records per transaction p50 / max "
            "| transaction p50 / p99 / max | loop stall p99 / max |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for durability, segments in parts["lag"].items():
            lags = [value for lag in segments for value in lag["lags"]]
            applies = [apply for lag in segments for apply in lag["applies"]]
            times = [seconds for seconds, _ in applies]
            sizes = [size for _, size in applies]
            stalls = [stall for lag in segments for stall in lag["stalls"]]
            lines.append(
                f"| {durability} | {_ms(percentile(lags, 0.5))} | {_ms(percentile(lags, 0.99))} | {_ms(max(lags, default=0.0))} "
                f"| {len(applies):,} | {percentile(sizes, 0.5):.0f} / {max(sizes, default=0):,} "
                f"| {_ms(percentile(times, 0.5))} / {_ms(percentile(times, 0.99))} / {_ms(max(times, default=0.0))} "
                f"| {_ms(percentile(stalls, 0.99))} / {_ms(max(stalls, default=0.0))} |"
            )
        lines.append("")
    return lines
