"""Subprocess roles for tests/storage/test_reliability*.py: real writers, readers and victims in other
processes. Every line of output is flushed as soon as it is written.

Usage: python tests/support/reliability_child.py ROLE PATH [options]

``triples``       open ``LmdbStorage`` for writing and commit batches of exactly three writes (two
                  entries and a new task, all tagged ``{"batch": N}``) until killed or
                  ``--count`` batches; print ``ready`` once open and ``ack SEQ N`` after each commit.
                  ``--map-size`` and ``--pad`` (bytes of text per entry) make the map grow.
``hold``          open ``LmdbStorage`` for writing, print ``ready PID``, keep it open until stdin
                  closes.
``try-open``      try ``LmdbStorage.open(PATH)`` for writing; print one JSON line
                  ``{"error", "message", "path"}``.
``reader``        for ``--seconds``, repeatedly open the store read-only and read it in one call
                  each (``scan_entries`` of conversation 1, ``scan_tasks``), checking every batch
                  it sees is whole; print one JSON report.
``stale-reader``  open the environment read-only, begin a read transaction, print ``ready PID``,
                  and sleep (the test SIGKILLs it, leaving its reader slot behind).
``decode``        read log records ``--seqs`` through ``WriteLog.get``; print one JSON line per
                  record (``corrupt`` with its sequence, or ``served``), then the peak RSS.
``open-loop``     open the store read-only and close it, again and again for ``--seconds`` (or
                  until the first error with ``--stop-at-error``); print one JSON report.
``umask-open``    set the umask to ``--umask`` (octal), create a store at PATH through
                  ``LmdbStorage.open``, commit once, run ``verify``, close.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def triple(n: int, ids: list[int], pad: int = 0) -> list[dict[str, Any]]:
    entry_a, entry_b, task = ids
    text = "t" * pad
    return [
        {
            "type": "entry",
            "value": {
                "id": entry_a,
                "conversationId": 1,
                "kind": "message",
                "batch": n,
                "part": 0,
                "text": text,
            },
        },
        {
            "type": "entry",
            "value": {
                "id": entry_b,
                "conversationId": 1,
                "kind": "message",
                "batch": n,
                "part": 1,
                "text": text,
            },
        },
        {
            "type": "task",
            "value": {
                "id": task,
                "conversationId": 1,
                "kind": "agent",
                "version": 1,
                "input": None,
                "state": {"status": "running"},
                "background": False,
                "abortRequested": False,
                "batch": n,
            },
        },
    ]


async def triples(args: argparse.Namespace) -> int:
    from pi_durable_lmdb.storage import LmdbStorage

    storage = await LmdbStorage.open(args.path, durability=args.durability, map_size=args.map_size)
    if await storage.conversation(1, CTX) is None:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    n = 0
    _say("ready")
    while args.count is None or n < args.count:
        ids = [await storage.mint_id() for _ in range(3)]
        seq = await storage.commit(triple(n, ids, args.pad), CTX)
        _say(f"ack {seq} {n}")
        n += 1
        if args.delay:
            await asyncio.sleep(args.delay)
    await storage.close()
    _say("done")
    return 0


async def hold(args: argparse.Namespace) -> int:
    from pi_durable_lmdb.storage import LmdbStorage

    storage = await LmdbStorage.open(args.path)
    _say(f"ready {os.getpid()}")
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await storage.close()
    return 0


async def try_open(args: argparse.Namespace) -> int:
    from pi_durable_lmdb.storage import LmdbStorage

    try:
        storage = await LmdbStorage.open(args.path)
    except Exception as error:
        _say(
            json.dumps(
                {
                    "error": type(error).__name__,
                    "message": str(error),
                    "path": getattr(error, "path", None),
                }
            )
        )
        return 0
    await storage.close()
    _say(json.dumps({"error": None, "message": "", "path": args.path}))
    return 0


async def reader(args: argparse.Namespace) -> int:
    """Each read is one read transaction: it must see whole batches only."""

    from pi_durable_lmdb.storage import LmdbStorage

    report: dict[str, Any] = {
        "opens": 0,
        "open_errors": {},
        "reads": 0,
        "torn": [],
        "max_batches": 0,
    }
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            storage = await LmdbStorage.open(args.path, readonly=True)
        except Exception as error:
            name = f"{type(error).__name__}: {str(error)[:120]}"
            report["open_errors"][name] = report["open_errors"].get(name, 0) + 1
            continue
        report["opens"] += 1
        try:
            for _ in range(5):
                page = await storage.scan_entries(
                    {"conversationId": 1, "order": "ascending"}, 10**9, None, CTX
                )
                parts: dict[int, set[int]] = {}
                for entry in page["items"]:
                    parts.setdefault(entry["batch"], set()).add(entry["part"])
                torn = [batch for batch, seen in parts.items() if seen != {0, 1}]
                if torn or sorted(parts) != list(range(len(parts))):
                    report["torn"].append({"entries": sorted(parts)[-5:], "torn": torn[:5]})
                tasks = await storage.scan_tasks({}, 10**9, None, CTX)
                task_batches = sorted(task["batch"] for task in tasks["items"])
                if task_batches != list(range(len(task_batches))):
                    report["torn"].append({"tasks": task_batches[-5:]})
                report["reads"] += 1
                report["max_batches"] = max(report["max_batches"], len(parts))
        finally:
            await storage.close()
    _say(json.dumps(report))
    return 0


async def stale_reader(args: argparse.Namespace) -> int:
    from pi_durable_lmdb.log import Environment

    env = Environment(args.path, readonly=True)
    txn = env.env.begin()  # a snapshot pinned until this process dies
    _say(f"ready {os.getpid()} {txn.id()}")
    time.sleep(3600)
    return 0


async def decode(args: argparse.Namespace) -> int:
    from pi_durable_lmdb.log import CorruptRecordError, Environment, WriteLog

    env = Environment(args.path, readonly=True)
    log = WriteLog(env)
    for seq in args.seqs:
        started = time.monotonic()
        try:
            commit = log.get(seq)
            outcome = {
                "seq": seq,
                "outcome": "served",
                "writes": 0 if commit is None else len(commit.writes),
            }
        except CorruptRecordError as error:
            outcome = {
                "seq": seq,
                "outcome": "corrupt",
                "named": error.seq,
                "message": str(error)[:300],
            }
        except BaseException as error:
            outcome = {"seq": seq, "outcome": type(error).__name__, "message": str(error)[:300]}
        outcome["seconds"] = round(time.monotonic() - started, 4)
        _say(json.dumps(outcome))
    env.close()
    _say(json.dumps({"peak_rss_kib": _peak_rss_kib()}))
    return 0


def _peak_rss_kib() -> int:
    """This process's peak resident set since its exec (ru_maxrss would include the parent's)."""

    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


async def open_loop(args: argparse.Namespace) -> int:
    """Open the store read-only and close it again, as fast as possible, for ``--seconds``."""

    from pi_durable_lmdb.storage import LmdbStorage

    report: dict[str, Any] = {"opens": 0, "open_errors": {}}
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        try:
            storage = await LmdbStorage.open(args.path, readonly=True)
        except Exception as error:
            name = f"{type(error).__name__}: {str(error)[:160]}"
            report["open_errors"][name] = report["open_errors"].get(name, 0) + 1
            if args.stop_at_error:
                break
            continue
        report["opens"] += 1
        await storage.close()
    _say(json.dumps(report))
    return 0


async def umask_open(args: argparse.Namespace) -> int:
    from pi_durable_lmdb.audit import verify
    from pi_durable_lmdb.storage import LmdbStorage

    os.umask(int(args.umask, 8))
    storage = await LmdbStorage.open(args.path)
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    await storage.close()
    _say(json.dumps({"verify": None if verify(args.path) is None else "difference"}))
    return 0


ROLES = {
    "triples": triples,
    "hold": hold,
    "try-open": try_open,
    "reader": reader,
    "stale-reader": stale_reader,
    "decode": decode,
    "open-loop": open_loop,
    "umask-open": umask_open,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("path")
    parser.add_argument("--count", type=int)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--durability", default="process", choices=["power", "process"])
    parser.add_argument("--map-size", type=int, default=1 << 30)
    parser.add_argument("--pad", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--seqs", type=int, nargs="*", default=[])
    parser.add_argument("--umask", default="000")
    parser.add_argument("--stop-at-error", action="store_true")
    args = parser.parse_args()
    return asyncio.run(ROLES[args.role](args))


if __name__ == "__main__":
    sys.exit(main())
