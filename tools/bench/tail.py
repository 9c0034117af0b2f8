"""Benchmark ``durable-log tail``: bulk throughput and live-follow latency, in real processes.

(a) Throughput: a store of ``--count`` typical agent turns (one commit each: an entry holding a
    ~500-byte model message plus the task's new state) is built through ``LmdbStorage``; then
    ``durable-log tail PATH --json --from 1 > /dev/null`` (and the readable format, and ``export``)
    is timed as a subprocess. The command's start-up (interpreter, imports, opening the store) is
    measured separately with a tail that prints nothing, and subtracted for the records/s rate.
    For attribution, the same decode (+ JSON) loop is also timed in-process.

(b) Follow latency: ``durable-log tail PATH --follow --json`` runs in another process while this
    process commits ``--follow-count`` batches spaced ``--interval`` apart, each carrying
    ``time.time_ns()`` taken just before the commit. A thread reads the tail's stdout and stamps
    each line on arrival. Reported: commit-returned -> line read, and pre-commit stamp -> line read.

Usage: python -m tools.bench.tail [--count N] [--follow-count M] [--interval S] [--repeat R] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import msgspec
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit import commit_to_builtins, to_json
from pi_durable_lmdb.log import Environment, WriteLog
from pi_durable_lmdb.storage import LmdbStorage

from tools.bench.sample import MESSAGE

ROOT = Path(__file__).resolve().parents[2]
_script = Path(sys.executable).parent / "durable-log"
DURABLE_LOG = [str(_script)] if _script.exists() else [sys.executable, "-m", "pi_durable_lmdb.cli"]
ENV = {
    **os.environ,
}

CONVERSATION, TASK, FIRST_ENTRY = 1, 2, 10


def setup_batch() -> list[dict[str, Any]]:
    return [{"type": "conversation", "value": {"id": CONVERSATION}}, task_write(0)]


def task_write(turn: int) -> dict[str, Any]:
    return {
        "type": "task",
        "value": {
            "id": TASK,
            "conversationId": CONVERSATION,
            "kind": "agent",
            "version": 1,
            "input": {"prompt": "fix the failing test"},
            "state": {"status": "running", "checkpoint": {"turn": turn}},
            "background": False,
            "abortRequested": False,
        },
    }


def turn_batch(n: int, sent_at: int | None = None) -> list[dict[str, Any]]:
    """One agent turn: the assistant's entry (a ~500-byte message) and the task's new state."""

    data: dict[str, Any] = {
        "role": "assistant",
        "model": "example-model-1",
        "content": [{"type": "text", "text": MESSAGE}],
        "usage": {"input": 1834 + n % 97, "output": 117, "cacheRead": 1024},
        "stopReason": "toolUse",
    }
    if sent_at is not None:
        data["sentAt"] = sent_at
    entry = {"id": FIRST_ENTRY + n, "conversationId": CONVERSATION, "kind": "message", "data": data}
    return [{"type": "entry", "value": entry}, task_write(n)]


async def build(path: str, count: int) -> float:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        started = time.perf_counter()
        await storage.commit(setup_batch(), CTX)
        for n in range(1, count):
            await storage.commit(turn_batch(n), CTX)
        return time.perf_counter() - started
    finally:
        await storage.close()


def run_to_devnull(args: list[str]) -> float:
    started = time.perf_counter()
    with open(os.devnull, "wb") as devnull:
        done = subprocess.run(args, stdout=devnull, stderr=subprocess.PIPE, env=ENV)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(
            f"{args} failed ({done.returncode}): {done.stderr.decode(errors='replace')}"
        )
    return elapsed


def in_process_rates(path: str) -> tuple[float, float, int]:
    """records/s of decode only and of decode + JSON, in this process; and the JSON bytes."""

    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        started = time.perf_counter()
        count = sum(1 for _ in log.read(1))
        decode = count / (time.perf_counter() - started)
        started = time.perf_counter()
        size = sum(len(to_json(commit_to_builtins(commit))) + 1 for commit in log.read(1))
        encode = count / (time.perf_counter() - started)
        return decode, encode, size
    finally:
        env.close()


class LineReader:
    """Collects (arrival time_ns, line) from a process's stdout on a thread."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.items: list[tuple[int, bytes]] = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, args=(popen,), daemon=True)
        self.thread.start()

    def _run(self, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        for line in popen.stdout:
            now = time.time_ns()
            with self.cond:
                self.items.append((now, line))
                self.cond.notify_all()

    def wait_for(self, count: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.items) >= count, timeout)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def follow_latency(path: str, count: int, interval: float) -> dict[str, Any]:
    storage = await LmdbStorage.open(path, durability="process")
    head = storage.log.head()
    tail = subprocess.Popen(
        [*DURABLE_LOG, "tail", path, "--follow", "--json", "--from", str(head + 1)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    reader = LineReader(tail)
    try:
        # Warm up: the tail has started and printed one commit before the measurement.
        first_id = FIRST_ENTRY + 10_000_000
        await storage.commit(turn_batch(first_id - FIRST_ENTRY), CTX)
        if not reader.wait_for(1, 30):
            raise RuntimeError("the tail printed nothing within 30 s")
        time.sleep(0.5)
        idle_before, idle_started = cpu_seconds(tail.pid), time.monotonic()
        time.sleep(2.0)
        idle_cpu = (cpu_seconds(tail.pid) - idle_before) / (time.monotonic() - idle_started)

        committed: dict[int, int] = {}  # seq -> time_ns when commit() returned
        start = time.monotonic()
        for i in range(count):
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent = time.time_ns()
            seq = await storage.commit(turn_batch(first_id - FIRST_ENTRY + 1 + i, sent), CTX)
            committed[seq] = time.time_ns()
        if not reader.wait_for(count + 1, 30):
            raise RuntimeError(f"the tail printed {len(reader.items) - 1} of {count} commits")
    finally:
        await storage.close()
        tail.send_signal(signal.SIGTERM)
        rc = tail.wait(10)
    if rc != 0:
        raise RuntimeError(
            f"tail exited {rc}: {tail.stderr.read().decode(errors='replace') if tail.stderr else ''}"
        )

    after_commit, after_stamp = [], []
    for arrived, line in reader.items[1:]:
        batch = json.loads(line)
        after_stamp.append((arrived - batch["writes"][0]["value"]["data"]["sentAt"]) / 1e6)
        after_commit.append((arrived - committed[batch["seq"]]) / 1e6)
    return {"after_commit": after_commit, "after_stamp": after_stamp, "idle_cpu": idle_cpu}


def summary(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return statistics.median(ordered), p95, ordered[-1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--count", type=int, default=50_000, help="turn commits in the store (default 50000)"
    )
    parser.add_argument(
        "--follow-count", type=int, default=200, help="commits for the latency run (default 200)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.02, help="seconds between those commits (default 0.02)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs per throughput case; best is reported"
    )
    parser.add_argument(
        "--dir", default=None, help="where to make the temporary store (default: system temp)"
    )
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="bench-tail-", dir=args.dir)
    path = os.path.join(root, "store")
    try:
        build_seconds = asyncio.run(build(path, args.count))
        data_bytes = os.path.getsize(os.path.join(path, "data.mdb"))
        count = args.count

        cases = [
            (
                "start-up only (tail printing nothing)",
                ["tail", path, "--json", "--from", str(count + 1)],
            ),
            ("tail --json --from 1", ["tail", path, "--json", "--from", "1"]),
            ("tail --from 1 (readable)", ["tail", path, "--from", "1"]),
            (
                "tail --json --from 1 --type task",
                ["tail", path, "--json", "--from", "1", "--type", "task"],
            ),
            ("export", ["export", path]),
        ]
        best: dict[str, float] = {}
        for _ in range(args.repeat):
            for name, cli_args in cases:
                seconds = run_to_devnull([*DURABLE_LOG, *cli_args])
                best[name] = min(best.get(name, seconds), seconds)
        decode_rate, json_rate, json_bytes = in_process_rates(path)
        latency = asyncio.run(follow_latency(path, args.follow_count, args.interval))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(
        f"python {platform.python_version()}, lmdb {lmdb.__version__} (LMDB {'.'.join(map(str, lmdb.version()))}), "
        f"msgspec {msgspec.__version__}, {platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(
        f"store: {count:,} commits (entry ~{len(MESSAGE)} B message + task update), data.mdb "
        f"{data_bytes / 2**20:.1f} MiB, built in {build_seconds:.1f} s ({count / build_seconds:,.0f} commits/s); "
        f"JSON output {json_bytes / 2**20:.1f} MiB ({json_bytes / count:.0f} B/record)"
    )
    print()
    print(f"(a) throughput, output to /dev/null, best of {args.repeat}")
    header = f"{'command':<42} {'wall s':>7} {'records/s':>11} {'records/s excl. start-up':>25}"
    print(header)
    print("-" * len(header))
    startup = best[cases[0][0]]
    for name, _ in cases:
        seconds = best[name]
        if name == cases[0][0]:
            print(f"{name:<42} {seconds:>7.2f} {'-':>11} {'-':>25}")
            continue
        net = seconds - startup
        rate = f"{count / net:,.0f}" if net > 0.05 else "n/a (within start-up noise)"
        print(f"{name:<42} {seconds:>7.2f} {count / seconds:>11,.0f} {rate:>25}")
    print(f"{'in-process: decode + verify only':<42} {'':>7} {decode_rate:>11,.0f}")
    print(f"{'in-process: decode + to_json':<42} {'':>7} {json_rate:>11,.0f}")
    print()
    n = len(latency["after_commit"])
    print(
        f"(b) follow latency: {n} commits spaced {args.interval * 1000:.0f} ms, tail --follow --json in another process"
    )
    header = f"{'measured from':<40} {'median ms':>10} {'p95 ms':>8} {'max ms':>8}"
    print(header)
    print("-" * len(header))
    for label, key in (
        ("commit() returned -> line read", "after_commit"),
        ("stamp before commit -> line read", "after_stamp"),
    ):
        median, p95, worst = summary(latency[key])
        print(f"{label:<40} {median:>10.2f} {p95:>8.2f} {worst:>8.2f}")
    print()
    print(f"idle tail --follow CPU: {latency['idle_cpu'] * 100:.2f} % of one core (2 s sample)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
