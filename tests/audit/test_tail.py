"""``durable-log tail`` against real stores, in real processes: following a writer in another
process (every batch once, in order), idle at no cost, filters and limits, across a rebuild in
another process, its readable and JSON formats.
"""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage

from tests.audit.test_audit import (
    BUILT,
    CHILD,
    DURABLE_LOG,
    Proc,
    batch,
    built,  # noqa: F401 - fixture
    cli,
    cli_ok,
    conversation_of,
    cpu_seconds,
    expected,
    json_lines,
    open_files,
    scratch_copy,  # noqa: F401 - fixture
    seqs_and_writes,
    write_store,
)

# ── tail ──────────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_follow_sees_every_batch_once_in_order_while_another_process_writes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    assert write_store(path, 0, 1) == 1  # the store exists before the tails start
    count = 150
    last = count + 1
    tails = {
        "all": Proc([*DURABLE_LOG, "tail", str(path), "--follow", "--json", "--from", "1"]),
        "conversation 1": Proc(
            [
                *DURABLE_LOG,
                "tail",
                str(path),
                "--follow",
                "--json",
                "--from",
                "1",
                "--conversation",
                "1",
            ]
        ),
        "tasks and document changes": Proc(
            [
                *DURABLE_LOG,
                "tail",
                str(path),
                "-f",
                "--json",
                "--from",
                "1",
                "--type",
                "task",
                "--type",
                "document.change",
            ]
        ),
    }
    keeps = {
        "all": lambda write: True,
        "conversation 1": lambda write: conversation_of(write) == 1,
        "tasks and document changes": lambda write: write["type"] in ("task", "document.change"),
    }
    writer = None
    try:
        seen: dict[str, list[dict[str, Any]]] = {
            name: tail.json_until(1) for name, tail in tails.items()
        }
        for (
            tail
        ) in tails.values():  # readers: no writer lock, so the writer below can open the store
            assert not any(name.endswith("writer.lock") for name in open_files(tail.pid))

        # Half the commits back to back, half spaced out, while the tails follow.
        writer = Proc(
            [sys.executable, CHILD, str(path), "--start", "1", "--count", str(count // 2)]
        )
        acks = [writer.line() for _ in range(count // 2)]
        assert writer.line().split() == [b"done", str(count // 2 + 1).encode()], writer.stderr
        assert writer.popen.wait(10) == 0
        writer = Proc(
            [
                sys.executable,
                CHILD,
                str(path),
                "--start",
                str(count // 2 + 1),
                "--count",
                str(count // 2),
                "--delay",
                "0.002",
            ]
        )
        acks += [writer.line() for _ in range(count // 2)]
        assert writer.line().split() == [b"done", str(last).encode()], writer.stderr
        assert writer.popen.wait(10) == 0
        assert [int(ack.split()[1]) for ack in acks] == list(range(2, last + 1))

        for name, tail in tails.items():
            want = expected(keeps[name], 1, last)
            seen[name] += tail.json_until(want[-1][0])
            got = seqs_and_writes(seen[name])
            assert [seq for seq, _ in got] == [seq for seq, _ in want], name  # once each, in order
            assert got == want, name
            assert all(isinstance(line["committedAt"], int) for line in seen[name])

        # Nothing after the last commit, no repeats: commits up to one that every filter keeps,
        # and each tail's next lines are exactly theirs (a repeat or extra line comes before).
        sentinel = next(
            n
            for n in itertools.count(last)
            if all(any(keep(write) for write in batch(n)) for keep in keeps.values())
        )
        assert write_store(path, last, sentinel - last + 1) == sentinel + 1
        for name, tail in tails.items():
            after = seqs_and_writes(tail.json_until(sentinel + 1))
            assert after == expected(keeps[name], last + 1, sentinel + 1), name
        for name, tail in tails.items():
            assert tail.terminate() == 0, (name, tail.stderr)
    finally:
        for proc in [*tails.values(), *([writer] if writer else [])]:
            proc.kill()


@pytest.mark.slow
async def test_tail_is_read_only_and_cheap_when_idle(scratch_copy: Path) -> None:
    tail = Proc([*DURABLE_LOG, "tail", str(scratch_copy), "--follow", "--json"])
    try:
        first = tail.json_until(BUILT)
        assert [line["seq"] for line in first] == list(
            range(BUILT - 9, BUILT + 1)
        )  # default: last 10
        assert not any(name.endswith("writer.lock") for name in open_files(tail.pid))

        storage = await LmdbStorage.open(
            scratch_copy, durability="process"
        )  # the writer lock is free
        try:
            seq = await storage.commit(batch(BUILT), CTX)
        finally:
            await storage.close()
        assert seq == BUILT + 1
        assert seqs_and_writes(tail.json_until(seq)) == [(seq, batch(BUILT))]

        time.sleep(0.5)  # let the poll interval back off to its idle maximum
        before, started = cpu_seconds(tail.pid), time.monotonic()
        time.sleep(2.0)
        used, elapsed = cpu_seconds(tail.pid) - before, time.monotonic() - started
        assert used / elapsed < 0.05, f"idle tail --follow used {used:.3f} s CPU in {elapsed:.2f} s"

        assert tail.terminate() == 0, tail.stderr
        assert tail.quiet(0.1) == []
    finally:
        tail.kill()


@pytest.mark.slow
def test_tail_conversation_and_type_filters_print_only_matching_writes(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cli_call import call

    def tail_json(*options: str) -> bytes:
        """The filters through the command's entry point in this process (the refusal below and the
        other tail tests run it as a process)."""

        code, out, err = call(capsys, "tail", built, "--json", "--from", "1", *options)
        assert code == 0, (options, code, err)
        return out.encode()

    cases = [
        (["--conversation", "2"], lambda w: conversation_of(w) == 2),
        (["--conversation", "1"], lambda w: conversation_of(w) == 1),  # document 20's changes too
        (["--type", "task"], lambda w: w["type"] == "task"),
        (
            ["--type", "entry", "--type", "document.change"],
            lambda w: w["type"] in ("entry", "document.change"),
        ),
        (
            ["--conversation", "1", "--type", "document.change"],
            lambda w: w["type"] == "document.change" and conversation_of(w) == 1,
        ),
        (["--type", "submission"], lambda w: w["type"] == "submission"),
        (["--conversation", "99"], lambda w: False),
    ]
    for options, keep in cases:
        got = seqs_and_writes(json_lines(tail_json(*options)))
        assert got == expected(keep), options
    # Session-scoped document 21 belongs to no conversation.
    got = json_lines(tail_json("--type", "document.change", "--conversation", "3"))
    assert got == []

    unknown = cli("tail", built, "--json", "--type", "bogus")
    assert unknown.returncode != 0
    assert b"bogus" in unknown.stderr and unknown.stdout == b""


TAIL_LIMITS = [
    # (options, which batches: like tail -n and git log -n, the last N that match, oldest first)
    (["--limit", "3"], expected()[-3:]),
    (["--from", "1", "--limit", "5"], expected()[-5:]),
    (["--from", "1", "--limit", str(BUILT + 5)], expected()),
    (["--from", str(BUILT - 1), "--limit", "5"], expected(first=BUILT - 1)),
    (
        ["--from", "10", "--limit", "3", "--type", "submission"],
        expected(lambda w: w["type"] == "submission", 10)[-3:],
    ),
    (["--limit", "3", "--type", "submission"], expected(lambda w: w["type"] == "submission")[-3:]),
    (["--limit", "2", "--conversation", "2"], expected(lambda w: conversation_of(w) == 2)[-2:]),
    (["--from", "1", "--limit", "0"], []),
    ([], expected()[-10:]),  # no range, no limit: the last 10, like tail
    (["--from", "50"], expected(first=50)),  # a range and no limit: all of it
]


@pytest.mark.parametrize("options, want", TAIL_LIMITS)
def test_tail_limit_keeps_the_last_n_matching(
    built: Path, options: list[str], want: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    if (
        options == TAIL_LIMITS[0][0]
    ):  # one case in real processes, the rest through the same entry point here
        json_output, text_output = (
            cli_ok("tail", built, "--json", *options),
            cli_ok("tail", built, *options),
        )
    else:
        from tests.support.cli_call import call

        outputs = []
        for json_option in (["--json"], []):
            code, out, err = call(capsys, "tail", built, *json_option, *options)
            assert code == 0, (options, code, err)
            outputs.append(out.encode())
        json_output, text_output = outputs
    assert seqs_and_writes(json_lines(json_output)) == want
    text = text_output.decode().splitlines()
    assert [int(line.split()[0]) for line in text] == [seq for seq, _ in want]


def test_tail_limit_with_follow_prints_the_last_n_then_follows(scratch_copy: Path) -> None:
    tail = Proc([*DURABLE_LOG, "tail", str(scratch_copy), "-f", "--json", "--limit", "2"])
    try:
        assert [line["seq"] for line in tail.json_until(BUILT)] == [BUILT - 1, BUILT]
        assert write_store(scratch_copy, BUILT, 3) == BUILT + 3
        assert [line["seq"] for line in tail.json_until(BUILT + 3)] == [
            BUILT + 1,
            BUILT + 2,
            BUILT + 3,
        ]
        assert tail.terminate() == 0, tail.stderr
    finally:
        tail.kill()


def test_filtered_follow_survives_a_rebuild_in_another_process(scratch_copy: Path) -> None:
    in_one = lambda write: conversation_of(write) == 1  # noqa: E731
    tail = Proc(
        [
            *DURABLE_LOG,
            "tail",
            str(scratch_copy),
            "-f",
            "--json",
            "--from",
            "1",
            "--conversation",
            "1",
        ]
    )
    try:
        want = expected(in_one)
        assert (
            seqs_and_writes(tail.json_until(want[-1][0])) == want
        )  # document 20's changes looked up
        rebuilt = cli("rebuild", scratch_copy)
        assert rebuilt.returncode == 0, rebuilt.stderr
        assert write_store(scratch_copy, BUILT, 10) == BUILT + 10
        want = expected(in_one, BUILT + 1, BUILT + 10)
        assert any(write["type"] == "document.change" for _, writes in want for write in writes)
        assert seqs_and_writes(tail.json_until(want[-1][0])) == want
        assert tail.terminate() == 0, tail.stderr
    finally:
        tail.kill()


LINE = re.compile(rb"^ *(\d+)  (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z  (.+)$")


def test_tail_default_readable_format(built: Path) -> None:
    lines = cli_ok("tail", built).splitlines()
    assert len(lines) == 10  # like tail: the last 10 batches
    everything = cli_ok("tail", built, "--from", "1").splitlines()
    assert len(everything) == BUILT and everything[-10:] == lines
    for line in everything:
        match = LINE.match(line)
        assert match, line
        seq, summary = int(match[1]), match[3].decode()
        parts = summary.split("; ")
        assert len(parts) == len(batch(seq - 1)), line  # one phrase per write
        if seq == 1:
            assert parts[:3] == ["conversation 1", "conversation 2", "conversation 3"]
            assert (
                "task 10 agent pending" in parts
                and "document 21 created (settings, definition version 1)" in parts
            )
            continue
        n = seq - 1
        assert parts[0].startswith(f"entry {1000 + n} in {1 + n % 3} (message)"), line
        assert parts[0].endswith(" head") == (n % 4 == 0), line
        if n % 2 == 0:
            assert f"task {10 if n % 4 == 0 else 11} agent running" in parts, line
        if n % 5 == 0:
            assert "document 20 changed (2 ops, definition version 1)" in parts, line
        if n % 11 == 0:
            assert f"submission {5000 + n} queued" in parts, line
    assert [int(LINE.match(line)[1]) for line in everything] == list(range(1, BUILT + 1))  # type: ignore[index]


def test_tail_json_is_lossless(built: Path) -> None:
    raw = cli_ok("tail", built, "--json", "--from", "1")
    raw.decode("utf-8")  # strict: no raw surrogates on the wire
    lines = raw.splitlines()
    assert len(lines) == BUILT
    for seq in (8, 15, 29):  # batches 7, 14, 28 hold a lone surrogate
        assert b"\\ud800" in lines[seq - 1]
        writes = json.loads(lines[seq - 1])["writes"]
        assert writes[0]["value"]["data"]["text"].endswith("\ud800")
        assert writes == batch(seq - 1)
    # Integers beyond 2**53 come back exactly.
    assert json.loads(lines[1])["writes"][0]["value"]["data"]["big"] == 2**70 + 1


async def test_tail_readable_format_survives_lone_surrogates(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.commit(
            [{"type": "entry", "value": {"id": 2, "conversationId": 1, "kind": "\ud800"}}], CTX
        )
    finally:
        await storage.close()
    out = cli_ok("tail", path)
    assert len(out.splitlines()) == 2 and b"entry 2 in 1" in out
