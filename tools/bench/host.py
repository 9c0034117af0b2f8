"""The realistic host of ``tools/bench/report.py``: a pi-durable ``Session`` on the store, one turn per
commit, each turn appending an entry (a model message with usage data) and changing a
conversation document that grows every turn (a running log of the turns, one line more per turn,
never checkpointed: every change is a delta). What a host with the default durability feels,
per turn, and what its store leaves on disk, journal included.

The four stores (this store in ``power`` and ``process`` mode, SQLite FULL and NORMAL) run in
the same rounds, rotated (``bench.run_workload`` with both durability classes), so the power
class and the process class are compared on the same slice of a noisy machine. The sizes are
counted after each store is closed (SQLite checkpoints its WAL into the database at its close;
this store's journal stays on disk and is counted).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from pi_durable import create_session, define_doc
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.bench.workloads import ROOT, TimedStorage, Timings, Workload, conversation, entry

HOST_SIZES = (1_000, 10_000)
"""Turns per store at ``--scale 1``."""
LONG_SIZES = (100_000,)
"""Turns of the long host runs (``--long``): one round each, about a quarter of an hour, so they
are left out of a run unless asked for."""


def _never(value: Any, ops: Any, info: Any) -> bool:
    return False


Transcript = define_doc(
    kind="bench.transcript",
    version=1,
    scope="conversation",
    history="rewindable",
    fork="asOf",
    initial=lambda: {"text": ""},
    checkpoint_when=_never,
)
"""The growing conversation document: a running log of the turns, one line more per turn (the
Session sends each change as an append delta), never checkpointed. A text, not a list of
records: the Session's draft of a list compares every item at every commit, which at 10,000
turns made the Session, not either store, most of each turn."""


def summary(n: int) -> str:
    return f"Turn {n}: ran the tests, {1834 + n % 97} tokens.\n"


@dataclass
class HostState:
    name: str
    session: Any
    timed: TimedStorage
    """The storage the Session sees, through a stopwatch: the store's own part of each turn."""
    count: int
    commits: int = 0


def populate_host(name: str, turns: int) -> Any:
    async def populate(store: Any, scale: float) -> HostState:
        await store.storage.commit([conversation(ROOT)], CTX)
        timed = TimedStorage(store.storage)
        return HostState(name, create_session(timed), timed, max(10, int(turns * scale)), 1)

    return populate


async def turn(tx: Any, n: int) -> None:
    """Turn ``n`` of the host, in a Session transaction: the entry, and one more line in the
    transcript."""

    value = entry(0, ROOT, n)
    await tx.append_entry(ROOT, {key: value[key] for key in ("kind", "model", "data")})
    transcript = await tx.doc(Transcript, ROOT)
    transcript["text"] += summary(n)


async def measure_host(store: Any, state: HostState, round: int) -> Timings:
    session = state.session
    state.timed.inside = 0.0
    started = time.perf_counter()
    for n in range(1, state.count + 1):
        await session.commit(lambda tx, n=n: turn(tx, n), CTX)
    elapsed = time.perf_counter() - started
    state.commits += state.count
    return {
        state.name: (elapsed, state.count, await transcript_length(store.storage)),
        # The store's own methods: the Session's part (the same code on every backend) left out.
        f"{state.name}.in_store": (state.timed.inside, state.count, state.count),
    }


CEILING_STORES = (("power", "floor"), ("process", "memory"))
"""The stores that bound each class on the host's turns: this engine's ``process`` commit path
behind one flush per commit (``report.OneFlush``), and pi-durable's ``MemoryStorage``."""


def ceilings_table(results: Any, rows: list[str]) -> list[str]:
    """The host's turns on the stores that bound each class, and their ratios against SQLite:
    a host target above its class's ratio here cannot be met by this engine's design (its work,
    then one flush) on this machine."""

    if not any((row, *key) in results.series for row in rows for key in CEILING_STORES):
        return []
    lines = [
        "",
        "Ceilings, in the same rounds: `floor` is this engine's `process` commit path behind one "
        "journal-like flush per commit (`OneFlush` in `tools/bench/report.py`: no checkpoint, "
        "nothing recoverable), the least a `power` turn can cost; `memory` is pi-durable's "
        "`MemoryStorage`, the least any store can cost a turn.",
        "",
        "| workload | floor | memory | FULL / floor (power's ceiling) | NORMAL / memory (process's ceiling) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in rows:
        cells = []
        for mode, backend in CEILING_STORES:
            series = results.series.get((name, mode, backend))
            cells.append(
                f"{statistics.median(series.times.values()) * 1e3:.2f} ms" if series else "—"
            )
        lines.append(
            f"| {name} | {' | '.join(cells)} "
            f"| {_ratio(_paired(results, name, ('power', 'sqlite'), ('power', 'floor')))} "
            f"| {_ratio(_paired(results, name, ('process', 'sqlite'), ('process', 'memory')))} |"
        )
    return lines


async def transcript_length(storage: Any) -> int:
    """How many turns the stored document holds (the digest every backend must agree on)."""

    page = await storage.scan_documents(
        {"scope": {"kind": "conversation", "conversationId": ROOT}, "at": "current"}, 10, None, CTX
    )
    (record,) = page["items"]
    current = await storage.document(record["id"], "current", CTX)
    return int(current["value"]["text"].count("\n"))


HOST_WORKLOADS: dict[str, Workload] = {
    f"host_{turns}": Workload(
        f"host_{turns}",
        f"a Session host, {turns:,} turns: per turn an entry (model message + usage) and one more line in a "
        "conversation document that is never checkpointed; power, process, SQLite FULL and NORMAL in the same rounds",
        ("process", "power"),
        True,
        populate_host(f"host_{turns}", turns),
        measure_host,
        backends=("lmdb", "sqlite", "floor", "memory"),
        commits=lambda state: state.commits,
        rounds=1 if turns in LONG_SIZES else None,
    )
    for turns in (*HOST_SIZES, *LONG_SIZES)
}
LONG_WORKLOADS: frozenset[str] = frozenset(f"host_{turns}" for turns in LONG_SIZES)


# ── the report's table ───────────────────────────────────────────────────────

STORES = (("power", "lmdb"), ("power", "sqlite"), ("process", "lmdb"), ("process", "sqlite"))
LABELS = {
    ("power", "lmdb"): "lmdb (power)",
    ("power", "sqlite"): "SQLite FULL",
    ("process", "lmdb"): "lmdb (process)",
    ("process", "sqlite"): "SQLite NORMAL",
}


def _paired(
    results: Any, row: str, slower: tuple[str, str], faster: tuple[str, str]
) -> list[float]:
    """Per round, ``slower``'s time over ``faster``'s (the same round: the stores share it)."""

    a = results.series.get((row, *slower))
    b = results.series.get((row, *faster))
    if a is None or b is None:
        return []
    return [a.times[r] / b.times[r] for r in sorted(a.times) if r in b.times and b.times[r] > 0]


def _ratio(values: list[float], goal: str = "") -> str:
    if not values:
        return "—"
    return f"**{statistics.median(values):.2f}x** [{min(values):.2f}x–{max(values):.2f}x]{goal}"


def host_table(results: Any) -> list[str]:
    """The Session host's rows of the report: time per turn and bytes on disk of the four
    stores, and the ratios the default durability is held to."""

    names = [name for name in HOST_WORKLOADS if any(key[0] == name for key in results.series)]
    if not names:
        return []
    rows = [
        row
        for name in names
        for row in (name, f"{name}.in_store")
        if any(key[0] == row for key in results.series)
    ]
    lines = [
        "",
        "### A Session host (`tools/bench/host.py`): both durability classes in the same rounds",
        "",
        "Each turn through a pi-durable `Session`: an entry (model message + usage) and one more line in a conversation "
        "document never checkpointed. Time per turn: median over rounds; ratios: per round, then the median [min–max] "
        "(FULL / power > 1: power is faster). `.in_store`: the time inside the store's own async methods "
        "(a stopwatch around them), the Session's part left out: what each engine itself costs a turn. Bytes: every file of the store after its close, this store's journal "
        "included (SQLite checkpoints its WAL at its close), median over rounds.",
        "",
        "| workload | turns | lmdb (power) | SQLite FULL | lmdb (process) | SQLite NORMAL | FULL / power (>= 1) "
        "| NORMAL / process | power / process (<= 1.2) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in rows:
        cells = []
        turns = 0
        for mode, backend in STORES:
            series = results.series.get((name, mode, backend))
            cells.append(
                f"{statistics.median(series.times.values()) * 1e3:.2f} ms" if series else "—"
            )
            turns = series.ops if series else turns
        lines.append(
            f"| {name} | {turns:,} | {' | '.join(cells)} | {_ratio(_paired(results, name, ('power', 'sqlite'), ('power', 'lmdb')))} "
            f"| {_ratio(_paired(results, name, ('process', 'sqlite'), ('process', 'lmdb')))} "
            f"| {_ratio(_paired(results, name, ('power', 'lmdb'), ('process', 'lmdb')))} |"
        )
    lines += ceilings_table(results, rows)
    lines += [
        "",
        "| workload | lmdb (power) | SQLite FULL | lmdb (process) | SQLite NORMAL | power / FULL bytes (<= 2) "
        "| power / process bytes (<= 1.5) | process / NORMAL bytes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        sizes = {
            key: statistics.median(size for size, _ in results.sizes[(name, *key)])
            for key in STORES
            if (name, *key) in results.sizes
        }
        cells = [f"{sizes[key] / 1024:,.0f} KiB" if key in sizes else "—" for key in STORES]

        def over(a: tuple[str, str], b: tuple[str, str]) -> str:
            return (
                f"**{sizes[a] / sizes[b]:.2f}x**" if a in sizes and b in sizes and sizes[b] else "—"
            )

        lines.append(
            f"| {name} | {' | '.join(cells)} | {over(('power', 'lmdb'), ('power', 'sqlite'))} "
            f"| {over(('power', 'lmdb'), ('process', 'lmdb'))} | {over(('process', 'lmdb'), ('process', 'sqlite'))} |"
        )
    return lines
