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
from pi_durable_lmdb.log import records
from pi_durable_lmdb.projections.tables import CHUNK

from tests.support.compare import outcome

CONVERSATION = {"type": "conversation", "value": {"id": 1}}
LONG = "l" * (CHUNK + 100)
"""Text that makes a document long: its value is kept as bases and deltas, not in its row."""


def create(id: int, value: Any, kind: str = "notes") -> dict[str, Any]:
    return {
        "type": "document.create",
        "record": {
            "id": id,
            "kind": kind,
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


# ── a delta nesting a document deeper than a commit of its value may ───────


def nest(levels: int) -> Any:
    """An object nested ``levels`` deep: ``{"k": {"k": ... {}}}``."""

    value: Any = {}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


def depth(value: Any) -> int:
    """How many containers deep ``value`` nests (0 for a scalar)."""

    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend(
                (child, level + 1) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


@pytest.mark.parametrize("text", ["c", LONG], ids=["short", "long"])
def test_a_delta_nesting_a_document_past_what_a_commit_may_hold_is_refused_and_leaves_the_store(
    tmp_path: Path, text: str
) -> None:
    async def body(pair: Pair) -> None:
        storage = pair.storage
        for writes in [[CONVERSATION], [create(2, {"text": text, "d": {}})]]:
            await storage.commit(writes, CTX)
        await storage.commit([change(2, [["s", ["d"], nest(899)]])], CTX)  # 900 levels
        inner = ["d"] + ["k"] * 898  # the innermost object, 900 levels down
        await storage.commit([change(2, [["s", inner + ["a"], []]])], CTX)  # 901
        too_deep = nest(998)
        with pytest.raises(TypeError) as plain:  # what a commit of such a value raises
            await storage.commit([create(3, too_deep, "plan")], CTX)
        expected = str(plain.value)
        assert "1000 levels" in expected
        before = await storage.document(2, "current", CTX)
        refused = [
            [["s", inner[:-1] + ["x"], nest(900)]],  # 1799 levels
            [["s", inner + ["x"], nest(98)]],  # 998 levels
            [["s", ["n"], 1], ["p", inner + ["a"], 0, 0, [nest(97)]]],  # an array's items
            [["s", inner + ["x"], [nest(97)]]],
        ]
        for ops in refused:
            with pytest.raises(TypeError) as raised:
                await storage.commit([change(2, ops)], CTX)
            assert str(raised.value) == expected, ops
            assert await storage.document(2, "current", CTX) == before
        # as deep as a commit may hold: committed, read back, and a commit of it is accepted
        seq = await storage.commit([change(2, [["s", inner + ["x"], nest(97)]])], CTX)
        assert seq == 5  # the refused commits took no sequence
        await storage.commit([change(2, [["p", inner + ["a"], 0, 0, [nest(96)]]])], CTX)
        after = await storage.document(2, "current", CTX)
        assert depth(after["value"]) == 997 and after["deltasSinceBase"] == 4
        assert depth(after["value"]["d"]) == 996
        await storage.commit([change(2, [["s", ["n"], 1]])], CTX)
        await storage.commit([create(4, after["value"], "plan")], CTX)
        await pair.reopen()
        await pair.storage.rebuild()
        reopened = await pair.storage.document(2, "current", CTX)
        assert depth(reopened["value"]) == 997 and reopened["value"]["n"] == 1
        assert depth((await pair.storage.document(2, 6, CTX))["value"]) == 997
        await pair.storage.commit([change(2, [["d", ["d"]]])], CTX)
        await pair.storage.commit([{"type": "document.retire", "id": 2}], CTX)

    run_pair(tmp_path, body)


# ── a copy from a point that is no sequence of the log ──────────────────────


def copy_of(id: int, source: int, at: Any, conversation: int = 1) -> dict[str, Any]:
    written = create(id, None)
    written.pop("content")
    written["record"]["scope"]["conversationId"] = conversation
    return {**written, "type": "document.copy", "source": {"id": source, "at": at}}


POINTS = [3, 3.5, 4.0, 4.999, 2**64, 2**70, 1e300, True, -1.5, -(2**70), 0.5, "yesterday", None]


@pytest.mark.parametrize("at", POINTS, ids=repr)
def test_a_copy_from_a_point_between_or_past_sequences_reads_as_memory_storage(
    tmp_path: Path, at: Any
) -> None:
    async def body(pair: Pair) -> None:
        for writes in [
            [CONVERSATION],
            [create(2, {"text": "a"})],
            [change(2, [["a", ["text"], "b"]])],
            [change(2, [["a", ["text"], "c"]])],
            [change(2, [["a", ["text"], "d"]])],
            [{"type": "conversation", "value": {"id": 9}}],
        ]:
            ours, theirs = await pair.commit(writes)
            assert ours[0] == theirs[0] == "ok"
        ours, theirs = await pair.commit([copy_of(10, 2, at, conversation=9)])
        assert ours[:2] == theirs[:2]
        await pair.assert_reads_match(10)
        await pair.reopen()
        await pair.assert_reads_match(10)

    run_pair(tmp_path, body)


# ── an integer key set in an object by a delta ──────────────────────────────


@pytest.mark.parametrize("text", ["c", LONG + "\ud800"], ids=["short", "long"])
def test_an_integer_key_set_by_a_delta_fails_the_reads_memory_storage_fails(
    tmp_path: Path, text: str
) -> None:
    """``MemoryStorage`` sets the key (the applier allows it) and raises ``TypeError`` when a
    read copies the value out; once a later op removes the key, the document reads again."""

    async def body(pair: Pair) -> None:
        for writes in [
            [CONVERSATION],
            [create(2, {"text": text, "o": {}, "l": ["\ud800"]})],
            [change(2, [["s", ["o", 5], "five"], ["s", ["o", "5"], "string five"]])],
            [change(2, [["a", ["text"], "x"], ["a", ["o", 5], "!"]])],
            [change(2, [["s", ["l", 0], {"k": {7: 1}}]])],  # refused: a commit holds no such key
            [change(2, [["d", ["o", 5]], ["s", ["o", 6], 1]])],
            [change(2, [["a", ["text"], "y"]])],
            [change(2, [["s", ["o"], {"kept": True}]])],
            [change(2, [["a", ["text"], "z"]])],
            [change(2, [["s", ["n"], 1], ["s", ["o", 1], 1], ["d", ["o", 1]]])],
            [change(2, [["s", [3], 1]])],  # on the root object
            [change(2, [["d", [3]]])],
        ]:
            ours, theirs = await pair.commit(writes)
            assert ours[0] == theirs[0], writes
            await pair.assert_reads_match(2)
        current = await pair.storage.document(2, "current", CTX)
        assert current["value"]["o"] == {"kept": True} and current["value"]["n"] == 1
        await pair.reopen()
        await pair.assert_reads_match(2)
        await pair.commit([change(2, [["s", ["o", 9], 9]])])
        await pair.assert_reads_match(2)
        await pair.reopen()
        await pair.assert_reads_match(2)
        ours, theirs = await pair.commit(
            [
                {
                    "type": "document.change",
                    "id": 2,
                    "content": {"kind": "base", "version": 1, "value": {"b": 1}},
                }
            ]
        )
        assert ours[0] == theirs[0] == "ok"
        await pair.commit([change(2, [["a", ["b"], "x"]])])  # fails on both: a number
        await pair.assert_reads_match(2)

    run_pair(tmp_path, body)


def test_a_copy_of_a_document_holding_an_integer_key_is_refused_as_memory_storage_refuses_it(
    tmp_path: Path,
) -> None:
    """The reference resolves every copy of the batch, then fails copying such a value out
    (``TypeError``); a copy it rejects while resolving is rejected first (``ValueError``)."""

    async def body(pair: Pair) -> None:
        for writes in [
            [CONVERSATION],
            [create(2, {"o": {}})],
            [change(2, [["s", ["o", 5], 1]])],
            [{"type": "conversation", "value": {"id": 9}}],
            [create(3, {"o": {}}, "plan")],
        ]:
            ours, theirs = await pair.commit(writes)
            assert ours[0] == theirs[0] == "ok"
        unknown = copy_of(11, 77, "current", 9)
        unknown["record"]["kind"] = "plan"
        for writes in [
            [copy_of(10, 2, "current", 9)],
            [copy_of(10, 2, 3, 9)],
            [copy_of(10, 2, 2**70, 9)],
            [copy_of(10, 2, 3, 9), unknown],
            [unknown, copy_of(10, 2, 3, 9)],
        ]:
            ours, theirs = await pair.commit(writes)
            assert ours[:2] == theirs[:2], writes
        ours, theirs = await pair.commit([copy_of(10, 2, 2, 9)])  # before the key was set
        assert ours == theirs and ours[0] == "ok"
        await pair.assert_reads_match(10)

    run_pair(tmp_path, body)


@pytest.mark.parametrize("text", ["c", LONG], ids=["short", "long"])
def test_a_too_deep_delta_an_earlier_version_committed_leaves_its_document_broken_not_the_store(
    tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log written before such deltas were refused: the fold marks the document broken (no
    row holds the value), reads raise the commit's ``TypeError``, a base or a retirement ends
    it, and a rebuild folds the same."""

    async def body(pair: Pair) -> None:
        storage = pair.storage
        for writes in [[CONVERSATION], [create(2, {"text": text, "d": {}})]]:
            await storage.commit(writes, CTX)
        await storage.commit([change(2, [["s", ["d"], nest(899)]])], CTX)
        inner = ["d"] + ["k"] * 898
        with monkeypatch.context() as patch:  # as an earlier version committed it
            patch.setattr(records, "check_delta_depth", lambda ops: None)
            await storage.commit([change(2, [["s", inner + ["x"], nest(900)]])], CTX)
        for _ in range(2):
            for at in ("current", 4):
                with pytest.raises(TypeError, match="nests deeper than 1000 levels"):
                    await pair.storage.document(2, at, CTX)
            assert depth((await pair.storage.document(2, 3, CTX))["value"]) == 900
            await pair.reopen()
            await pair.storage.rebuild()
        await pair.storage.commit([change(2, [["s", ["n"], 1]])], CTX)
        rebased = {"type": "document.change", "id": 2}
        rebased["content"] = {"kind": "base", "version": 1, "value": {"text": text}}
        await pair.storage.commit([rebased], CTX)
        assert (await pair.storage.document(2, "current", CTX))["value"] == {"text": text}
        await pair.storage.commit([{"type": "document.retire", "id": 2}], CTX)
        await pair.storage.rebuild()
        assert (await pair.storage.document(2, 6, CTX))["value"] == {"text": text}

    run_pair(tmp_path, body)
