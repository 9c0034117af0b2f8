"""``durable-log`` as auditors and operators use it, as a real process on real stores: one exit-code
scheme, refused ranges, help for everything, look-ups by id and time, backups, lossless
export -> import, imports that leave nothing behind when they fail, progress only when asked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb import cli as cli_module
from pi_durable_lmdb.audit.jsonlines import from_json, to_json
from pi_durable_lmdb.log.records import WRITE_TYPES

from examples.task_outcomes import TaskOutcomes
from tests.support.cli_call import call

DURABLE_LOG = [sys.executable, "-m", "pi_durable_lmdb.cli"]
T0 = 1_767_225_600_000
"""2026-01-01T00:00:00Z in Unix ms: the fixture's commits are one minute apart from here."""
MINUTE = 60_000


def run(*args: object, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*DURABLE_LOG, *map(str, args)], input=input, capture_output=True, timeout=60
    )


def ok(*args: object, input: bytes | None = None) -> bytes:
    done = run(*args, input=input)
    assert done.returncode == 0, (args, done.returncode, done.stderr.decode(errors="replace"))
    return done.stdout


def task(id: int, status: str = "pending") -> dict[str, Any]:
    state: dict[str, Any] = {"status": status}
    if status == "terminal":
        state["outcome"] = {"status": "completed"}
    return {
        "type": "task",
        "value": {
            "id": id,
            "conversationId": 1,
            "kind": "job",
            "version": 1,
            "input": None,
            "background": False,
            "abortRequested": False,
            "state": state,
        },
    }


NOTES = {"id": 4, "kind": "notes", "scope": {"kind": "session"}}
BATCHES: list[list[dict[str, Any]]] = [
    [{"type": "conversation", "value": {"id": 1}}],
    [
        {
            "type": "entry",
            "value": {
                "id": 2,
                "conversationId": 1,
                "kind": "m",
                "data": {
                    "pair": "\ud83d\ude00",
                    "emoji": "😀",
                    "lone": "x\ud800",
                    "huge": 10**5000 + 1,
                },
            },
        }
    ],
    [task(3)],
    [
        {
            "type": "document.create",
            "record": NOTES,
            "content": {"kind": "base", "version": 1, "value": {"n": 0}},
        }
    ],
    [
        {
            "type": "document.change",
            "id": 4,
            "content": {"kind": "delta", "version": 1, "ops": [["s", ["n"], 1]]},
        }
    ],
    [
        task(3, "terminal"),
        {
            "type": "submission",
            "value": {"id": 5, "conversationId": 1, "type": "input", "status": "queued"},
        },
    ],
]
"""Commit n + 1 is BATCHES[n], committed at T0 + n minutes."""


def at(seq: int) -> str:
    """The ISO time of commit ``seq``."""

    import datetime

    moment = datetime.datetime.fromtimestamp((T0 + (seq - 1) * MINUTE) / 1000, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def build(path: Path, projections: Any = ()) -> None:
    storage = await LmdbStorage.open(path, durability="process", projections=projections)
    try:
        for n, writes in enumerate(BATCHES):
            await storage.commit(writes, CTX, committed_at=T0 + n * MINUTE)
        await storage.projections.wait(storage.log.head())
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import asyncio

    path = tmp_path_factory.mktemp("cli") / "store"
    asyncio.run(build(path, [TaskOutcomes()]))
    return path


# ── one exit-code scheme; no command creates a store it only reads or repairs ──


USAGE_ERRORS = [
    # (arguments, words the message holds); PATH is the store, MISSING a path that does not exist
    (["tail", "PATH", "--from", "-5"], "1 or more"),
    (["tail", "PATH", "--from", "0"], "1 or more"),
    (["tail", "PATH", "--limit", "-1"], "0 or more"),
    (["tail", "PATH", "--limit", "x"], "'x' is not a count"),
    (["tail", "PATH", "--type", "bogus"], "bogus"),
    (["tail", "PATH", "--follow", "--until", "2026-01-01"], "--until"),
    (["tail", "PATH", "--from", "2", "--since", "2026-01-01"], "--since"),
    (["tail", "PATH", "--since", "yesterday"], "ISO 8601"),
    (["export", "PATH", "--from", "5", "--to", "3"], "empty range"),
    (["export", "PATH", "--since", "2026-02-01", "--until", "2026-01-01"], "empty range"),
    (["export", "PATH", "--to", "0"], "1 or more"),
    (["show", "PATH", "task", "999"], "no task 999"),
    (["show", "PATH", "widget", "3"], "widget"),
    (["show", "PATH", "task", "3", "--as-of", "99"], "99"),
    (["rebuild", "PATH", "--projection", "nosuch"], "no projection 'nosuch'"),
    (["backup", "PATH", "PATH"], "already exists"),
    (["import", "MISSING", "NEW"], "MISSING"),
    (["stats", "MISSING"], "No store"),
    (["tail", "MISSING"], "No store"),
    (["verify", "MISSING"], "No store"),
    (["export", "MISSING"], "No store"),
    (["show", "MISSING", "task", "3"], "No store"),
    (["backup", "MISSING", "NEW"], "No store"),
    (["rebuild", "MISSING"], "No store"),
    (["rebuild", "MISSING", "--projection", "x"], "No store"),
    (["search", "MISSING", "word"], "No store"),
    (["search", "PATH", " "], "TEXT is empty"),
]


@pytest.mark.parametrize("args, words", USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS])
def test_usage_and_environment_errors_exit_2_with_a_message_and_create_nothing(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], words: str
) -> None:
    names = {"PATH": str(store), "MISSING": str(tmp_path / "MISSING"), "NEW": str(tmp_path / "NEW")}
    code, stdout, stderr = call(capsys, *[names.get(arg, arg) for arg in args])
    assert code == 2, (code, stderr)
    assert words.replace("MISSING", names["MISSING"]) in stderr, stderr
    assert "Traceback" not in stderr and stdout == ""
    assert sorted(os.listdir(tmp_path)) == [], "nothing was created"


def test_help_documents_every_argument_and_the_exit_codes() -> None:
    parser = cli_module._parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == {
        "demo",
        "stats",
        "tail",
        "show",
        "verify",
        "export",
        "import",
        "rebuild",
        "compact",
        "erase",
        "trim",
        "backup",
        "restore",
        "replica",
        "promote",
        "serve",
        "keygen",
        "checkpoint",
        "prove",
        "search",
        "snapshot",
        "projections",
        "list",
        "verify-proof",
    }
    for name, sub in commands.choices.items():
        for action in sub._actions:
            assert action.help, f"{name} {action.dest} has no help"
        text = sub.format_help()
        assert "``" not in text and ":class:" not in text, name
        assert "exit status" in text and "docs/operations.md" in text, name
        assert "1  damage found" not in text, f"{name} repeats the shared exit-status block"
    tail_help = commands.choices["tail"].format_help()
    for kind in WRITE_TYPES:
        assert kind in tail_help
    top = ok("--help").decode()
    assert "``" not in top and "exit status" in top and "1  damage found" in top


def test_version() -> None:
    from pi_durable_lmdb import __version__

    assert ok("--version").decode().startswith(f"durable-log {__version__} (log format ")


@pytest.mark.slow
def test_rebuild_takes_the_writer_lock_only_on_a_store_and_names_user_projections(
    store: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    ok("backup", store, copy)
    done = run("rebuild", copy)
    assert done.returncode == 0 and done.stderr == b"", (
        "progress only on a terminal or with --progress"
    )
    assert b"from 6 log records" in done.stdout
    done = run("rebuild", copy, "--progress")
    assert done.returncode == 0 and b"rebuild: 6/6 records" in done.stderr
    assert b"task_outcomes" in run("rebuild", copy, "--projection", "nosuch").stderr, (
        "lists what there is"
    )
    ok("rebuild", copy, "--projection", "task_outcomes")


# ── look-ups and time navigation ──────────────────────────────────────────────


SHOWN = [
    (["task", "3"], lambda got: got["state"]["status"] == "terminal"),
    (["task", "3", "--as-of", "3"], lambda got: got["state"]["status"] == "pending"),
    (["task", "3", "--as-of", at(5)], lambda got: got["state"]["status"] == "pending"),
    (["task", "3", "--as-of", at(6)], lambda got: got["state"]["status"] == "terminal"),
    (["conversation", "1"], lambda got: got == {"id": 1}),
    (
        ["entry", "2"],
        lambda got: got["commitSeq"] == 2 and got["entry"]["data"]["pair"] == "\ud83d\ude00",
    ),
    (["submission", "5"], lambda got: got["status"] == "queued"),
    (["document", "4"], lambda got: got["value"] == {"n": 1} and got["record"]["kind"] == "notes"),
    (["document", "4", "--as-of", "4"], lambda got: got["value"] == {"n": 0}),
]


@pytest.mark.parametrize("args, check", SHOWN, ids=[" ".join(a) for a, _ in SHOWN])
def test_show_any_record_now_or_as_of_a_sequence_or_time(
    store: Path, capsys: pytest.CaptureFixture[str], args: list[str], check: Any
) -> None:
    code, output, stderr = call(capsys, "show", store, *args, "--json")
    assert code == 0, stderr
    assert check(from_json(output))


def test_show_before_a_record_existed(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, stderr = call(capsys, "show", store, "task", "3", "--as-of", "2")
    assert code == 2 and "no task 3" in stderr and "as of log sequence 2" in stderr


RANGES = [
    (["--since", at(3)], [3, 4, 5, 6]),
    (["--until", at(2)], [1, 2]),
    (["--since", at(2), "--until", at(4)], [2, 3, 4]),
    (["--since", "2026-01-01T00:02:30Z"], [4, 5, 6]),  # between commits 3 and 4
    (["--since", "2026-01-01T02:00:30+02:00"], [2, 3, 4, 5, 6]),  # 00:00:30 UTC
    (["--since", "2030-01-01"], []),
    (["--until", "2020-01-01"], []),
]


@pytest.mark.parametrize("options, seqs", RANGES, ids=[" ".join(o) for o, _ in RANGES])
def test_since_and_until_select_by_commit_time(
    store: Path, capsys: pytest.CaptureFixture[str], options: list[str], seqs: list[int]
) -> None:
    for command in (["export"], ["tail", "--json"]):
        code, output, stderr = call(capsys, command[0], store, *command[1:], *options)
        assert code == 0, stderr
        assert [from_json(line)["seq"] for line in output.splitlines()] == seqs, command


# ── export and import ─────────────────────────────────────────────────────────


def test_export_and_tail_json_carry_integers_beyond_the_4300_digit_limit(store: Path) -> None:
    for command in (["export"], ["tail", "--json", "--from", "1"]):
        done = run(command[0], store, *command[1:])
        assert done.returncode == 0, done.stderr
        lines = done.stdout.decode("utf-8").splitlines()
        assert len(lines) == len(BATCHES)
        assert from_json(lines[1])["writes"][0]["value"]["data"]["huge"] == 10**5000 + 1


async def test_export_import_is_lossless_for_surrogate_pairs_and_huge_integers(
    store: Path, tmp_path: Path
) -> None:
    exported = ok("export", store)
    exported.decode("utf-8")  # strict UTF-8 on the wire
    copy = tmp_path / "copy"
    assert b"imported 6 commits" in ok("import", "-", copy, input=exported)
    assert ok("export", copy) == exported
    storage = await LmdbStorage.open(copy, readonly=True)
    try:
        data = (await storage.entry(2, CTX))["entry"]["data"]  # type: ignore[index]
    finally:
        await storage.close()
    assert data == BATCHES[1][0]["value"]["data"]
    assert len(data["pair"]) == 2 and len(data["emoji"]) == 1, (
        "two code points stay two; one stays one"
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.text()
    | st.integers()
    | st.integers(min_value=-(10**9000), max_value=10**9000)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["\ud83d\ude00", "\ud800", "\udfff\ud800", "😀"]),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(json_values)
def test_json_lines_round_trip_every_json_value(value: Any) -> None:
    text = to_json(value)
    text.encode("utf-8")  # writable as strict UTF-8
    assert "\n" not in text
    assert same(from_json(text), value)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""

    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b and str(a) == str(b)
    return bool(a == b)


BAD_LINES = [
    ('{"seq": 1, "committedAt": 1.5, "writes": []}', "'committedAt'"),
    ('{"seq": 1, "committedAt": "2026-01-01", "writes": []}', "'committedAt'"),
    ('{"seq": 1, "committedAt": 18446744073709551616, "writes": []}', "'committedAt'"),
    ('{"seq": 1, "committedAt": 9223372036854775808, "writes": []}', "'committedAt'"),
    ('{"seq": 1, "committedAt": true, "writes": []}', "'committedAt'"),
    ('{"seq": 1, "committedAt": -9223372036854775809, "writes": []}', "'committedAt'"),
    ('{"seq": 1, "committedAt": 5}', "'writes'"),
    ('{"seq": 1, "committedAt": 5, "writes": {}}', "'writes'"),
    ('{"seq": "1", "committedAt": 5, "writes": []}', "'seq'"),
    ("[1, 2]", "not an object"),
    ('{"seq": 1, "committedAt": 5, "writes": [', "not JSON"),
    ('{"seq": 2, "committedAt": 5, "writes": [{"type": "nonsense"}]}', "refused"),
]


@pytest.mark.parametrize("line, words", BAD_LINES, ids=[words for _, words in BAD_LINES])
def test_a_malformed_import_line_is_named_and_leaves_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, words: str
) -> None:
    good = '{"seq": 1, "committedAt": 5, "writes": [{"type": "conversation", "value": {"id": 1}}]}'
    source = tmp_path / "export.jsonl"
    source.write_text(f"{good}\n\n{line}\n")
    target = tmp_path / "out" / "store"
    code, _, stderr = call(capsys, "import", source, target)
    assert code == 2 and "Line 3" in stderr and words in stderr, stderr
    assert "Traceback" not in stderr
    assert os.listdir(tmp_path / "out") == [], "no store, no temporary directory"


@pytest.mark.slow
def test_import_into_an_empty_directory_and_progress_only_when_asked(
    store: Path, tmp_path: Path
) -> None:
    dump = tmp_path / "log.jsonl"
    dump.write_bytes(ok("export", store))
    empty = tmp_path / "empty"
    empty.mkdir()
    done = run("import", dump, empty)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    assert done.stdout.decode().startswith(
        "imported 6 commits (1 conversation, 1 entry, 2 tasks, 1 document.create"
    )
    done = run("import", dump, tmp_path / "other", "--progress")
    assert done.returncode == 0 and b"import: 6/6 commits" in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["empty", "log.jsonl", "other"]
    assert run("verify", empty, "--progress").stderr.startswith(b"\rverify: ")


# ── backup, stats ─────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_backup_of_a_store_a_writer_holds_open(tmp_path: Path) -> None:
    path = tmp_path / "store"
    script = (
        "import asyncio, sys\n"
        "from pi_durable.context import BACKGROUND_CONTEXT as CTX\n"
        "from pi_durable_lmdb import LmdbStorage\n"
        "async def main():\n"
        f"    storage = await LmdbStorage.open({str(path)!r}, durability='process')\n"
        "    await storage.commit([{'type': 'conversation', 'value': {'id': 1}}], CTX)\n"
        "    for n in range(2, 400):\n"
        "        await storage.commit([{'type': 'entry', 'value': {'id': n, 'conversationId': 1, 'pad': 'x' * 3000}}], CTX)\n"
        "    await storage.rebuild()\n"  # leaves free pages behind: the file does not shrink
        "    print('ready', flush=True)\n"
        "    sys.stdin.readline()\n"
        "    await storage.close()\n"
        "asyncio.run(main())\n"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        assert b"a consistent copy" in ok("backup", path, tmp_path / "full")
        assert b"compacted copy" in ok("backup", path, tmp_path / "small", "--compact")
    finally:
        writer.communicate("\n", timeout=30)
    for copy in ("full", "small"):
        assert b"the projections match the log" in ok("verify", tmp_path / copy)
        assert json.loads(ok("stats", tmp_path / copy, "--json"))["headSeq"] == 399
    full, small = ((tmp_path / name / "data.mdb").stat().st_size for name in ("full", "small"))
    assert small < full


def test_stats_lists_user_projections_and_counts_in_words(store: Path) -> None:
    info = json.loads(ok("stats", store, "--json"))
    assert info["projections"]["user"] == {
        "task_outcomes": {
            "version": 1,
            "foldedSeq": 6,
            "failedSeq": None,
            "error": None,
            "building": None,
        }
    }
    text = ok("stats", store).decode()
    assert "task_outcomes: version 1, folded to sequence 6" in text
    assert "1 conversation, 1 entry, 1 task, 1 submission, 1 document" in text


def test_tail_lines_in_words(store: Path) -> None:
    lines = ok("tail", store).decode().splitlines()
    assert lines[3].endswith("document 4 created (notes, definition version 1)")
    assert lines[4].endswith("document 4 changed (1 op, definition version 1)")


def test_import_from_pi_durable_refuses_what_is_not_a_pi_durable_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database\n" * 100)
    empty = tmp_path / "empty"
    empty.mkdir()
    for source, words in (
        (not_sqlite, "is not a pi-durable store: not a SQLite database"),
        (empty, "no main.jsonl"),
    ):
        code, _, stderr = call(capsys, "import", "--from-pi-durable", source, tmp_path / "new")
        assert code == 2 and words in stderr and "Traceback" not in stderr, stderr
    assert sorted(os.listdir(tmp_path)) == ["empty", "notes.txt"] and os.listdir(empty) == []


def test_a_truncated_store_is_damage_for_every_reading_command(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "copy"
    ok("backup", store, copy)
    with open(copy / "data.mdb", "r+b") as data:
        data.truncate(5 * 4096)
    for command in (["stats"], ["verify"], ["tail"], ["export"], ["show", "task", "3"], ["backup"]):
        args = [command[0], copy, *command[1:]] + (
            [tmp_path / "dest"] if command == ["backup"] else []
        )
        code, _, stderr = call(capsys, *args)
        assert code == 1 and "truncated" in stderr, (command, code, stderr)


async def test_every_commit_time_the_engine_writes_imports_back(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        for n, when in enumerate((-(2**63), -1, 0, 2**63 - 1), 1):
            await storage.commit(
                [{"type": "conversation", "value": {"id": n}}], CTX, committed_at=when
            )
    finally:
        await storage.close()
    exported = ok("export", tmp_path / "store")
    assert b"imported 4 commits" in ok("import", "-", tmp_path / "copy", input=exported)
    assert ok("export", tmp_path / "copy") == exported
