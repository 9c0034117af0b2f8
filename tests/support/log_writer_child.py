"""Subprocess helper for tests/log/test_log*.py: real writers and readers in other processes.

Usage: python tests/support/log_writer_child.py MODE PATH [options]

Modes (every line of output is flushed as soon as it is written):

``append``   append ``--count`` batches, one per commit, printing ``ack SEQ N`` after each commit,
             then ``done``; ``--delay`` sleeps between commits.
``loop``     append forever (until killed), printing ``ack SEQ N`` after each commit.
``hold``     open the store for writing, print ``ready PID``, and keep it open until stdin closes.
``try-writer`` try to open the store for writing; print one JSON line {"error", "message", "path"}.
``reader``   open the store read-only (``--map-size``), print ``ready HEAD``, then answer each stdin
             line ``read`` with one JSON line about the whole log (see ``_report``).

The batch for counter N is ``batch(N, size)``: the test process rebuilds it to check what it reads.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import time
import zlib

import lmdb
from pi_durable_lmdb.log import (
    Environment,
    WriteLog,
    WriterLockedError,
    encode_batch,
    write_to_builtins,
)


def batch(n: int, size: int = 0) -> list[dict]:
    """A deterministic agent-turn batch: an entry (with ``size`` bytes of text) and a task."""

    # random text, so records stay about ``size`` bytes once compressed (the log compresses them)
    filler = base64.b64encode(random.Random(n).randbytes(size)).decode()[:size]
    return [
        {
            "type": "entry",
            "value": {
                "n": n,
                "role": "assistant",
                "text": filler,
                "odd": "\ud800" if n % 7 == 0 else "x",
            },
        },
        {"type": "task", "value": {"n": n, "state": "running", "big": 2**70 + n}},
    ]


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _append(env: Environment, log: WriteLog, n: int, size: int) -> int:
    payload = encode_batch(batch(n, size)).payload
    seq = env.write(lambda txn: log.append(txn, payload))
    log.committed()
    return seq


def _report(env: Environment, log: WriteLog, resized: bool) -> dict:
    seqs = []
    ns = []
    digest = 0
    for commit in log.read(1):
        seqs.append(commit.seq)
        writes = [write_to_builtins(w) for w in commit.writes]
        ns.append(writes[0]["value"]["n"])
        digest = zlib.crc32(json.dumps(writes, ensure_ascii=True).encode(), digest)
    return {
        "head": log.head(),
        "seqs": seqs,
        "ns": ns,
        "digest": digest,
        "resized_seen": resized,
        "map_size": env.env.info()["map_size"],
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["append", "loop", "hold", "try-writer", "reader"])
    parser.add_argument("path")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--start", type=int, default=0, help="first batch counter N")
    parser.add_argument("--size", type=int, default=64, help="bytes of text per entry")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--durability", default="power", choices=["power", "process"])
    parser.add_argument("--map-size", type=int, default=1 << 30)
    args = parser.parse_args()

    if args.mode == "try-writer":
        try:
            env = Environment(args.path)
        except WriterLockedError as error:
            _say(
                json.dumps(
                    {"error": type(error).__name__, "message": str(error), "path": error.path}
                )
            )
            return 0
        env.close()
        _say(json.dumps({"error": None, "message": "", "path": args.path}))
        return 0

    if args.mode == "reader":
        env = Environment(args.path, readonly=True, map_size=args.map_size)
        log = WriteLog(env)
        _say(f"ready {log.head()}")
        for line in sys.stdin:
            if line.strip() != "read":
                continue
            resized = False
            # Show that the writer's growth really reached this reader: a bare LMDB transaction
            # is refused; Environment.read must adopt the new size by itself.
            try:
                env.env.begin().abort()
            except lmdb.MapResizedError:
                resized = True
            _say(json.dumps(_report(env, log, resized)))
        env.close()
        return 0

    env = Environment(args.path, durability=args.durability, map_size=args.map_size)
    log = WriteLog(env)
    if args.mode == "hold":
        _say(f"ready {os.getpid()}")
        sys.stdin.read()
        env.close()
        return 0
    if args.mode == "append":
        for n in range(args.start, args.start + args.count):
            seq = _append(env, log, n, args.size)
            _say(f"ack {seq} {n}")
            if args.delay:
                time.sleep(args.delay)
        env.close()
        _say("done")
        return 0
    n = args.start  # loop: until SIGKILL
    while True:
        seq = _append(env, log, n, args.size)
        _say(f"ack {seq} {n}")
        n += 1


if __name__ == "__main__":
    sys.exit(main())
