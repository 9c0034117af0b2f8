"""The differential state machine on long documents: ``LmdbStorage`` against pi_durable's
``MemoryStorage`` while documents grow past many of the projections' chunks
(``projections.tables.CHUNK``).

``LongDocumentMachine`` is ``tests/storage/test_state_machine.py``'s ``StorageMachine`` (every
result compared strictly, errors by family and message; ``check_state`` after each rejection;
``check_everything``; close and reopen) with its table-only rules left out and rules of its own:

* long documents created with values of up to several chunks, in any scope and semantics;
* agent turns: runs of up to 100 commits of ``[["a", ["text"], line], ["s", ["turns"], n]]``,
  lines from empty to over two chunks, mixing one- to four-byte UTF-8 characters and lone
  surrogates, so a document reaches hundreds of revisions and chunk boundaries fall inside
  characters;
* every other op on a long value (``t`` trims across chunks, ``p`` splices and ``m`` moves of
  long items, ``s``/``d`` of long strings, ``a`` into a list item, ``r``, several ops in one
  delta), bases that rebase a long value, with and without a version change; the general
  machine's ``commit_document_history`` also draws its small ops on long values;
* ``document.copy`` of a long document from its past points (revision points, points between
  them, before its first), into a new or an existing conversation;
* batches that append to a long document (and to another) and are then rejected by a later
  write (the general machine's invalid writes), followed by reads of current and past points;
* reads of a long document at its revision points and between them (``document``,
  ``find_document``, ``scan_documents``);
* ``rebuild()``, ``durable-log backup`` (plain and compacting, while the writer is open),
  export and import into a new store, and ``compact`` (closed, then reopened): after each, every
  long document is read at a spread of its points, and every record, on the store or its copy.

Fewer, longer examples than the general machine (``PI_DURABLE_LMDB_LONG_EXAMPLES`` /
``PI_DURABLE_LMDB_LONG_STEPS``): each step commits and reads values tens of KB long.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
import tempfile
from typing import Any

import lmdb
import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule, run_state_machine_as_test
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.delta import apply_immutable
from pi_durable_lmdb.audit import export_lines
from pi_durable_lmdb.audit.migrate import import_export
from pi_durable_lmdb.log.compact import compact
from pi_durable_lmdb.projections import Projector
from pi_durable_lmdb.projections.tables import CHUNK
from pi_durable_lmdb.storage import LmdbStorage
from pi_durable_lmdb.storage.backup import backup

from tools.harness.faults import commit_fails, failing

from ..support.compare import REFUSALS
from ..support.long_documents import (
    OP_KINDS,
    SIZES,
    LongDocumentWork,
    append_ops,
    current_value,
    long_ops,
    long_value,
)
from ..support.machine_draws import _Batch, _drawn
from .test_state_machine import SETTINGS, StorageMachine

EXAMPLES = int(os.environ.get("PI_DURABLE_LMDB_LONG_EXAMPLES", "20"))
STEPS = int(os.environ.get("PI_DURABLE_LMDB_LONG_STEPS", "40"))

TURNS = 100
"""Most commits one ``grow_long_document`` step makes."""
LONGEST = 250_000
"""Characters a document's text grows to at most (about 30 chunks): the reference replays every
delta from the last base at each past read, copying the text at each append, so its reads cost
the square of a history's length; bounded, an example's time is too."""
SPREAD = 8
"""Points of each long document read after a rebuild, reopen or copy (its first and last among
them): reading all of hundreds would make the reference replay its history hundreds of times."""


async def _open(path: str) -> Any:
    return await LmdbStorage.open(path, durability="process")


def _address(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k in ("kind", "scope", "key")}


class LongDocumentMachine(StorageMachine):
    OPEN = staticmethod(_open)

    # The general machine's rules that do not touch documents (or only small ones, as its
    # ``commit_invalid_batch`` and ``commit_document_history`` do here too): this machine spends
    # its steps on long documents.
    read_conversations = None
    read_entries = None
    read_tasks = None
    read_submissions = None
    read_with_invalid_cursor_or_order = None
    commit_table_writes = None
    commit_nothing = None
    commit_document_writes = None
    commit_mixed_writes = None
    mint_id = None

    def __init__(self) -> None:
        super().__init__()
        self.long: list[int] = []  # documents created or copied long, retired ones included
        self.scratch = tempfile.mkdtemp(prefix="pi-durable-lmdb-long-")
        self.copies = 0

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)

    # ── helpers ─────────────────────────────────────────────────────────

    def replace_reference(self, batches: Any) -> None:
        """After an erasure: the long documents it erased are gone from the model too."""

        super().replace_reference(batches)
        self.long = [id for id in self.long if id in self.documents]

    def live_long(self) -> list[int]:
        return [id for id in self.long if not self.documents[id]["retired"]]

    def seeded(self, data: Any) -> random.Random:
        """Long texts come from a drawn seed: one draw, not thousands, per step."""

        return random.Random(data.draw(st.integers(0, 2**32 - 1), label="text seed"))

    def current(self, id: int) -> tuple[Any, int]:
        return self.run(lambda: current_value(self.ref, id))

    def point_reads(self, id: int, points: list[Any]) -> list[tuple[str, str, tuple[Any, ...]]]:
        record = self.documents[id]["record"]
        address = _address(record)
        calls: list[tuple[str, str, tuple[Any, ...]]] = []
        for at in points:
            if self.before_trim(at):  # gone with a trim: checked here, not compared
                self.expect_trimmed(f"document({id}, {at})", "document", (id, at))
            else:
                calls.append((f"({id}, {at})", "document", (id, at)))
            calls.append((f"({address!r}, {at})", "find_document", (address, at)))
            query = {"scope": record["scope"], "at": at, "kind": record["kind"]}
            calls.append((f" {query!r}", "scan_documents", (query, 10_000, None)))
        return calls

    def spread(self, id: int) -> list[Any]:
        """``SPREAD`` revision points of ``id`` from first to last, the one before its first,
        one between two revisions, and ``current``."""

        points = self.documents[id]["points"]
        step = max(1, len(points) // (SPREAD - 1))
        chosen = {*points[::step], points[-1], max(points[0] - 1, 1)}
        if len(points) > 1:
            chosen.add((points[-2] + points[-1]) // 2)
        return ["current", *sorted(chosen)]

    def check_long_documents(self) -> None:
        calls: list[tuple[str, str, tuple[Any, ...]]] = []
        for id in self.long:
            calls += self.point_reads(id, self.spread(id))
        self.same_all(calls)

    def commit_long(self, label: str, writes: list[dict[str, Any]]) -> bool:
        """Commit; on success the documents it created or copied count as long ones."""

        if not self.commit(label, writes):
            return False
        for write in writes:
            if write["type"] in ("document.create", "document.copy"):
                self.long.append(write["record"]["id"])
        return True

    def compare_copy(self, path: str) -> None:
        """Every record and a spread of every long document's points on the store in ``path``
        (a backup, an import) equal the reference's."""

        other = self.run(lambda: LmdbStorage.open(path, readonly=True))
        mine, self.ours = self.ours, other
        try:
            self.check_state()
            self.check_long_documents()
        finally:
            self.ours = mine
            self.run(lambda: other.close())
            shutil.rmtree(path, ignore_errors=True)

    def new_copy_path(self) -> str:
        self.copies += 1
        return os.path.join(self.scratch, f"copy-{self.copies}")

    # ── lifecycle ───────────────────────────────────────────────────────

    @initialize(data=st.data())
    def open_and_seed(self, data: Any) -> None:
        """Open the backend, create two conversations and a long document."""

        self.ours = self.run(lambda: type(self).OPEN(self.path))
        self.commit("root", [{"type": "conversation", "value": {"id": 1}}])
        self.commit("second conversation", [{"type": "conversation", "value": {"id": 2}}])
        self.create_long_document(data)

    @rule()
    def rebuild(self) -> None:
        self.run(lambda: self.ours.rebuild())
        self.check_state()
        self.check_long_documents()

    @rule(data=st.data())
    def backup_and_compare(self, data: Any) -> None:
        path = self.new_copy_path()
        backup(self.path, path, compact=data.draw(st.booleans(), label="compacting backup"))
        self.compare_copy(path)

    @rule()
    def export_import_and_compare(self) -> None:
        path = self.new_copy_path()
        if self.trimmed > 1:  # an export carries records, not the base a trim left: refused
            with pytest.raises(ValueError, match=f"export from sequence {self.trimmed} on"):
                self.run(lambda: import_export(export_lines(self.path), path))
            return
        self.run(lambda: import_export(export_lines(self.path), path))
        self.compare_copy(path)

    @rule()
    def compact_and_reopen(self) -> None:
        self.run(lambda: self.ours.close())
        self.ours_closed = True
        compact(self.path)
        self.ours = self.run(lambda: type(self).OPEN(self.path))
        self.ours_closed = False
        self.reopened = True
        self.check_state()
        self.check_long_documents()

    @rule()
    def close_and_reopen(self) -> None:
        super().close_and_reopen()
        self.check_long_documents()

    # ── long documents ──────────────────────────────────────────────────

    @rule(data=st.data())
    def create_long_document(self, data: Any) -> None:
        batch = _Batch()
        write = self.draw_document_create(data, batch)
        record = write["record"]
        if data.draw(st.sampled_from([True, True, True, False]), label="conversation scope"):
            # Mostly where history is kept: other scopes and "latest" keep the current value only.
            conversation = self.draw_conversation(data, batch)
            record["scope"] = {"kind": "conversation", "conversationId": conversation}
            history = data.draw(st.sampled_from(["rewindable", "rewindable", "latest"]))
            forks = ["asOf", "current", "initial"][history == "latest" :]
            record.update(history=history, fork=data.draw(st.sampled_from(forks), label="fork"))
        if data.draw(st.sampled_from([True, True, False]), label="a key of its own"):
            record["key"] = f"long-{record['id']}"  # else the pool's: addresses collide
        size = data.draw(st.sampled_from([CHUNK + 1, 3 * CHUNK, 0, 100]), label="text size")
        write["content"]["value"] = long_value(self.seeded(data), size)
        self.commit_long("long document", [write])

    @precondition(lambda self: bool(self.live_long()))
    @rule(data=st.data())
    def grow_long_document(self, data: Any) -> None:
        """Agent turns on one long document: an appended line and the turn count per commit."""

        id = data.draw(st.sampled_from(self.live_long()), label="long document")
        rng = self.seeded(data)
        for _ in range(data.draw(st.integers(1, TURNS), label="turns")):
            value, version = self.current(id)
            if isinstance(value, dict) and len(str(value.get("text"))) > LONGEST:
                break
            size = rng.choice(SIZES[1:6]) if rng.random() < 0.9 else rng.choice(SIZES[6:])
            change = LongDocumentWork.delta(id, version, append_ops(rng, value, size))
            if not self.commit("long append", [change]) or value is None:
                break  # rejected, or a value that does not read (a bad op in its history)

    @precondition(lambda self: bool(self.live_long()))
    @rule(data=st.data())
    def change_long_document(self, data: Any) -> None:
        """Any op on a long value as a delta, or a base rebasing it (the version may change)."""

        id = data.draw(st.sampled_from(self.live_long()), label="long document")
        rng = self.seeded(data)
        kind = data.draw(st.sampled_from([*OP_KINDS, "base", "new version"]), label="change")
        value, version = self.current(id)
        if kind in ("base", "new version"):
            try:
                rebased = apply_immutable(value, long_ops(rng, value, rng.choice(OP_KINDS)))
            except REFUSALS:  # a value the general machine's ops left in another shape
                rebased = value
            content = {
                "kind": "base",
                "version": version + (kind == "new version"),
                "value": rebased if isinstance(rebased, dict) else {},
            }
            change = {"type": "document.change", "id": id, "content": content}
        else:
            change = LongDocumentWork.delta(id, version, long_ops(rng, value, kind))
        self.commit(f"long {kind}", [change])

    @precondition(lambda self: bool(self.live_long()))
    @rule(data=st.data())
    def fail_a_long_turn_after_its_checks(self, data: Any) -> None:
        """A turn on a long document that fails after its checks (raised in its work, or by
        LMDB's commit), the snapshot packer let finish or not: the store goes on as if it was
        never made, and nothing it would have written is served, now or after a reopen."""

        id = data.draw(st.sampled_from(self.live_long()), label="long document")
        value, version = self.current(id)
        if value is None:
            return  # a value that does not read: nothing to append to
        rng = self.seeded(data)
        change = LongDocumentWork.delta(id, version, append_ops(rng, value, rng.choice(SIZES)))
        where = data.draw(st.sampled_from(["work", "commit"]), label="failing at")
        environment = self.ours._env  # the handle's environment: LMDB's commit fails there
        with (
            failing(Projector, "apply", lambda *args: True, OSError(errno.EIO, "injected"))
            if where == "work"
            else commit_fails(environment)
        ):
            try:
                self.run(lambda: self.ours.commit([change], CTX))
            except (OSError, lmdb.Error, *REFUSALS):
                pass  # a refusal by the checks: before the failure, and as good
            else:
                raise AssertionError(f"a commit failing at {where} was acknowledged")
        event(f"long turn failing at {where}")
        if data.draw(st.booleans(), label="the packer finishes"):
            self.ours._model.documents.drain()
        self.check_state()

    @precondition(lambda self: bool(self.long))
    @rule(data=st.data())
    def copy_long_document(self, data: Any) -> None:
        """``document.copy`` of a long document from a past point, into a conversation made in
        the same batch or an existing one (where the address may be taken)."""

        copyable = [
            id for id in self.long if self.documents[id]["record"].get("history") == "rewindable"
        ]
        source = data.draw(st.sampled_from(copyable * 3 + self.long), label="copy source")
        points = self.documents[source]["points"]
        last = self.seqs[-1]
        at = data.draw(
            st.one_of(
                st.sampled_from(["current", *points]),
                st.integers(points[0], last),
                st.integers(max(points[0] - 1, 1), last),
            ),
            label="copy point",
        )
        batch = _Batch()
        writes: list[dict[str, Any]] = []
        if data.draw(st.booleans(), label="into a new conversation"):
            conversation = self.draw_id(data, batch, "fork id")
            writes.append({"type": "conversation", "value": {"id": conversation}})
            batch.conversations.append(conversation)
        copy_write = self.draw_document_copy(data, batch, source)
        if data.draw(st.sampled_from([True, True, False]), label="record as the source's"):
            source_record = self.documents[source]["record"]
            for field in ("kind", "key", "history", "fork"):
                copy_write["record"].pop(field, None)
                if field in source_record:
                    copy_write["record"][field] = source_record[field]
        if writes:
            copy_write["record"]["scope"]["conversationId"] = writes[0]["value"]["id"]
        copy_write["source"]["at"] = at
        self.commit_long("long copy", [*writes, copy_write])

    @precondition(lambda self: bool(self.live_long()))
    @rule(data=st.data())
    def reject_after_long_document(self, data: Any) -> None:
        """A batch appending to a long document (and maybe another), then invalid writes: the
        rejection leaves every record as it was, and every past point reads as before."""

        id = data.draw(st.sampled_from(self.live_long()), label="long document")
        rng = self.seeded(data)
        value, version = self.current(id)
        writes = [LongDocumentWork.delta(id, version, append_ops(rng, value, rng.choice(SIZES)))]
        batch = _Batch()
        batch.documents.add(id)
        others = [other for other in self.live_long() if other != id]
        if others and data.draw(st.booleans(), label="another long document"):
            other = data.draw(st.sampled_from(others), label="other long document")
            other_value, other_version = self.current(other)
            ops = append_ops(rng, other_value, CHUNK + 9)
            writes.append(LongDocumentWork.delta(other, other_version, ops))
            batch.documents.add(other)
        writes += self.draw_writes(data, batch, self.TABLE_KINDS, 0, 1, "valid writes between")
        writes += data.draw(
            _drawn(lambda draw: self.draw_invalid(draw, batch)), label="invalid writes"
        )
        self.commit("rejected after a long document", writes)
        self.same_all(self.point_reads(id, self.spread(id)))

    @precondition(lambda self: bool(self.long))
    @rule(data=st.data())
    def read_long_points(self, data: Any) -> None:
        """A long document at drawn points: its revisions, between them, before its first."""

        id = data.draw(st.sampled_from(self.long), label="long document")
        points = self.documents[id]["points"]
        drawn = data.draw(
            st.lists(
                st.one_of(
                    st.sampled_from(points), st.integers(max(points[0] - 1, 1), self.seqs[-1])
                ),
                min_size=1,
                max_size=4,
            ),
            label="points",
        )
        self.same_all(self.point_reads(id, ["current", *drawn]))


LONG_SETTINGS = SETTINGS.__class__(SETTINGS, max_examples=EXAMPLES, stateful_step_count=STEPS)


@pytest.mark.slow
def test_long_documents_match_memory_storage() -> None:
    run_state_machine_as_test(LongDocumentMachine, settings=LONG_SETTINGS)
