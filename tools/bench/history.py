"""Long-log costs: reopen, rebuild, verify, tail, and ``as_of`` views.

    python -m tools.bench.history --commits 100000
    python -m tools.bench.history --commits 1000000 --views 10

Builds a store of typical agent turns (an entry plus a task update per commit, a document delta
every tenth), then measures: close and reopen plus the first read, a full rebuild of the
projections (records/s), ``verify`` (records/s), tail as JSON in-process (records/s), opening a
view at random sequences plus its first reads, and the peak RSS of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit import Tail, verify
from pi_durable_lmdb.storage import LmdbStorage

MESSAGE = {"role": "assistant", "content": "word " * 100}


async def build(path: Path, commits: int) -> float:
    storage = await LmdbStorage.open(path, durability="process")
    started = time.perf_counter()
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    notes = {
        "id": 3,
        "kind": "notes",
        "scope": {"kind": "conversation", "conversationId": 1},
        "history": "rewindable",
        "fork": "asOf",
    }
    await storage.commit(
        [
            {
                "type": "document.create",
                "record": notes,
                "content": {"kind": "base", "version": 1, "value": {"text": ""}},
            }
        ],
        CTX,
    )
    task = {
        "id": 2,
        "conversationId": 1,
        "kind": "agent",
        "version": 1,
        "input": None,
        "background": False,
        "abortRequested": False,
    }
    for turn in range(commits - 2):
        writes = [
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
                "value": {**task, "state": {"status": "running", "checkpoint": {"turn": turn}}},
            },
        ]
        if turn % 10 == 0:
            writes.append(
                {
                    "type": "document.change",
                    "id": 3,
                    "content": {"kind": "delta", "version": 1, "ops": [["a", ["text"], "x"]]},
                }
            )
        await storage.commit(writes, CTX)
    elapsed = time.perf_counter() - started
    await storage.close()
    return elapsed


async def measure(path: Path, commits: int, views: int) -> None:
    build_s = await build(path, commits)
    print(
        f"built {commits} commits in {build_s:.1f} s ({commits / build_s:,.0f} commits/s, process mode)"
    )

    reopen = []
    for _ in range(5):
        started = time.perf_counter()
        storage = await LmdbStorage.open(path, durability="process")
        await storage.task(2, CTX)
        reopen.append(time.perf_counter() - started)
        await storage.close()
    print(f"reopen + first read: median {statistics.median(reopen) * 1e3:.2f} ms")

    tail = Tail(path)
    started = time.perf_counter()
    lines = 0
    async for _ in tail.json_lines(1):
        lines += 1
    tail.close()
    print(f"tail --json in-process: {lines / (time.perf_counter() - started):,.0f} records/s")

    storage = await LmdbStorage.open(path, durability="process")
    started = time.perf_counter()
    await storage.rebuild()
    rebuild_s = time.perf_counter() - started
    print(f"rebuild: {rebuild_s:.1f} s, {commits / rebuild_s:,.0f} records/s")

    rng = random.Random(1)
    timings: dict[str, list[float]] = {"open": [], "task": [], "document": [], "entry page": []}
    for _ in range(views):
        seq = rng.randint(1, commits)
        started = time.perf_counter()
        view = await storage.as_of(seq)
        timings["open"].append(time.perf_counter() - started)
        for name, read in (
            ("task", view.task(2, CTX)),
            ("document", view.document(3, "current", CTX)),
            ("entry page", view.scan_entries({"conversationId": 1}, 50, None, CTX)),
        ):
            started = time.perf_counter()
            await read
            timings[name].append(time.perf_counter() - started)
    print(f"as_of at {views} random seqs (median / max):")
    for name, values in timings.items():
        print(
            f"  {name:<11} {statistics.median(values) * 1e3:8.3f} ms / {max(values) * 1e3:8.3f} ms"
        )
    await storage.close()

    started = time.perf_counter()
    assert verify(path) is None
    verify_s = time.perf_counter() - started
    print(f"verify: {verify_s:.1f} s, {commits / verify_s:,.0f} records/s")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    status = dict(
        line.split(":", 1)
        for line in Path("/proc/self/status").read_text().splitlines()
        if ":" in line
    )
    anonymous = int(status.get("RssAnon", "0 kB").split()[0]) / 1024
    size = (path / "data.mdb").stat().st_size
    print(
        f"peak RSS {peak:,.0f} MiB (mapped store pages included); anonymous memory now {anonymous:,.0f} MiB; "
        f"data.mdb {size / 2**20:,.0f} MiB ({size / commits:,.0f} B per commit)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=100_000)
    parser.add_argument("--views", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        asyncio.run(measure(Path(directory) / "store", args.commits, args.views))


if __name__ == "__main__":
    main()
