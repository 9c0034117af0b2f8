"""Deltas at the edges of what pi-durable's ``MemoryStorage`` does with them, committed to both
stores and read back from both: short documents (kept whole in their row) and long ones (over
``tables.CHUNK``: bases, deltas and snapshots, the writer's cache, a replay after a reopen)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.projections.tables import CHUNK

from tests.support.compare import outcome

CONVERSATION = {"type": "conversation", "value": {"id": 1}}
LONG = "l" * (CHUNK + 100)
"""Text that makes a document long: its value is kept as bases and deltas, not in its row."""


def create(id: int, value: Any) -> dict[str, Any]:
    return {
        "type": "document.create",
        "record": {
            "id": id,
            "kind": "notes",
            "scope": {"kind": "conversation", "conversationId": 1},
            "history": "rewindable",
            "fork": "asOf",
        },
        "content": {"kind": "base", "version": 1, "value": value},
    }


def change(id: int, ops: list[Any]) -> dict[str, Any]:
    return {
        "type": "document.change",
        "id": id,
        "content": {"kind": "delta", "version": 1, "ops": ops},
    }


class Pair:
    """An ``LmdbStorage`` at ``path`` and a ``MemoryStorage`` given the same commits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.memory = MemoryStorage()
        self.storage: Any = None
        self.seqs: list[int] = []

    async def open(self) -> None:
        self.storage = await LmdbStorage.open(self.path, durability="process")

    async def close(self) -> None:
        await self.storage.close()

    async def reopen(self) -> None:
        await self.close()
        await self.open()

    async def commit(self, writes: list[dict[str, Any]]) -> tuple[Any, Any]:
        """Both stores' outcomes (a sequence or the error raised)."""

        ours = await outcome(self.storage.commit(writes, CTX))
        theirs = await outcome(self.memory.commit(writes, CTX))
        if ours[0] == "ok":
            self.seqs.append(ours[1])
        return ours, theirs

    async def reads(self, id: int) -> list[tuple[Any, Any, Any]]:
        """``(point, ours, theirs)`` for the document's current value and every past point."""

        found = []
        for at in ["current", *self.seqs]:
            ours = await outcome(self.storage.document(id, at, CTX))
            theirs = await outcome(self.memory.document(id, at, CTX))
            found.append((at, ours, theirs))
        return found

    async def assert_reads_match(self, id: int) -> None:
        for at, ours, theirs in await self.reads(id):
            assert ours == theirs, at


def run_pair(tmp_path: Path, body: Any) -> None:
    async def main() -> None:
        pair = Pair(tmp_path / "store")
        await pair.open()
        try:
            await body(pair)
        finally:
            await pair.close()

    asyncio.run(main())


# ── appends pending on an array element, then an element before it deleted ──


@pytest.mark.parametrize("text", ["c", LONG], ids=["short", "long"])
def test_appends_to_an_array_element_then_a_delete_before_it_read_as_memory_storage(
    tmp_path: Path, text: str
) -> None:
    async def body(pair: Pair) -> None:
        value = {"items": [{"text": "a"}, {"text": "b"}, {"text": text}], "n": 0}
        batches = [
            [CONVERSATION],
            [create(2, value)],
            [change(2, [["a", ["items", 2, "text"], "x"]])],
            [change(2, [["a", ["items", 2, "text"], "y"], ["a", ["items", 2, "text"], "z"]])],
            [change(2, [["d", ["items", 0]]])],
            [change(2, [["s", ["n"], 1]])],
            [change(2, [["a", ["items", 1, "text"], "w"]])],
        ]
        for writes in batches:
            ours, theirs = await pair.commit(writes)
            assert ours[0] == theirs[0] == "ok"
            await pair.assert_reads_match(2)
        current = (await pair.storage.document(2, "current", CTX))["value"]
        assert current["items"][1]["text"] == text + "xyzw" and len(current["items"]) == 2
        await pair.reopen()  # a cold cache: the value replayed from the store
        await pair.assert_reads_match(2)
        assert (await pair.commit([change(2, [["s", ["n"], 2]])]))[0][0] == "ok"
        await pair.assert_reads_match(2)

    run_pair(tmp_path, body)
