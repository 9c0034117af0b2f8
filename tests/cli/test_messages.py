"""Every refusal reads as a person's words: one line naming the file, value or sequence as the
user gave it, never a Python call (``as_of()``), an ``[Errno N]`` or the prefix twice; and the
exit status of its kind (docs/operations.md, "Exit status and inputs"). Each command is fed its
bad inputs from a table, against a store ``durable-log demo`` made."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli_call import call
from tests.support.demo_store import BOUND, durable_log, make_demo

NOT_PYTHON = ("[Errno", "()", "Traceback", "durable-log: durable-log", "-9223372036854775807")

# (arguments, exit status, what the line says); STORE: the demo's store, FILE: a plain file,
# EMPTY: an empty file, PUB: a verifier key file, HERE: the directory the store is in
REFUSED = [
    (
        ["import", "HERE/nosuch.jsonl", "HERE/new"],
        2,
        "HERE/nosuch.jsonl: no such file or directory",
    ),
    (["import", "EMPTY", "HERE/new"], 2, "EMPTY is empty: an export holds a line per batch"),
    (["import", "HERE", "HERE/new"], 2, "is a directory, not an export"),
    (["import", "FILE", "HERE/new"], 2, "FILE: Line 1 of the export is not a batch: not JSON"),
    (
        ["verify-proof", "HERE/nosuch.json", "--checkpoint", "FILE", "--vkey", "PUB"],
        2,
        "HERE/nosuch.json: no such file or directory",
    ),
    (
        ["verify-proof", "HERE/nosuch.json", "--checkpoint", "HERE/a", "--vkey", "HERE/b"],
        2,
        "HERE/nosuch.json: no such file or directory",
    ),
    (
        ["checkpoint", "STORE", "--key", "HERE/nosuch.key"],
        2,
        "HERE/nosuch.key: no such file or directory (nor a signing key given as text)",
    ),
    (
        ["verify", "STORE", "--trusted", "FILE", "--vkey", "HERE/nosuch.pub"],
        2,
        "HERE/nosuch.pub: no such file or directory (nor a verifier key given as text)",
    ),
    (
        ["verify", "STORE", "--trusted", "HERE/nosuch.checkpoint", "--vkey", "PUB"],
        2,
        "HERE/nosuch.checkpoint: no such file or directory",
    ),
    (["show", "STORE", "task", "3", "--as-of", "999"], 2, "log sequence 999 is not in the log yet"),
    (["list", "STORE", "tasks", "--as-of", "999"], 2, "log sequence 999 is not in the log yet"),
    (["search", "STORE", "answer", "--as-of", "999"], 2, "log sequence 999 is not in the log yet"),
    (["show", "STORE", "task", "abc"], 2, "'abc' is not a record id: a whole number, such as 3"),
    (["show", "STORE", "tusk", "3"], 2, "'tusk' is not a kind of record: conversation, entry"),
    (["show", "STORE", "task", "999"], 2, "no task 999 in"),
    (["stats", "FILE"], 2, "FILE is a file, not a store"),
    (["list", "FILE", "tasks"], 2, "FILE is a file, not a store"),
    (["stats", "HERE/nosuch"], 2, "No store at"),
    (["search", "STORE", ""], 2, "TEXT is empty: give the words to find"),
    (["search", "STORE", " "], 2, "TEXT is empty: give the words to find"),
    (["search", "STORE", "!!"], 2, "'!!' holds no word to find: words are letters"),
    (["list", "STORE", "tasks", "--columns", "id,nosuch"], 2, "unknown field 'nosuch' of tasks"),
    (["list", "STORE", "tasks", "--columns", "id,"], 2, "--columns 'id,' names an empty column"),
    (["export", "STORE", "--seq", "3", "--from", "2"], 2, "--seq is the range of one record"),
    (["keygen", "audit.example.com/demo", "--out", "PUB"], 2, "exists: keygen never overwrites"),
    (["--frobnicate"], 2, "durable-log: error: unrecognized arguments: --frobnicate"),
    (["verify", "STORE", "--json", "--frob"], 2, "durable-log verify: error: unrecognized"),
]


@pytest.fixture(scope="module")
def here(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("messages")
    make_demo(directory)
    (directory / "plain.txt").write_text("not a store\n")
    (directory / "empty.jsonl").write_bytes(b"")
    # the verifier key; the word index, whose first build says so on stderr
    for first in (["keygen", "audit.example.com/demo"], ["search", "demo-store", "answer"]):
        done = durable_log(*first, cwd=directory)
        assert done.returncode == 0, done.stderr
    return directory


def _names(here: Path) -> dict[str, str]:
    return {
        "STORE": str(here / "demo-store"),
        "FILE": str(here / "plain.txt"),
        "EMPTY": str(here / "empty.jsonl"),
        "PUB": str(here / "audit.example.com_demo.pub"),
        "HERE": str(here),
    }


def _filled(text: str, names: dict[str, str]) -> str:
    for name, value in names.items():
        text = text.replace(name, value)
    return text


@pytest.mark.parametrize(
    "args, status, says", REFUSED, ids=[" ".join(args) or "(nothing)" for args, _, _ in REFUSED]
)
def test_a_refusal_is_one_line_in_the_users_words(
    here: Path, capsys: pytest.CaptureFixture[str], args: list[str], status: int, says: str
) -> None:
    names = _names(here)
    code, out, err = call(capsys, *(_filled(arg, names) for arg in args))
    assert code == status and out == "", (code, out, err)
    lines = err.splitlines()
    assert _filled(says, names) in lines[-1], err
    assert lines[-1].startswith("durable-log"), err
    if "error:" not in lines[-1]:  # argparse's: its usage line, then the error
        assert len(lines) == 1, f"a refusal is one line: {err}"
    assert not any(bad in err for bad in NOT_PYTHON), err
    assert not (here / "new").exists(), "a refused import leaves nothing behind"


def test_an_empty_import_from_stdin_is_refused_and_leaves_nothing(here: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "import", "-", str(here / "new")],
        input=b"\n",
        capture_output=True,
        timeout=BOUND,
    )
    assert done.returncode == 2 and done.stderr.decode().splitlines() == [
        "durable-log: stdin is empty: an export holds a line per batch, and it holds none"
    ]
    assert not (here / "new").exists()


def test_serve_without_the_web_extra_says_so_once(here: Path) -> None:
    """The [web] extra hidden from the interpreter: its refusal has one ``durable-log:``."""

    script = (
        "import sys\n"
        "sys.modules['aiohttp'] = None  # as if the [web] extra were not installed\n"
        "from pi_durable_lmdb.cli import main\n"
        f"sys.exit(main(['serve', {str(here / 'demo-store')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=BOUND
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("durable-log: serve needs the [web] extra (aiohttp is not installed)")


def test_a_refusal_never_repeats_the_prefix_or_an_errno() -> None:
    from pi_durable_lmdb.cli.common import refusal, serve_missing

    assert not refusal(serve_missing("aiohttp")).startswith("durable-log")
    assert refusal(FileNotFoundError(2, os.strerror(2), "x.jsonl")) == (
        "x.jsonl: no such file or directory"
    )
    assert refusal(IsADirectoryError(21, os.strerror(21), "d")) == "d: is a directory, not a file"
