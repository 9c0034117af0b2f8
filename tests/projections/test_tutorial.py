"""docs/projections.md: the example it includes is the file in examples/, and the schema change it
walks through does what it says (version 1 serves while version 2 is built, then version 2)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import ProjectionNotReady
from pi_durable_lmdb.storage import LmdbStorage

from examples.task_outcomes import TaskOutcomes, TaskOutcomesV2, outcome_counts

ROOT = Path(__file__).resolve().parents[2]


def test_the_tutorial_includes_the_example_as_it_is() -> None:
    doc = (ROOT / "docs" / "projections.md").read_text()
    blocks = re.findall(r"<!-- include: (\S+) -->\n```python\n(.*?)```\n", doc, re.S)
    assert [name for name, _ in blocks] == ["examples/task_outcomes.py"]
    assert blocks[0][1] == (ROOT / "examples" / "task_outcomes.py").read_text()


async def _settle(
    storage: LmdbStorage, id: int, conversation: int, kind: str, outcome: str
) -> None:
    task = {
        "id": id,
        "conversationId": conversation,
        "kind": kind,
        "version": 1,
        "input": None,
        "background": False,
        "abortRequested": False,
        "state": {"status": "running"},
    }
    await storage.commit([{"type": "task", "value": task}], CTX)
    settled = {**task, "state": {"status": "terminal", "outcome": {"status": outcome}}}
    await storage.commit([{"type": "task", "value": settled}], CTX)
    await storage.commit([{"type": "task", "value": settled}], CTX)  # rewritten: counted once


async def test_the_tutorial_schema_change(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process", projections=[TaskOutcomes()])
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await _settle(storage, 2, 1, "fetch", "completed")
        owned = {"id": 3, "owner": {"kind": "task", "taskId": 2, "conversationId": 1}}
        await storage.commit([{"type": "conversation", "value": owned}], CTX)
        await _settle(storage, 4, 3, "fetch", "failed")
        await _settle(storage, 5, 1, "sum", "completed")
        await storage.projections.wait(storage.log.head())
        assert outcome_counts(storage.projections) == {
            ("fetch", "completed"): 1,
            ("fetch", "failed"): 1,
            ("sum", "completed"): 1,
        }
    finally:
        await storage.close()
    storage = await LmdbStorage.open(path, durability="process", projections=[TaskOutcomesV2()])
    try:
        with storage.projections.read("task_outcomes") as tables:
            assert tables.version in (1, 2)
        # Version 2 is refused while version 1 is served; the rebuild may swap at any moment, so
        # a read of version 2 that is not refused must find the swap done.
        try:
            with storage.projections.read("task_outcomes", version=2):
                pass
        except ProjectionNotReady:
            pass
        else:
            assert storage.projections.status()["task_outcomes"].version == 2
        await asyncio.wait_for(storage.projections.wait(storage.log.head()), 30)
        with storage.projections.read("task_outcomes", version=2) as tables:
            assert tables.folded_seq == storage.log.head()
        assert outcome_counts(storage.projections, "by_conversation") == {
            ("top-level", "completed"): 2,
            ("sub-agent", "failed"): 1,
        }
    finally:
        await storage.close()
