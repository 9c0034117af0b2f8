"""A writer in a child process, killed (SIGKILL) while it rewrites its log: the kill tests of an
erasure and of a trim run their script through ``run_killed``."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def run_killed(
    script: str,
    args: list[str],
    marker: str,
    kill: bool,
    rng: random.Random,
    delay: float,
    acks: Path | None = None,
) -> tuple[list[int], int]:
    """Run ``script`` with ``args``; it prints ``ack ID`` for each commit acknowledged and
    ``marker`` when its rewrite begins. ``kill``: SIGKILL it a random moment (up to ``delay``
    seconds) after the marker; else it runs to its end (or to where it makes itself die).
    ``acks``: a file where another thread of the script writes an id a line as its commits
    return. Returns the ids it acknowledged (on its output and in ``acks``) and its exit code."""

    child = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    acked: list[int] = []
    for raw in child.stdout:
        line = raw.decode().split()
        if line[0] == "ack":
            acked.append(int(line[1]))
        if line[0] == marker and kill:
            time.sleep(rng.uniform(0, delay))
            child.send_signal(signal.SIGKILL)
            break
    code = child.wait(timeout=300)
    rest = child.stdout.read().decode().split("\n")
    acked += [int(line.split()[1]) for line in rest if line.startswith("ack ")]
    if acks is not None:  # whole lines only: the kill may cut the last one
        written = acks.read_text()
        acked += [int(line) for line in written[: written.rfind("\n") + 1].split()]
    return acked, code


__all__ = ["run_killed"]
