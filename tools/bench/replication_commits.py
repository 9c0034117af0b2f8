"""Replicated commits for ``tools.bench.replication``: commit latency and throughput beside local
``power`` LMDB and SQLite FULL, raw nats-py publishes for context, replica lag under a paced writer;
and what the other parts share (the stream, the replicated store handle, the turn commits)."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import tempfile
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.bench.concurrent import TICK, percentile
from tools.bench.report import Store
from tools.bench.report_markdown import LABELS
from tools.bench.workloads import Ids, conversation, entry, task

STREAM = "BENCH"
REPLICATED = "replicated"
BACKENDS = (REPLICATED, "lmdb", "sqlite")
LABEL = {
    REPLICATED: "replicated (R3)",
    "lmdb": LABELS[("lmdb", "power")],
    "sqlite": LABELS[("sqlite", "power")],
}
COMMITTERS = (1, 64)


# ── part 1: commit latency and throughput ────────────────────────────────────


class ReplicatedStore(Store):
    """``tools/bench/report.py``'s store handle for a ``durability="replicated"`` LMDB store."""

    def __init__(self, path: str, urls: list[str]) -> None:
        super().__init__("lmdb", REPLICATED, path)
        self.urls = urls

    async def open(self) -> None:
        from pi_durable_lmdb.storage import LmdbStorage

        os.makedirs(self.path, exist_ok=True)
        self.storage = await LmdbStorage.open(
            self.path, durability="replicated", nats=self.urls, stream=STREAM, replicas=3
        )


def turn(ids: Ids, conversation_id: int, task_id: int, n: int) -> list[dict[str, Any]]:
    status = "running" if n % 3 else "sleeping"
    return [
        {"type": "entry", "value": entry(ids(), conversation_id, n, task_id)},
        {"type": "task", "value": task(task_id, conversation_id, n, status)},
    ]


async def own(storage: Any, ids: Ids, count: int) -> list[tuple[int, int]]:
    """``count`` conversations, each with its task (untimed set-up commits)."""

    owned = []
    for _ in range(count):
        conversation_id, task_id = ids(), ids()
        await storage.commit(
            [
                conversation(conversation_id),
                {"type": "task", "value": task(task_id, conversation_id, 0, "pending")},
            ],
            CTX,
        )
        owned.append((conversation_id, task_id))
    return owned


async def run_committers(storage: Any, committers: int, commits: int) -> dict[str, float]:
    """``commits`` turn commits spread over ``committers`` concurrent committers."""

    ids = Ids()
    owned = await own(storage, ids, committers)
    per = max(1, commits // committers)
    latencies: list[float] = []

    async def committer(conversation_id: int, task_id: int) -> None:
        for n in range(1, per + 1):
            writes = turn(ids, conversation_id, task_id, n)
            started = time.perf_counter()
            await storage.commit(writes, CTX)
            latencies.append(time.perf_counter() - started)

    gc.collect()
    started = time.perf_counter()
    await asyncio.gather(*(committer(c, t) for c, t in owned))
    elapsed = time.perf_counter() - started
    return {
        "rate": per * committers / elapsed,
        "p50": percentile(latencies, 0.50),
        "p99": percentile(latencies, 0.99),
    }


async def measure_commits(
    backend: str, committers: int, commits: int, base: str, urls: list[str]
) -> dict[str, float]:
    path = tempfile.mkdtemp(dir=base, prefix=f"{backend}-")
    store = ReplicatedStore(path, urls) if backend == REPLICATED else Store(backend, "power", path)
    await store.open()
    try:
        return await run_committers(store.storage, committers, commits)
    finally:
        await store.close()
        shutil.rmtree(path, ignore_errors=True)


# ── raw publish, for context ─────────────────────────────────────────────────


async def raw_publish(urls: list[str], count: int, size: int) -> list[float]:
    import nats

    nc = await nats.connect(servers=urls)
    try:
        js = nc.jetstream(timeout=5)
        body = os.urandom(size)
        latencies = []
        for n in range(count):
            started = time.perf_counter()
            await js.publish(f"rawpub.s{n % 8}", body)
            latencies.append(time.perf_counter() - started)
        return latencies
    finally:
        await nc.close()


# ── part 2: replica lag under a paced writer ─────────────────────────────────


async def measure_lag(
    urls: list[str],
    base: str,
    seconds: float,
    rate: float,
    replica_durability: str = "power",
    instrument: bool = False,
) -> dict[str, Any]:
    from pi_durable_lmdb.storage import LmdbStorage

    writer_dir = tempfile.mkdtemp(dir=base, prefix="lag-writer-")
    replica_dir = tempfile.mkdtemp(dir=base, prefix="lag-replica-")
    writer = await LmdbStorage.open(
        writer_dir, durability="replicated", nats=urls, stream=STREAM, replicas=3
    )
    replica = None
    try:
        ids = Ids()
        owned = await own(writer, ids, 64)
        replica = await LmdbStorage.open_replica(
            replica_dir,
            nats=urls,
            stream=STREAM,
            store=writer.store_id,
            durability=replica_durability,
        )
        await replica.wait(writer.log.head(), 30)
        applies: list[tuple[float, int]] = []
        if instrument:  # --breakdown: each transaction the replica takes a chunk in with
            follower = replica.replication
            write = follower._write

            def timed_write(chunk: Any) -> Any:
                started = time.perf_counter()
                try:
                    return write(chunk)
                finally:
                    applies.append((time.perf_counter() - started, len(chunk)))

            follower._write = timed_write
        total = max(1, int(seconds * rate))
        commit_latency: list[float] = []
        lags: list[float] = []
        errors: list[str] = []

        async def one(n: int) -> None:
            conversation_id, task_id = owned[n % len(owned)]
            writes = turn(ids, conversation_id, task_id, n + 1)
            started = time.perf_counter()
            seq = await writer.commit(writes, CTX)
            acked = time.perf_counter()
            commit_latency.append(acked - started)
            try:
                await replica.wait(seq, 30)
            except Exception as error:
                errors.append(f"{type(error).__name__}: {error}")
                return
            lags.append(time.perf_counter() - acked)

        gc.collect()
        pauses: list[float] = []
        began: list[float] = [0.0]

        def note(phase: str, info: dict[str, int]) -> None:  # the collector's pauses meanwhile
            if phase == "start":
                began[0] = time.perf_counter()
            elif info.get("generation") == 2:
                pauses.append(time.perf_counter() - began[0])

        gc.callbacks.append(note)
        stalls: list[float] = []
        ticking = True

        async def ticker() -> None:  # how late the loop wakes (as tools/bench/concurrent.py)
            loop = asyncio.get_running_loop()
            while ticking:
                before = loop.time()
                await asyncio.sleep(TICK)
                stalls.append(max(0.0, loop.time() - before - TICK))

        tick = asyncio.create_task(ticker())
        tasks = []
        started = time.perf_counter()
        for n in range(total):
            delay = started + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(n)))
        issued = time.perf_counter() - started
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        gc.callbacks.remove(note)
        ticking = False
        await tick
        return {
            "gc": pauses,
            "stalls": stalls,
            "applies": applies,
            "commits": total,
            "offered": total / issued if issued else rate,
            "achieved": total / elapsed,
            "commit_latency": commit_latency,
            "lags": lags,
            "errors": errors,
        }
    finally:
        if replica is not None:
            await replica.close()
        await writer.close()
        shutil.rmtree(writer_dir, ignore_errors=True)
        shutil.rmtree(replica_dir, ignore_errors=True)
