"""The power-loss explorer's long-document workload (``writer.py --workload longdocs``) and the
check every crash state of it gets (``check.py``).

``LongDocs`` commits mostly agent turns to documents many chunks long (``["a", ["text"], line]``
with ``["s", ["turns"], n]``, lines up to two chunks, one- to four-byte UTF-8 characters and, in
``power`` durability, incompressible letters), and now and then every other op on them (trims
from the front, splices, moves, sets and deletes of long strings, ``r``), bases that rebase
them, new long documents, copies from past points into fork conversations, retirements, and
entries. The store is rebuilt, reopened and (in ``power`` mode) has its journal replayed as in
the ``single`` workload.

``documents_problems``: what a crash state's documents read back must equal. pi-durable's
``MemoryStorage`` replays the state's log (each batch checked against the acknowledgements
already); every document the log names must then read the same on the store at ``current``
and at every sequence from the one before its creation to the head, and so must its address.
"""

from __future__ import annotations

import random
from typing import Any, Final

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.delta import apply_immutable
from pi_durable.errors import StorageRequestError
from pi_durable_lmdb.projections.tables import CHUNK

from tools.harness.powerloss.workload import canonical
from tools.harness.powerloss.writer import Workload

WIDE: Final = "éß日本語😀𝄞"
"""Characters of two to four bytes in UTF-8, so chunk boundaries fall inside characters."""
SIZES: Final = (40, 300, 1500, 4000, CHUNK + 7)


def long_text(rng: random.Random, size: int, noise: bool) -> str:
    """``size`` characters: random letters and wide characters (``noise``: the log stores records
    compressed and a power writer's journal must still fill its segments), else mostly one."""

    if noise:
        return "".join(rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGH \n" + WIDE, k=size))
    return ("lé😀" * (size // 3 + 1))[:size]


class LongDocs(Workload):
    """Batches over a few long documents; ops are built on the values the store reads back (the
    check compares every read with the reference, so a wrong read cannot hide there)."""

    KINDS = ["turn"] * 8 + ["op"] * 3 + ["base", "create", "copy", "retire", "entry"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.points: dict[int, list[int]] = {}  # document -> sequences that changed it
        self.head = 0

    async def commit(self, writes: list[dict[str, Any]]) -> int:
        seq: int = await super().commit(writes)
        self.head = seq
        for write in writes:
            id = write["record"]["id"] if "record" in write else write.get("id")
            if write["type"].startswith("document."):
                self.points.setdefault(id, []).append(seq)
        return seq

    async def batch(self) -> list[dict[str, Any]]:
        rng = self.rng
        if not self.conversations:
            return [{"type": "conversation", "value": {"id": await self.mint()}}]
        live = sorted(self.documents)
        kind = rng.choice(self.KINDS)
        if kind == "create" or len(live) < 2:
            return [await self._long_create()]
        if kind == "entry":
            return await self._entry(set(), [])
        if kind == "retire" and len(live) > 3:
            return [{"type": "document.retire", "id": rng.choice(live[1:])}]
        if kind == "copy":
            return await self._long_copy(rng.choice(live))
        id = live[0] if rng.random() < 0.6 else rng.choice(live)  # one long history
        stored = await self.storage.document(id, "current", CTX)
        value, version = stored["value"], stored["version"]
        if kind == "base":
            rebased = apply_immutable(value, self._ops(value, rng.choice(["trim", "set", "turn"])))
            content = {"kind": "base", "version": version + rng.choice([0, 1]), "value": rebased}
        else:
            op = "turn" if kind == "turn" else rng.choice(["trim", "splice", "move", "set", "r"])
            content = {"kind": "delta", "version": version, "ops": self._ops(value, op)}
        return [{"type": "document.change", "id": id, "content": content}]

    def _ops(self, value: Any, kind: str) -> list[Any]:
        rng, noise = self.rng, self.noise
        if kind == "trim":
            return [["t", ["text"], rng.randint(0, min(len(value["text"]), 2 * CHUNK))]]
        if kind == "splice":
            at = rng.randint(0, len(value["log"]))
            items = [long_text(rng, rng.choice(SIZES), noise) for _ in range(rng.randint(0, 2))]
            return [["p", ["log"], at, rng.randint(0, 1), items]]
        if kind == "move":
            order = list(range(len(value["log"])))
            rng.shuffle(order)
            return [["m", ["log"], order]]
        if kind == "set":
            key = rng.choice("ab")
            if rng.random() < 0.3:
                return [["d", ["meta", key]]]
            return [["s", ["meta", key], long_text(rng, rng.choice(SIZES), noise)]]
        if kind == "r":
            kept = value["text"][: rng.randint(0, len(value["text"]))]
            return [["r", {**value, "text": kept, "meta": {}}]]
        line = long_text(rng, rng.choice(SIZES) if rng.random() < 0.8 else 2 * CHUNK, noise)
        return [["a", ["text"], line], ["s", ["turns"], value["turns"] + 1]]

    async def _long_create(self) -> dict[str, Any]:
        id = await self.mint()
        history = self.rng.choice(["rewindable", "rewindable", "latest"])
        if not self.documents:
            history = "rewindable"  # the first, with the long history, keeps its past
        record = {
            "id": id,
            "kind": "notes",
            "scope": {
                "kind": "conversation",
                "conversationId": self.rng.choice(self.conversations),
            },
            "key": f"k{id}",
            "history": history,
            "fork": "asOf" if history == "rewindable" else "current",
        }
        value = {
            "text": long_text(self.rng, self.rng.choice([100, CHUNK + 1, 2 * CHUNK]), self.noise),
            "turns": 0,
            "log": [long_text(self.rng, 300, self.noise)],
            "meta": {},
        }
        content = {"kind": "base", "version": 1, "value": value}
        return {"type": "document.create", "record": record, "content": content}

    async def _long_copy(self, source: int) -> list[dict[str, Any]]:
        """A fork conversation and a copy of ``source`` into it, from a past point when the
        source keeps its history."""

        record = dict(self.documents[source]["record"])
        at: Any = "current"
        if record["history"] == "rewindable":
            at = self.rng.choice([*self.points[source], self.head])
        fork = await self.mint()
        record.update(id=await self.mint(), scope={"kind": "conversation", "conversationId": fork})
        return [
            {"type": "conversation", "value": {"id": fork}},
            {"type": "document.copy", "record": record, "source": {"id": source, "at": at}},
        ]


async def documents_problems(storage: Any, batches: list[list[dict[str, Any]]]) -> list[str]:
    """Where the store's documents read other than the reference's after ``batches`` (the log of
    the state, in order: sequence ``n`` is ``batches[n - 1]``)."""

    from pi_durable.storage.memory import MemoryStorage

    ref = MemoryStorage()
    created: dict[int, tuple[int, dict[str, Any]]] = {}  # document -> (sequence, address)
    for seq, writes in enumerate(batches, 1):
        try:
            got = await ref.commit(writes, CTX)
        except Exception as error:
            return [f"REFERENCE refused sequence {seq}: {type(error).__name__}: {error}"]
        if got != seq:
            return [f"REFERENCE numbered sequence {seq} as {got}"]
        for write in writes:
            if write["type"] in ("document.create", "document.copy"):
                record = write["record"]
                address = {k: v for k, v in record.items() if k in ("kind", "scope", "key")}
                created[record["id"]] = (seq, address)
    problems: list[str] = []
    head = len(batches)
    for id, (first, address) in sorted(created.items()):
        for at in ["current", *range(max(first - 1, 1), head + 1)]:
            for method, args in (("document", (id, at)), ("find_document", (address, at))):
                mine = await _outcome(getattr(storage, method)(*args, CTX))
                theirs = await _outcome(getattr(ref, method)(*args, CTX))
                if mine != theirs:
                    problems.append(
                        f"DOCUMENT: {method}{args} reads {mine[:300]}, the reference {theirs[:300]}"
                    )
                    if len(problems) >= 5:
                        return problems
    return problems


async def _outcome(call: Any) -> str:
    """A read's answer as one comparable string: its result, or that it raised and whether as a
    refused request (the messages of the two stores' errors may differ)."""

    try:
        return canonical(await call)
    except Exception as error:
        return f"raised ({'request' if isinstance(error, StorageRequestError) else 'other'})"


__all__ = [
    "LongDocs",
    "documents_problems",
    "long_text",
]
