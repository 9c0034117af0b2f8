"""The realistic host of ``tools/bench.py``: a pi-durable ``Session`` on the store, one turn per
commit, each turn appending an entry (a model message with usage data) and changing a
conversation document that grows every turn (a list of turn summaries, one more item per turn,
never checkpointed: every change is a delta). What a host with the default durability feels,
per turn, and what its store leaves on disk, journal included.

The four stores (this store in ``power`` and ``process`` mode, SQLite FULL and NORMAL) run in
the same rounds, rotated (``bench.run_workload`` with both durability classes), so the power
class and the process class are compared on the same slice of a noisy machine. The sizes are
counted after each store is closed (SQLite checkpoints its WAL into the database at its close;
this store's journal stays on disk and is counted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pi_durable import create_session, define_doc
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from bench_workloads import ROOT, Timings, Workload, conversation, entry

HOST_SIZES = (1_000, 10_000)
"""Turns per store at ``--scale 1``."""


def _never(value: Any, ops: Any, info: Any) -> bool:
    return False


Transcript = define_doc(
    kind="bench.transcript", version=1, scope="conversation", history="rewindable", fork="asOf",
    initial=lambda: {"turns": []}, checkpoint_when=_never,
)
"""The growing conversation document: one summary per turn, deltas only."""


def summary(n: int) -> dict[str, Any]:
    return {"turn": n, "summary": "ran the tests", "tokens": 1834 + n % 97}


@dataclass
class HostState:
    session: Any
    count: int
    commits: int = 0


def populate_host(turns: int) -> Any:
    async def populate(store: Any, scale: float) -> HostState:
        await store.storage.commit([conversation(ROOT)], CTX)
        return HostState(create_session(store.storage), max(10, int(turns * scale)), 1)

    return populate


async def measure_host(store: Any, state: HostState, round: int) -> Timings:
    session = state.session

    async def turn(tx: Any, n: int) -> None:
        value = entry(0, ROOT, n)
        await tx.append_entry(ROOT, {key: value[key] for key in ("kind", "model", "data")})
        (await tx.doc(Transcript, ROOT))["turns"].append(summary(n))

    started = time.perf_counter()
    for n in range(1, state.count + 1):
        await session.commit(lambda tx, n=n: turn(tx, n), CTX)
    elapsed = time.perf_counter() - started
    state.commits += state.count
    return {f"host_turn.{state.count}": (elapsed, state.count, await transcript_length(store.storage))}


async def transcript_length(storage: Any) -> int:
    """How many turns the stored document holds (the digest every backend must agree on)."""

    page = await storage.scan_documents({"scope": {"kind": "conversation", "conversationId": ROOT}, "at": "current"}, 10, None, CTX)
    (record,) = page["items"]
    current = await storage.document(record["id"], "current", CTX)
    return len(current["value"]["turns"])


HOST_WORKLOADS: dict[str, Workload] = {
    f"host_{turns}": Workload(
        f"host_{turns}",
        f"a Session host, {turns:,} turns: per turn an entry (model message + usage) and one more item in a "
        "conversation document that is never checkpointed; power, process, SQLite FULL and NORMAL in the same rounds",
        ("process", "power"),
        True,
        populate_host(turns),
        measure_host,
        backends=("lmdb", "sqlite"),
        commits=lambda state: state.commits,
    )
    for turns in HOST_SIZES
}
