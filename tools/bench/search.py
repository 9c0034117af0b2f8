"""Benchmark search (``/search``, ``durable-log search``): the time a query answers on a big store,
and what the word index costs in bytes and in build time.

A store of ``--entries`` entries is built through ``LmdbStorage`` (process durability, to build it
quickly): ``--conversations`` conversations, turns of a user message and an assistant message of
~40 words each drawn from a Zipf-distributed vocabulary (so some words are in most entries and
others in a handful), a task per turn whose state moves pending -> terminal, and a notes document
per conversation that a delta appends ~12 words to every fifth turn. The index is then built once (timed, size
reported) and each query class is run ``--repeat`` times, every run the full path a page takes:
bring the index level with the log, then ``search`` (candidates from the index, each checked
against the store, entries' commit times read from the log). Reported per class: p50 / p95 / max
of the wall time, and p50 / p95 of this process's CPU time (what the wall time would be on an
otherwise idle machine, the data in the page cache; the load average is printed beside them).

Usage: python -m tools.bench.search [--entries N] [--repeat R] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit.search import catch_up, search
from pi_durable_lmdb.projections.search_index import SearchIndex
from pi_durable_lmdb.storage import LmdbStorage

VOCABULARY = 20000
"""Distinct words; word ``k`` is drawn with weight 1/k (Zipf), ``w0`` the commonest."""


def vocabulary() -> tuple[list[str], list[float]]:
    words = [f"w{k}" for k in range(VOCABULARY)]
    weights = [1.0 / (k + 1) for k in range(VOCABULARY)]
    return words, weights


async def build(path: str, entries: int, conversations: int, seed: int = 7) -> float:
    rng = random.Random(seed)
    words, weights = vocabulary()
    cumulative = list(__import__("itertools").accumulate(weights))

    def sentence(count: int = 40) -> str:
        return " ".join(rng.choices(words, cum_weights=cumulative, k=count))

    storage = await LmdbStorage.open(path, durability="process")
    started = time.perf_counter()
    try:
        next_id = 1
        notes: dict[int, int] = {}
        first = []
        for _ in range(conversations):
            conversation, document = next_id, next_id + 1
            next_id += 2
            notes[conversation] = document
            first.append({"type": "conversation", "value": {"id": conversation}})
            first.append(
                {
                    "type": "document.create",
                    "record": {
                        "id": document,
                        "kind": "notes",
                        "scope": {"kind": "conversation", "conversationId": conversation},
                    },
                    "content": {"kind": "base", "version": 1, "value": {"text": ""}},
                }
            )
        await storage.commit(first, CTX)
        made = 0
        turn = 0
        while made < entries:
            conversation = 1 + 2 * (turn % conversations)
            user, assistant, task = next_id, next_id + 1, next_id + 2
            next_id += 3
            question = sentence()
            batch: list[dict[str, Any]] = [
                {
                    "type": "entry",
                    "value": {
                        "id": user,
                        "conversationId": conversation,
                        "kind": "message",
                        "model": [{"role": "user", "content": question}],
                    },
                },
                {
                    "type": "task",
                    "value": {
                        "id": task,
                        "conversationId": conversation,
                        "kind": rng.choice(["answer", "summarize", "search"]),
                        "version": 1,
                        "input": {},
                        "background": False,
                        "abortRequested": False,
                        "state": {"status": "pending"},
                    },
                },
            ]
            await storage.commit(batch, CTX)
            batch = [
                {
                    "type": "entry",
                    "value": {
                        "id": assistant,
                        "conversationId": conversation,
                        "kind": "message",
                        "model": [
                            {"role": "assistant", "content": [{"type": "text", "text": sentence()}]}
                        ],
                    },
                },
                {
                    "type": "task",
                    "value": {
                        "id": task,
                        "conversationId": conversation,
                        "kind": "answer",
                        "version": 1,
                        "input": {},
                        "background": False,
                        "abortRequested": False,
                        "state": {
                            "status": "terminal",
                            "outcome": {"status": "completed", "result": "ok"},
                        },
                    },
                },
            ]
            if turn % 5 == 0:
                batch.append(
                    {
                        "type": "document.change",
                        "id": notes[conversation],
                        "content": {
                            "kind": "delta",
                            "version": 1,
                            "ops": [["a", ["text"], " " + sentence(12)]],
                        },
                    }
                )
            await storage.commit(batch, CTX)
            made += 2
            turn += 1
        return time.perf_counter() - started
    finally:
        await storage.close()


def queries(rng: random.Random) -> dict[str, list[str]]:
    """Query classes: one common word, one rare word, two words, three words, a word that no
    entry holds, and a common word as of the log's middle."""

    def rare() -> str:
        return f"w{rng.randrange(5000, VOCABULARY)}"

    return {
        "common word (w0)": ["w0"],
        "mid word": [f"w{rng.randrange(50, 500)}" for _ in range(20)],
        "rare word": [rare() for _ in range(20)],
        "two words": [f"w{rng.randrange(0, 50)} w{rng.randrange(50, 2000)}" for _ in range(20)],
        "three words": [
            f"w{rng.randrange(0, 20)} w{rng.randrange(20, 200)} w{rng.randrange(200, 3000)}"
            for _ in range(20)
        ],
        "no such word": ["nowhere"],
        "task kind + state": ["summarize pending", "answer completed"],
    }


async def measure(path: str, repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    rng = random.Random(11)
    index = SearchIndex(path)
    storage = await LmdbStorage.open(path, readonly=True)
    head = storage.log.head()
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    try:
        for name, texts in queries(rng).items():
            for as_of in (None, head // 2):
                label = name if as_of is None else f"{name}, as of the middle"
                found = times.setdefault(label, [])
                spent = cpu.setdefault(label, [])
                for round in range(repeat):
                    text = texts[round % len(texts)]
                    started, began = time.perf_counter(), time.process_time()
                    await asyncio.to_thread(catch_up, path, index)
                    reader = storage if as_of is None else await storage.as_of(as_of)
                    await search(index, storage, reader, text, as_of)
                    found.append(time.perf_counter() - started)
                    spent.append(time.process_time() - began)
    finally:
        await storage.close()
        index.close()
    return times, cpu


def p95(values: list[float]) -> float:
    """The 95th percentile of sorted ``values`` (nearest rank)."""

    return values[min(len(values) - 1, max(0, -(-len(values) * 95 // 100) - 1))]


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument(
        "--dir", default=None, help="build the store here (default: a temporary directory)"
    )
    args = parser.parse_args()
    parent = tempfile.mkdtemp(prefix="bench-search-", dir=args.dir)
    path = os.path.join(parent, "store")
    try:
        built = asyncio.run(build(path, args.entries, args.conversations))
        store_bytes = os.path.getsize(os.path.join(path, "data.mdb"))
        index = SearchIndex(path, create=True)
        started = time.perf_counter()
        folded = catch_up(path, index)
        index.compact()  # as the first durable-log search does
        indexed = time.perf_counter() - started
        index_bytes = index.size()
        index.close()
        print(
            f"# search on {args.entries:,} entries ({folded:,} log records), Python {platform.python_version()}, {platform.machine()}"
        )
        print(f"store built in {built:.1f} s; data.mdb {store_bytes / 2**20:.1f} MiB")
        print(
            f"index built in {indexed:.1f} s; search.index {index_bytes / 2**20:.1f} MiB "
            f"({index_bytes / store_bytes:.0%} of the store, {index_bytes / args.entries:.0f} bytes per entry)"
        )
        print()
        print(f"load average before the queries: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print()
        print("| query | runs | p50 | p95 | max | CPU p50 | CPU p95 |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        every: list[float] = []
        every_cpu: list[float] = []
        times, cpu = asyncio.run(measure(path, args.repeat))
        for label, found in times.items():
            found.sort()
            spent = sorted(cpu[label])
            every += found
            every_cpu += spent
            print(
                f"| {label} | {len(found)} | {ms(statistics.median(found))} | {ms(p95(found))} | {ms(found[-1])} | "
                f"{ms(statistics.median(spent))} | {ms(p95(spent))} |"
            )
        every.sort()
        every_cpu.sort()
        print(
            f"| all queries | {len(every)} | {ms(statistics.median(every))} | {ms(p95(every))} | {ms(every[-1])} | "
            f"{ms(statistics.median(every_cpu))} | {ms(p95(every_cpu))} |"
        )
        print(f"load average after: {os.getloadavg()[0]:.1f}")
        return 0
    finally:
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
