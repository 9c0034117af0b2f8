"""The write log across real processes and real signals: SIGKILL at random moments in both durability
modes keeps every acknowledged commit, one writer at a time (in this process and across processes),
map growth seen by a reader in another process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable_lmdb.log import Environment, WriteLog, WriterLockedError, write_to_builtins

from ..support.log_helpers import child, commit, drain, finish, open_log, read_line, run_child, same

# ── 5. SIGKILL at a random moment ───────────────────────────────────────────


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["power", "process"])
def test_kill_9_keeps_every_acknowledged_commit(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "store"
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    previous_head = 0
    start = 0
    for round_ in range(5):
        size = rng.choice([64, 500, 5000, 50_000])
        context = f"seed={seed} round={round_} durability={durability} size={size}"
        proc = run_child(
            "loop",
            str(path),
            "--durability",
            durability,
            "--start",
            str(start),
            "--size",
            str(size),
        )
        acked: dict[int, int] = {}  # seq -> batch counter
        for _ in range(rng.randint(1, 40)):
            seq, n = map(int, read_line(proc).split()[1:])
            acked[seq] = n
        time.sleep(rng.random() * 0.05)  # a random moment: mid-commit, mid-print or idle
        os.kill(proc.pid, signal.SIGKILL)
        out = drain(proc)
        assert proc.returncode == -signal.SIGKILL, context
        for line in out.split("\n")[
            :-1
        ]:  # the last piece is unterminated or empty: not acknowledged
            seq, n = map(int, line.split()[1:])
            acked[seq] = n
        seqs = list(acked)
        assert seqs == list(range(previous_head + 1, previous_head + 1 + len(seqs))), context

        env, log = open_log(path, durability=durability)
        try:
            head = log.head()
            assert head >= max(seqs), context
            for seq, n in acked.items():
                c = log.get(seq)
                assert c is not None, f"acknowledged seq {seq} lost ({context})"
                same([write_to_builtins(w) for w in c.writes], child.batch(n, size), context)
            # Anything committed but not yet acknowledged is whole too.
            assert [c.seq for c in log.read(1)] == list(range(1, head + 1)), context
            extra = commit(env, log, [{"type": "entry", "value": "after kill"}])
            assert extra == head + 1, context
            previous_head = extra
        finally:
            env.close()
        start = max(acked.values()) + 1000


def _size_of(c: Any) -> int:
    return len(c.writes[0].value["text"])


# ── 6. one writer ───────────────────────────────────────────────────────────


def test_second_writer_refused_in_process_and_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    commit(env, log, child.batch(0, 10))
    try:
        # Same process, second handle.
        with pytest.raises(WriterLockedError) as caught:
            Environment(path)
        assert str(path) in str(caught.value) and caught.value.path == str(path)
        assert f"by process {os.getpid()}" in str(caught.value)

        # Another process.
        proc = run_child("try-writer", str(path))
        out, err = finish(proc)
        assert proc.returncode == 0, err
        result = json.loads(out.splitlines()[-1])
        assert result["error"] == "WriterLockedError"
        assert str(path) in result["message"] and result["path"] == str(path)
        assert f"by process {os.getpid()}" in result["message"]

        # Readers are allowed meanwhile, in another process and in this one.
        reader = run_child("reader", str(path), stdin=subprocess.PIPE)
        assert read_line(reader) == "ready 1"
        out, err = reader.communicate(input="read\n", timeout=20)
        assert reader.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["seqs"] == [1]
        ro, ro_log = open_log(path, readonly=True)
        assert ro_log.head() == 1
        ro.close()
        commit(env, log, [{"type": "entry", "value": "still writing"}])
    finally:
        env.close()
    # Released: a new writer may open.
    env, log = open_log(path)
    assert log.head() == 2
    env.close()


def test_writer_in_another_process_blocks_this_one(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    commit(env, log, [{"type": "entry", "value": 1}])
    env.close()

    holder = run_child("hold", str(path), stdin=subprocess.PIPE)
    try:
        ready = read_line(holder)
        assert ready == f"ready {holder.pid}"
        with pytest.raises(WriterLockedError) as caught:
            Environment(path)
        message = str(caught.value)
        assert str(path) in message and f"by process {holder.pid}" in message
        ro, ro_log = open_log(path, readonly=True)  # a reader never takes the lock
        assert ro_log.head() == 1 and ro_log.get(1) is not None
        ro.close()
        # A relative path is reported absolute.
        with pytest.raises(WriterLockedError, match=str(path)):
            cwd = os.getcwd()
            os.chdir(tmp_path)
            try:
                Environment("store")
            finally:
                os.chdir(cwd)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(20)
    assert holder.returncode == 0
    env, log = open_log(path)
    assert commit(env, log, [{"type": "entry", "value": 2}]) == 2
    env.close()


def test_killed_writer_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "store"
    holder = run_child("hold", str(path), stdin=subprocess.PIPE)
    try:
        assert read_line(holder).startswith("ready")
        with pytest.raises(WriterLockedError):
            Environment(path)
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    env, log = open_log(path)
    assert commit(env, log, [{"type": "entry", "value": 1}]) == 1
    env.close()


# ── 7. map growth ───────────────────────────────────────────────────────────


def test_map_growth_with_a_reader_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "store"
    small = 64 * 1024
    env, log = open_log(path, map_size=small, durability="process")
    reader = None
    try:
        for n in range(3):
            commit(env, log, child.batch(n, 100))
        reader = run_child("reader", str(path), "--map-size", str(small), stdin=subprocess.PIPE)
        assert reader.stdin is not None
        assert read_line(reader) == "ready 3"
        reader.stdin.write("read\n")
        reader.stdin.flush()
        before = json.loads(read_line(reader))
        assert before["seqs"] == [1, 2, 3] and not before["resized_seen"]

        # ~6 MB in 120 commits of ~50 kB, plus one 1.5 MB commit far bigger than the initial map.
        for n in range(3, 123):
            commit(env, log, child.batch(n, 50_000))
        commit(env, log, child.batch(123, 1_500_000))
        grown = env.env.info()["map_size"]
        assert grown >= 64 * small and env.counters.map_growths >= 2
        assert [c.seq for c in log.read(1)] == list(range(1, 125))
        for c in log.read(1):
            same([write_to_builtins(w) for w in c.writes], child.batch(c.seq - 1, _size_of(c)))

        reader.stdin.write("read\n")
        reader.stdin.flush()
        after = json.loads(read_line(reader))
        assert after["resized_seen"], (
            "the reader's map never needed resizing: the test proves nothing"
        )
        assert after["head"] == 124
        assert after["seqs"] == list(range(1, 125))
        assert after["ns"] == list(range(124))
        assert after["digest"] == child._report(env, log, False)["digest"]
        assert after["map_size"] >= os.path.getsize(path / "data.mdb")

        commit(
            env, log, child.batch(124, 10)
        )  # the reader keeps following after it adopted the size
        reader.stdin.write("read\n")
        reader.stdin.flush()
        assert json.loads(read_line(reader))["head"] == 125
    finally:
        if reader is not None:
            assert reader.stdin is not None
            reader.stdin.close()
            reader.wait(20)
            assert reader.returncode == 0, reader.stderr.read() if reader.stderr else ""
        env.close()


def test_reader_in_this_process_adopts_a_map_grown_by_another(tmp_path: Path) -> None:
    path = tmp_path / "store"
    small = 64 * 1024
    env, log = open_log(path, map_size=small)
    commit(env, log, child.batch(0, 10))
    env.close()
    env, log = open_log(path, readonly=True, map_size=small)
    try:
        assert log.head() == 1
        proc = run_child(
            "append", str(path), "--count", "60", "--start", "1", "--size", "60000",
            "--durability", "process", "--map-size", str(small),
        )  # fmt: skip
        _out, err = finish(proc)
        assert proc.returncode == 0, err
        with pytest.raises(lmdb.MapResizedError):  # the situation really arose
            env.env.begin().abort()
        assert log.head() == 61
        assert [c.seq for c in log.read(1)] == list(range(1, 62))
        c = log.get(61)
        assert c is not None
        same([write_to_builtins(w) for w in c.writes], child.batch(60, 60000))
    finally:
        env.close()


def test_reader_opened_before_the_first_commit_sees_later_commits(tmp_path: Path) -> None:
    path = tmp_path / "store"
    Environment(path).close()  # a store with no log database yet
    env, log = open_log(path, readonly=True)
    try:
        assert log.head() == 0
        proc = run_child("append", str(path), "--count", "3", "--durability", "process")
        _out, err = finish(proc)
        assert proc.returncode == 0, err
        assert WriteLog(env).head() == 3  # a fresh WriteLog on the same environment sees them
        assert log.head() == 3
        assert log.get(1) is not None
        assert [c.seq for c in log.read(1)] == [1, 2, 3]
    finally:
        env.close()
