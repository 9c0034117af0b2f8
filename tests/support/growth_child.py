"""Child process of the map-growth tests (tests/log/test_growth.py): LMDB's map grows while other
threads of this process read the store.

``mdb_env_set_mapsize`` replaces the memory map; LMDB requires that no transaction of the process
is active meanwhile, and does not check it. Run in a process of its own, because where the
binding does not guard it either, a reader touching the old map dies with SIGSEGV.

Modes (one JSON line on stdout, exit 0 unless something crashed):

``writer PATH``
    Opens ``PATH`` for writing with a tiny map, seeds known records, starts ``--readers`` threads
    (each with its own event loop) that read them over and over, and meanwhile commits
    ``--commits`` large entries from several tasks at once, so the map grows many times while
    groups commit on the writer thread and the readers read.
``reader PATH``
    Opens ``PATH`` read-only with a tiny map and reads it from ``--readers`` threads until stdin
    closes, while a writer in another process grows the map: the reader threads adopt the new
    size (``MapResizedError``) while the others hold transactions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
import traceback
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage

SEED_TASKS = 20
SEED_ENTRIES = 30


def seed_writes() -> list[dict[str, Any]]:
    writes: list[dict[str, Any]] = [{"type": "conversation", "value": {"id": 1}}]
    for n in range(SEED_ENTRIES):
        writes.append(
            {
                "type": "entry",
                "value": {
                    "id": 100 + n,
                    "conversationId": 1,
                    "kind": "message",
                    "text": f"seed {n}",
                },
            }
        )
    for n in range(SEED_TASKS):
        writes.append(
            {
                "type": "task",
                "value": {
                    "id": 1000 + n,
                    "conversationId": 1,
                    "kind": "job",
                    "version": 1,
                    "input": {"n": n},
                    "state": {"status": "pending"},
                    "background": False,
                    "abortRequested": False,
                },
            }
        )
    return writes


def big_entry(id: int, size: int) -> dict[str, Any]:
    return {
        "type": "entry",
        "value": {
            "id": id,
            "conversationId": 2,
            "kind": "message",
            # Random hex, the same for an id every time: it compresses no more than half (the
            # log's records) or not at all (an entry row), so the map grows with every commit.
            "text": random.Random(id).randbytes(size // 2).hex(),
        },
    }


class Readers:
    """Reader threads, each on its own event loop, checking every answer against the seed."""

    def __init__(self, storage: LmdbStorage, count: int) -> None:
        self.storage = storage
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.reads = 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.run, args=(n,), daemon=True) for n in range(count)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            if thread.is_alive():
                self.errors.append("a reader thread hung")

    def run(self, n: int) -> None:
        try:
            asyncio.run(self.read(n))
        except BaseException:
            with self.lock:
                self.errors.append(traceback.format_exc())

    async def read(self, n: int) -> None:
        storage = self.storage
        reads = 0
        head = 0
        while not self.stop.is_set():
            task = await storage.task(1000 + reads % SEED_TASKS, CTX)
            assert task is not None and task["input"]["n"] == reads % SEED_TASKS, task
            entry = await storage.entry(100 + reads % SEED_ENTRIES, CTX)
            assert entry is not None and entry["entry"]["text"] == f"seed {reads % SEED_ENTRIES}", (
                entry
            )
            page = await storage.scan_entries({"conversationId": 1}, 10, None, CTX)
            assert [item["id"] for item in page["items"]] == list(
                range(100 + SEED_ENTRIES - 1, 100 + SEED_ENTRIES - 11, -1)
            ), page
            tasks = await storage.scan_tasks({"status": "pending"}, SEED_TASKS + 1, None, CTX)
            assert len(tasks["items"]) == SEED_TASKS, tasks
            now = storage.log.head()
            assert now >= head, (now, head)
            head = now
            if now > 1:
                latest = storage.log.get(now)
                assert latest is not None and latest.seq == now
            reads += 1
        with self.lock:
            self.reads += reads


async def commit_many(storage: LmdbStorage, commits: int, size: int, agents: int) -> dict[int, int]:
    acked: dict[int, int] = {}

    async def agent(k: int) -> None:
        for i in range(k, commits, agents):
            id = 10_000 + i
            seq = await storage.commit([big_entry(id, size)], CTX)
            acked[seq] = id

    await asyncio.gather(*(agent(k) for k in range(agents)))
    return acked


def writer(args: argparse.Namespace) -> dict[str, Any]:
    storage = asyncio.run(
        LmdbStorage.open(args.path, durability=args.durability, map_size=args.map_size)
    )
    env = storage._env
    asyncio.run(storage.commit(seed_writes(), CTX))
    asyncio.run(storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX))
    start_size = env.env.info()["map_size"]
    readers = Readers(storage, args.readers)
    readers.start()
    time.sleep(0.05)
    try:
        acked = asyncio.run(commit_many(storage, args.commits, args.size, args.agents))
    finally:
        readers.join()
    end_size = env.env.info()["map_size"]
    growths = env.counters.map_growths
    lost = []
    for seq, id in acked.items():
        commit = storage.log.get(seq)
        if commit is None or [w.value["id"] for w in commit.writes] != [id]:  # type: ignore[union-attr]
            lost.append(seq)
        read = asyncio.run(storage.entry(id, CTX))
        if (
            read is None
            or read["commitSeq"] != seq
            or read["entry"]["text"] != big_entry(id, args.size)["value"]["text"]
        ):
            lost.append(seq)
    asyncio.run(storage.close())
    return {
        "reads": readers.reads,
        "errors": readers.errors,
        "acked": len(acked),
        "lost": lost,
        "start_size": start_size,
        "end_size": end_size,
        "growths": growths,
    }


def reader(args: argparse.Namespace) -> dict[str, Any]:
    storage = asyncio.run(LmdbStorage.open(args.path, readonly=True, map_size=args.map_size))
    start_size = storage._env.env.info()["map_size"]
    readers = Readers(storage, args.readers)
    readers.start()
    print("ready", flush=True)
    sys.stdin.read()  # the writer in the other process grows the map meanwhile
    readers.join()
    head = storage.log.head()
    end_size = storage._env.env.info()["map_size"]
    asyncio.run(storage.close())
    return {
        "reads": readers.reads,
        "errors": readers.errors,
        "head": head,
        "start_size": start_size,
        "end_size": end_size,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["writer", "reader"])
    parser.add_argument("path")
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--commits", type=int, default=600)
    parser.add_argument("--size", type=int, default=6000, help="bytes of text per committed entry")
    parser.add_argument("--agents", type=int, default=8, help="tasks committing at once")
    parser.add_argument("--durability", default="process", choices=["power", "process"])
    parser.add_argument("--map-size", type=int, default=64 * 1024)
    args = parser.parse_args()
    result = writer(args) if args.mode == "writer" else reader(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
