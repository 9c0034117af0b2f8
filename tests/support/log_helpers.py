"""Shared by the write-log tests (``tests/log/test_log*.py``): open and commit on a real log, compare
values strictly, run and read ``log_writer_child.py`` processes, build nested values.
"""

from __future__ import annotations

import importlib.util
import math
import os
import select
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
from pi_durable_lmdb.log import Environment, WriteLog, encode_batch

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(ROOT / "tests" / "support" / "log_writer_child.py")
CHILD_ENV = dict(os.environ)


def _load_child_module() -> Any:
    spec = importlib.util.spec_from_file_location("log_writer_child", CHILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_child_module()


# ── helpers ─────────────────────────────────────────────────────────────────


def same(a: Any, b: Any, where: str = "$") -> None:
    """Assert ``a`` and ``b`` are the same JSON value: types, float signs, code points, key order.

    Iterative, so it compares values of any depth.
    """

    stack = [(a, b, where)]
    while stack:
        a, b, at = stack.pop()
        assert type(a) is type(b), (
            f"{at}: {type(a).__name__} != {type(b).__name__} ({a!r:.80} vs {b!r:.80})"
        )
        if isinstance(a, float):
            assert a == b and math.copysign(1.0, a) == math.copysign(1.0, b), (
                f"{at}: {a!r} != {b!r}"
            )
        elif isinstance(a, str):
            assert len(a) == len(b) and a == b, f"{at}: {a!r} != {b!r}"
        elif isinstance(a, dict):
            assert list(a) == list(b), f"{at}: keys {list(a)!r} != {list(b)!r}"
            stack.extend((a[key], b[key], f"{at}.{key!r}") for key in a)
        elif isinstance(a, list):
            assert len(a) == len(b), f"{at}: length {len(a)} != {len(b)}"
            stack.extend((x, y, f"{at}[{index}]") for index, (x, y) in enumerate(zip(a, b)))
        else:
            assert a == b, f"{at}: {a!r} != {b!r}"


def open_log(path: Path, **options: Any) -> tuple[Environment, WriteLog]:
    env = Environment(path, **options)
    return env, WriteLog(env)


def commit(env: Environment, log: WriteLog, writes: list[dict[str, Any]]) -> int:
    payload = encode_batch(writes).payload
    seq = env.write(lambda txn: log.append(txn, payload))
    log.committed()
    return seq


def run_child(*args: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
        cwd=str(ROOT),
        **popen,
    )


_pending: weakref.WeakKeyDictionary[subprocess.Popen[str], bytearray] = weakref.WeakKeyDictionary()
"""Per child: bytes read from its stdout and not yet returned."""


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """One line of a child's stdout, failing (not hanging) if it does not come.

    Reads the pipe with ``os.read`` (no Python-level buffer), so ``drain`` or ``communicate``
    afterwards sees exactly what this has not returned.
    """

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = _pending.setdefault(proc, bytearray())
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            proc.kill()
            proc.wait(5)
            pytest.fail(
                f"child sent no line in {timeout}s; stderr: {proc.stderr.read() if proc.stderr else ''}"
            )
        chunk = os.read(fd, 65536)
        if not chunk:
            proc.wait(5)
            pytest.fail(
                f"child exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}"
            )
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode()


def drain(proc: subprocess.Popen[str], timeout: float = 10.0) -> str:
    """Everything a dead (or finishing) child wrote that ``read_line`` has not returned."""

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = _pending.pop(proc, bytearray())
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            pytest.fail("child's stdout did not reach EOF")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
    proc.wait(timeout)
    return buffer.decode()


def finish(proc: subprocess.Popen[str], timeout: float = 30.0) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"child did not finish in {timeout}s: {err}")
    return out, err


def nest_lists(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nest_dicts(depth: int, leaf: Any, key: str = "k") -> Any:
    value = leaf
    for _ in range(depth):
        value = {key: value}
    return value
