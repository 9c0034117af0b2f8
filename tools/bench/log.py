"""Benchmark the write log against raw LMDB on this machine, in one run.

Cases (each on a fresh store in a temporary directory):

* raw LMDB: one ``put`` (append, 8-byte key, a value the size of a typical log record) per write
  transaction, with ``sync`` on and off;
* ``WriteLog`` append: one typical agent-turn batch per commit (an entry holding a ~500-byte model
  message plus a task record), encoded, appended and committed through ``Environment.write``, in
  ``durability="power"`` and ``"process"``;
* ``encode_batch`` alone on the same batches (no LMDB).

Usage: python -m tools.bench.log [--count N] [--sync-count M] [--repeat R] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import lmdb
import msgspec
from pi_durable_lmdb.log import Environment, WriteLog, encode_batch
from pi_durable_lmdb.log.records import encode_record

from tools.bench.sample import MESSAGE


def turn_batch(n: int) -> list[dict[str, Any]]:
    """One agent turn: the assistant's entry and the task's new state."""

    now = 1_760_000_000_000 + n
    return [
        {
            "type": "entry",
            "value": {
                "id": n,
                "conversation": 42,
                "parent": n - 1,
                "role": "assistant",
                "model": "example-model-1",
                "content": [{"type": "text", "text": MESSAGE}],
                "usage": {"input": 1834 + n % 97, "output": 117, "cache_read": 1024},
                "stop_reason": "tool_use",
                "created_at": now,
            },
        },
        {
            "type": "task",
            "value": {
                "id": 7,
                "conversation": 42,
                "state": "running",
                "turn": n,
                "updated_at": now,
            },
        },
    ]


def payload_of(batch: list[dict[str, Any]]) -> bytes:
    """The log payload of a batch (``encode_batch`` returns ``EncodedBatch(payload, writes)``)."""

    encoded = encode_batch(batch)
    return encoded if isinstance(encoded, bytes) else encoded.payload


def timed(count: int, step: Callable[[int], object]) -> float:
    """Seconds for ``count`` calls of ``step``."""

    start = time.perf_counter()
    for i in range(count):
        step(i)
    return time.perf_counter() - start


def bench_raw(root: str, count: int, sync: bool, value: bytes) -> float:
    path = os.path.join(root, f"raw-sync-{'on' if sync else 'off'}")
    os.makedirs(path)
    env = lmdb.open(path, map_size=1 << 30, max_dbs=4, sync=sync, metasync=True)
    db = env.open_db(b"log")
    key = struct.Struct(">Q").pack

    def step(i: int) -> None:
        with env.begin(write=True) as txn:
            txn.put(key(i + 1), value, db=db, append=True)

    try:
        return timed(count, step)
    finally:
        env.close()


def bench_writelog(
    root: str,
    count: int,
    durability: str,
    batches: list[list[dict[str, Any]]],
    pre_encoded: bool = False,
) -> float:
    name = f"log-{durability}{'-pre' if pre_encoded else ''}"
    env = Environment(os.path.join(root, name), durability=durability)  # type: ignore[arg-type]
    log = WriteLog(env)
    payloads = [payload_of(batch) for batch in batches[:count]] if pre_encoded else []

    def step(i: int) -> None:
        payload = payloads[i] if pre_encoded else payload_of(batches[i])
        env.write(lambda txn: log.append(txn, payload))
        log.committed()

    try:
        seconds = timed(count, step)
        assert log.head() == count
        return seconds
    finally:
        env.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=20000, help="commits per case (default 20000)")
    parser.add_argument(
        "--dir", default=None, help="where to make the temporary stores (default: system temp)"
    )
    parser.add_argument(
        "--sync-count",
        type=int,
        default=None,
        help="commits for the two synced cases (sync on, durability=power); default --count. "
        "Each synced commit waits for the disk, so a smaller number keeps the run short.",
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds; each case reports its best (default 3)"
    )
    args = parser.parse_args()
    count = args.count
    sync_count = min(args.sync_count or count, count)

    batches = [turn_batch(n) for n in range(count)]
    sample_payload = payload_of(batches[0])
    record = encode_record(sample_payload, 1_760_000_000_000)

    RAW_ON, RAW_OFF = "raw LMDB put+commit, sync on", "raw LMDB put+commit, sync off"
    cases: list[
        tuple[str, int, Callable[[str], float], str | None]
    ] = [  # name, count, run, baseline
        (RAW_ON, sync_count, lambda root: bench_raw(root, sync_count, True, record), None),
        (RAW_OFF, count, lambda root: bench_raw(root, count, False, record), None),
        (
            'WriteLog append, durability="power"',
            sync_count,
            lambda root: bench_writelog(root, sync_count, "power", batches),
            RAW_ON,
        ),
        (
            'WriteLog append, durability="process"',
            count,
            lambda root: bench_writelog(root, count, "process", batches),
            RAW_OFF,
        ),
        (
            "  same, payload encoded beforehand",
            count,
            lambda root: bench_writelog(root, count, "process", batches, pre_encoded=True),
            RAW_OFF,
        ),
        (
            "encode_batch alone (no LMDB)",
            count,
            lambda root: timed(count, lambda i: encode_batch(batches[i])),
            None,
        ),
    ]
    best: dict[str, float] = {}
    for _ in range(
        args.repeat
    ):  # rounds interleave the cases, so a busy moment hits them all alike
        for name, _n, run, _baseline in cases:
            root = tempfile.mkdtemp(prefix="bench-log-", dir=args.dir)
            try:
                seconds = run(root)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            best[name] = min(best.get(name, seconds), seconds)
    results = [(name, n, best[name], baseline) for name, n, _run, baseline in cases]

    per_commit = {name: seconds / n for name, n, seconds, _ in results}
    print(
        f"python {platform.python_version()}, lmdb {lmdb.__version__} (LMDB {'.'.join(map(str, lmdb.version()))}), "
        f"msgspec {msgspec.__version__}, {platform.machine()}, stores under {args.dir or tempfile.gettempdir()}"
    )
    print(
        f"payload {len(sample_payload)} B per batch; stored record {len(record)} B; "
        f"best of {args.repeat} rounds, interleaved"
    )
    print()
    header = f"{'case':<40} {'count':>6} {'commits/s':>11} {'us/commit':>10}  {'vs raw LMDB':<22}"
    print(header)
    print("-" * len(header))
    for name, n, seconds, baseline in results:
        if baseline is not None:
            ratio = f"{per_commit[baseline] / per_commit[name]:.2f}x of {'sync on' if baseline == RAW_ON else 'sync off'}"
        else:
            ratio = "baseline" if name.startswith("raw") else "(calls/s, not commits)"
        print(f"{name:<40} {n:>6} {n / seconds:>11,.0f} {seconds / n * 1e6:>10.1f}  {ratio:<22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
