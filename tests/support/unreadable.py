"""A store holding documents whose committed change cannot apply, for the tests of the tools
and pages that read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.delta import PathError
from pi_durable_lmdb.audit.unreadable import UNREADABLE_ERRORS
from pi_durable_lmdb.cli.demo import run_workload
from pi_durable_lmdb.storage import LmdbStorage

BAD_OPS = [["a", ["nope"], "x"]]
WORD = "quagga"
OTHER_FAILURES: dict[str, tuple[list[Any], str]] = {
    "a missing key": (["s", ["a", "b"], 1], "KeyError: 'a'"),
    "a permutation of another length": (
        ["m", ["list"], [0, 0]],
        "TypeError: m permutation is not a bijection",
    ),
    "an unsafe segment": (["s", ["__proto__"], 1], "UnsafePathError: unsafe path segment"),
    "a path into text": (["s", ["text", "x"], 1], "PathError: unresolvable path"),
}
"""The other ways a committed change fails to apply, as the reference's applier fails: one
session document each (``others``: its id -> the error its read raises)."""


async def build_unreadable(path: Path) -> dict[str, Any]:
    """The demo's workload, then a conversation-scoped document and a current-only one whose
    change at sequence ``bad`` cannot apply (``good``: the change before; ``after``: one after)."""

    made = await run_workload(str(path))
    storage = await LmdbStorage.open(path)
    try:
        history, session = await storage.mint_id(), await storage.mint_id()
        others = {await storage.mint_id(): error for _, error in OTHER_FAILURES.values()}
        conversation = {"kind": "conversation", "conversationId": made.root}
        await storage.commit(
            [
                {
                    "type": "document.create",
                    "record": {"id": history, "kind": "plan", "scope": conversation},
                    "content": {"kind": "base", "version": 1, "value": {"text": WORD + " plan"}},
                },
                {
                    "type": "document.create",
                    "record": {"id": session, "kind": "state", "scope": {"kind": "session"}},
                    "content": {"kind": "base", "version": 1, "value": {"text": WORD + " state"}},
                },
                *(
                    {
                        "type": "document.create",
                        "record": {"id": id, "kind": f"other{id}", "scope": {"kind": "session"}},
                        "content": {
                            "kind": "base",
                            "version": 1,
                            "value": {"text": "x", "list": [1, 2]},
                        },
                    }
                    for id in others
                ),
            ],
            CTX,
        )
        good = await storage.commit(
            [{"type": "document.change", "id": history, "content": _delta([["s", ["n"], 1]])}],
            CTX,
        )
        bad = await storage.commit(
            [
                {"type": "document.change", "id": history, "content": _delta(BAD_OPS)},
                {"type": "document.change", "id": session, "content": _delta(BAD_OPS)},
                *(
                    {"type": "document.change", "id": id, "content": _delta([op])}
                    for id, (op, _) in zip(others, OTHER_FAILURES.values(), strict=True)
                ),
            ],
            CTX,
        )
        after = await storage.commit(  # a change after the failing one: still unreadable
            [{"type": "document.change", "id": history, "content": _delta([["s", ["m"], 2]])}],
            CTX,
        )
        for id in (history, session):
            with pytest.raises(PathError, match="unresolvable path"):
                await storage.document(id, "current", CTX)
        for id, error in others.items():
            with pytest.raises(UNREADABLE_ERRORS) as raised:
                await storage.document(id, "current", CTX)
            assert f"{type(raised.value).__name__}: {raised.value}".startswith(error)
        return {
            "root": made.root,
            "history": history,
            "session": session,
            "good": good,
            "bad": bad,
            "after": after,
            "others": others,
        }
    finally:
        await storage.close()


def _delta(ops: list[Any]) -> dict[str, Any]:
    return {"kind": "delta", "version": 1, "ops": ops}
