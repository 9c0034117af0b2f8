"""Every program in ``examples/`` runs as its docs say (``python examples/NAME.py PATH``), in a
process of its own, from outside the repository, on a store that has something to show: a user
copies these files, so each must work without the tests' imports around it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from pi_durable_lmdb.storage import LmdbStorage

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path.stem for path in (ROOT / "examples").glob("*.py") if path.stem != "__init__")

EXPECTED = {
    "entries_per_conversation": ["the new conversation: 2 entries"],
    "errors": [
        "a second writer: WriterLockedError",
        "an entry in no conversation: ValueError",
        "snapshot_as_of of a latest document: TypeError",
        "its value at an earlier sequence: StorageRequestError",
        "a malformed write: ValueError",
        "a commit through a view: PermissionError",
        "that Session afterwards: SessionFailed",
        "a read after close: StoreClosedError",
    ],
    "fork": [
        "the fork sees: ['What is stored?', 'How is it rebuilt?']",
        "its notes hold 2 answers, the root's 3",
        "the root's notes at its first question: ['answer to What is stored?']",
    ],
    "history": [
        "as of the first turn: 1 entry",
        "its notes then: {'answers': [1]}",
        "a commit of 2 writes: entry, document.change",
        "a commit of 2 writes: entry, document.change",
        "the notes' stored versions: ['base', 'delta', 'delta']",
        "the notes at their second version: {'answers': [1, 2]}",
    ],
    "host": ["conversation 1: ['Hello to you'], log head 11"],  # the seeded root, one more commit
    "task_outcomes": [
        "       2  fetch  completed",
        "       1  fetch  failed",
        "       1  sum  completed",
    ],
}
"""What each example prints on the store of ``_seeded``, line by line; a new example adds its own."""


async def _seeded(path: Path) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for id, kind, outcome in ((2, "fetch", "completed"), (3, "fetch", "failed"), (4, "sum", "completed"), (5, "fetch", "completed")):
            task = {"id": id, "conversationId": 1, "kind": kind, "version": 1, "input": None,
                    "background": False, "abortRequested": False, "state": {"status": "running"}}
            await storage.commit([{"type": "task", "value": task}], CTX)
            settled = {**task, "state": {"status": "terminal", "outcome": {"status": outcome}}}
            await storage.commit([{"type": "task", "value": settled}], CTX)
        running = {"id": 6, "conversationId": 1, "kind": "sum", "version": 1, "input": None,
                   "background": False, "abortRequested": False, "state": {"status": "running"}}
        await storage.commit([{"type": "task", "value": running}], CTX)  # not settled: not counted
    finally:
        await storage.close()


def test_every_example_has_its_expected_output() -> None:
    assert EXAMPLES and sorted(EXPECTED) == EXAMPLES


@pytest.mark.parametrize("name", EXAMPLES)
async def test_the_example_runs_as_a_program(name: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    await _seeded(store)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), str(store)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == EXPECTED[name], done.stdout
