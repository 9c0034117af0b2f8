"""The shape checks' refusals (``projector._check_shape``) word for word, for every field they name.

The field names are formatted only when a check fails (a commit that passes builds no
message); these pin each message word for word, so no refusal changes its words. Each refused commit leaves the log as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage

_SUB: dict[str, Any] = {"id": 9, "requestId": "r", "type": "input", "status": "queued"}

# name: (one write, the refusal's exact message)
REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "entry value": (
        {"type": "entry", "value": [1]},
        "An entry write's value must be an object, not list",
    ),
    "entry id": (
        {"type": "entry", "value": {"id": 0}},
        "An entry's 'id' must be a positive safe integer, not 0",
    ),
    "entry conversation missing": (
        {"type": "entry", "value": {"id": 7, "kind": "m"}},
        "Entry 7's 'conversationId' must be a positive safe integer, not None",
    ),
    "entry conversation text": (
        {"type": "entry", "value": {"id": 7, "conversationId": "1"}},
        "Entry 7's 'conversationId' must be a positive safe integer, not '1'",
    ),
    "task value": (
        {"type": "task", "value": "t"},
        "A task write's value must be an object, not str",
    ),
    "task id": (
        {"type": "task", "value": {"id": True}},
        "A task's 'id' must be a positive safe integer, not True",
    ),
    "task state": (
        {"type": "task", "value": {"id": 8, "state": "running"}},
        "Task 8's 'state' must be an object, not str",
    ),
    "task status": (
        {"type": "task", "value": {"id": 8, "state": {"status": "flying"}}},
        "Task 8 has an unknown status 'flying'",
    ),
    "submission id": (
        {"type": "submission", "value": {"id": -1}},
        "A submission's 'id' must be a positive safe integer, not -1",
    ),
    "submission conversation": (
        {"type": "submission", "value": _SUB},
        "Submission 9's 'conversationId' must be a positive safe integer, not None",
    ),
    "conversation id": (
        {"type": "conversation", "value": {"id": 2**53}},
        "A conversation's 'id' must be a positive safe integer, not 9007199254740992",
    ),
    "conversation parent": (
        {"type": "conversation", "value": {"id": 3, "parent": 5}},
        "Conversation 3's 'parent' must be an object, not int",
    ),
    "conversation parent at": (
        {"type": "conversation", "value": {"id": 3, "parent": {"conversationId": 1}}},
        "Conversation 3's 'parent.at' must be a positive safe integer, not None",
    ),
    "conversation owner": (
        {"type": "conversation", "value": {"id": 3, "owner": None}},
        "Conversation 3's 'owner' must be an object, not NoneType",
    ),
    "conversation owner task": (
        {"type": "conversation", "value": {"id": 3, "owner": {"conversationId": 1, "taskId": "t"}}},
        "Conversation 3's 'owner.taskId' must be a positive safe integer, not 't'",
    ),
    "document record": (
        {
            "type": "document.create",
            "record": [],
            "content": {"kind": "base", "version": 1, "value": 1},
        },
        "A document write's record must be an object, not list",
    ),
    "document id": (
        {
            "type": "document.create",
            "record": {"id": "x"},
            "content": {"kind": "base", "version": 1, "value": 1},
        },
        "A document's 'id' must be a positive safe integer, not 'x'",
    ),
    "document scope": (
        {
            "type": "document.copy",
            "record": {"id": 7, "kind": "k"},
            "source": {"id": 1, "at": "current"},
        },
        "Document 7's 'scope' must be an object, not NoneType",
    ),
    "document command id": (
        {"type": "document.retire", "id": 0},
        "A document command's 'id' must be a positive safe integer, not 0",
    ),
}


@pytest.mark.parametrize("name", list(REFUSALS))
async def test_a_shape_refusal_says_exactly_what_it_said(tmp_path: Path, name: str) -> None:
    write, message = REFUSALS[name]
    storage = await LmdbStorage.open(str(tmp_path / "store"), durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        with pytest.raises(ValueError) as refused:
            await storage.commit([write], CTX)
        assert str(refused.value) == message
        assert storage.log.head() == 1
    finally:
        await storage.close(CTX)
