"""Model-based differential test: the backend under test against pi_durable's MemoryStorage.

A Hypothesis ``RuleBasedStateMachine`` sends every operation to both stores and compares every
result: return values must be equal under a strict structural comparison (``1``, ``1.0`` and
``True`` differ, ``-0.0`` differs from ``0.0``; object key order is ignored), and when the
reference raises, ours must raise too, from the same family (``StorageRequestError`` or any other
exception) with the reference's message contained in ours.

What it drives:

* all eight write kinds: conversations (roots, forks with ``parent``, owners), entries (data, model
  messages, context edits, ``byTaskId``, head markers), task records in every status (also
  ``sleeping``) and their replacement, submissions of both types in every status with request IDs
  that move, and documents (create / copy / change / retire) in session, conversation and task
  scope, ``latest`` and ``rewindable`` history, ``asOf`` / ``current`` / ``initial`` forks, base
  and delta contents using every op verb (``r s d a t p m``), version changes, and invalid ops;
* deliberately invalid batches, often with valid writes around them: duplicate IDs, an ID of
  another record type, unknown documents, a delta without a base, a second current incarnation,
  copies of changed/mismatched/unknown sources, non-JSON values, ...; after every rejection all
  records and secondary indexes of both stores are compared (``check_state``);
* every read method, walking pages to the end through (JSON round-tripped) cursors in both
  orders, plus malformed cursors and orders, unknown conversations, historical document points;
* strings with non-ASCII characters, astral characters and lone surrogates everywhere strings go;
* closing and reopening the backend on the same directory (MemoryStorage keeps its state);
* ``check_everything``: all records, indexes, point reads and every document at each of its
  revision points, as a rule of its own and after each reopen;
* ``erase`` (stores that have ``erase_conversation``): a conversation, with or without its forks,
  or an unknown or erased one. The test works out from the committed batches alone what goes
  (``tests/support/erasure.py``) and which refusal is due (unknown, forks, a kept copy of an
  erased document): a refusal must raise it and change nothing. After an erasure the reference
  is a ``MemoryStorage`` that folded the batches without the erased writes, an empty batch in
  the erasure record's place (so sequences and ``commit`` results still match) and its next id
  where it was (erased ids are never minted again): every read, of the erased ids too, is
  compared now, and, through ``as_of``, with a ``MemoryStorage`` folded up to sampled points;
* ``trim`` (a backend with ``trim``: this store): the log trimmed before a drawn sequence; then
  every read now, and as of drawn points the trim keeps (against a reference that replays the
  commits up to the point), equals the reference's, and a read as of a dropped point (a view, a
  document at it) raises ``HistoryTrimmed``; an erasure of a trimmed log is refused.

Invalid delta ops are stored as MemoryStorage stores them (it does not check ops when it commits);
reading such a document raises whatever ``pi_durable.delta.apply`` raises, and ours must match.

IDs come from a small pool so collisions happen. ``mint_id`` must return exactly MemoryStorage's
values until the first reopen; afterwards it must return an ID above every ID minted or stored
before (the sqlite stand-in only promises "above every stored ID", see ``STRICT_MINT``).

Relaxations (all documented where they happen): after ``close()`` only the word "closed" is
required, since the reference's message names its class; no others.

Environment knobs: ``PI_DURABLE_LMDB_MACHINE_EXAMPLES`` / ``PI_DURABLE_LMDB_MACHINE_STEPS``.

The machine's drawing half (value pools, plausible and invalid writes) is
``tests/support/machine_draws.py``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pi_durable.errors import StorageRequestError
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb import HistoryTrimmed
from pi_durable_lmdb.log.tree import TILE

from tests.support.compare import REFUSALS

from ..support.compare import canonical
from ..support.erasure import Batches, erased_with, is_conversation, memory_of, without
from ..support.machine_draws import (
    CTX,
    MachineDraws,
    _Batch,
    _describe,
    _drawn,
    _message_shape,
)
from ..support.machine_values import (
    BAD_CURSORS,
    DOC_KEYS,
    DOC_KINDS,
    ID_POOL,
    MAX_SAFE,
    ORDERS,
    REQUEST_IDS,
    SUBMISSION_STATUSES,
    TASK_KINDS,
    TASK_STATUSES,
)

EXAMPLES = int(os.environ.get("PI_DURABLE_LMDB_MACHINE_EXAMPLES", "200"))
STEPS = int(os.environ.get("PI_DURABLE_LMDB_MACHINE_STEPS", "50"))


# ── The machine ─────────────────────────────────────────────────────────────


class StorageMachine(MachineDraws, RuleBasedStateMachine):
    OPEN: Callable[[str], Any]
    STRICT_MINT = True

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.path = tempfile.mkdtemp(prefix="pi-durable-lmdb-machine-")
        self.ref: Any = MemoryStorage()
        self.ours: Any = None
        self.ours_closed = False
        self.reopened = False
        # Model of what committed, to draw plausible (and colliding) writes.
        self.seqs: list[int] = []
        self.record_types: dict[int, str] = {}
        self.conversations: list[int] = []
        self.entries: list[int] = []
        self.tasks: dict[int, dict[str, Any]] = {}
        self.submissions: dict[int, dict[str, Any]] = {}
        self.documents: dict[int, dict[str, Any]] = {}
        self.minted: list[int] = []
        self.ours_minted_max = 0
        # Every committed batch by sequence (an erasure's record is an empty one), and the
        # conversations erased and ids of the records erased, whose reads stay checked.
        self.batches: Batches = {}
        self.erased: set[int] = set()
        self.erased_ids: set[int] = set()
        self.trimmed = 0
        """The first sequence our log keeps since a trim (0: never trimmed)."""

    def id_pool(self) -> list[int]:
        """The draws' ids, erased ones too: a store takes them again as the reference does."""

        return super().id_pool() + sorted(self.erased_ids)[-4:]

    # ── plumbing ────────────────────────────────────────────────────────

    def run(self, make: Callable[[], Any]) -> Any:
        async def go() -> Any:
            return await make()

        return self.loop.run_until_complete(go())

    @staticmethod
    async def _call(
        store: Any,
        method: str,
        args: tuple[Any, ...],
        ctx: bool,
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, Any]:
        call_args = copy.deepcopy(args)  # each store gets its own arguments
        if ctx:
            call_args = (*call_args, CTX)
        try:
            return ("ok", await getattr(store, method)(*call_args, **(kwargs or {})))
        except REFUSALS as error:
            return ("error", error)

    def outcome(
        self,
        store: Any,
        method: str,
        args: tuple[Any, ...],
        ctx: bool,
        kwargs: dict[str, Any] | None = None,
    ) -> tuple[str, Any]:
        return self.run(lambda: self._call(store, method, args, ctx, kwargs))

    def same_all(
        self, calls: list[tuple[str, str, tuple[Any, ...]]], ref: Any = None, ours: Any = None
    ) -> None:
        """Compare many independent reads, each store's in one event-loop turn (it is faster),
        of the two stores or of ``ref`` and ``ours`` (views as of one point).

        A method named ``walk:scan_x`` walks that scan to its end (``args``: query, limit).
        """

        async def on(store: Any) -> list[Any]:
            results: list[Any] = []
            for _, method, args in calls:
                if method.startswith("walk:"):
                    results.append(await self._walk(store, method[5:], args[0], args[1], True))
                else:
                    results.append(await self._call(store, method, args, True))
            return results

        left_store = self.ref if ref is None else ref
        right_store = self.ours if ours is None else ours
        lefts = self.run(lambda: on(left_store))
        rights = self.run(lambda: on(right_store))
        for (label, method, _), left, right in zip(calls, lefts, rights, strict=True):
            if method.startswith("walk:"):
                self.compare_walks(label, method[5:], left, right)
            else:
                self.compare(f"{method}{label}", left, right)

    def compare(self, label: str, ref: tuple[str, Any], ours: tuple[str, Any]) -> None:
        if ref[0] == "ok" and ours[0] == "ok":
            if canonical(ref[1]) != canonical(ours[1]):
                raise AssertionError(
                    f"{label}: results differ\n  reference {_describe(ref)}\n  ours      {_describe(ours)}"
                )
            return
        if ref[0] == "error" and ours[0] == "error":
            ref_request = isinstance(ref[1], StorageRequestError)
            our_request = isinstance(ours[1], StorageRequestError)
            if ref_request != our_request or str(ref[1]) not in str(ours[1]):
                raise AssertionError(
                    f"{label}: errors differ\n  reference {_describe(ref)}\n  ours      {_describe(ours)}"
                ) from ours[1]
            return
        error = ours[1] if ours[0] == "error" else None
        raise AssertionError(
            f"{label}: outcomes differ\n  reference {_describe(ref)}\n  ours      {_describe(ours)}"
        ) from error

    def same(self, label: str, method: str, *args: Any, ctx: bool = True) -> tuple[str, Any]:
        ref = self.outcome(self.ref, method, args, ctx)
        ours = self.outcome(self.ours, method, args, ctx)
        self.compare(f"{method}{label}", ref, ours)
        return ref

    @staticmethod
    async def _walk(
        store: Any, method: str, query: dict[str, Any], limit: int, keep_order: bool
    ) -> list[tuple[str, Any]]:
        """Every page of one scan, following its (JSON round-tripped) cursors."""

        pages: list[tuple[str, Any]] = []
        cursor: Any = None
        for _ in range(200):
            outcome = await StorageMachine._call(store, method, (query, limit, cursor), True)
            pages.append(outcome)
            if (
                outcome[0] != "ok"
                or not isinstance(outcome[1], dict)
                or outcome[1].get("next") is None
            ):
                return pages
            cursor = json.loads(json.dumps(outcome[1]["next"]))
            if not keep_order:
                query = {key: value for key, value in query.items() if key != "order"}
        raise AssertionError(f"{method} {query!r}: more than 200 pages")

    def compare_walks(self, label: str, method: str, ref: list[Any], ours: list[Any]) -> None:
        for number, (left, right) in enumerate(zip(ref, ours)):
            self.compare(f"{method}{label} page {number}", left, right)
        if len(ref) != len(ours):
            raise AssertionError(
                f"{method}{label}: {len(ref)} pages in the reference, {len(ours)} in ours"
            )

    def walk(
        self, label: str, method: str, query: dict[str, Any], limit: int, keep_order: bool = True
    ) -> None:
        """Walk a scan to its end on both stores, comparing every page."""

        ref = self.run(lambda: self._walk(self.ref, method, query, limit, keep_order))
        ours = self.run(lambda: self._walk(self.ours, method, query, limit, keep_order))
        self.compare_walks(f" {label}", method, ref, ours)
        last = ref[-1]
        if last[0] != "ok":
            event(f"{method}: {_message_shape(last[1])}")
        else:
            event(f"{method}: {min(len(ref), 4)}{'+' if len(ref) >= 4 else ''} pages")

    def teardown(self) -> None:
        try:
            if self.ours is not None and not self.ours_closed:
                self.run(lambda: self.ours.close(CTX))
            self.run(lambda: self.ref.close(CTX))
        finally:
            self.loop.close()
            shutil.rmtree(self.path, ignore_errors=True)

    # ── the model ───────────────────────────────────────────────────────

    def apply_model(self, writes: list[dict[str, Any]], seq: int) -> None:
        self.seqs.append(seq)
        for write in writes:
            kind = write["type"]
            if kind in ("conversation", "entry", "task", "submission"):
                value = write["value"]
                self.record_types[value["id"]] = kind
                if kind == "conversation" and value["id"] not in self.conversations:
                    self.conversations.append(value["id"])
                elif kind == "entry":
                    self.entries.append(value["id"])
                elif kind == "task":
                    self.tasks[value["id"]] = copy.deepcopy(value)
                elif kind == "submission":
                    self.submissions[value["id"]] = copy.deepcopy(value)
            elif kind in ("document.create", "document.copy"):
                record = write["record"]
                self.record_types[record["id"]] = "document"
                version = write["content"]["version"] if kind == "document.create" else None
                self.documents[record["id"]] = {
                    "record": copy.deepcopy(record),
                    "retired": False,
                    "version": version,
                    "points": [seq],
                }
            elif kind == "document.change":
                self.documents[write["id"]]["version"] = write["content"]["version"]
                self.documents[write["id"]]["points"].append(seq)
        for write in writes:
            if write["type"] == "document.retire":
                self.documents[write["id"]]["retired"] = True
                self.documents[write["id"]]["points"].append(seq)
        for id, document in self.documents.items():
            if document["version"] is None:  # a copy: its version is its source's
                try:
                    stored = self.run(lambda id=id: self.ref.document(id, "current", CTX))
                except REFUSALS:
                    stored = None
                document["version"] = 1 if stored is None else stored["version"]

    def commit(self, label: str, writes: list[dict[str, Any]]) -> bool:
        ref = self.outcome(self.ref, "commit", (writes,), True)
        ours = self.outcome(self.ours, "commit", (writes,), True)
        self.compare(f"commit {label}", ref, ours)
        event(f"commit {label}: " + ("ok" if ref[0] == "ok" else _message_shape(ref[1])))
        if ref[0] == "ok":
            self.batches[ref[1]] = copy.deepcopy(writes)
            self.apply_model(writes, ref[1])
            return True
        # After a rejected commit both stores must still agree on every record.
        self.check_state()
        return False

    # ── lifecycle ───────────────────────────────────────────────────────

    @initialize(data=st.data())
    def open_and_seed(self, data: Any) -> None:
        """Open the backend, create the root conversation and commit a few seed batches."""

        self.ours = self.run(lambda: type(self).OPEN(self.path))
        self.commit("root", [{"type": "conversation", "value": {"id": 1}}])
        kinds = ["conversation", "entry", "entry", "entry", "task", "submission", "document.create"]
        for _ in range(6):
            if not data.draw(st.booleans(), label="another seed batch"):
                break
            self.commit("seed", self.draw_writes(data, _Batch(), kinds, 1, 10, "seed writes"))

    # ── commit rules ────────────────────────────────────────────────────

    TABLE_KINDS = ["entry", "entry", "conversation", "task", "submission"]
    DOCUMENT_KINDS = ["document.create", "document.change", "document.copy", "document.retire"]

    @rule(data=st.data())
    def commit_table_writes(self, data: Any) -> None:
        batch = _Batch()
        writes = self.draw_writes(data, batch, self.TABLE_KINDS, 1, 6)
        self.commit("table writes", writes)

    @rule(data=st.data())
    def commit_document_writes(self, data: Any) -> None:
        batch = _Batch()
        writes = self.draw_writes(data, batch, self.DOCUMENT_KINDS + ["document.create"], 1, 3)
        self.commit("document writes", writes)

    @rule(data=st.data())
    def commit_mixed_writes(self, data: Any) -> None:
        batch = _Batch()
        writes = self.draw_writes(data, batch, self.TABLE_KINDS + self.DOCUMENT_KINDS, 1, 5)
        self.commit("mixed writes", writes)

    @precondition(lambda self: bool(self.documents))
    @rule(data=st.data())
    def commit_document_history(self, data: Any) -> None:
        """Up to four commits, each a delta (or a rebasing base) of one document: long histories."""

        live = sorted(d for d, doc in self.documents.items() if not doc["retired"]) or sorted(
            self.documents
        )
        rewindable = [d for d in live if self.documents[d]["record"].get("history") == "rewindable"]
        id = data.draw(st.sampled_from(rewindable + live), label="document")
        for index in range(4):
            if index > 0 and not data.draw(st.booleans(), label="another revision"):
                break
            change = data.draw(
                _drawn(lambda draw: self.draw_document_change(draw, _Batch(), id)), label="change"
            )
            if not self.commit("document history", [change]):
                break

    @precondition(lambda self: bool(self.documents))
    @rule(data=st.data())
    def commit_long_document(self, data: Any) -> None:
        """A run of commits that grow one document past a chunk (a transcript: a text append
        and a counter per turn, now and then another op), long enough for snapshots; a value
        kept as a head row, read back from memory, a replay, or a past point."""

        live = sorted(d for d, doc in self.documents.items() if not doc["retired"]) or sorted(
            self.documents
        )
        id = data.draw(st.sampled_from(live), label="long document")
        turns = data.draw(st.sampled_from([3, 20, 70]), label="turns")
        size = data.draw(st.sampled_from([900, 4000, 12_000]), label="turn bytes")
        version = self.documents[id]["version"] or 1
        start = _long_change(id, [["s", ["long"], "L" * size]], version)
        if not self.commit("long start", [start]):
            return
        for turn in range(turns):
            ops: list[Any] = [["a", ["long"], f"<{turn}>" + "y" * size], ["s", ["turns"], turn]]
            if turn % 9 == 4:
                ops.append(data.draw(_drawn(lambda draw: self.draw_op(draw, {})), label="op"))
            if not self.commit("long turn", [_long_change(id, ops, version)]):
                return

    @rule()
    def commit_nothing(self) -> None:
        self.commit("empty batch", [])

    @rule(data=st.data())
    def commit_invalid_batch(self, data: Any) -> None:
        batch = _Batch()
        before = self.draw_writes(
            data, batch, self.TABLE_KINDS + ["document.create"], 0, 2, "valid writes before"
        )
        invalid = data.draw(
            _drawn(lambda draw: self.draw_invalid(draw, batch)), label="invalid writes"
        )
        after = self.draw_writes(data, batch, self.TABLE_KINDS, 0, 1, "valid writes after")
        self.commit("invalid batch", before + invalid + after)

    # ── mint and reopen ─────────────────────────────────────────────────

    @rule()
    def mint_id(self) -> None:
        ref = self.outcome(self.ref, "mint_id", (), False)
        ours = self.outcome(self.ours, "mint_id", (), False)
        if not self.reopened or ref[0] == "error":
            # Exact until the first reopen; an exhausted ID space stays exhausted.
            self.compare("mint_id", ref, ours)
        else:
            if ours[0] == "error":
                raise AssertionError(f"mint_id after reopen {_describe(ours)}") from ours[1]
            value = ours[1]
            assert isinstance(value, int) and not isinstance(value, bool), (
                f"mint_id returned {value!r}"
            )
            floor = max([*self.record_types, *self.erased_ids, 1])  # erased ids: never again
            if self.STRICT_MINT:
                floor = max(floor, self.ours_minted_max)
            assert value > floor, f"mint_id after reopen returned {value}, not above {floor}"
            assert value <= MAX_SAFE
        if ours[0] == "ok":
            self.minted.append(ours[1])
            self.ours_minted_max = max(self.ours_minted_max, ours[1])

    @rule()
    def close_and_reopen(self) -> None:
        self.run(lambda: self.ours.close(CTX))
        self.ours_closed = True
        # Relaxation: only "closed" is required; the reference's message names its own class.
        for method, args, ctx in [
            ("conversation", (1,), True),
            ("commit", ([],), True),
            ("mint_id", (), False),
            ("scan_tasks", ({}, 10, None), True),
            ("document", (1, "current"), True),
        ]:
            outcome = self.outcome(self.ours, method, args, ctx)
            if outcome[0] != "error" or "closed" not in str(outcome[1]):
                raise AssertionError(f"{method}() after close {_describe(outcome)}")
        self.ours = self.run(lambda: type(self).OPEN(self.path))
        self.ours_closed = False
        self.reopened = True
        self.check_everything()

    # ── erasure ─────────────────────────────────────────────────────────

    @precondition(lambda self: hasattr(self.ours, "erase_conversation"))
    @rule(data=st.data())
    def erase(self, data: Any) -> None:
        """Erase a conversation (now and then an unknown or erased one, or one with forks),
        then compare every read, now and as of sampled points, with a ``MemoryStorage`` that
        folded the committed batches without the erased writes (and an empty batch for the
        erasure record: sequences match). Refusals must leave everything as it was."""

        if data.draw(st.integers(0, 5), label="known") > 0:
            target = data.draw(st.sampled_from(self.conversations), label="erase")
        else:
            target = data.draw(st.sampled_from([*sorted(self.erased), 3, 9]), label="erase")
        with_forks = data.draw(st.booleans(), label="with forks")
        outcome = self.outcome(
            self.ours,
            "erase_conversation",
            (target,),
            False,
            kwargs={"reason": "machine", "with_forks": with_forks},
        )
        gone = erased_with(self.batches, target)
        kept, refused = without(self.batches, gone)
        expected: str | None = None
        if self.trimmed > 1:
            expected = "is trimmed"
        elif not is_conversation(self.batches, target):
            expected = "Unknown conversation"
        elif len(gone) > 1 and not with_forks:
            expected = "has forks or owned conversations"
        elif refused:
            expected = "is a copy of document"
        if expected is not None:
            event(f"erase refused: {expected}")
            error = outcome[1] if outcome[0] == "error" else None
            assert error is not None and expected in str(error), (
                f"erase {target} (with forks {with_forks}, {sorted(gone)}): expected a refusal "
                f"naming {expected!r}, got {_describe(outcome)}"
            )
            family = StorageRequestError if expected.startswith("Unknown") else ValueError
            assert isinstance(error, family), _describe(outcome)
            assert self.ours.log.head() == max(self.batches), "a refused erasure wrote"
            self.check_everything()  # nothing changed
            return
        if outcome[0] == "error":
            raise AssertionError(
                f"erase {target} (with forks {with_forks}) refused: {_describe(outcome)}"
            ) from outcome[1]
        report = outcome[1]
        head = max(self.batches, default=0) + 1
        removed = sum(len(w) for w in self.batches.values()) - sum(len(w) for w in kept.values())
        changed = sorted(seq for seq in self.batches if kept[seq] != self.batches[seq])
        assert (report.seq, report.conversations, report.records, report.writes) == (
            head,
            sorted(gone),
            changed,
            removed,
        ), f"erase {target}: report {report}"
        event(f"erased {len(gone)} conversation(s), {removed} writes")
        for seq, writes in self.batches.items():
            for write in writes:
                if write not in kept[seq]:
                    value = write.get("value") or write.get("record") or {}
                    self.erased_ids.add(value.get("id", write.get("id")))
        self.erased |= gone
        kept[head] = []  # the erasure record
        self.replace_reference(kept)
        if not self.conversations:  # the draws need one: a fresh root
            fresh = max([*self.known_ids(), *self.erased_ids, *self.minted]) + 1
            self.commit("fresh root", [{"type": "conversation", "value": {"id": fresh}}])
        self.check_everything()
        points = sorted(
            {data.draw(st.integers(1, head), label="as of") for _ in range(2)} | {head - 1, head}
        )
        for point in points:
            if point < 1:
                continue
            memory = self.run(lambda point=point: memory_of(self.batches, point))
            view = self.run(lambda point=point: self.ours.as_of(point))
            self.same_all(self.everything(), ref=memory, ours=view)
            self.run(lambda memory=memory: memory.close(CTX))

    def replace_reference(self, batches: Batches) -> None:
        """The reference folds ``batches`` afresh; the model is drawn from them again. Ids are
        never minted again, erased ones included: the reference's next id stays where it was."""

        next_id = self.ref._next_id
        self.run(lambda: self.ref.close(CTX))
        self.ref = self.run(lambda: memory_of(batches, max(batches)))
        self.ref._next_id = max(self.ref._next_id, next_id)
        self.batches = batches
        self.seqs, self.record_types, self.conversations, self.entries = [], {}, [], []
        self.tasks, self.submissions, self.documents = {}, {}, {}
        for seq, writes in sorted(batches.items()):
            self.apply_model(writes, seq)

    # ── reads ───────────────────────────────────────────────────────────

    def check_tables(self) -> list[tuple[str, str, tuple[Any, ...]]]:
        """Reads that together show every record: the check after each rejected commit."""

        calls: list[tuple[str, str, tuple[Any, ...]]] = [
            (" (all)", "scan_conversations", ({}, 10_000, None))
        ]
        for order in ("ascending", "descending"):
            calls.append((f" (all, {order})", "scan_tasks", ({"order": order}, 10_000, None)))
            calls.append((f" (all, {order})", "scan_submissions", ({"order": order}, 10_000, None)))
        # Secondary indexes: statuses, kinds, owners, request IDs.
        for status in TASK_STATUSES:
            calls.append((f" ({status})", "scan_tasks", ({"status": status}, 10_000, None)))
        for kind in TASK_KINDS:
            calls.append((f" ({kind!r})", "scan_tasks", ({"kind": kind}, 10_000, None)))
        for status in SUBMISSION_STATUSES:
            calls.append((f" ({status})", "scan_submissions", ({"status": status}, 10_000, None)))
        for task in sorted({*self.tasks, 1, 2}):
            calls.append(
                (
                    f" (owner task {task})",
                    "scan_conversations",
                    ({"ownerTaskId": task}, 10_000, None),
                )
            )
        conversations = sorted(set(self.conversations) | self.erased | {2})
        for conversation in conversations:
            calls.append(
                (
                    f" (owner {conversation})",
                    "scan_conversations",
                    ({"ownerConversationId": conversation}, 10_000, None),
                )
            )
            for request in REQUEST_IDS:
                calls.append(
                    (
                        f"({conversation}, {request!r})",
                        "submission_by_request",
                        (conversation, request),
                    )
                )
            for order in ("ascending", "descending"):
                query = {"conversationId": conversation, "order": order}
                calls.append((f" ({conversation}, {order})", "scan_entries", (query, 10_000, None)))
        scopes = {
            json.dumps(doc["record"]["scope"], sort_keys=True) for doc in self.documents.values()
        }
        scopes.add(json.dumps({"kind": "session"}))
        for scope in sorted(scopes):
            calls.append(
                (
                    f" ({scope})",
                    "scan_documents",
                    ({"scope": json.loads(scope), "at": "current"}, 10_000, None),
                )
            )
            for kind in DOC_KINDS:
                query = {"scope": json.loads(scope), "at": "current", "kind": kind}
                calls.append((f" ({scope}, {kind!r})", "scan_documents", (query, 10_000, None)))
        for id in sorted(self.documents):
            calls.append((f"({id}, current)", "document", (id, "current")))
        return calls

    def check_state(self) -> None:
        self.same_all(self.check_tables())

    @rule()
    def check_everything(self) -> None:
        """Compare the complete observable state of both stores, point reads included."""

        self.same_all(self.everything())

    def everything(self) -> list[tuple[str, str, tuple[Any, ...]]]:
        """The reads of ``check_everything``, over the erased records' ids too."""

        calls = self.check_tables()
        conversations = sorted(set(self.conversations) | self.erased | {2})
        for conversation in conversations:
            calls.append((f"({conversation})", "conversation", (conversation,)))
            calls.append(
                (f"({conversation}, None)", "find_latest_head_marker", (conversation, None))
            )
        for id in sorted(set(self.known_ids()) | self.erased_ids):
            calls.append((f"({id})", "entry", (id,)))
            calls.append((f"({id})", "task", (id,)))
            calls.append((f"({id})", "submission", (id,)))
            if id not in self.documents:
                calls.append((f"({id}, current)", "document", (id, "current")))
        for conversation in conversations:
            for order in ("ascending", "descending"):
                query = {"conversationId": conversation, "order": order}
                calls.append((f" {query!r} limit 2", "walk:scan_entries", (query, 2)))
        for order in ("ascending", "descending"):
            calls.append(
                (
                    f" {{'order': {order!r}}} limit 2",
                    "walk:scan_conversations",
                    ({"order": order}, 2),
                )
            )
        for id, document in sorted(self.documents.items()):
            record = document["record"]
            address = {k: v for k, v in record.items() if k in ("kind", "scope", "key")}
            calls.append((f"({address!r}, current)", "find_document", (address, "current")))
            # Each revision point of the document, and the commit before its first.
            points = sorted({*document["points"][-4:], max(document["points"][0] - 1, 1)})
            for at in points:
                if at >= self.trimmed:
                    calls.append((f"({id}, {at})", "document", (id, at)))
                else:
                    self.expect_trimmed(f"document({id}, {at})", "document", (id, at))
                calls.append((f"({address!r}, {at})", "find_document", (address, at)))
        return calls

    def before_trim(self, at: Any) -> bool:
        """Whether a document point is one our trim dropped."""

        try:
            return at != "current" and math.floor(at) < self.trimmed
        except (TypeError, ValueError, OverflowError):
            return False

    def expect_trimmed(self, label: str, method: str, args: tuple[Any, ...]) -> None:
        """A read as of a point our trim dropped: ``HistoryTrimmed``, unless the reference
        refuses it as well (a document that keeps no history)."""

        ours = self.outcome(self.ours, method, args, True)
        if ours[0] == "error" and isinstance(ours[1], HistoryTrimmed):
            return
        self.compare(label, self.outcome(self.ref, method, args, True), ours)

    # ── trimming old history (LmdbStorage.trim) ─────────────────────────

    @precondition(lambda self: hasattr(self.ours, "trim") and len(self.seqs) > TILE + 1)
    @rule(data=st.data())
    def trim(self, data: Any) -> None:
        """Trim our log before a drawn sequence: every read now, and as of drawn points the trim
        keeps, is the reference's; a read as of a point it dropped raises ``HistoryTrimmed``."""

        head = self.seqs[-1]
        before = data.draw(st.integers(1, head), label="trim before")
        report = self.run(lambda: self.ours.trim(before))
        assert max(self.trimmed, 1) <= report.point <= max(before, self.trimmed, 1)
        assert report.records == 0 or report.point > self.trimmed
        self.trimmed = max(self.trimmed, report.point)
        event(f"trim: {'dropped records' if report.records else 'nothing to drop'}")
        self.check_everything()
        points = data.draw(
            st.lists(st.integers(self.trimmed, head), min_size=1, max_size=1),
            label="as of",
        )
        for at in points:
            view = self.run(lambda at=at: self.ours.as_of(at))
            memory = self.run(lambda at=at: memory_of(self.batches, at))
            try:
                self.same_all(self.check_tables(), ref=memory, ours=view)
            finally:
                self.run(lambda memory=memory: memory.close(CTX))
        if self.trimmed > 1:
            at = data.draw(st.integers(0, self.trimmed - 1), label="as of a trimmed point")
            outcome = self.outcome(self.ours, "as_of", (at,), False)
            assert outcome[0] == "error" and isinstance(outcome[1], HistoryTrimmed), outcome

    @rule(data=st.data())
    def read_conversations(self, data: Any) -> None:
        id = data.draw(st.sampled_from(self.known_ids()), label="id")
        self.same(f"({id})", "conversation", id)
        query: dict[str, Any] = {}
        owners = sorted(set(ID_POOL[:4]) | set(self.conversations))
        tasks = sorted(set(ID_POOL[:8]) | set(self.tasks))
        shape = data.draw(
            st.sampled_from(["all", "owner conversation", "owner task", "both"]), label="query"
        )
        if shape in ("owner conversation", "both"):
            query["ownerConversationId"] = data.draw(
                st.sampled_from(owners), label="owner conversation"
            )
        if shape in ("owner task", "both"):
            query["ownerTaskId"] = data.draw(st.sampled_from(tasks), label="owner task")
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(
            f" {query!r} limit {limit}",
            "scan_conversations",
            query,
            limit,
            data.draw(st.booleans(), label="keep order"),
        )

    @rule(data=st.data())
    def read_entries(self, data: Any) -> None:
        ids = sorted(set(self.known_ids()) | set(self.entries))
        conversations = [*self.conversations, *self.conversations, 9]
        id = data.draw(st.sampled_from([*ids, MAX_SAFE]), label="entry id")
        conversation = data.draw(st.sampled_from(conversations), label="conversation")
        self.same(f"({id})", "entry", id)
        visible_id = data.draw(st.sampled_from([*ids, "7", 1.5, True]), label="visible entry id")
        self.same(f"({conversation}, {visible_id!r})", "entry", conversation, visible_id)
        cutoff = data.draw(st.sampled_from([None, *ids]), label="at or before")
        self.same(f"({conversation}, {cutoff})", "find_latest_head_marker", conversation, cutoff)
        query: dict[str, Any] = {"conversationId": conversation}
        for bound in data.draw(
            st.lists(st.sampled_from(["minEntryId", "maxEntryId"]), unique=True, max_size=2),
            label="bounds",
        ):
            query[bound] = data.draw(st.sampled_from(ids), label=bound)
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(
            f" {query!r} limit {limit}",
            "scan_entries",
            query,
            limit,
            data.draw(st.booleans(), label="keep order"),
        )

    @rule(data=st.data())
    def read_tasks(self, data: Any) -> None:
        id = data.draw(st.sampled_from(self.known_ids()), label="id")
        self.same(f"({id})", "task", id)
        query: dict[str, Any] = {}
        for field in data.draw(
            st.lists(
                st.sampled_from(
                    ["conversationId", "kind", "status", "abortRequested", "background"]
                ),
                unique=True,
                max_size=2,
            ),
            label="filters",
        ):
            if field == "conversationId":
                query[field] = data.draw(
                    st.sampled_from(sorted(set(self.conversations) | {1, 2})), label=field
                )
            elif field == "kind":
                query[field] = data.draw(st.sampled_from(TASK_KINDS), label=field)
            elif field == "status":
                query[field] = data.draw(st.sampled_from(TASK_STATUSES), label=field)
            else:
                query[field] = data.draw(st.booleans(), label=field)
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(
            f" {query!r} limit {limit}",
            "scan_tasks",
            query,
            limit,
            data.draw(st.booleans(), label="keep order"),
        )

    @rule(data=st.data())
    def read_submissions(self, data: Any) -> None:
        id = data.draw(st.sampled_from(self.known_ids()), label="id")
        self.same(f"({id})", "submission", id)
        conversation = data.draw(
            st.sampled_from(sorted(set(self.conversations) | {1, 2})), label="conversation"
        )
        request = data.draw(st.sampled_from(REQUEST_IDS), label="request")
        self.same(f"({conversation}, {request!r})", "submission_by_request", conversation, request)
        query: dict[str, Any] = {}
        if data.draw(st.booleans(), label="by conversation"):
            query["conversationId"] = conversation
        if data.draw(st.booleans(), label="by status"):
            query["status"] = data.draw(st.sampled_from(SUBMISSION_STATUSES), label="status")
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(
            f" {query!r} limit {limit}",
            "scan_submissions",
            query,
            limit,
            data.draw(st.booleans(), label="keep order"),
        )

    @rule(data=st.data())
    def read_documents(self, data: Any) -> None:
        ids = sorted(set(self.known_ids()) | set(self.documents))
        id = data.draw(st.sampled_from(ids), label="document id")
        at = self.draw_seq_point(data)
        if self.before_trim(at):
            self.expect_trimmed(f"document({id}, {at})", "document", (id, at))
        else:
            self.same(f"({id}, {at})", "document", id, at)
        if self.documents and data.draw(st.booleans(), label="known address"):
            record = self.documents[
                data.draw(st.sampled_from(sorted(self.documents)), label="address of")
            ]["record"]
            address = {k: v for k, v in record.items() if k in ("kind", "scope", "key")}
        else:
            address = {
                "kind": data.draw(st.sampled_from(DOC_KINDS), label="kind"),
                "scope": self.draw_scope(data, _Batch()),
            }
            key = data.draw(st.sampled_from(DOC_KEYS), label="key")
            if key is not None:
                address["key"] = key
        at = self.draw_seq_point(data)
        self.same(f"({address!r}, {at})", "find_document", address, at)
        query: dict[str, Any] = {"scope": address["scope"], "at": self.draw_seq_point(data)}
        if data.draw(st.booleans(), label="by kind"):
            query["kind"] = address["kind"]
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(f" {query!r} limit {limit}", "scan_documents", query, limit)

    @rule(data=st.data())
    def read_with_invalid_cursor_or_order(self, data: Any) -> None:
        method = data.draw(
            st.sampled_from(
                [
                    "scan_conversations",
                    "scan_entries",
                    "scan_tasks",
                    "scan_submissions",
                    "scan_documents",
                ]
            ),
            label="scan",
        )
        if method == "scan_entries":
            query: dict[str, Any] = {"conversationId": self.draw_conversation(data, any_id=True)}
        elif method == "scan_documents":
            query = {"scope": {"kind": "session"}, "at": "current"}
        else:
            query = {}
        order = data.draw(
            st.sampled_from([None, "ascending", "descending", "sideways", ""]), label="order"
        )
        if order is not None:
            query["order"] = order
        cursor = data.draw(st.sampled_from([None, *BAD_CURSORS]), label="cursor")
        self.same(f" {query!r} cursor {cursor!r}", method, query, 2, cursor)


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


@pytest.mark.slow
def test_backend_matches_memory_storage(open_storage: Any, backend: str) -> None:
    class Machine(StorageMachine):
        OPEN = staticmethod(open_storage)
        # The sqlite stand-in persists its ID counter only with stored IDs.
        STRICT_MINT = backend != "sqlite"

    run_state_machine_as_test(Machine, settings=SETTINGS)


def _long_change(id: int, ops: list[Any], version: int) -> dict[str, Any]:
    return {
        "type": "document.change",
        "id": id,
        "content": {"kind": "delta", "version": 1, "ops": ops},
    }
