"""Workloads of ``tools/bench/report.py``: how each store is populated, what is timed (the records
they commit: ``tools/bench/records.py``).

Every workload drives only the public ``Storage`` API, so the same code runs against LmdbStorage
and pi-durable's own backends. Ids come from a counter of our own (not ``mint_id``), so every
backend stores byte-for-byte the same records. A timed pass returns, per measured operation kind,
``(seconds, operations, digest)``: the digest (item counts, a value's length) lets the runner check
that every backend answered the same thing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.bench.records import (
    ROOT,
    Ids,
    conversation,
    document_create,
    document_delta,
    entry,
    task,
)

Timings = dict[str, tuple[float, int, Any]]


async def commit_batches(storage: Any, writes: list[dict[str, Any]], per_commit: int) -> None:
    for start in range(0, len(writes), per_commit):
        await storage.commit(writes[start : start + per_commit], CTX)


# ── workloads ────────────────────────────────────────────────────────────────


@dataclass
class Workload:
    """``populate`` (untimed) fills a fresh store and returns state for ``measure`` (timed).

    ``fresh`` workloads get a new store every round (commits); the others populate one store per
    backend and time every round on it (reads). ``measure(store, state, round)`` takes the
    runner's store handle (``.storage``, ``.reopen()``)."""

    name: str
    describe: str
    modes: tuple[str, ...]
    fresh: bool
    populate: Callable[[Any, float], Awaitable[Any]]
    measure: Callable[[Any, Any, int], Awaitable[Timings]]
    backends: tuple[str, ...] = ("lmdb", "sqlite", "memory", "jsonl", "floor")
    commits: Callable[[Any], int] = field(default=lambda state: 0)
    """How many commits the store holds after a pass, for the bytes-per-commit column."""
    rounds: int | None = None
    """Rounds at most, whatever ``--rounds`` says (a workload of many minutes a round)."""


def _n(base: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, int(base * scale))


# commit_turn ─────────────────────────────────────────────────────────────────


@dataclass
class TurnState:
    ids: Ids
    task_id: int
    count: int
    commits: int = 0


async def populate_turns(store: Any, scale: float) -> TurnState:
    storage, ids = store.storage, Ids()
    task_id = ids()
    await storage.commit([conversation(ROOT)], CTX)
    await storage.commit([{"type": "task", "value": task(task_id, ROOT, 0, "pending")}], CTX)
    count = _n(400 if store.mode == "process" else 150, scale, 10)
    return TurnState(ids, task_id, count, 2)


def turn_batches(ids: Ids, task_id: int, count: int) -> list[list[dict[str, Any]]]:
    """``count`` turn commits of one task: an entry and the task record, its status moving."""

    return [
        [
            {"type": "entry", "value": entry(ids(), ROOT, n, task_id)},
            {"type": "task", "value": task(task_id, ROOT, n, "running" if n % 3 else "sleeping")},
        ]
        for n in range(1, count + 1)
    ]


async def measure_turns(store: Any, state: TurnState, round: int) -> Timings:
    storage = store.storage
    batches = turn_batches(state.ids, state.task_id, state.count)
    started = time.perf_counter()
    for writes in batches:
        await storage.commit(writes, CTX)
    elapsed = time.perf_counter() - started
    state.commits += state.count
    return {"commit_turn": (elapsed, state.count, state.count)}


# commit_doc_delta ────────────────────────────────────────────────────────────


@dataclass
class DocState:
    doc: int
    count: int
    commits: int = 0


async def populate_doc(store: Any, scale: float) -> DocState:
    storage, ids = store.storage, Ids()
    doc = ids()
    await storage.commit([conversation(ROOT)], CTX)
    await storage.commit([document_create(doc)], CTX)
    count = _n(500 if store.mode == "process" else 150, scale, 10)
    return DocState(doc, count, 2)


async def measure_doc(store: Any, state: DocState, round: int) -> Timings:
    storage = store.storage
    batches = [[document_delta(state.doc)] for _ in range(state.count)]
    started = time.perf_counter()
    for writes in batches:
        await storage.commit(writes, CTX)
    elapsed = time.perf_counter() - started
    state.commits += state.count
    current = await storage.document(state.doc, "current", CTX)
    return {"commit_doc_delta": (elapsed, state.count, len(current["value"]["text"]))}


# read_point ──────────────────────────────────────────────────────────────────


@dataclass
class PointState:
    entries: list[int]
    tasks: list[int]
    conversations: list[int]
    lookups: int


async def populate_point(store: Any, scale: float) -> PointState:
    storage, ids = store.storage, Ids()
    conversations = [ROOT] + [ids() for _ in range(19)]
    await storage.commit([conversation(c) for c in conversations], CTX)
    entries, tasks, writes = [], [], []
    for n in range(_n(5000, scale, 100)):
        id = ids()
        entries.append(id)
        writes.append({"type": "entry", "value": entry(id, conversations[n % 20], n)})
    for n in range(_n(1000, scale, 20)):
        id = ids()
        tasks.append(id)
        writes.append({"type": "task", "value": task(id, conversations[n % 20], n, "running")})
    await commit_batches(storage, writes, 100)
    return PointState(entries, tasks, conversations, _n(2000, scale, 100))


async def measure_point(store: Any, state: PointState, round: int) -> Timings:
    storage, rng = store.storage, random.Random(1000 + round)
    entry_ids = [rng.choice(state.entries) for _ in range(state.lookups)]
    task_ids = [rng.choice(state.tasks) for _ in range(state.lookups)]
    conversation_ids = [rng.choice(state.conversations) for _ in range(state.lookups)]
    found = 0
    started = time.perf_counter()
    for id in entry_ids:
        found += (await storage.entry(id, CTX)) is not None
    entries_done = time.perf_counter()
    for id in task_ids:
        found += (await storage.task(id, CTX)) is not None
    tasks_done = time.perf_counter()
    for id in conversation_ids:
        found += (await storage.conversation(id, CTX)) is not None
    done = time.perf_counter()
    n = state.lookups
    return {
        "read_point": (done - started, 3 * n, found),
        "read_point.entry": (entries_done - started, n, None),
        "read_point.task": (tasks_done - entries_done, n, None),
        "read_point.conversation": (done - tasks_done, n, None),
    }


# read_entry_pages ───────────────────────────────────────────────────────────


@dataclass
class PagesState:
    linear: int
    leaf: int
    passes: int


async def populate_pages(store: Any, scale: float) -> PagesState:
    """One conversation of N entries, and a fork chain of depth 20 holding N entries in all,
    each fork made at its parent's newest entry, so the leaf sees every entry of the chain."""

    storage, ids = store.storage, Ids()
    total = _n(5000, scale, 200)
    await storage.commit([conversation(ROOT)], CTX)
    linear = ids()
    await storage.commit([conversation(linear)], CTX)
    await commit_batches(
        storage, [{"type": "entry", "value": entry(ids(), linear, n)} for n in range(total)], 100
    )
    depth = 20
    per_conversation = total // (depth + 1)
    parent, at = None, None
    for level in range(depth + 1):
        id = ids()
        await storage.commit([conversation(id, parent, at)], CTX)
        count = per_conversation if level < depth else total - depth * per_conversation
        writes = []
        for n in range(count):
            at = ids()
            writes.append({"type": "entry", "value": entry(at, id, n)})
        await commit_batches(storage, writes, 100)
        parent = id
    return PagesState(linear, parent, 3)  # type: ignore[arg-type]


async def _scan_all(storage: Any, conversation_id: int) -> int:
    seen, cursor = 0, None
    while True:
        page = await storage.scan_entries({"conversationId": conversation_id}, 50, cursor, CTX)
        seen += len(page["items"])
        cursor = page.get("next")
        if cursor is None:
            return seen


async def measure_pages(store: Any, state: PagesState, round: int) -> Timings:
    storage = store.storage
    linear = forks = 0
    started = time.perf_counter()
    for _ in range(state.passes):
        linear += await _scan_all(storage, state.linear)
    middle = time.perf_counter()
    for _ in range(state.passes):
        forks += await _scan_all(storage, state.leaf)
    done = time.perf_counter()
    pages_linear = -(-linear // 50)
    pages_forks = -(-forks // 50)
    return {
        "read_entry_pages": (middle - started, pages_linear, linear),
        "read_entry_pages.forks": (done - middle, pages_forks, forks),
    }


# read_doc_tail ───────────────────────────────────────────────────────────────


@dataclass
class DocTailState:
    doc: int
    middle_seq: int
    current_reads: int
    middle_reads: int


async def populate_doc_tail(store: Any, scale: float) -> DocTailState:
    storage, ids = store.storage, Ids()
    doc = ids()
    await storage.commit([conversation(ROOT)], CTX)
    await storage.commit([document_create(doc)], CTX)
    deltas = _n(1000, scale, 20)
    middle_seq = 0
    for n in range(deltas):
        seq = await storage.commit([document_delta(doc)], CTX)
        if n == deltas // 2 - 1:
            middle_seq = seq
    return DocTailState(doc, middle_seq, _n(200, scale, 20), _n(40, scale, 5))


async def measure_doc_tail(store: Any, state: DocTailState, round: int) -> Timings:
    storage = store.storage
    started = time.perf_counter()
    for _ in range(state.current_reads):
        current = await storage.document(state.doc, "current", CTX)
    middle = time.perf_counter()
    for _ in range(state.middle_reads):
        past = await storage.document(state.doc, state.middle_seq, CTX)
    done = time.perf_counter()
    return {
        "read_doc_tail.current": (
            middle - started,
            state.current_reads,
            (len(current["value"]["text"]), current["deltasSinceBase"]),
        ),
        "read_doc_tail.middle": (
            done - middle,
            state.middle_reads,
            (len(past["value"]["text"]), past["deltasSinceBase"]),
        ),
    }


# scan_tasks_status ───────────────────────────────────────────────────────────


async def populate_tasks(store: Any, scale: float) -> int:
    """N tasks, three in five pending, the rest running or sleeping."""

    storage, ids = store.storage, Ids()
    await storage.commit([conversation(ROOT)], CTX)
    statuses = ("pending", "running", "pending", "sleeping", "pending")
    writes = [
        {"type": "task", "value": task(ids(), ROOT, n, statuses[n % 5])}
        for n in range(_n(5000, scale, 100))
    ]
    await commit_batches(storage, writes, 100)
    return 5


async def measure_tasks(store: Any, passes: int, round: int) -> Timings:
    storage = store.storage
    seen = pages = 0
    started = time.perf_counter()
    for _ in range(passes):
        cursor = None
        while True:
            page = await storage.scan_tasks({"status": "pending"}, 100, cursor, CTX)
            seen += len(page["items"])
            pages += 1
            cursor = page.get("next")
            if cursor is None:
                break
    return {"scan_tasks_status": (time.perf_counter() - started, pages, seen)}


# session_turn ────────────────────────────────────────────────────────────────


class TimedStorage:
    """A Storage seen through a stopwatch: the seconds spent inside the store's own async methods
    (reads, ``mint_id``, ``commit``), so a Session turn splits into the store's part and the
    Session's."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage
        self.inside = 0.0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._storage, name)
        if not callable(value) or name.startswith("_"):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if not hasattr(result, "__await__"):
                return result

            async def waited() -> Any:
                started = time.perf_counter()
                try:
                    return await result
                finally:
                    self.inside += time.perf_counter() - started

            return waited()

        return timed


@dataclass
class SessionState:
    session: Any
    timed: TimedStorage
    task_id: int
    count: int
    commits: int = 0


async def populate_session(store: Any, scale: float) -> SessionState:
    """A pi-durable Session on the store, the root conversation and one task record."""

    from pi_durable import create_session

    storage = store.storage
    task_id = await storage.mint_id()
    await storage.commit([conversation(ROOT)], CTX)
    await storage.commit([{"type": "task", "value": task(task_id, ROOT, 0, "pending")}], CTX)
    count = _n(400 if store.mode == "process" else 150, scale, 10)
    timed = TimedStorage(storage)
    return SessionState(create_session(timed), timed, task_id, count, 2)


async def measure_session(store: Any, state: SessionState, round: int) -> Timings:
    """``commit_turn`` as a host makes it through a Session: the transaction reads the task,
    appends the entry (the Session checks the conversation and mints the id) and sets the task.
    ``.in_store``: the part of each turn spent inside the store's methods."""

    session, task_id = state.session, state.task_id
    turns = [(n, "running" if n % 3 else "sleeping") for n in range(1, state.count + 1)]

    async def turn(tx: Any, n: int, status: str) -> None:
        current = await tx.task(task_id)
        value = entry(0, ROOT, n, task_id)
        await tx.append_entry(ROOT, {key: value[key] for key in ("kind", "model", "data")})
        tx.set_task({**task(task_id, ROOT, n, status), "version": current["version"]})

    state.timed.inside = 0.0
    started = time.perf_counter()
    for n, status in turns:
        await session.commit(lambda tx, n=n, status=status: turn(tx, n, status), CTX)
    elapsed = time.perf_counter() - started
    state.commits += state.count
    return {
        "session_turn": (elapsed, state.count, state.count),
        "session_turn.in_store": (
            state.timed.inside,
            state.count,
            state.count,
        ),  # the rest is the Session's
    }


# reopen ──────────────────────────────────────────────────────────────────────


@dataclass
class ReopenState:
    task_id: int
    commits: int
    times: int


async def populate_reopen(store: Any, scale: float) -> ReopenState:
    """N one-turn commits (entry + task update), each its own commit."""

    state = await populate_turns(store, scale)
    state.count = _n(2000, scale, 50)
    await measure_turns(store, state, 0)
    return ReopenState(state.task_id, state.commits, 5)


async def measure_reopen(store: Any, state: ReopenState, round: int) -> Timings:
    elapsed, digest = 0.0, None
    for _ in range(state.times):
        await store.close()
        started = time.perf_counter()
        await store.open()
        storage = store.storage
        page = await storage.scan_entries({"conversationId": ROOT}, 50, None, CTX)
        found = await storage.task(state.task_id, CTX)
        elapsed += time.perf_counter() - started
        digest = (len(page["items"]), found["memos"]["turns"])
    return {"reopen": (elapsed, state.times, digest)}


WORKLOADS: dict[str, Workload] = {
    workload.name: workload
    for workload in (
        Workload(
            "commit_turn",
            "per commit: one entry (~500 B model message + data) and the full task record rewritten",
            ("process", "power"),
            True,
            populate_turns,
            measure_turns,
            commits=lambda state: state.commits,
        ),
        Workload(
            "session_turn",
            "commit_turn through a pi-durable Session (what a host feels): the transaction reads the task, appends the entry (the Session checks the conversation, mints the id) and sets the task",
            ("process", "power"),
            True,
            populate_session,
            measure_session,
            commits=lambda state: state.commits,
        ),
        Workload(
            "commit_doc_delta",
            "one rewindable conversation document, then one-delta commits (string append)",
            ("process", "power"),
            True,
            populate_doc,
            measure_doc,
            commits=lambda state: state.commits,
        ),
        Workload(
            "read_point",
            "random entry(id) / task(id) / conversation(id) on 5,000 entries, 1,000 tasks, 20 conversations",
            ("process",),
            False,
            populate_point,
            measure_point,
        ),
        Workload(
            "read_entry_pages",
            "newest-first pages of 50 over 5,000 entries; .forks: the same through a fork chain of depth 20",
            ("process",),
            False,
            populate_pages,
            measure_pages,
        ),
        Workload(
            "read_doc_tail",
            "document(id, 'current') and document(id, middle seq) with 1,000 deltas since the base",
            ("process",),
            False,
            populate_doc_tail,
            measure_doc_tail,
        ),
        Workload(
            "scan_tasks_status",
            "pages of 100 of scan_tasks({status: pending}) over 5,000 tasks (3,000 pending)",
            ("process",),
            False,
            populate_tasks,
            measure_tasks,
        ),
        Workload(
            "reopen",
            "close + open a store of 2,000 turn commits + first read (entries page, task)",
            ("process",),
            False,
            populate_reopen,
            measure_reopen,
            backends=("lmdb", "sqlite", "jsonl"),
            commits=lambda state: state.commits,
        ),
    )
}
