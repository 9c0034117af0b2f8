"""One command-line surface, held by walking the real parser: a new command that breaks a rule
fails here with no change to this file.

- Each command's ``--help`` is its own: a line of what it does, its options, one example (which
  runs as printed, in a directory where ``durable-log demo`` made ``demo-store``), and a pointer
  to the exit statuses every command shares instead of the whole block.
- Every command that reads (``commands.READS``) prints text by default and JSON with ``--json``.
- A kind of record is taken in one spelling set everywhere: singular and plural alike.
- A usage error names the command and prints the command's own usage line.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import pytest
from pi_durable_lmdb import cli as cli_module
from pi_durable_lmdb.cli.commands import COMMANDS, READS
from pi_durable_lmdb.cli.common import KINDS, READ_ONLY

from tests.support.cli_call import call
from tests.support.demo_store import make_demo, run_as_printed

ROOT = Path(__file__).resolve().parents[2]
SPELLINGS = [word for pair in KINDS.items() for word in pair]
NEEDS_A_SERVER = ("--nats", "serve ")
"""Examples that need a NATS server or run until Ctrl-C: shown, not run here
(tests/cli/test_cli_nats.py and test_suggested_commands.py run such commands)."""


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli_module._parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


SUBPARSERS = _subparsers()


def _example(name: str) -> str:
    text = SUBPARSERS[name].format_help()
    found = re.search(r"^example:\n  (durable-log .+)$", text, re.M)
    assert found, f"{name} --help shows no example:\n{text}"
    return found.group(1)


def test_every_command_is_walked() -> None:
    assert set(SUBPARSERS) == set(COMMANDS) and set(COMMANDS) >= READS


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_commands_help_is_its_own(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    sub = SUBPARSERS[name]
    text = sub.format_help()
    assert text.startswith(f"usage: durable-log {name}")
    assert sub.description and sub.description.strip(), f"{name} says nothing of what it does"
    assert _example(name).startswith(f"durable-log {name}")
    assert "docs/operations.md" in text and "durable-log --help" in text, "the exit-status pointer"
    assert "1  damage found" not in text and "examples:" not in text, "the shared block, repeated"
    assert len(text.splitlines()) <= 50, f"{name} --help is {len(text.splitlines())} lines"
    for action in sub._actions:
        assert action.help, f"{name} {action.dest} has no help"


@pytest.mark.parametrize("name", sorted(READS))
def test_a_command_that_reads_takes_json(name: str) -> None:
    (json_option,) = [a for a in SUBPARSERS[name]._actions if "--json" in a.option_strings]
    assert isinstance(json_option, argparse._StoreTrueAction) and json_option.dest == "json"


def test_the_commands_with_json_are_the_reading_ones_each_shape_documented() -> None:
    with_json = {
        name
        for name, sub in SUBPARSERS.items()
        if any("--json" in action.option_strings for action in sub._actions)
    }
    assert with_json == READS
    page = (ROOT / "docs" / "operations.md").read_text()
    table = page.split("### What --json prints\n", 1)[1].split("\n### ", 1)[0]
    assert set(re.findall(r"^\| `([a-z-]+)` \|", table, re.M)) == READS


NOT_REPORTS = {
    "export": "writes the export format, JSON Lines, for import",
    "backup": "writes a copy of the store",
    "serve": "serves pages and their .json",
}


def test_every_read_only_command_reports_text_and_json() -> None:
    """A new command that reads a store is held to --json unless it says why it is not a report."""

    read_only = {name for name, sub in SUBPARSERS.items() if READ_ONLY in (sub.description or "")}
    assert read_only - set(NOT_REPORTS) <= READS, read_only - set(NOT_REPORTS) - READS
    assert set(NOT_REPORTS) <= read_only


def test_every_kind_argument_takes_both_spellings() -> None:
    found = []
    for name, sub in SUBPARSERS.items():
        for action in sub._actions:
            assert not set(action.choices or ()) & set(SPELLINGS), (
                f"{name} {action.dest} takes kinds of its own spelling: {action.choices}"
            )
            if action.metavar != "KIND":
                continue
            found.append(name)
            assert callable(action.type), f"{name} {action.dest}"
            for singular, plural in KINDS.items():
                assert action.type(singular) == action.type(plural), (name, singular)
    assert {"show", "list", "tail"} <= set(found)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_usage_error_names_the_command_and_prints_its_usage(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = call(capsys, name, "--no-such-option")
    assert code == 2 and out == ""
    assert err.startswith(f"usage: durable-log {name} "), err
    assert f"\ndurable-log {name}: error: " in err, err


def test_a_word_before_the_command_or_no_command_is_the_top_levels(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = call(capsys, "--frobnicate")
    assert code == 2 and "durable-log: error: unrecognized arguments: --frobnicate" in err, err
    code, _, err = call(capsys, "--frobnicate", "stats", "x")
    assert code == 2 and "durable-log: error: unrecognized arguments: --frobnicate" in err, err
    code, _, err = call(capsys)
    assert code == 2 and "a COMMAND is required" in err, err


@pytest.fixture(scope="module")
def examples_ran(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory where every example ran, in the order ``--help`` lists the commands (keygen's
    key then signs checkpoint's, prove's proof is checked by verify-proof's)."""

    here = tmp_path_factory.mktemp("examples")
    make_demo(here)
    for name in COMMANDS:
        example = _example(name)
        if any(server in example + " " for server in NEEDS_A_SERVER):
            continue
        done = run_as_printed(example, here)
        assert done.returncode == 0, f"{example}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
    return here


@pytest.mark.slow  # runs every example on a demo store (about 18 s)
def test_every_example_runs_as_printed(examples_ran: Path) -> None:
    assert (examples_ran / "audit.example.com_demo.pub").is_file()
    assert (examples_ran / "restored-store" / "data.mdb").is_file()


@pytest.mark.slow  # on the store every example ran on
@pytest.mark.parametrize("name", sorted(READS))
def test_a_command_that_reads_prints_text_then_json_with_json(
    name: str,
    examples_ran: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(examples_ran)
    words = shlex.split(_example(name).split(" > ")[0])[1:]
    words = [word for word in words if word != "--json"]
    code, text, err = call(capsys, *words)
    assert code == 0 and text.strip(), (words, err)
    assert not all(_is_json(line) for line in text.splitlines() if line.strip()), text
    code, out, err = call(capsys, *words, "--json")
    assert code == 0, (words, err)
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines and all(_is_json(line) for line in lines), out


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True
