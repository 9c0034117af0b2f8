"""``durable-log`` starts without the engine when it does not need it: ``--version`` and
``--help`` import none of LMDB, msgspec, pi-durable, zstandard, cryptography or the web view's
aiohttp and jinja2, and a command imports the module of its own family only. Checked in a fresh
interpreter through ``sys.modules`` (never by timing). ``commands.COMMANDS``, the table that lets
the parser name every command without importing it, is checked against what each module
registers."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

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
        assert out.startswith("durable-log ") and "(log format 5, projection schema " in out
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


# ── Ctrl-C while the command starts ────────────────────────────────────────────

DURABLE_LOG = Path(sys.executable).with_name("durable-log")
INTERRUPTED = "durable-log: interrupted\n"
WAITING = "durable-log: no store at"
EARLY = ("/_typing.", "/zlib.", "/_socket.", "/_asyncio.", "/lmdb/")
"""Shared objects the start maps in this order, all after the entry point's first line and before
the command runs (the engine is imported while its arguments are parsed): each a moment to
interrupt it at, known from ``/proc/PID/maps``, never from a sleep."""


def _interrupted_at(argv: list[str], marker: str | None) -> tuple[int, str, str]:
    """Start ``argv`` (``tail --follow`` of a store that never comes: it runs until stopped),
    send SIGINT once ``marker`` is mapped (None: right after the spawn), and return its status,
    stdout and stderr."""

    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if marker is not None:
            maps = Path(f"/proc/{child.pid}/maps")
            for _ in range(200_000):  # bounded: the start maps it or ends first
                try:
                    if marker in maps.read_text() or child.poll() is not None:
                        break
                except OSError:  # ended meanwhile
                    break
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, out.decode(), err.decode()


MOMENTS = [("script", None), *(("script", m) for m in EARLY), *(("module", m) for m in EARLY[1:])]
"""``python -m`` imports the package (``_typing``) before its ``__main__`` runs: from ``zlib`` on."""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc/PID/maps")
@pytest.mark.parametrize(
    ("how", "marker"), MOMENTS, ids=[f"{how}-{(m or '/spawned').strip('/.')}" for how, m in MOMENTS]
)
def test_ctrl_c_while_starting_is_the_one_line_and_130(
    tmp_path: Path, how: str, marker: str | None
) -> None:
    command = (
        [str(DURABLE_LOG)] if how == "script" else [sys.executable, "-m", "pi_durable_lmdb.cli"]
    )
    code, out, err = _interrupted_at([*command, "tail", str(tmp_path / "none"), "--follow"], marker)
    if marker is None and err.startswith("Fatal Python error: init_"):
        # The signal came while CPython itself started (its handler in place, its standard
        # streams not yet): CPython's own failure, before the entry point's first line ran.
        assert code != 0 and out == "" and "durable-log" not in err, err
        return
    assert "Traceback" not in err, err
    if code == -signal.SIGINT:  # the signal came before Python had started: killed, silent
        assert (out, err) == ("", "")
    elif code == 0:  # the start was over: ``tail --follow`` stops cleanly on Ctrl-C
        assert err.startswith(WAITING) and err.count("\n") == 1, err
    else:
        assert (code, out, err) == (130, "", INTERRUPTED)


def test_the_entry_point_says_what_the_command_line_says() -> None:
    from pi_durable_lmdb.cli.status import EXIT_INTERRUPTED

    from pi_durable_lmdb_launcher import EXIT_INTERRUPTED as LAUNCHER

    assert LAUNCHER == EXIT_INTERRUPTED


def test_importing_the_package_installs_no_handler() -> None:
    script = (
        "import signal, pi_durable_lmdb, pi_durable_lmdb.cli\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "True", done.stderr
