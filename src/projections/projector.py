"""Folds log records into the projected tables: one code path for a live commit, a rebuild and a
catch-up.

``prepare`` checks a batch against the tables (the reference backends' checks, in their order, so
a rejected batch fails with the same words) and resolves document copies; ``apply`` writes the
prepared batch. Both run inside the caller's write transaction, so a rejection leaves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lmdb

from log import Commit, Write, codec
from log.records import (
    BaseContent,
    Content,
    ConversationWrite,
    DeltaContent,
    DocumentChangeWrite,
    DocumentCopyWrite,
    DocumentCreateWrite,
    DocumentRetireWrite,
    EntryWrite,
    SubmissionWrite,
    TaskWrite,
)

from . import tables as t
from .delta import apply_ops
from .readmodel import (
    MAX_SAFE_INTEGER,
    ReadModel,
    address_key,
    is_current_only,
    scope_key,
)


@dataclass(slots=True)
class DocumentAction:
    create: Any = None
    content: Content | None = None
    retire: bool = False


@dataclass(slots=True)
class Plan:
    """A checked batch: copies resolved to creates, document commands grouped by id."""

    writes: list[Write]
    actions: dict[int, DocumentAction] = field(default_factory=dict)
    max_id: int = 0


_TABLE_OF = {
    ConversationWrite: "conversation",
    EntryWrite: "entry",
    TaskWrite: "task",
    SubmissionWrite: "submission",
}


class Projector:
    """Applies batches to the core tables of a ``ReadModel``."""

    def __init__(self, model: ReadModel) -> None:
        self.model = model
        self.db = model.db

    def fold(self, txn: lmdb.Transaction, commit: Commit) -> Plan:
        plan = self.prepare(txn, commit.writes)
        self.apply(txn, commit.seq, plan)
        return plan

    # ── checks ──────────────────────────────────────────────────────────────

    def prepare(self, txn: lmdb.Transaction, writes: list[Write]) -> Plan:
        for write in writes:
            _check_shape(write)
        plan = Plan(self._resolve_copies(txn, writes))
        self._check_ids(txn, plan)
        self._group_document_commands(plan)
        self._check_document_actions(txn, plan)
        return plan

    def _resolve_copies(self, txn: lmdb.Transaction, writes: list[Write]) -> list[Write]:
        if not any(type(write) is DocumentCopyWrite for write in writes):
            return writes
        changed = {
            write.record["id"] if isinstance(write, (DocumentCreateWrite, DocumentCopyWrite)) else write.id
            for write in writes
            if isinstance(write, (DocumentCreateWrite, DocumentCopyWrite, DocumentChangeWrite, DocumentRetireWrite))
        }
        resolved: list[Write] = []
        for write in writes:
            if type(write) is not DocumentCopyWrite:
                resolved.append(write)
                continue
            try:
                resolved.append(self._resolve_copy(txn, write, changed))
            except Exception as error:
                raise ValueError(f"Document copy {write.record['id']} was rejected") from error
        return resolved

    def _resolve_copy(
        self, txn: lmdb.Transaction, write: DocumentCopyWrite, changed: set[int]
    ) -> DocumentCreateWrite:
        source = write.source
        if source.id in changed:
            raise ValueError(f"Fork source document {source.id} is changed in the copy batch")
        stored = self.model.materialize(txn, source.id, source.at)
        if stored is None:
            raise ValueError(f"Fork source document {source.id} cannot be read")
        source_record, record = stored["record"], write.record
        if (
            source_record["scope"]["kind"] != "conversation"
            or record["scope"]["kind"] != "conversation"
            or source_record["kind"] != record["kind"]
            or source_record.get("key") != record.get("key")
            or source_record.get("history") != record.get("history")
            or source_record.get("fork") != record.get("fork")
        ):
            raise ValueError(f"Fork source document {source.id} does not match the copied record")
        return DocumentCreateWrite(record, BaseContent(stored["version"], stored["value"]))

    def _check_ids(self, txn: lmdb.Transaction, plan: Plan) -> None:
        claimed: dict[int, str] = {}
        max_id = 0
        for write in plan.writes:
            kind = type(write)
            if kind is DocumentCreateWrite:
                table, id = "document", write.record["id"]  # type: ignore[union-attr]
            elif kind in _TABLE_OF:
                table, id = _TABLE_OF[kind], write.value["id"]  # type: ignore[union-attr]
            else:
                continue
            existing = self.model.record_type(txn, id)
            earlier = claimed.get(id)
            if table in ("conversation", "entry", "document"):
                if existing is not None:
                    raise ValueError(f"ID {id} already belongs to {existing}")
                if earlier is not None:
                    raise ValueError(f"ID {id} is written more than once")
            else:
                if existing is not None and existing != table:
                    raise ValueError(f"ID {id} already belongs to {existing}")
                if earlier is not None and earlier != table:
                    raise ValueError(f"ID {id} is written as two record types")
            claimed[id] = table
            max_id = max(max_id, id)
        plan.max_id = max_id

    def _group_document_commands(self, plan: Plan) -> None:
        actions = plan.actions
        for write in plan.writes:
            if isinstance(write, DocumentCreateWrite):
                id = write.record["id"]
                action = actions.setdefault(id, DocumentAction())
                if action.create is not None or action.content is not None:
                    raise ValueError(f"Document {id} has more than one content command")
                action.create = write.record
                action.content = write.content
            elif isinstance(write, DocumentChangeWrite):
                action = actions.setdefault(write.id, DocumentAction())
                if action.content is not None:
                    raise ValueError(f"Document {write.id} has more than one content command")
                action.content = write.content
            elif isinstance(write, DocumentRetireWrite):
                action = actions.setdefault(write.id, DocumentAction())
                if action.retire:
                    raise ValueError(f"Document {write.id} is retired more than once")
                action.retire = True

    def _check_document_actions(self, txn: lmdb.Transaction, plan: Plan) -> None:
        live_counts: dict[bytes, int] = {}
        for id, action in plan.actions.items():
            existing = self.model.document_record(txn, id)
            if action.create is None and existing is None:
                raise ValueError(f"Unknown document: {id}")
            if action.create is not None and existing is not None:
                raise ValueError(f"Document {id} already exists")
            if existing is not None and "retiredAt" in existing:
                raise ValueError(f"Document {id} is retired")
            if isinstance(action.content, DeltaContent):
                previous = None if existing is None else self.model.last_revision_version(txn, id)
                if previous is None:
                    raise ValueError(f"Document {id} delta has no base")
                if previous != action.content.version:
                    raise ValueError(f"Document {id} version transition requires a base")
            address = address_key(action.create if action.create is not None else existing)
            current_id = self.model.current_document_id(txn, address)
            live = live_counts.get(address)
            if live is None:
                live = 0 if current_id is None else 1
            if action.retire and current_id == id:
                live -= 1
            if action.create is not None and not action.retire:
                live += 1
            live_counts[address] = live
        if any(live > 1 for live in live_counts.values()):
            raise ValueError("Document address already has a current incarnation")

    # ── application ─────────────────────────────────────────────────────────

    def apply(self, txn: lmdb.Transaction, seq: int, plan: Plan) -> None:
        for write in plan.writes:
            kind = type(write)
            if kind is EntryWrite:
                self._put_entry(txn, seq, write.value)  # type: ignore[union-attr]
            elif kind is TaskWrite:
                self._put_task(txn, write.value)  # type: ignore[union-attr]
            elif kind is SubmissionWrite:
                self._put_submission(txn, write.value)  # type: ignore[union-attr]
            elif kind is ConversationWrite:
                self._put_conversation(txn, write.value)  # type: ignore[union-attr]
        for id, action in plan.actions.items():
            self._apply_document(txn, seq, id, action)
        state = t.ProjectionState(t.SCHEMA_VERSION, seq)
        txn.put(t.STATE_KEY, t.encode_state(state), db=self.db[t.STATE])

    def _claim(self, txn: lmdb.Transaction, id: int, table: str) -> None:
        txn.put(t.u64(id), t.RECORD_TYPES[table], db=self.db[t.RECORD_IDS])

    def _put_conversation(self, txn: lmdb.Transaction, value: Any) -> None:
        id = value["id"]
        self._claim(txn, id, "conversation")
        txn.put(t.u64(id), codec.encode(value), db=self.db[t.CONVERSATIONS])
        owner = value.get("owner")
        if owner is not None:
            txn.put(t.u64_pair(owner["conversationId"], id), b"", db=self.db[t.CONVERSATIONS_BY_OWNER_CONVERSATION])
            txn.put(t.u64_pair(owner["taskId"], id), b"", db=self.db[t.CONVERSATIONS_BY_OWNER_TASK])

    def _put_entry(self, txn: lmdb.Transaction, seq: int, value: Any) -> None:
        id, conversation_id = value["id"], value["conversationId"]
        self._claim(txn, id, "entry")
        txn.put(t.u64(id), t.encode_row(t.EntryRow(seq, value)), db=self.db[t.ENTRIES])
        txn.put(t.u64_pair(conversation_id, id), b"", db=self.db[t.ENTRIES_BY_CONVERSATION])
        if "head" in value:
            txn.put(t.u64_pair(conversation_id, id), b"", db=self.db[t.HEADS_BY_CONVERSATION])

    def _put_task(self, txn: lmdb.Transaction, value: Any) -> None:
        id = value["id"]
        self._claim(txn, id, "task")
        by_status = self.db[t.TASKS_BY_STATUS]
        previous = self.model.task(txn, id)
        status = value["state"]["status"]
        if previous is not None:
            txn.delete(t.TASK_STATUS_KEYS[previous["state"]["status"]] + t.u64(id), db=by_status)
        txn.put(t.TASK_STATUS_KEYS[status] + t.u64(id), b"", db=by_status)
        txn.put(t.u64(id), codec.encode(value), db=self.db[t.TASKS])

    def _put_submission(self, txn: lmdb.Transaction, value: Any) -> None:
        id = value["id"]
        self._claim(txn, id, "submission")
        by_status = self.db[t.SUBMISSIONS_BY_STATUS]
        by_request = self.db[t.SUBMISSIONS_BY_REQUEST]
        previous = self.model.submission(txn, id)
        if previous is not None:
            txn.delete(t.SUBMISSION_STATUS_KEYS[previous["status"]] + t.u64(id), db=by_status)
            previous_request = previous.get("requestId")
            if previous_request is not None:
                key = t.u64(previous["conversationId"]) + t.text_key(previous_request)
                if txn.get(key, db=by_request) == t.u64(id):
                    txn.delete(key, db=by_request)
        txn.put(t.SUBMISSION_STATUS_KEYS[value["status"]] + t.u64(id), b"", db=by_status)
        request = value.get("requestId")
        if request is not None:
            key = t.u64(value["conversationId"]) + t.text_key(request)
            txn.put(key, t.u64(id), db=by_request)
        txn.put(t.u64(id), codec.encode(value), db=self.db[t.SUBMISSIONS])

    def _apply_document(self, txn: lmdb.Transaction, seq: int, id: int, action: DocumentAction) -> None:
        documents = self.db[t.DOCUMENTS]
        key = t.u64(id)
        if action.create is not None:
            record = {**action.create, "createdAt": seq}
            if action.retire:
                record["retiredAt"] = seq
            self._claim(txn, id, "document")
            address = address_key(record)
            txn.put(address + key, b"", db=self.db[t.DOCUMENT_INCARNATIONS])
            txn.put(scope_key(record["scope"]) + key, b"", db=self.db[t.DOCUMENTS_BY_SCOPE])
            if not action.retire:
                txn.put(address, key, db=self.db[t.DOCUMENT_CURRENT])
        else:
            record = self.model.document_record(txn, id)
            if action.retire:
                record["retiredAt"] = seq
                address = address_key(record)
                if self.model.current_document_id(txn, address) == id:
                    txn.delete(address, db=self.db[t.DOCUMENT_CURRENT])
        if action.create is not None or action.retire:
            txn.put(key, codec.encode(record), db=documents)
        current_only = is_current_only(record)
        if action.content is not None:
            self._put_revision(txn, seq, id, action.content, current_only)
        if action.retire:
            txn.delete(key, db=self.db[t.DOCUMENT_VALUES])
            if current_only:
                self._drop_revisions(txn, id)

    def _put_revision(
        self, txn: lmdb.Transaction, seq: int, id: int, content: Content, current_only: bool
    ) -> None:
        values = self.db[t.DOCUMENT_VALUES]
        if isinstance(content, BaseContent):
            if current_only:
                self._drop_revisions(txn, id)
            revision = t.Revision("base", content.version, content.value)
            current = t.CurrentValue(content.version, 0, content.value)
        else:
            revision = t.Revision("delta", content.version, content.ops)
            previous = self.model.current_value(txn, id)
            assert previous is not None, f"document {id} has no current value"
            current = t.CurrentValue(
                previous.version, previous.deltas_since_base + 1, previous.value, previous.broken
            )
            if not current.broken:
                try:
                    current.value = apply_ops(current.value, content.ops)
                except Exception:
                    current.broken = True
        txn.put(t.u64_pair(id, seq), t.encode_row(revision), db=self.db[t.DOCUMENT_REVISIONS])
        txn.put(t.u64(id), t.encode_row(current), db=values)

    def _drop_revisions(self, txn: lmdb.Transaction, id: int) -> None:
        revisions = self.db[t.DOCUMENT_REVISIONS]
        prefix = t.u64(id)
        cursor = txn.cursor(db=revisions)
        if not cursor.set_range(prefix):
            return
        while cursor.key()[:8] == prefix:
            if not cursor.delete():
                break


# ── shape checks: what the folds rely on, named precisely ─────────────────────


def _check_id(value: object, what: str) -> None:
    if type(value) is not int or not 1 <= value <= MAX_SAFE_INTEGER:
        raise ValueError(f"{what} must be a positive safe integer, not {value!r}")


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be an object, not {type(value).__name__}")
    return value


def _check_shape(write: Write) -> None:
    kind = type(write)
    if kind is EntryWrite:
        value = _object(write.value, "An entry write's value")  # type: ignore[union-attr]
        _check_id(value.get("id"), "An entry's 'id'")
        _check_id(value.get("conversationId"), f"Entry {value['id']}'s 'conversationId'")
    elif kind is TaskWrite:
        value = _object(write.value, "A task write's value")  # type: ignore[union-attr]
        _check_id(value.get("id"), "A task's 'id'")
        state = _object(value.get("state"), f"Task {value['id']}'s 'state'")
        if state.get("status") not in t.TASK_STATUS_KEYS:
            raise ValueError(f"Task {value['id']} has an unknown status {state.get('status')!r}")
    elif kind is SubmissionWrite:
        value = _object(write.value, "A submission write's value")  # type: ignore[union-attr]
        _check_id(value.get("id"), "A submission's 'id'")
        if value.get("status") not in t.SUBMISSION_STATUS_KEYS:
            raise ValueError(
                f"Submission {value['id']} has an unknown status {value.get('status')!r}"
            )
        if value.get("requestId") is not None:
            _check_id(value.get("conversationId"), f"Submission {value['id']}'s 'conversationId'")
    elif kind is ConversationWrite:
        value = _object(write.value, "A conversation write's value")  # type: ignore[union-attr]
        _check_id(value.get("id"), "A conversation's 'id'")
        for name, fields in (("parent", ("conversationId", "at")), ("owner", ("conversationId", "taskId"))):
            if name in value:
                part = _object(value[name], f"Conversation {value['id']}'s '{name}'")
                for field_name in fields:
                    _check_id(part.get(field_name), f"Conversation {value['id']}'s '{name}.{field_name}'")
    elif kind is DocumentCreateWrite or kind is DocumentCopyWrite:
        record = _object(write.record, "A document write's record")  # type: ignore[union-attr]
        _check_id(record.get("id"), "A document's 'id'")
        scope = _object(record.get("scope"), f"Document {record['id']}'s 'scope'")
        if "kind" not in record or "kind" not in scope:
            raise ValueError(f"Document {record['id']} needs a 'kind' and a 'scope.kind'")
    elif kind is DocumentChangeWrite or kind is DocumentRetireWrite:
        _check_id(write.id, "A document command's 'id'")  # type: ignore[union-attr]
