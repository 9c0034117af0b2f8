"""``durable-log`` refusing what would hide a loss: an import whose
sequences skip or repeat, an import line that is not UTF-8, a SQLite file given as an export;
``show`` of id 0 answering as the contract does; ``tail --follow`` waiting for a store that is not
there yet; exit 2 only for refusals the command names, exit 3 and a traceback for a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb import cli as cli_module
from pi_durable_lmdb.log import LogError

from tests.support.cli_call import call
from tests.support.polling import until

DURABLE_LOG = [sys.executable, "-m", "pi_durable_lmdb.cli"]
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def batch_line(seq: int, n: int) -> str:
    """An export line: sequence ``seq`` holding conversation ``n`` (so each batch is told apart)."""

    return json.dumps(
        {
            "seq": seq,
            "committedAt": 1_000 + n,
            "writes": [{"type": "conversation", "value": {"id": n}}],
        }
    )


def export_of(seqs: list[int]) -> str:
    return "".join(batch_line(seq, n) + "\n" for n, seq in enumerate(seqs, 1))


def first_out_of_order(seqs: list[int]) -> int | None:
    """The 1-based line of the first sequence that is not its line number (None: 1, 2, 3, ...)."""

    return next((line for line, seq in enumerate(seqs, 1) if seq != line), None)


# ── import: sequences that skip or repeat are refused unless --renumber ───────


SEQUENCES = {
    "skip at start": [2, 3, 4],
    "skip in the middle": [1, 2, 4],
    "skip at the end": [1, 2, 3, 5],
    "gap of several": [1, 5, 6],
    "repeat at start": [1, 1, 2],
    "repeat in the middle": [1, 2, 2, 3],
    "repeat at the end": [1, 2, 3, 3],
    "out of order": [1, 3, 2],
    "partial export (--from 5)": [5, 6, 7],
}


@pytest.mark.parametrize("seqs", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_an_import_that_skips_or_repeats_is_refused_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seqs: list[int]
) -> None:
    source = tmp_path / "export.jsonl"
    source.write_text(export_of(seqs))
    target = tmp_path / "out" / "store"
    code, out, err = call(capsys, "import", source, target)
    line = first_out_of_order(seqs)
    assert code == 2 and out == "", (code, out, err)
    assert (
        f"Line {line} of the export is sequence {seqs[line - 1]}" in err and "--renumber" in err
    ), err
    assert "Traceback" not in err
    assert os.listdir(tmp_path / "out") == [], "no store, no temporary directory"


@pytest.mark.parametrize("seqs", SEQUENCES.values(), ids=SEQUENCES.keys())
def test_renumber_imports_in_line_order_and_lists_what_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seqs: list[int]
) -> None:
    source = tmp_path / "export.jsonl"
    source.write_text(export_of(seqs))
    code, out, err = call(capsys, "import", "--renumber", source, tmp_path / "store")
    assert code == 0, err
    assert "did not start at sequence 1" not in out
    assert renumbered_pairs(out) == [
        (seq, line) for line, seq in enumerate(seqs, 1) if seq != line
    ], out
    code, exported, _ = call(capsys, "export", tmp_path / "store")
    batches = [json.loads(text) for text in exported.splitlines()]
    assert [b["seq"] for b in batches] == list(range(1, len(seqs) + 1))
    assert [b["writes"][0]["value"]["id"] for b in batches] == list(range(1, len(seqs) + 1)), (
        "line order kept"
    )
    assert [b["committedAt"] for b in batches] == [1_000 + n for n in range(1, len(seqs) + 1)]


def renumbered_pairs(report: str) -> list[tuple[int, int]]:
    """``(export sequence, new sequence)`` of every batch an import's report says it renumbered."""

    pairs: list[tuple[int, int]] = []
    for match in re.finditer(r"^  (\d+)(?:-(\d+))? -> (\d+)(?:-(\d+))?$", report, re.MULTILINE):
        first, last, new_first = int(match[1]), int(match[2] or match[1]), int(match[3])
        pairs.extend((first + k, new_first + k) for k in range(last - first + 1))
    return pairs


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seqs=st.lists(st.integers(1, 8), min_size=1, max_size=8))
def test_any_sequence_list_imports_exactly_when_it_runs_1_2_3(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], seqs: list[int]
) -> None:
    where = tmp_path_factory.mktemp("seqs")
    source = where / "export.jsonl"
    source.write_text(export_of(seqs))
    code, out, err = call(capsys, "import", source, where / "strict")
    line = first_out_of_order(seqs)
    if line is None:
        assert code == 0 and "renumbered" not in out, err
    else:
        assert code == 2 and f"Line {line} of the export is sequence {seqs[line - 1]}" in err, err
        assert not (where / "strict").exists()
    code, out, err = call(capsys, "import", "--renumber", source, where / "renumbered")
    assert code == 0, err
    assert renumbered_pairs(out) == [(seq, n) for n, seq in enumerate(seqs, 1) if seq != n]


def test_a_long_renumbering_is_counted_after_twenty_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seqs = [n * 2 for n in range(1, 31)]  # every other sequence missing: 30 runs of one
    source = tmp_path / "export.jsonl"
    source.write_text(export_of(seqs))
    code, out, _ = call(capsys, "import", "--renumber", source, tmp_path / "store")
    assert code == 0 and "renumbered 30 batches of 30" in out
    assert len(renumbered_pairs(out)) == 20 and "... and 10 more runs (10 batches)" in out


# ── import: bytes that are not UTF-8, a SQLite file, a directory ───────────────


INVALID_UTF8 = {
    "lone 0xff": b"\xff",
    "lone continuation byte": b"\x80",
    "truncated two-byte sequence": b"\xc3",
    "truncated three-byte sequence": b"\xe2\x82",
    "overlong slash": b"\xc0\xaf",
    "encoded surrogate (CESU-8)": b"\xed\xa0\x80",
    "five-byte form": b"\xf8\x88\x80\x80\x80",
    "beyond U+10FFFF": b"\xf4\x90\x80\x80",
}


@pytest.mark.parametrize("via_stdin", [False, True], ids=["file", "stdin"])
@pytest.mark.parametrize("bad", INVALID_UTF8.values(), ids=INVALID_UTF8.keys())
def test_an_import_line_that_is_not_utf8_is_refused_naming_the_line(
    tmp_path: Path,
    bad: bytes,
    via_stdin: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = batch_line(1, 1).encode()
    broken = (
        b'{"seq": 2, "committedAt": 5, "writes": [{"type": "conversation", "value": {"id": 2, "t": "a'
        + bad
        + b'"}}]}'
    )
    data = good + b"\n" + broken + b"\n"
    source = tmp_path / "export.jsonl"
    source.write_bytes(data)
    target = tmp_path / "out" / "store"
    args = ["import", "-", target] if via_stdin else ["import", source, target]
    if bad == INVALID_UTF8["lone 0xff"]:  # one form, from a file and from a pipe, in a real process
        done = subprocess.run(
            [*DURABLE_LOG, *map(str, args)],
            input=data if via_stdin else None,
            capture_output=True,
            timeout=60,
        )
        code, stderr = done.returncode, done.stderr.decode()
    else:  # the other forms through the same entry point, in this process, the bytes on stdin as a pipe gives them
        import io

        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data if via_stdin else b"")))
        code, _, stderr = call(capsys, *args)
    assert code == 2 and "Line 2 of the export is not UTF-8" in stderr, stderr
    assert bad[:1].hex() in stderr and "Traceback" not in stderr
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.parametrize("via_stdin", [False, True], ids=["file", "stdin"])
def test_a_sqlite_file_given_as_an_export_names_the_option_that_reads_it(
    tmp_path: Path, via_stdin: bool
) -> None:
    database = tmp_path / "agent.sqlite"
    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE t (a)")
    connection.commit()
    connection.close()
    args = (
        ["import", "-", tmp_path / "new"] if via_stdin else ["import", database, tmp_path / "new"]
    )
    done = subprocess.run(
        [*DURABLE_LOG, *map(str, args)],
        input=database.read_bytes() if via_stdin else None,
        capture_output=True,
        timeout=60,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 2 and "SQLite database" in stderr and "--from-pi-durable" in stderr, (
        stderr
    )
    assert "not JSON" not in stderr and not (tmp_path / "new").exists()


def test_a_directory_given_as_an_export_names_the_option_that_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "jsonl-store").mkdir()
    code, _, err = call(capsys, "import", tmp_path / "jsonl-store", tmp_path / "new")
    assert code == 2 and "is a directory" in err and "--from-pi-durable" in err, err
    code, _, err = call(
        capsys,
        "import",
        "--renumber",
        "--from-pi-durable",
        tmp_path / "jsonl-store",
        tmp_path / "new",
    )
    assert code == 2 and "--renumber" in err
    assert not (tmp_path / "new").exists()


# ── show: an id the contract never hands out is answered as the contract answers ──


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("show") / "store"

    async def build() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.close()

    asyncio.run(build())
    return path


async def contract_answer(kind: str, id: int) -> str | None:
    """What pi-durable's MemoryStorage says for ``kind`` ``id``: None (no such record) or its error."""

    memory = MemoryStorage()
    try:
        if kind == "document":
            found = await memory.document(id, "current", CTX)  # type: ignore[arg-type]
        else:
            found = await getattr(memory, kind)(id, CTX)
    except (TypeError, ValueError) as error:
        return str(error)
    assert found is None
    return None


@pytest.mark.parametrize("id", [0, -1, -7])
@pytest.mark.parametrize("kind", ["conversation", "entry", "task", "submission", "document"])
def test_show_of_an_id_below_1_answers_as_the_contract_does(
    small_store: Path, capsys: pytest.CaptureFixture[str], kind: str, id: int
) -> None:
    code, out, err = call(capsys, "show", small_store, kind, id)
    assert code == 2 and out == ""
    assert "log sequence" not in err, "an id is not a log sequence"
    refusal = asyncio.run(contract_answer(kind, id))
    if refusal is None:
        assert f"no {kind} {id} in " in err, err
    else:
        assert refusal in err, (refusal, err)


# ── tail --follow waits for a store that is not there yet ──────────────────────


def _stderr_reader(process: subprocess.Popen[str]) -> list[str]:
    lines: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.mark.parametrize("json_lines", [False, True], ids=["text", "json"])
def test_tail_follow_waits_for_the_store_then_prints_its_commits(
    tmp_path: Path, json_lines: bool
) -> None:
    path = tmp_path / "not-yet" / "store"
    follower = subprocess.Popen(
        [*DURABLE_LOG, "tail", str(path), "--follow", *(["--json"] if json_lines else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        errors = _stderr_reader(follower)
        until(
            lambda: any("waiting" in line for line in errors), timeout=20, what="waiting on stderr"
        )
        assert follower.poll() is None  # it keeps waiting: the commits below reach its output
        assert not path.exists(), "tail creates nothing"  # once it has exited: the next test

        async def write() -> None:
            storage = await LmdbStorage.open(path, durability="process")
            for n in (1, 2):
                await storage.commit([{"type": "conversation", "value": {"id": n}}], CTX)
            await storage.close()

        asyncio.run(write())
        assert follower.stdout is not None
        lines = [follower.stdout.readline() for _ in range(2)]
        if json_lines:
            assert [json.loads(line)["seq"] for line in lines] == [1, 2]
        else:
            assert [line.split()[0] for line in lines] == ["1", "2"]
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(20) == 0
        assert sum("waiting" in line for line in errors) == 1, errors
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()


def test_tail_follow_stopped_while_waiting_exits_0_and_tail_without_follow_refuses(
    tmp_path: Path,
) -> None:
    path = tmp_path / "never"
    follower = subprocess.Popen(
        [*DURABLE_LOG, "tail", str(path), "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        errors = _stderr_reader(follower)
        until(
            lambda: any("waiting" in line for line in errors), timeout=20, what="waiting on stderr"
        )
        follower.send_signal(signal.SIGINT)
        assert follower.wait(20) == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    done = subprocess.run(
        [*DURABLE_LOG, "tail", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "No store" in done.stderr
    assert not path.exists()


# ── exit 2 for what the command names, exit 3 and the traceback for a bug ─────


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli_module._parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _valid_args(name: str, tmp_path: Path) -> list[str]:
    """Arguments that parse for command ``name`` (what they point to is never opened here)."""

    path, nats = str(tmp_path / "x"), ["--nats", "nats://127.0.0.1:1", "--stream", "S"]
    return {
        "demo": [path],
        "stats": [path],
        "tail": [path],
        "show": [path, "task", "1"],
        "verify": [path],
        "export": [path],
        "import": [path, str(tmp_path / "y")],
        "rebuild": [path],
        "compact": [path],
        "erase": [path, "--conversation", "1", "--reason", "asked"],
        "trim": [path, "--before", "17"],
        "backup": [path, str(tmp_path / "y")],
        "restore": [*nats, "--store", "abc", path],
        "replica": [path, *nats, "--store", "abc"],
        "promote": [path, *nats],
        "snapshot": [path, *nats],
        "projections": [path],
        "serve": [path],
        "keygen": ["name"],
        "checkpoint": [path, "--key", str(tmp_path / "k")],
        "prove": [path, "1"],
        "search": [path, "word"],
        "list": [path, "tasks"],
        "verify-proof": [path, "--checkpoint", path, "--vkey", path],
    }[name]


UNEXPECTED = [
    KeyError("k"),
    IndexError("i"),
    TypeError("t"),
    AttributeError("a"),
    RuntimeError("r"),
    AssertionError("x"),
    ZeroDivisionError("z"),
]
KNOWN = [
    ValueError("a refused value"),
    FileNotFoundError("No store at x"),
    LogError("a log refusal"),
    PermissionError("not yours"),
]


def _failing_parser(error: BaseException) -> Any:
    """The real parser, every command's work replaced by one that raises ``error`` (the fault
    planted is in the command, the handling under test is main's)."""

    real = cli_module._parser

    def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
        built = real(argv)
        for sub in _subparsers(built).values():

            def fail(args: argparse.Namespace) -> int:
                raise error

            sub.set_defaults(run=fail)
        return built

    return parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("error", UNEXPECTED, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("command", sorted(_commands()))
def test_an_unexpected_error_prints_its_traceback_and_exits_3(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    error: BaseException,
) -> None:
    monkeypatch.setattr(cli_module, "_parser", _failing_parser(error))
    code, _out, err = call(capsys, command, *_valid_args(command, tmp_path))
    assert code == cli_module.EXIT_BUG == 3, (code, err)
    assert "unexpected error" in err and "Traceback (most recent call last)" in err
    assert (
        err.rstrip().splitlines()[-1] == "".join(traceback.format_exception_only(error)).strip()
    ), err


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "--debug"])
@pytest.mark.parametrize("error", KNOWN, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("command", sorted(_commands()))
def test_a_known_refusal_is_one_line_and_exit_2_with_its_traceback_under_debug(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    error: BaseException,
    debug: bool,
) -> None:
    monkeypatch.setattr(cli_module, "_parser", _failing_parser(error))
    code, _, err = call(
        capsys, *(["--debug"] if debug else []), command, *_valid_args(command, tmp_path)
    )
    assert code == 2 and f"durable-log: {error.args[0]}" in err, err
    assert ("Traceback" in err) is debug
    if not debug:
        assert err.count("\n") == 1, err


# ── the operator manual's command table lists every command ─────────────────────────────


def test_the_operator_manual_table_lists_every_command_and_no_other() -> None:
    section = (
        OPERATIONS.read_text().split("## The `durable-log` command", 1)[1].split("\n## ", 1)[0]
    )
    rows = re.findall(r"^\| `durable-log (?:--\w+ )*([a-z-]+)", section, re.MULTILINE)
    assert set(rows) == set(_commands()), sorted(set(rows) ^ set(_commands()))
    assert "3" in section and "--debug" in section and "--renumber" in section
