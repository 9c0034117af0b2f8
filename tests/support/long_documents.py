"""Long documents for the tests: values that grow past many of the projections' chunks
(``projections.tables.CHUNK``, a long current value is stored in pieces of that size) through long
histories of every delta op, and a seeded generator of batches over them.

A long document's value is ``{"text": str, "turns": int, "log": [str], "meta": {str: str}}``:
``text`` grows by appends (``["a", ["text"], line]`` with ``["s", ["turns"], n]``, the turn an
agent commits) and is trimmed from its front; ``log`` is spliced, reordered and edited; ``meta``
holds long strings set and deleted; ``r`` replaces the whole value and a base rebases it. Texts
mix ASCII with two-, three- and four-byte UTF-8 characters and lone surrogates, so chunk
boundaries fall inside characters.

``LongDocumentWork`` draws whole batches (appends, every other op, bases, creates, copies from
past points, retirements, and batches rejected after touching a long document), asking
pi-durable's ``MemoryStorage`` (the reference) for the current values it builds ops on.
"""

from __future__ import annotations

import random
from typing import Any, Final

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.delta import apply_immutable
from pi_durable_lmdb.projections.tables import CHUNK

from .compare import REFUSALS

PIECES: Final = (
    list("abcdefghijklmnopqrstuvwxyz      ,.\n") + ["é", "ß", "日", "本", "語", "😀", "𝄞"] * 3
)
"""Characters of a long text: mostly one byte, often two to four (astral) in UTF-8."""

SIZES: Final = (0, 1, 40, 300, 1500, 4000, CHUNK - 1, CHUNK + 7, 2 * CHUNK + 3)
"""Lengths of appended and set texts: empty, short, and about or over a chunk."""


def long_text(rng: random.Random, size: int) -> str:
    """``size`` characters of mixed widths; now and then a lone surrogate."""

    text = "".join(rng.choices(PIECES, k=size))
    if size > 10 and rng.random() < 0.1:
        at = rng.randrange(size)
        text = text[:at] + rng.choice(["\ud800", "\udfff"]) + text[at + 1 :]
    return text


def long_value(rng: random.Random, size: int) -> dict[str, Any]:
    """A fresh long-document value whose ``text`` has ``size`` characters."""

    return {
        "text": long_text(rng, size),
        "turns": 0,
        "log": [long_text(rng, rng.choice(SIZES[:6])) for _ in range(rng.randint(0, 3))],
        "meta": {"a": long_text(rng, rng.choice(SIZES))},
    }


def append_ops(rng: random.Random, value: Any, size: int | None = None) -> list[Any]:
    """One agent turn: append a line to ``text`` and count the turn (or, when ``value`` lost its
    shape, set a fresh ``text``)."""

    size = rng.choice(SIZES[1:6]) if size is None else size
    line = long_text(rng, size)
    turns = value.get("turns") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        return [["s", ["text"], line], ["s", ["turns"], 1]]
    next_turn = turns + 1 if type(turns) is int else 1
    return [["a", ["text"], line], ["s", ["turns"], next_turn]]


OP_KINDS: Final = (
    "append",
    "append long",
    "trim",
    "splice",
    "move",
    "set",
    "delete",
    "append to log",
    "replace",
    "several",
)


def long_ops(rng: random.Random, value: Any, kind: str) -> list[Any]:
    """Ops of ``kind`` (``OP_KINDS``) on a long document's current ``value``; each applies."""

    if not isinstance(value, dict):
        return [["r", long_value(rng, CHUNK + 1)]]
    text = value.get("text")
    log = value.get("log")
    if kind == "append":
        return append_ops(rng, value)
    if kind == "append long":
        return append_ops(rng, value, rng.choice(SIZES[5:]))
    if kind == "trim" and isinstance(text, str):
        return [["t", ["text"], rng.randint(0, min(len(text), 2 * CHUNK + 5))]]
    if kind == "splice" and isinstance(log, list):
        index = rng.randint(0, len(log))
        items = [long_text(rng, rng.choice(SIZES)) for _ in range(rng.randint(0, 2))]
        return [["p", ["log"], index, rng.randint(0, 2), items]]
    if kind == "move" and isinstance(log, list):
        order = list(range(len(log)))
        rng.shuffle(order)
        return [["m", ["log"], order]]
    meta = value.get("meta")
    if kind == "set":
        if isinstance(log, list) and log and rng.random() < 0.5:
            return [["s", ["log", rng.randrange(len(log))], long_text(rng, rng.choice(SIZES))]]
        if not isinstance(meta, dict):
            return [["s", ["meta"], {"a": long_text(rng, rng.choice(SIZES))}]]
        return [["s", ["meta", rng.choice("abc")], long_text(rng, rng.choice(SIZES))]]
    if kind == "delete":
        if isinstance(log, list) and log and rng.random() < 0.5:
            return [["d", ["log", rng.randrange(len(log))]]]
        return [["d", ["meta", rng.choice("abc")] if isinstance(meta, dict) else ["text"]]]
    if kind == "append to log" and isinstance(log, list) and log:
        at = rng.randrange(len(log))
        if isinstance(log[at], str):
            return [["a", ["log", at], long_text(rng, rng.choice(SIZES))]]
    if kind == "replace":
        kept = text[: rng.randint(0, len(text))] if isinstance(text, str) else ""
        replaced = long_value(rng, rng.choice(SIZES[:7]))
        replaced["text"] = kept + replaced["text"]
        return [["r", replaced]]
    if kind == "several":  # each op drawn on the value the ones before it left
        ops = append_ops(rng, value)
        value = apply_immutable(value, ops)
        for other in rng.sample(["trim", "splice", "set", "delete"], 2):
            more = long_ops(rng, value, other)
            value = apply_immutable(value, more)
            ops += more
        return ops
    return append_ops(rng, value)


async def current_value(ref: Any, id: int) -> tuple[Any, int]:
    """The reference's current value and version of document ``id`` (``(None, 1)`` if it has
    none or refuses to read it)."""

    try:
        stored = await ref.document(id, "current", CTX)
    except REFUSALS:
        return None, 1
    return (None, 1) if stored is None else (stored["value"], stored["version"])


class LongDocumentWork:
    """Seeded batches over a few long documents and the conversations they are scoped to.

    ``batch()`` returns a label and the writes; call ``committed(writes, seq)`` after the
    reference accepted them (ids, points and copies are drawn from what committed)."""

    KINDS: Final = (
        ["append"] * 10
        + ["op"] * 5
        + ["base", "create", "copy", "copy", "retire", "entry"]
        + ["rejected"] * 2
    )

    def __init__(self, seed: int, ref: Any) -> None:
        self.rng = random.Random(seed)
        self.ref = ref
        self.next_id = 100
        self.seq = 0
        self.conversations: list[int] = []
        self.documents: dict[int, dict[str, Any]] = {}  # id -> record, points, retired

    def fresh(self) -> int:
        self.next_id += 1
        return self.next_id

    def live(self) -> list[int]:
        return sorted(id for id, doc in self.documents.items() if not doc["retired"])

    def committed(self, writes: list[dict[str, Any]], seq: int) -> None:
        self.seq = seq
        for write in writes:
            kind = write["type"]
            if kind == "conversation":
                self.conversations.append(write["value"]["id"])
            elif kind in ("document.create", "document.copy"):
                self.documents[write["record"]["id"]] = {
                    "record": write["record"],
                    "points": [seq],
                    "retired": False,
                }
            elif kind == "document.change":
                self.documents[write["id"]]["points"].append(seq)
            elif kind == "document.retire":
                self.documents[write["id"]]["retired"] = True
                self.documents[write["id"]]["points"].append(seq)

    async def batch(self) -> tuple[str, list[dict[str, Any]]]:
        rng = self.rng
        if not self.conversations:
            return "conversations", [
                {"type": "conversation", "value": {"id": 1}},
                {"type": "conversation", "value": {"id": 2}},
            ]
        kind = rng.choice(self.KINDS)
        live = self.live()
        if kind == "create" or len(live) < 2:
            return "create", [self.create()]
        id = live[0] if rng.random() < 0.5 else rng.choice(live)  # one long history
        value, version = await current_value(self.ref, id)
        if kind == "append":
            return "append", [self.delta(id, version, append_ops(rng, value))]
        if kind == "op":
            op = rng.choice(OP_KINDS)
            return f"op {op}", [self.delta(id, version, long_ops(rng, value, op))]
        if kind == "base":
            ops = long_ops(rng, value, rng.choice(OP_KINDS))
            rebased = apply_immutable(value, ops) if isinstance(value, dict) else {}
            content = {"kind": "base", "version": rng.choice([1, 2]), "value": rebased}
            return "base", [{"type": "document.change", "id": id, "content": content}]
        if kind == "copy":
            return "copy", self.copy(id)
        if kind == "retire" and len(live) > 2:  # never the one with the long history
            return "retire", [{"type": "document.retire", "id": rng.choice(live[1:])}]
        if kind == "entry":
            entry = {"id": self.fresh(), "conversationId": rng.choice(self.conversations)}
            return "entry", [{"type": "entry", "value": {**entry, "kind": "message"}}]
        return "rejected", await self.rejected(id, value, version)

    @staticmethod
    def delta(id: int, version: int, ops: list[Any]) -> dict[str, Any]:
        content = {"kind": "delta", "version": version, "ops": ops}
        return {"type": "document.change", "id": id, "content": content}

    def create(self) -> dict[str, Any]:
        rng = self.rng
        id = self.fresh()
        history = rng.choice(["rewindable", "rewindable", "latest"])
        forks = ["asOf", "current", "initial"] if history == "rewindable" else ["current"]
        record = {
            "id": id,
            "kind": "notes",
            "scope": {"kind": "conversation", "conversationId": rng.choice(self.conversations)},
            "key": f"k{id}",
            "history": history,
            "fork": rng.choice(forks),
        }
        content = {
            "kind": "base",
            "version": 1,
            "value": long_value(rng, rng.choice([0, 100, CHUNK + 1, 3 * CHUNK])),
        }
        return {"type": "document.create", "record": record, "content": content}

    def copy(self, source: int) -> list[dict[str, Any]]:
        """A fork conversation and a copy of ``source`` into it, from a past point or current."""

        rng = self.rng
        points = self.documents[source]["points"]
        at: Any = rng.choice(
            ["current", rng.choice(points), rng.randint(points[0], max(points[0], self.seq))]
        )
        conversation = self.fresh()
        record = {**self.documents[source]["record"], "id": self.fresh()}
        record["scope"] = {"kind": "conversation", "conversationId": conversation}
        return [
            {"type": "conversation", "value": {"id": conversation}},
            {"type": "document.copy", "record": record, "source": {"id": source, "at": at}},
        ]

    async def rejected(self, id: int, value: Any, version: int) -> list[dict[str, Any]]:
        """A long append to ``id`` (and maybe to another long document), then a write that makes
        the batch invalid: the store must be left as it was."""

        rng = self.rng
        writes = [self.delta(id, version, append_ops(rng, value, rng.choice(SIZES[4:])))]
        others = [d for d in self.live() if d != id]
        rng.shuffle(others)
        if len(others) > 1 and rng.random() < 0.5:
            other = others.pop()
            other_version = (await current_value(self.ref, other))[1]
            text = long_text(rng, CHUNK + 9)
            writes.append(self.delta(other, other_version, [["a", ["text"], text]]))
        poison = rng.choice(["root again", "second change", "unknown", "version"])
        if poison == "version" and others:  # a version change without a base
            other = others.pop()
            other_version = (await current_value(self.ref, other))[1]
            writes.append(self.delta(other, other_version + 7, []))
        elif poison == "second change":
            writes.append(self.delta(id, version, [["a", ["text"], "x"]]))
        elif poison == "unknown":
            writes.append({"type": "document.retire", "id": 10**9})
        else:
            writes.append({"type": "conversation", "value": {"id": 1}})
        return writes


__all__ = [
    "OP_KINDS",
    "PIECES",
    "SIZES",
    "LongDocumentWork",
    "append_ops",
    "current_value",
    "long_ops",
    "long_text",
    "long_value",
]
