"""The demo: its Session workload reads back after reopen, and the command runs end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.cli.demo import QUESTIONS, _definitions, run_workload
from pi_durable_lmdb.storage import LmdbStorage


async def test_the_demo_workload_reads_back_after_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    first = await run_workload(path)
    assert first.root_answers == len(QUESTIONS)
    assert first.fork_answers == 0, "the fork copied the notes as of its fork point"
    assert first.fork_entries == 1
    second = await run_workload(path)  # the same store, reopened: history accumulates
    assert second.root_answers == 2 * len(QUESTIONS)
    assert second.head > first.head
    assert verify(path) is None

    _notes, settings, _ = _definitions()
    storage = await LmdbStorage.open(path, readonly=True)
    session = create_session(storage)
    try:
        assert (await session.snapshot(settings, CTX))["turns"] == 2 * len(QUESTIONS)
        tasks = await storage.scan_tasks({"status": "terminal"}, 100, None, CTX)
        assert len(tasks["items"]) == 2 * len(QUESTIONS)
        assert all(task["state"]["outcome"]["status"] == "completed" for task in tasks["items"])
    finally:
        await session.close(CTX)
        await storage.close()


def test_the_demo_command_runs_and_points_the_way(tmp_path: Path) -> None:
    store = tmp_path / "demo-store"
    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "demo", str(store)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for words in ("through a pi-durable Session", "head sequence", "durable-log tail", "Try next"):
        assert words in done.stdout
    assert verify(store) is None
