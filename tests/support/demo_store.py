"""A demo store made as a new user makes one (``durable-log demo`` run in a directory), and
``durable-log`` command lines run there as a user types them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BOUND = 120  # seconds: far beyond what any command here takes, even on a loaded machine
BIN = os.path.dirname(sys.executable)  # where the venv's durable-log script is


def durable_log(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``durable-log ARGS`` in a fresh interpreter, in ``cwd``."""

    return subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )


def make_demo(directory: Path) -> str:
    """Run ``durable-log demo`` in ``directory`` (it writes ``directory/demo-store``); its stdout."""

    done = durable_log("demo", cwd=directory)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_as_printed(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command line as a text prints it (redirections, pipes), run by bash in ``cwd`` with the
    venv's ``durable-log`` on PATH; a pipe fails when any of its commands does."""

    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run(
        ["bash", "-c", "set -o pipefail; " + line],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )


__all__ = ["BIN", "BOUND", "durable_log", "make_demo", "run_as_printed"]
