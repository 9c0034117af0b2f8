"""``durable-log`` starts without the engine when it does not need it: ``--version`` and
``--help`` import none of LMDB, msgspec, pi-durable, zstandard, cryptography or the web view's
aiohttp and jinja2, and a command imports the module of its own family only. Checked in a fresh
interpreter through ``sys.modules`` (never by timing). ``commands.COMMANDS``, the table that lets
the parser name every command without importing it, is checked against what each module
registers."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest
from pi_durable_lmdb.cli.commands import COMMANDS, command_in, family

HEAVY = ("lmdb", "msgspec", "aiohttp", "jinja2", "pi_durable", "zstandard", "cryptography")


def _loaded_after(*argv: str) -> tuple[str, list[str], list[str]]:
    """Run ``durable-log ARGV`` in a fresh interpreter: its stdout, the heavy modules and the
    command modules it imported."""

    script = f"""
import io, json, sys
from contextlib import redirect_stdout
from pi_durable_lmdb.cli import main
out = io.StringIO()
with redirect_stdout(out):
    try:
        main({list(argv)!r})
    except SystemExit:
        pass
loaded = sorted(sys.modules)
print(json.dumps([
    out.getvalue(),
    [m for m in loaded if m.split(".")[0] in {list(HEAVY)!r}],
    [m for m in loaded if m.startswith("pi_durable_lmdb.cli.")],
]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out, heavy, cli = json.loads(done.stdout)
    return out, heavy, cli


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []], ids=["version", "help", "none"])
def test_version_and_help_load_nothing_of_the_engine(argv: list[str]) -> None:
    out, heavy, cli = _loaded_after(*argv)
    assert heavy == [], heavy
    assert cli == ["pi_durable_lmdb.cli.commands", "pi_durable_lmdb.cli.status"], cli
    if argv == ["--version"]:
        assert out.startswith("durable-log ") and "(log format 3, projection schema " in out
    if argv == ["--help"]:
        for name in COMMANDS:
            assert name in out, name


def test_a_command_loads_its_own_family_only() -> None:
    out, heavy, cli = _loaded_after("list", "--help")
    assert "--where FIELD=VALUE" in out and "aiohttp" not in heavy
    assert "pi_durable_lmdb.cli.lists" in cli
    assert not {f"pi_durable_lmdb.cli.{m}" for m in ("inspect", "move", "serve", "demo")} & set(cli)


def test_the_table_names_what_each_module_registers() -> None:
    for module in dict.fromkeys(module for module, _help in COMMANDS.values()):
        found = family(module)
        parser = argparse.ArgumentParser()
        commands = parser.add_subparsers()
        (getattr(found, "register", None) or found.add_parser)(commands)
        registered = {action.dest: action.help for action in commands._choices_actions}
        expected = {name: help for name, (owner, help) in COMMANDS.items() if owner == module}
        assert registered == expected, module


def test_the_command_is_the_first_word_that_is_not_an_option() -> None:
    assert command_in(["--debug", "show", "PATH", "task", "1"]) == "show"
    assert command_in(["--help"]) is None and command_in([]) is None
    assert command_in(["nosuch", "stats"]) is None
    assert command_in(["verify-proof", "p.json"]) == "verify-proof"
