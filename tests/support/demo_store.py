"""A demo store made as a new user makes one: ``durable-log demo`` run in a directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BOUND = 120  # seconds: far beyond what the demo takes, even on a loaded machine


def make_demo(directory: Path) -> str:
    """Run ``durable-log demo`` in ``directory`` (it writes ``directory/demo-store``); its stdout."""

    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "demo"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


__all__ = ["BOUND", "make_demo"]
