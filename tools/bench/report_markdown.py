"""The markdown report of ``python -m tools.bench`` (``tools.bench.report``): a run's results, the
tables and targets made of them, and writing them into a file's marked block."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
from dataclasses import dataclass, field
from typing import Any

from tools.bench.host import host_table

BACKENDS = ("lmdb", "sqlite", "memory", "jsonl", "floor")
LABELS = {
    ("lmdb", "process"): "lmdb (process)",
    ("lmdb", "power"): "lmdb (power)",
    ("sqlite", "process"): "sqlite (NORMAL)",
    ("sqlite", "power"): "sqlite (FULL)",
    ("memory", "process"): "memory",
    ("jsonl", "process"): "jsonl",
    ("jsonl", "power"): "jsonl (fsync)",
    ("floor", "power"): "floor: lmdb (process) + one flush",
}
CEILINGS = {"process": "memory", "power": "floor"}
"""Per class, the backend that bounds what any design of this engine can reach here on a commit: in
``process``, pi-durable's ``MemoryStorage`` (no I/O, no encoding); in ``power``, ``OneFlush``
(this engine's ``process`` commit path plus one device flush per commit)."""
COMMIT_ROWS = frozenset(
    {"commit_turn", "commit_doc_delta", "session_turn", "host_1000", "host_10000", "host_100000"}
)
"""The workloads that write: the ceilings bound them (a read may well beat MemoryStorage)."""

# (row, mode, required lmdb/sqlite ratio, also faster than MemoryStorage)
TARGETS: tuple[tuple[str, str, float, bool], ...] = (
    ("commit_turn", "process", 10.0, False),
    ("commit_doc_delta", "process", 10.0, False),
    ("commit_turn", "power", 1.5, False),
    ("read_point", "process", 4.0, True),
    ("read_entry_pages", "process", 3.0, False),
    ("read_entry_pages.forks", "process", 4.0, False),
    ("read_doc_tail.current", "process", 100.0, False),
    ("read_doc_tail.middle", "process", 3.0, False),
    ("scan_tasks_status", "process", 2.0, False),
    ("host_10000", "power", 1.1, False),
    ("host_10000", "process", 1.0, False),
    ("host_10000.in_store", "process", 2.0, False),
)


@dataclass
class Series:
    """Per-op seconds, one value per round (index = round), and what each round answered."""

    times: dict[int, float] = field(default_factory=dict)
    ops: int = 0
    digests: dict[int, Any] = field(default_factory=dict)


@dataclass
class Results:
    series: dict[tuple[str, str, str], Series] = field(default_factory=dict)
    sizes: dict[tuple[str, str, str], list[tuple[int, int]]] = field(default_factory=dict)
    """(workload, mode, backend) -> [(bytes on disk, commits)] after each store is closed."""
    rss: dict[tuple[str, str, str], int] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    source: str = "unknown"
    flushes: list[float] = field(default_factory=list)
    """One flush on the disk of the stores (``flush``), at the start and the end of the run."""
    paths: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    """Per workload, per timed pass of a ``power`` LMDB store: its counters' growth (batches,
    direct, device flushes, checkpoints, segment switches, segments made ahead:
    ``report.engine_counts``)."""

    def add(
        self, mode: str, backend: str, round: int, timings: dict[str, tuple[float, int, Any]]
    ) -> None:
        for row, (seconds, ops, digest) in timings.items():
            series = self.series.setdefault((row, mode, backend), Series())
            series.times[round] = seconds / ops
            series.ops = ops
            series.digests[round] = digest


def fmt_time(seconds: float) -> str:
    us = seconds * 1e6
    if us >= 10_000:
        return f"{us / 1000:,.1f} ms"
    if us >= 100:
        return f"{us:,.0f} µs"
    if us >= 10:
        return f"{us:.1f} µs"
    return f"{us:.2f} µs"


def _fmt_ratio(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}x"
    if value >= 10:
        return f"{value:.1f}x"
    return f"{value:.2f}x"


def paired_ratios(
    results: Results, row: str, mode: str, backend: str, against: str = "sqlite"
) -> list[float]:
    mine = results.series.get((row, mode, backend))
    theirs = results.series.get((row, mode, against))
    if mine is None or theirs is None:
        return []
    return [
        theirs.times[r] / mine.times[r]
        for r in sorted(mine.times)
        if r in theirs.times and mine.times[r] > 0
    ]


def _row_order(results: Results) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    for row, mode, _backend in results.series:
        if (row, mode) not in seen:
            seen.append((row, mode))
    return seen


def _bytes(value: float) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:,.1f} {unit}"
    return f"{value:,.0f} B"


def render(results: Results, args: argparse.Namespace, command: str) -> str:
    lines = [
        f"Command: `{command}`  ",
        f"Engine: git {results.source}  ",
        f"Machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}; "
        f"{args.rounds} rounds, scale {args.scale}, run took {results.elapsed:.0f} s  ",
        *(
            [
                f"One device flush on the stores' disk (4 KiB overwritten in a preallocated file + fdatasync, "
                f"median of 200, `tools/bench/flush.py`): {' at the start, '.join(fmt_time(t) for t in results.flushes)} "
                f"at the end of the run: the floor of a power commit"
            ]
            if results.flushes
            else []
        ),
        "",
        "Median time per operation over rounds; spread = min–max over rounds; ratio = SQLite time / "
        "this backend's time, paired per round, median [min–max] (> 1: faster than SQLite, same "
        "durability class).",
        "",
        "| workload | class | backend | median / op | spread (min–max) | ratio vs SQLite | ops per round |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for row, mode in _row_order(results):
        for backend in BACKENDS:
            series = results.series.get((row, mode, backend))
            if series is None:
                continue
            values = list(series.times.values())
            ratios = paired_ratios(results, row, mode, backend)
            ratio = (
                "—"
                if backend == "sqlite" or not ratios
                else (
                    f"**{_fmt_ratio(statistics.median(ratios))}** "
                    f"[{_fmt_ratio(min(ratios))}–{_fmt_ratio(max(ratios))}]"
                )
            )
            lines.append(
                f"| {row} | {mode} | {LABELS[(backend, mode)]} | {fmt_time(statistics.median(values))} "
                f"| {fmt_time(min(values))}–{fmt_time(max(values))} | {ratio} | {series.ops:,} |"
            )
    lines += [
        "",
        "### Targets (LMDB vs SQLite, same run, same durability class)",
        "",
        "The ceiling column, for commits: the same ratio for the backend that bounds any design of this engine "
        "here (`process`: pi-durable's MemoryStorage, no I/O at all; `power`: this engine's "
        "`process` commit path plus one device flush, `OneFlush` in `tools/bench/report.py`). A target "
        "above its ceiling cannot be met by this engine's commit design (its work, then its flush) "
        "on this machine.",
        "",
        "| workload | class | target | measured (median [min–max]) | ceiling here | met |",
        "|---|---|---|---:|---:|---|",
    ]
    for row, mode, target, vs_memory in TARGETS:
        ratios = paired_ratios(results, row, mode, "lmdb")
        if not ratios:
            continue
        median = statistics.median(ratios)
        met = median >= target
        text = f"{_fmt_ratio(median)} [{_fmt_ratio(min(ratios))}–{_fmt_ratio(max(ratios))}]"
        bound = (
            paired_ratios(results, row, mode, CEILINGS[mode])
            if row.split(".")[0] in COMMIT_ROWS
            else []
        )
        ceiling = (
            f"{_fmt_ratio(statistics.median(bound))} ({LABELS[(CEILINGS[mode], mode)]})"
            if bound
            else "—"
        )
        goal = f">= {target:g}x"
        if vs_memory:
            memory = paired_ratios(results, row, mode, "lmdb", against="memory")
            if memory:
                faster = statistics.median(memory)
                met = met and faster > 1
                text += f"; vs memory {_fmt_ratio(faster)}"
                goal += ", faster than memory"
        lines.append(
            f"| {row} | {mode} | {goal} | {text} | {ceiling} | {'met' if met else '**not met**'} |"
        )
    if results.sizes:
        lines += [
            "",
            "### Store size on disk (after close)",
            "",
            "| workload | class | backend | bytes on disk | commits | bytes / commit |",
            "|---|---|---|---:|---:|---:|",
        ]
        for (name, mode, backend), sizes in results.sizes.items():
            if backend in ("memory", "floor"):
                continue
            size, commits = sizes[-1]
            count, per = (f"{commits:,}", _bytes(size / commits)) if commits else ("—", "—")
            lines.append(
                f"| {name} | {mode} | {LABELS[(backend, mode)]} | {_bytes(size)} | {count} | {per} |"
            )
    lines += paths_table(results)
    lines += host_table(results)
    if results.rss:
        baselines = {
            backend: kib for (name, _mode, backend), kib in results.rss.items() if name == "none"
        }
        lines += [
            "",
            "### Peak RSS (VmHWM of one subprocess each: populate + one pass; baseline: the same "
            "backend opening and closing an empty store; LMDB's count includes the mapped pages "
            "of its file)",
            "",
            "| workload | class | backend | peak RSS | above baseline |",
            "|---|---|---|---:|---:|",
        ]
        for (name, mode, backend), kib in results.rss.items():
            if name == "none":
                continue
            above = kib - baselines.get(backend, kib)
            lines.append(
                f"| {name} | {mode} | {LABELS[(backend, mode)]} | {kib / 1024:.1f} MiB "
                f"| {above / 1024:+.1f} MiB |"
            )
        lines.append("")
        lines.append(
            "Baselines: "
            + ", ".join(f"{backend} {kib / 1024:.1f} MiB" for backend, kib in baselines.items())
        )
    if results.mismatches:
        lines += ["", "### Answers that differ from SQLite", ""]
        lines += [f"- {mismatch}" for mismatch in results.mismatches]
    return "\n".join(lines) + "\n"


def paths_table(results: Results) -> list[str]:
    """Where the ``power`` LMDB store's timed commits went and what they flushed: the share
    committed on the caller's thread (the rest took the writer thread's two hand-offs), device
    flushes per commit (frames, checkpoints, segments), checkpoints per commit and how many
    segment switches found their segment made ahead. Counts, not times: a loaded machine
    changes them little, so a regression (commits pushed to the writer thread, more flushes)
    shows here when the times are too noisy to tell."""

    if not results.paths:
        return []
    lines = [
        "",
        "### Power commits: path and flushes (LMDB, timed passes, counted by the engine)",
        "",
        "| workload | commits | on the caller's thread | writer thread | share direct per pass "
        "(min–max) | device flushes / commit | checkpoints / commit | segment switches (made ahead) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, passes in results.paths.items():
        batches, direct, flushes, checkpoints, switches, ahead = (
            sum(column) for column in zip(*passes)
        )
        if not batches:
            continue
        shares = [p[1] / p[0] for p in passes if p[0]]
        lines.append(
            f"| {name} | {batches:,} | {direct / batches:.1%} | {(batches - direct) / batches:.1%} "
            f"| {min(shares):.0%}–{max(shares):.0%} | {flushes / batches:.3f} "
            f"| {checkpoints / batches:.3f} | {switches:,} ({ahead:,}) |"
        )
    return lines


SQLITE_SYNC = {"process": "NORMAL", "power": "FULL"}
"""SQLite's ``synchronous`` setting in each durability class."""
MARKDOWN_BEGIN = "<!-- generated by python -m tools.bench --markdown: begin -->"
MARKDOWN_END = "<!-- generated by python -m tools.bench --markdown: end -->"


def _legacy(marker: str) -> str:
    """The same marker as written by the report when it was the script ``tools/bench.py``: a file
    that still holds it is rewritten with the new one."""

    return marker.replace("python -m tools.bench", "tools/bench.py")


def write_marked(path: str, block: str, begin: str, end: str) -> None:
    """Replace the block between the lines ``begin`` and ``end`` of ``path`` (once each) with
    ``block`` (which starts and ends with them)."""

    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    if begin not in text and end not in text:
        begin, end = _legacy(begin), _legacy(end)
    if text.count(begin) != 1 or text.count(end) != 1:
        raise SystemExit(f"{path} must hold the lines {begin!r} and {end!r} once each")
    head, rest = text.split(begin)
    tail = rest.split(end, 1)[1]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(head + block + tail)


def write_markdown(path: str, table: str) -> None:
    """The tables into ``path``: its marked block when it has one (docs/benchmarks.md), else the
    whole file."""

    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
            marked = MARKDOWN_BEGIN in text or _legacy(MARKDOWN_BEGIN) in text
        if marked:
            write_marked(
                path, f"{MARKDOWN_BEGIN}\n{table}{MARKDOWN_END}", MARKDOWN_BEGIN, MARKDOWN_END
            )
            return
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(table)
