"""Shared by the reliability tests (``tests/storage/test_reliability*.py``): ``reliability_child.py``
processes, the CLI, a seeded store and its fingerprint, nested and cyclic values.
"""

from __future__ import annotations

import hashlib
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CHILD = str(ROOT / "tests" / "support" / "reliability_child.py")
HARNESS = str(ROOT / "tools" / "harness" / "crash_harness.py")
CLI = str(Path(sys.executable).parent / "durable-log")
CHILD_ENV = dict(os.environ)


# ── helpers ───────────────────────────────────────────────────────────────────


class Child(subprocess.Popen):  # type: ignore[type-arg]
    """A ``tests/support/reliability_child.py`` process whose output lines are read by a thread, so a
    line is never stuck in a buffer while the test waits for it."""

    def __init__(self, *args: str, **popen: Any) -> None:
        options: dict[str, Any] = {
            "stdout": subprocess.PIPE,
            "text": True,
            "env": CHILD_ENV,
            "cwd": ROOT,
        }
        options.update(popen)
        super().__init__([sys.executable, CHILD, *args], **options)
        self.lines: queue.Queue[str | None] = queue.Queue()
        if self.stdout is not None:
            threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.stdout is not None
        for line in self.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout: float = 30.0) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line from the child within {timeout} s") from None
        if line is None:
            self.lines.put(None)
            raise AssertionError(f"the child ended (exit {self.wait()}) without the line")
        return line


def child(*args: str, **popen: Any) -> Child:
    return Child(*args, **popen)


def child_line(proc: Child, timeout: float = 30.0) -> str:
    return proc.line(timeout)


def cli(*args: Any, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=CHILD_ENV
    )


def kill(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def task(id: int, status: str = "running", conversation: int = 1) -> dict[str, Any]:
    return {
        "type": "task",
        "value": {
            "id": id,
            "conversationId": conversation,
            "kind": "agent",
            "version": 1,
            "input": None,
            "state": {"status": status},
            "background": False,
            "abortRequested": False,
        },
    }


SEED = [
    [{"type": "conversation", "value": {"id": 1}}],
    [
        {
            "type": "entry",
            "value": {"id": 2, "conversationId": 1, "kind": "message", "text": "hello"},
        }
    ],
    [task(3)],
    [
        {
            "type": "document.create",
            "record": {"id": 4, "kind": "notes", "scope": {"kind": "session"}},
            "content": {"kind": "base", "version": 1, "value": {"text": "session notes"}},
        }
    ],
    [
        {
            "type": "document.create",
            "record": {
                "id": 5,
                "kind": "plan",
                "scope": {"kind": "conversation", "conversationId": 1},
                "history": "rewindable",
                "fork": "current",
            },
            "content": {"kind": "base", "version": 1, "value": {"steps": ["a", "b"]}},
        }
    ],
    [
        {
            "type": "submission",
            "value": {"id": 6, "conversationId": 1, "status": "queued", "requestId": "r1"},
        }
    ],
]


async def seeded(path: Path, durability: str = "process") -> LmdbStorage:
    storage = await LmdbStorage.open(path, durability=durability)
    for writes in SEED:
        await storage.commit(writes, CTX)
    return storage


def fingerprint(storage: LmdbStorage) -> tuple[int, str, int]:
    """The log head, a digest of every key/value of every named database but ``meta``, and how
    many pairs it covered."""

    env = storage._env
    with env.read() as txn:
        names = sorted(bytes(key) for key, _ in txn.cursor())
    handles = [(name, env.db(name.decode())) for name in names if name != b"meta"]
    digest = hashlib.blake2b()
    pairs = 0
    with env.read() as txn:
        for name, db in handles:
            digest.update(b"\x00db\x00" + name)
            for key, value in txn.cursor(db=db):
                digest.update(
                    len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value
                )
                pairs += 1
    return storage.log.head(), digest.hexdigest(), pairs


def nest(depth: int, kind: str = "list") -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def _cyclic() -> Any:
    value: dict[str, Any] = {"id": 7, "conversationId": 1}
    value["self"] = value
    return value
