"""The write log against real LMDB files and real subprocesses (no mocks): sequences and ranges across
reopen, following another process's writer, file modes and use after fork.

The other parts: ``test_log_values.py`` (round trips, strict JSON), ``test_log_processes.py`` (SIGKILL,
the single-writer lock, map growth across processes), ``test_log_corruption.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import pytest
from pi_durable_lmdb.log import Environment, encode_batch, write_to_builtins

from ..support.log_helpers import child, commit, finish, open_log, run_child, same

# ── 3. sequences, ranges, committed_at ──────────────────────────────────────


def test_sequences_ranges_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    assert log.head() == 0 and log.first() == 0 and log.count() == 0
    assert log.get(1) is None and list(log.read(1)) == []
    t0 = time.time() * 1000
    seqs = [commit(env, log, [{"type": "entry", "value": i}]) for i in range(5)]
    t1 = time.time() * 1000
    assert seqs == [1, 2, 3, 4, 5]
    env.close()

    seen = set(seqs)
    for round_ in range(3):  # reopen repeatedly: sequences continue, never reused
        env, log = open_log(path, durability="process" if round_ % 2 else "power")
        head = log.head()
        assert head == max(seen)
        new = [commit(env, log, [{"type": "task", "value": [round_, i]}]) for i in range(3)]
        assert new == [head + 1, head + 2, head + 3]
        assert not seen & set(new)
        seen |= set(new)
        env.close()

    env, log = open_log(path)
    try:
        head = log.head()
        assert head == 14 and log.count() == 14 and log.first() == 1
        # Two appends in one transaction take consecutive sequences.
        empty = encode_batch([]).payload
        pair = env.write(lambda txn: (log.append(txn, empty), log.append(txn, empty)))
        assert pair == (15, 16)

        # An aborted transaction commits nothing; the next commit takes the next free sequence.
        def append_then_fail(txn: lmdb.Transaction) -> None:
            assert log.append(txn, empty) == 17
            raise RuntimeError("abort")

        with pytest.raises(RuntimeError, match="abort"):
            env.write(append_then_fail)
        assert log.head() == 16
        assert commit(env, log, [{"type": "entry", "value": "x"}]) == 17

        assert [c.seq for c in log.read(1)] == list(range(1, 18))
        assert [c.seq for c in log.read()] == list(range(1, 18))
        assert [c.seq for c in log.read(0)] == list(range(1, 18))
        assert [c.seq for c in log.read(3, 6)] == [3, 4, 5, 6]
        assert [c.seq for c in log.read(6, 6)] == [6]
        assert [c.seq for c in log.read(7, 3)] == []
        assert [c.seq for c in log.read(15)] == [15, 16, 17]
        assert [c.seq for c in log.read(16, 1000)] == [16, 17]
        assert list(log.read(18)) == []
        assert log.get(0) is None and log.get(18) is None
        assert log.get(4) is not None and log.get(4).writes[0].value == 3  # type: ignore[union-attr]

        first_five = list(log.read(1, 5))
        for c in first_five:
            assert t0 - 1000 <= c.committed_at <= t1 + 1000, c.committed_at
        stamps = [c.committed_at for c in log.read(1)]
        assert all(
            1_500_000_000_000 < s < 4_000_000_000_000 for s in stamps
        )  # unix ms, not s or ns
    finally:
        env.close()


def test_read_spans_many_chunks(tmp_path: Path) -> None:
    env, log = open_log(tmp_path / "store", durability="process")
    try:
        payloads = [encode_batch([{"type": "entry", "value": i}]).payload for i in range(700)]
        last = env.write(lambda txn: [log.append(txn, p) for p in payloads][-1])
        assert last == 700
        assert [c.seq for c in log.read(1)] == list(range(1, 701))
        assert [c.writes[0].value for c in log.read(250, 520)] == list(range(249, 520))
        assert [c.seq for c in log.read(256, 257)] == [256, 257]
    finally:
        env.close()


# ── 4. follow ───────────────────────────────────────────────────────────────


async def test_follow_sees_another_process_commits_once_in_order(tmp_path: Path) -> None:
    path = tmp_path / "store"
    Environment(path).close()  # the store exists, its log database does not yet
    count = 150
    env, log = open_log(path, readonly=True)
    assert log.db is None
    proc = run_child(
        "append", str(path), "--count", str(count), "--delay", "0.002", "--durability", "process"
    )
    seen: list[int] = []

    async def consume() -> None:
        async with contextlib.aclosing(log.follow(1)) as commits:
            async for c in commits:
                seen.append(c.seq)
                same([write_to_builtins(w) for w in c.writes], child.batch(c.seq - 1, 64))
                if len(seen) == count:
                    return

    try:
        await asyncio.wait_for(consume(), timeout=30)
    finally:
        out, err = finish(proc)
        env.close()
    assert proc.returncode == 0, err
    assert seen == list(range(1, count + 1))
    acks = [int(line.split()[1]) for line in out.splitlines() if line.startswith("ack")]
    assert acks == seen


async def test_follow_from_the_middle_and_in_process_wakeup(tmp_path: Path) -> None:
    env, log = open_log(tmp_path / "store", durability="process")
    try:
        for i in range(10):
            commit(env, log, [{"type": "entry", "value": i}])
        got: list[int] = []
        arrived = asyncio.Event()

        async def consume() -> None:
            # Long poll intervals: only committed() can deliver new commits in time.
            async for c in log.follow(6, poll_interval=30, max_poll_interval=30):
                got.append(c.seq)
                if c.seq >= 12:
                    arrived.set()
                    return

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        assert got == [6, 7, 8, 9, 10]
        started = time.monotonic()
        commit(env, log, [{"type": "entry", "value": 10}])
        commit(env, log, [{"type": "entry", "value": 11}])
        await asyncio.wait_for(arrived.wait(), timeout=5)
        assert time.monotonic() - started < 2
        await task
        assert got == [6, 7, 8, 9, 10, 11, 12]
    finally:
        env.close()


# ── 9. file modes and fork ──────────────────────────────────────────────────


def test_file_modes(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "deeper" / "store"
        env, log = open_log(path)
        commit(env, log, [{"type": "entry", "value": 1}])
        env.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    names = sorted(os.listdir(path))
    assert {"data.mdb", "lock.mdb", "writer.lock"} <= set(names)
    for name in names:
        assert stat.S_IMODE(os.stat(path / name).st_mode) == 0o600, name


_FORKING_CHILD = """
import os, sys
from pi_durable_lmdb.log import Environment, ForkedEnvironmentError, WriteLog, encode_batch

path = sys.argv[1]
env = Environment(path)
log = WriteLog(env)


def commit(value):
    payload = encode_batch([{"type": "entry", "value": value}]).payload
    seq = env.write(lambda txn: log.append(txn, payload))
    log.committed()
    return seq


commit(1)
sys.stdout.flush()
sys.stderr.flush()
pid = os.fork()
if pid == 0:  # child: report through the exit code only
    code = 0
    try:
        checks = [
            lambda: log.head(),
            lambda: log.get(1),
            lambda: list(log.read(1)),
            lambda: commit(2),
            lambda: env.read().__enter__(),
            lambda: env.db("other"),
        ]
        for index, check in enumerate(checks):
            try:
                check()
                code = 10 + index
                break
            except ForkedEnvironmentError as error:
                if path not in str(error):
                    code = 30 + index
                    break
        if code == 0:
            env.close()  # must be a no-op, not touch the parent's environment
    except BaseException:
        code = 99
    os._exit(code)
_, status = os.waitpid(pid, 0)
print(os.WEXITSTATUS(status) if os.WIFEXITED(status) else f"status {status}")
# The parent's environment is untouched by the child.
print(commit(2), [c.seq for c in log.read(1)])
env.close()
"""


def test_environment_refuses_use_after_fork(tmp_path: Path) -> None:
    """Forked from a process of one thread (a fresh interpreter): forking the test process, which
    runs threads of its own under pytest-xdist, may deadlock, and Python 3.12 warns about it."""

    path = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", _FORKING_CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    child_code, parent_after = done.stdout.splitlines()
    assert child_code == "0", f"child exit code {child_code}"
    assert parent_after == "2 [1, 2]"
