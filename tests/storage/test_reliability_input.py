"""Reliability, bad input, against real stores (no mocks): malformed commits and reads
are refused with a clear error and change nothing; big, deep and huge-integer values read back.

``docs/reliability.md`` says what each of these promises. Known bugs are ``xfail(strict=True)``
with a reason starting "BUG": they turn into failures the day the bug is fixed, as a reminder.
"""

from __future__ import annotations

import math
import operator
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log import codec
from pi_durable_lmdb.projections import StorageRequestError
from pi_durable_lmdb.storage import LmdbStorage

from ..support.reliability_helpers import CHILD_ENV, _cyclic, fingerprint, nest, seeded, task

# ── 2. bad input ──────────────────────────────────────────────────────────────

ENTRY = {"id": 7, "conversationId": 1, "kind": "message"}

# name: (writes, exception type, words the message must contain)
BAD_COMMITS: dict[str, tuple[Any, type[BaseException], list[str]]] = {
    "unknown write type": (
        [{"type": "entry.delete", "id": 2}],
        ValueError,
        ["Invalid storage write", "entry.delete", "type"],
    ),
    "missing type": ([{"value": ENTRY}], ValueError, ["Invalid storage write", "type"]),
    "missing value": ([{"type": "entry"}], ValueError, ["missing required field", "value"]),
    "missing content": (
        [
            {
                "type": "document.create",
                "record": {"id": 7, "kind": "k", "scope": {"kind": "session"}},
            }
        ],
        ValueError,
        ["missing required field", "content"],
    ),
    "unknown field": (
        [{"type": "entry", "value": ENTRY, "extra": 1}],
        ValueError,
        ["unknown field", "extra"],
    ),
    "mistyped document id": (
        [{"type": "document.retire", "id": "4"}],
        ValueError,
        ["Expected `int`", "got `str`", "id"],
    ),
    "mistyped content version": (
        [
            {
                "type": "document.change",
                "id": 4,
                "content": {"kind": "base", "version": "1", "value": 1},
            }
        ],
        ValueError,
        ["Expected `int`", "version"],
    ),
    "unknown content kind": (
        [
            {
                "type": "document.change",
                "id": 4,
                "content": {"kind": "zip", "version": 1, "value": 1},
            }
        ],
        ValueError,
        ["zip", "kind"],
    ),
    "bad copy point": (
        [
            {
                "type": "document.copy",
                "record": {
                    "id": 7,
                    "kind": "plan",
                    "scope": {"kind": "conversation", "conversationId": 1},
                },
                "source": {"id": 5, "at": "yesterday"},
            }
        ],
        ValueError,
        ["yesterday", "source.at"],
    ),
    "entry without id": (
        [{"type": "entry", "value": {"conversationId": 1}}],
        ValueError,
        ["entry", "'id'", "positive safe integer", "None"],
    ),
    "entry value not an object": (
        [{"type": "entry", "value": [1, 2]}],
        ValueError,
        ["entry", "must be an object", "list"],
    ),
    "string id": (
        [{"type": "entry", "value": {**ENTRY, "id": "7"}}],
        ValueError,
        ["positive safe integer", "'7'"],
    ),
    "bool id": (
        [{"type": "entry", "value": {**ENTRY, "id": True}}],
        ValueError,
        ["positive safe integer", "True"],
    ),
    "float id": (
        [{"type": "entry", "value": {**ENTRY, "id": 7.0}}],
        ValueError,
        ["positive safe integer", "7.0"],
    ),
    "zero id": (
        [{"type": "entry", "value": {**ENTRY, "id": 0}}],
        ValueError,
        ["positive safe integer", "0"],
    ),
    "id 2**53": (
        [{"type": "entry", "value": {**ENTRY, "id": 2**53}}],
        ValueError,
        ["positive safe integer", str(2**53)],
    ),
    "id 2**64": (
        [{"type": "entry", "value": {**ENTRY, "id": 2**64}}],
        ValueError,
        ["positive safe integer", str(2**64)],
    ),
    "id -2**64": (
        [{"type": "entry", "value": {**ENTRY, "id": -(2**64)}}],
        ValueError,
        ["positive safe integer", str(-(2**64))],
    ),
    "NaN": (
        [{"type": "entry", "value": {**ENTRY, "x": math.nan}}],
        TypeError,
        ["non-finite", "strict JSON"],
    ),
    "inf": (
        [{"type": "entry", "value": {**ENTRY, "x": math.inf}}],
        TypeError,
        ["non-finite", "strict JSON"],
    ),
    "-inf in a document": (
        [
            {
                "type": "document.change",
                "id": 4,
                "content": {"kind": "base", "version": 1, "value": [-math.inf]},
            }
        ],
        TypeError,
        ["non-finite"],
    ),
    "int key": (
        [{"type": "entry", "value": {**ENTRY, "data": {1: "x"}}}],
        TypeError,
        ["string keys", "strict JSON"],
    ),
    "tuple key": (
        [{"type": "entry", "value": {**ENTRY, "data": {(1, 2): "x"}}}],
        TypeError,
        ["string keys"],
    ),
    "cycle through a dict": ([{"type": "entry", "value": _cyclic()}], TypeError, ["cycles"]),
    "cycle through a list": (
        [
            {
                "type": "entry",
                "value": {**ENTRY, "data": (lambda items: (items.append(items), items)[1])([])},
            }
        ],
        TypeError,
        ["cycles"],
    ),
    "10,000-deep lists": (
        [{"type": "entry", "value": {**ENTRY, "data": nest(10_000)}}],
        TypeError,
        ["deeper than 1000"],
    ),
    "10,000-deep objects": (
        [{"type": "entry", "value": {**ENTRY, "data": nest(10_000, "dict")}}],
        TypeError,
        ["deeper than 1000"],
    ),
    "a set": ([{"type": "entry", "value": {**ENTRY, "data": {1, 2}}}], TypeError, ["non-JSON set"]),
    "bytes": ([{"type": "entry", "value": {**ENTRY, "data": b"x"}}], TypeError, ["non-JSON bytes"]),
    "an object": (
        [{"type": "entry", "value": {**ENTRY, "data": object()}}],
        TypeError,
        ["non-JSON object"],
    ),
    "writes is a string": ("entry", ValueError, ["Expected `object`", "str"]),
    "writes is None": (None, TypeError, ["NoneType", "not iterable"]),
    "entry on a task's id": (
        [{"type": "entry", "value": {**ENTRY, "id": 3}}],
        ValueError,
        ["ID 3 already belongs to task"],
    ),
    "conversation on an entry's id": (
        [{"type": "conversation", "value": {"id": 2}}],
        ValueError,
        ["ID 2 already belongs to entry"],
    ),
    "task on a conversation's id": (
        [task(1)],
        ValueError,
        ["ID 1 already belongs to conversation"],
    ),
    "submission on a document's id": (
        [{"type": "submission", "value": {"id": 4, "conversationId": 1, "status": "queued"}}],
        ValueError,
        ["ID 4 already belongs to document"],
    ),
    "change of a task's id": (
        [
            {
                "type": "document.change",
                "id": 3,
                "content": {"kind": "base", "version": 1, "value": 1},
            }
        ],
        ValueError,
        ["Unknown document: 3"],
    ),
    "retire of an entry's id": (
        [{"type": "document.retire", "id": 2}],
        ValueError,
        ["Unknown document: 2"],
    ),
    "id written twice": (
        [{"type": "entry", "value": ENTRY}, {"type": "entry", "value": ENTRY}],
        ValueError,
        ["ID 7 is written more than once"],
    ),
    "unknown task status": (
        [task(8, status="exploded")],
        ValueError,
        ["unknown status", "exploded"],
    ),
    "delta across versions": (
        [
            {
                "type": "document.change",
                "id": 4,
                "content": {"kind": "delta", "version": 2, "ops": []},
            }
        ],
        ValueError,
        ["version transition requires a base"],
    ),
    "copy of an unknown document": (
        [
            {
                "type": "document.copy",
                "record": {
                    "id": 7,
                    "kind": "plan",
                    "scope": {"kind": "conversation", "conversationId": 1},
                },
                "source": {"id": 99, "at": "current"},
            }
        ],
        ValueError,
        ["Document copy 7 was rejected"],
    ),
    "second live document at an address": (
        [
            {
                "type": "document.create",
                "record": {"id": 7, "kind": "notes", "scope": {"kind": "session"}},
                "content": {"kind": "base", "version": 1, "value": 1},
            }
        ],
        ValueError,
        ["already has a current incarnation"],
    ),
    "document without a scope": (
        [
            {
                "type": "document.create",
                "record": {"id": 7, "kind": "notes"},
                "content": {"kind": "base", "version": 1, "value": 1},
            }
        ],
        ValueError,
        ["Document 7", "'scope'"],
    ),
    "a good write then a bad one": (
        [
            {"type": "entry", "value": ENTRY},
            {"type": "entry", "value": {"id": 8, "conversationId": 1, "x": math.nan}},
        ],
        TypeError,
        ["non-finite"],
    ),
    "a good write then a rejected one": (
        [{"type": "entry", "value": ENTRY}, {"type": "document.retire", "id": 99}],
        ValueError,
        ["Unknown document: 99"],
    ),
}

# name: (call on the storage, exception type, words)
BAD_READS: dict[str, tuple[Callable[[LmdbStorage], Any], type[BaseException], list[str]]] = {
    "unknown scan order": (
        lambda s: s.scan_tasks({"order": "sideways"}, 10, None, CTX),
        StorageRequestError,
        ["Invalid scan order", "sideways"],
    ),
    "unknown entry scan order": (
        lambda s: s.scan_entries({"conversationId": 1, "order": "up"}, 10, None, CTX),
        StorageRequestError,
        ["Invalid scan order", "up"],
    ),
    "cursor with a string position": (
        lambda s: s.scan_tasks({}, 10, {"after": "x"}, CTX),
        StorageRequestError,
        ["Invalid storage cursor"],
    ),
    "cursor with a huge position": (
        lambda s: s.scan_conversations({}, 10, {"after": 2**64}, CTX),
        StorageRequestError,
        ["Invalid storage cursor"],
    ),
    "cursor with an unknown order": (
        lambda s: s.scan_submissions({}, 10, {"after": 1, "order": "sideways"}, CTX),
        StorageRequestError,
        ["Invalid storage cursor"],
    ),
    "cursor of the other order": (
        lambda s: s.scan_tasks(
            {"order": "descending"}, 10, {"after": 1, "order": "ascending"}, CTX
        ),
        StorageRequestError,
        ["cursor continues a ascending scan", "descending"],
    ),
    "document cursor below 1": (
        lambda s: s.scan_documents(
            {"scope": {"kind": "session"}, "at": "current"}, 10, {"after": -1}, CTX
        ),
        TypeError,
        ["-1 is not a positive ID"],
    ),
    "entries of an unknown conversation": (
        lambda s: s.scan_entries({"conversationId": 999}, 10, None, CTX),
        StorageRequestError,
        ["Unknown conversation: 999"],
    ),
    "head marker of an unknown conversation": (
        lambda s: s.find_latest_head_marker(999, None, CTX),
        StorageRequestError,
        ["Unknown conversation: 999"],
    ),
    "entry through an unknown conversation": (
        lambda s: s.entry(999, 2, CTX),
        StorageRequestError,
        ["Unknown conversation: 999"],
    ),
    "entry by a string id": (lambda s: s.entry("2", CTX), TypeError, ["'2' is not a positive ID"]),
    "history of a current-only document": (
        lambda s: s.document(4, 1, CTX),
        StorageRequestError,
        ["Document 4 does not retain historical content"],
    ),
    "as_of an uncommitted sequence": (lambda s: s.as_of(10**6), ValueError, ["as_of()", "1000000"]),
}


@pytest.mark.parametrize("name", list(BAD_COMMITS))
async def test_bad_commit_is_refused_and_changes_nothing(tmp_path: Path, name: str) -> None:
    writes, error, words = BAD_COMMITS[name]
    storage = await seeded(tmp_path / "store")
    try:
        before = fingerprint(storage)
        with pytest.raises(error) as caught:
            await storage.commit(writes, CTX)
        message = str(caught.value)
        missing = [word for word in words if word not in message]
        assert not missing, f"{name}: {message!r} does not say {missing}"
        assert fingerprint(storage) == before, f"{name}: the store changed"
        # the same storage keeps serving commits
        seq = await storage.commit(
            [{"type": "entry", "value": {"id": 100, "conversationId": 1, "after": name}}], CTX
        )
        assert seq == before[0] + 1
        assert (await storage.entry(100)) == {
            "entry": {"id": 100, "conversationId": 1, "after": name},
            "commitSeq": seq,
        }
    finally:
        await storage.close()


@pytest.mark.parametrize("name", list(BAD_READS))
async def test_bad_read_is_refused_and_changes_nothing(tmp_path: Path, name: str) -> None:
    call, error, words = BAD_READS[name]
    storage = await seeded(tmp_path / "store")
    try:
        before = fingerprint(storage)
        with pytest.raises(error) as caught:
            await call(storage)
        message = str(caught.value)
        assert all(word in message for word in words), f"{name}: {message!r} does not say {words}"
        assert fingerprint(storage) == before
        assert (
            await storage.commit(
                [{"type": "entry", "value": {"id": 100, "conversationId": 1}}], CTX
            )
            == before[0] + 1
        )
    finally:
        await storage.close()


async def test_reads_of_ids_that_are_not_there_answer_none(tmp_path: Path) -> None:
    storage = await seeded(tmp_path / "store")
    try:
        before = fingerprint(storage)
        assert await storage.task(2**80, CTX) is None  # beyond the key space
        assert await storage.task("3", CTX) is None  # a string never equals a stored id
        assert await storage.task(2, CTX) is None  # an entry's id
        assert await storage.conversation(3, CTX) is None  # a task's id
        assert await storage.document(3, "current", CTX) is None
        assert await storage.submission_by_request(999, "r1", CTX) is None
        assert fingerprint(storage) == before
    finally:
        await storage.close()


@pytest.mark.slow
async def test_big_values_commit_and_read_back(tmp_path: Path) -> None:
    """Values beyond 64-bit integers and a 50 MB string are valid JSON: they commit and come
    back exactly (the timing is printed: ``pytest -s``)."""

    storage = await seeded(tmp_path / "store")
    try:
        big = {
            "id": 7,
            "conversationId": 1,
            "big": 2**64 + 1,
            "small": -(2**64) - 5,
            "long": 10**4000,
        }
        seq = await storage.commit([{"type": "entry", "value": big}], CTX)
        assert await storage.entry(7) == {"entry": big, "commitSeq": seq}
        text = "0123456789abcdef" * (50 * 1024 * 1024 // 16)
        started = time.monotonic()
        seq = await storage.commit(
            [{"type": "entry", "value": {"id": 8, "conversationId": 1, "text": text}}], CTX
        )
        committed = time.monotonic() - started
        started = time.monotonic()
        row = await storage.entry(8)
        read = time.monotonic() - started
        assert row is not None and row["commitSeq"] == seq and row["entry"]["text"] == text
        assert storage.log.get(seq).writes[0].value["text"] == text  # type: ignore[union-attr]
        print(f"50 MB value: commit {committed:.2f} s, read {read:.2f} s")
        assert (
            await storage.commit([{"type": "entry", "value": {"id": 9, "conversationId": 1}}], CTX)
            == seq + 1
        )
    finally:
        await storage.close()
    assert verify(tmp_path / "store") is None


@pytest.mark.parametrize("kind", ["list", "dict"])
async def test_values_nested_as_deep_as_a_commit_accepts_read_back_everywhere(
    tmp_path: Path, kind: str
) -> None:
    """Commits accept 1,000 levels, past Python's default stack: every read path, a delta that
    sets such a value, views, a rebuild and verify must carry them (pi-durable's own backends
    already fail at 900)."""

    path = tmp_path / "store"
    deep = nest(995, kind)
    storage = await LmdbStorage.open(path, durability="process")
    try:
        conversation = {"id": 1, "data": deep}
        entry = {"id": 2, "conversationId": 1, "kind": "m", "data": deep}
        record = {
            "id": 4,
            "kind": "notes",
            "scope": {"kind": "conversation", "conversationId": 1},
            "history": "rewindable",
            "fork": "current",
        }
        await storage.commit([{"type": "conversation", "value": conversation}], CTX)
        await storage.commit([{"type": "entry", "value": entry}], CTX)
        await storage.commit([{**task(3), "value": {**task(3)["value"], "input": deep}}], CTX)
        created = await storage.commit(
            [
                {
                    "type": "document.create",
                    "record": record,
                    "content": {"kind": "base", "version": 1, "value": {"x": deep}},
                }
            ],
            CTX,
        )
        delta = {"kind": "delta", "version": 1, "ops": [["s", ["y"], deep]]}
        changed = await storage.commit(
            [{"type": "document.change", "id": 4, "content": delta}], CTX
        )
        expected = {"x": deep, "y": deep}

        def same(a: Any, b: Any) -> bool:  # == itself recurses once per level
            return codec.deep(operator.eq, a, b)

        for reads in (storage, await storage.as_of(changed)):
            assert same((await reads.conversation(1, CTX))["data"], deep)
            assert same((await reads.entry(2))["entry"], entry)
            assert same((await reads.entry(1, 2, CTX))["entry"], entry)
            assert same(
                (await reads.scan_entries({"conversationId": 1}, 10, None, CTX))["items"], [entry]
            )
            assert same((await reads.task(3, CTX))["input"], deep)
            assert same((await reads.document(4, "current", CTX))["value"], expected)
            assert same((await reads.document(4, changed, CTX))["value"], expected)
            assert same((await reads.document(4, created, CTX))["value"], {"x": deep})
        await storage.rebuild()
        assert same((await storage.document(4, "current", CTX))["value"], expected)
    finally:
        await storage.close()
    assert verify(path) is None


async def test_a_big_integer_committed_anywhere_reads_back_everywhere(tmp_path: Path) -> None:
    path = tmp_path / "store"
    script = (
        "import asyncio, sys\n"
        "sys.set_int_max_str_digits(0)\n"
        "from pi_durable.context import BACKGROUND_CONTEXT\n"
        "from pi_durable_lmdb import LmdbStorage\n"
        "async def main():\n"
        f"    storage = await LmdbStorage.open({str(path)!r})\n"
        "    await storage.commit([{'type': 'conversation', 'value': {'id': 1, 'n': 10**5000}}], BACKGROUND_CONTEXT)\n"
        "    await storage.close()\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=CHILD_ENV, timeout=60
    )
    assert done.returncode == 0, done.stderr
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        assert storage.log.get(1) is not None
        assert (await storage.conversation(1, CTX))["n"] == 10**5000
    finally:
        await storage.close()
