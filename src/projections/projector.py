"""Folds log records into the projected tables: one code path for a live commit, a rebuild and a
catch-up.

``prepare`` checks a batch against the tables (the reference backends' checks, in their order, so
a rejected batch fails with the same words) and resolves document copies; ``apply`` writes the
prepared batch. Both run inside the caller's write transaction, so a rejection leaves nothing.
``admit`` is the one sequence of check, append and fold that every path takes (a commit alone or
in a group, a record from the stream, a fold of records already in the log).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, assert_never

import lmdb
import msgspec

from ..errors import CorruptProjectionError
from ..log import Commit, Write, codec
from ..log.records import (
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
from .delta import unreadable_value
from .readmodel import (
    MAX_SAFE_INTEGER,
    ReadModel,
    address_key,
    is_current_only,
    scope_key,
)
from .rows import Rows


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
    current: dict[int, tuple[t.CurrentValue, bytes]] = field(default_factory=dict)
    """Current values the checks read (and their stored bytes), for the fold to continue from."""
    records: bool = True
    """Whether the batch writes anything but document commands (else the fold skips that walk)."""


_DOCUMENT_WRITES: Final = frozenset(
    {DocumentCreateWrite, DocumentCopyWrite, DocumentChangeWrite, DocumentRetireWrite}
)

_NAMING_WRITES: Final = frozenset({DocumentChangeWrite, DocumentRetireWrite})
"""Writes that name an existing document rather than claim an id."""

_UNCLAIMED_WRITES: Final = frozenset({DocumentCopyWrite, DocumentChangeWrite, DocumentRetireWrite})
"""Writes whose id check is elsewhere: a copy is resolved to a create first."""

_TABLE_OF: Final[dict[type, str]] = {
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

    def fold(
        self, txn: lmdb.Transaction[bytes], commits: Sequence[Commit], check: bool = True
    ) -> None:
        """Apply records in order and write the last down as folded (catch-ups, rebuilds, verify).

        ``check=False`` skips the commit checks, which the records passed when they were
        committed; ``verify`` keeps them, to prove it.
        """

        # Unchecked folds keep each document's value here through the chunk's plain deltas and
        # write it once: a long document would otherwise be unsealed, decoded, encoded and sealed
        # again on every delta. Anything else that reads values runs after they are written.
        values: dict[int, t.CurrentValue] | None = None if check else {}
        with self.model.documents.inline():  # a fold writes its snapshots as it goes
            self._fold(txn, commits, check, values)
        if commits:
            state = t.ProjectionState(t.SCHEMA_VERSION, commits[-1].seq)
            txn.put(t.STATE_KEY, t.encode_state(state), db=self.db[t.STATE])

    def _fold(
        self,
        txn: lmdb.Transaction[bytes],
        commits: Sequence[Commit],
        check: bool,
        values: dict[int, t.CurrentValue] | None,
    ) -> None:
        for commit in commits:
            if values and any(type(write) is DocumentCopyWrite for write in commit.writes):
                self.model.documents.write_values(txn, values)
            outcome = self.admit(txn, commit.writes, lambda: commit.seq, check, values)
            if isinstance(outcome, Exception):
                raise outcome
        if values:
            self.model.documents.write_values(txn, values)

    def admit(
        self,
        txn: lmdb.Transaction[bytes],
        writes: list[Write],
        append: Callable[[], int],
        check: bool = True,
        values: dict[int, t.CurrentValue] | None = None,
    ) -> tuple[int, int] | Exception:
        """The one way a batch enters the tables, for every path (a commit alone or in a group, a
        record from the stream, a fold): check it against what ``txn`` sees, then ``append()``
        (which puts it in the log, or names the sequence it already has there) and fold it.
        Returns its sequence and highest id; a batch the checks refuse comes back as the error
        they raised, with nothing written, and each caller says what a refusal means there. An
        LMDB error, or anything raised after the checks, propagates: the transaction is spoiled."""

        self.model.documents.land(txn)  # snapshots packed since the last commit
        try:
            plan = self.prepare(txn, writes, check)
        except lmdb.Error:
            raise
        except Exception as error:
            return error
        if values and not all(map(_plain_delta, plan.actions.values())):
            self.model.documents.write_values(txn, values)
        seq = append()
        self.apply(txn, seq, plan, values)
        return seq, plan.max_id

    # ── checks ──────────────────────────────────────────────────────────────

    def prepare(
        self, txn: lmdb.Transaction[bytes], writes: list[Write], check: bool = True
    ) -> Plan:
        if check:
            for write in writes:
                _check_shape(write)
        kinds = set(map(type, writes))
        documents = not _DOCUMENT_WRITES.isdisjoint(kinds)
        plan = Plan(self._resolve_copies(txn, writes) if DocumentCopyWrite in kinds else writes)
        plan.records = not kinds <= _DOCUMENT_WRITES
        if check and not kinds <= _NAMING_WRITES:  # those alone claim no id: max_id stays 0
            self._check_ids(txn, plan)
        if documents:  # else there is nothing to group or check: a turn's batch skips both walks
            self._group_document_commands(plan)
            if check:
                self._check_document_actions(txn, plan)
        return plan

    def _resolve_copies(self, txn: lmdb.Transaction[bytes], writes: list[Write]) -> list[Write]:
        changed = {
            write.record["id"]
            if isinstance(write, (DocumentCreateWrite, DocumentCopyWrite))
            else write.id
            for write in writes
            if isinstance(
                write,
                (DocumentCreateWrite, DocumentCopyWrite, DocumentChangeWrite, DocumentRetireWrite),
            )
        }
        resolved: list[Write] = []
        unreadable: Exception | None = None  # raised once every copy resolved, as the reference
        for write in writes:
            if type(write) is not DocumentCopyWrite:
                resolved.append(write)
                continue
            try:
                resolved.append(self._resolve_copy(txn, write, changed))
            except Exception as error:
                if unreadable_value(error):
                    unreadable = unreadable or error
                    continue
                raise ValueError(f"Document copy {write.record['id']} was rejected") from error
        if unreadable is not None:
            raise unreadable
        return resolved

    def _resolve_copy(
        self, txn: lmdb.Transaction[bytes], write: DocumentCopyWrite, changed: set[int]
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

    def _check_ids(self, txn: lmdb.Transaction[bytes], plan: Plan) -> None:
        """Each id a batch writes is free or already its record type's (the id registry, read
        by key: ``_check_shape`` proved every id a positive safe integer)."""

        claimed: dict[int, str] = {}
        max_id = 0
        value, type_name, u64 = self.model.value, t.record_type_name, t.u64
        for write in plan.writes:
            table = _TABLE_OF.get(type(write))  # the record writes, by their exact type
            if table is not None:
                id = write.value["id"]  # type: ignore[union-attr]
            elif type(write) is DocumentCreateWrite:
                table, id = "document", write.record["id"]
            elif type(write) in _UNCLAIMED_WRITES:
                continue  # a copy is resolved to a create; the others name an existing id
            else:
                raise AssertionError(f"no id check for a {type(write).__name__}")
            key = u64(id)
            raw = value(txn, t.RECORD_IDS, key)
            existing = None if raw is None else type_name(raw, key)
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
            if id > max_id:
                max_id = id
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

    def _check_document_actions(self, txn: lmdb.Transaction[bytes], plan: Plan) -> None:
        live_counts: dict[bytes, int] = {}
        for id, action in plan.actions.items():
            delta = _plain_delta(action)
            if delta is not None:
                found = self.model.current_encoded(txn, id)
                if found is not None:  # a live document: it exists, is not retired, has a base
                    if found[0].version != delta.version:
                        raise ValueError(f"Document {id} version transition requires a base")
                    plan.current[id] = found
                    continue  # its address keeps the one incarnation it has
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
        if live_counts and any(live > 1 for live in live_counts.values()):
            raise ValueError("Document address already has a current incarnation")

    # ── application ─────────────────────────────────────────────────────────

    def apply(
        self,
        txn: lmdb.Transaction[bytes],
        seq: int,
        plan: Plan,
        values: dict[int, t.CurrentValue] | None = None,
    ) -> None:
        """Write a prepared batch; a live commit calls this in the log's transaction. ``values``:
        where plain deltas leave documents' values for the caller to write (see ``fold``)."""

        rows = Rows(txn, self.db, seq)
        for write in plan.writes if plan.records else ():
            match write:
                case EntryWrite():
                    self._put_entry(rows, write.value)
                case TaskWrite():
                    self._put_task(rows, write.value)
                case SubmissionWrite():
                    self._put_submission(rows, write.value)
                case ConversationWrite():
                    self._put_conversation(rows, write.value)
                case DocumentCreateWrite() | DocumentChangeWrite() | DocumentRetireWrite():
                    pass  # grouped into ``plan.actions``, applied below
                case DocumentCopyWrite():
                    raise AssertionError("prepare resolves every copy to a create")
                case _:
                    assert_never(write)
        for id, action in plan.actions.items():
            delta = _plain_delta(action)
            if delta is not None:
                self.model.documents.put_delta(rows, id, delta, plan.current.get(id), values)
            else:
                self._apply_document(rows, id, action)

    def _put_conversation(self, rows: Rows, value: Any) -> None:
        id = value["id"]
        rows.claim(t.u64(id), "conversation")
        rows.put(t.CONVERSATIONS, t.u64(id), codec.encode(value))
        parent = value.get("parent")
        fork = b"" if parent is None else t.u64_pair(parent["conversationId"], parent["at"])
        rows.put(t.CONVERSATION_PARENTS, t.u64(id), fork)
        owner = value.get("owner")
        if owner is not None:
            rows.put(
                t.CONVERSATIONS_BY_OWNER_CONVERSATION, t.u64_pair(owner["conversationId"], id), b""
            )
            rows.put(t.CONVERSATIONS_BY_OWNER_TASK, t.u64_pair(owner["taskId"], id), b"")

    def _put_entry(self, rows: Rows, value: Any) -> None:
        id, conversation_id = value["id"], value["conversationId"]
        rows.claim(t.u64(id), "entry", t.u64(conversation_id))
        rows.put(
            t.ENTRIES_BY_CONVERSATION,
            t.u64_pair(conversation_id, id),
            t.pack_entry(t.encode_row(t.EntryRow(rows.seq, value))),
        )
        if "head" in value:
            rows.put(t.HEADS_BY_CONVERSATION, t.u64_pair(conversation_id, id), b"")

    def _put_task(self, rows: Rows, value: Any) -> None:
        id = value["id"]
        key = t.u64(id)
        previous = rows.replace(t.TASKS, key, t.written_row(rows.seq, codec.encode(value)))
        status = t.TASK_STATUS_KEYS[value["state"]["status"]]
        if previous is None:
            rows.claim(key, "task")
        else:
            old_status = t.TASK_STATUS_KEYS[_task_status(previous[t.WRITER_SIZE :], key)]
            if old_status == status:
                return
            rows.delete(t.TASKS_BY_STATUS, old_status + key)
        rows.put(t.TASKS_BY_STATUS, status + key, t.u64(rows.seq))

    def _put_submission(self, rows: Rows, value: Any) -> None:
        id = value["id"]
        rows.claim(t.u64(id), "submission")
        raw = rows.replace(t.SUBMISSIONS, t.u64(id), codec.encode(value))
        previous = (
            None if raw is None else t.decode_row(t.any_decoder, raw, t.SUBMISSIONS, t.u64(id))
        )
        status = t.SUBMISSION_STATUS_KEYS[value["status"]]
        if previous is not None:
            old_status = t.SUBMISSION_STATUS_KEYS[previous["status"]]
            if old_status != status:
                rows.delete(t.SUBMISSIONS_BY_STATUS, old_status + t.u64(id))
            previous_request = previous.get("requestId")
            if previous_request is not None:
                key = t.u64(previous["conversationId"]) + t.text_key(previous_request)
                if rows.get(t.SUBMISSIONS_BY_REQUEST, key) == t.u64(id):
                    rows.delete(t.SUBMISSIONS_BY_REQUEST, key)
        if previous is None or previous["status"] != value["status"]:
            rows.put(t.SUBMISSIONS_BY_STATUS, status + t.u64(id), t.u64(rows.seq))
        request = value.get("requestId")
        if request is not None:
            rows.put(
                t.SUBMISSIONS_BY_REQUEST,
                t.u64(value["conversationId"]) + t.text_key(request),
                t.u64(id),
            )

    def _apply_document(self, rows: Rows, id: int, action: DocumentAction) -> None:
        key = t.u64(id)
        seq = rows.seq
        if action.create is not None:
            record = {**action.create, "createdAt": seq}
            if action.retire:
                record["retiredAt"] = seq
            rows.claim(key, "document")
            address = address_key(record)
            rows.put(t.DOCUMENT_INCARNATIONS, address + key, b"")
            rows.put(t.DOCUMENTS_BY_SCOPE, scope_key(record["scope"]) + key, b"")
            if not action.retire:
                rows.put(t.DOCUMENT_CURRENT, address, key)
        else:
            stored = rows.get(t.DOCUMENTS, key)
            assert stored is not None, "prepare checked that the document exists"
            record = t.decode_row(t.any_decoder, stored, t.DOCUMENTS, key)
            if action.retire:
                record["retiredAt"] = seq
                address = address_key(record)
                if rows.get(t.DOCUMENT_CURRENT, address) == key:
                    rows.delete(t.DOCUMENT_CURRENT, address)
        if action.create is not None or action.retire:
            rows.put(t.DOCUMENTS, key, codec.encode(record))
        current_only = is_current_only(record)
        documents = self.model.documents
        match action.content:
            case BaseContent() as content:
                documents.put_base(rows, id, content, current_only)
            case DeltaContent() as content:
                documents.put_delta(rows, id, content, None)
            case None:
                pass
            case _:
                assert_never(action.content)
        if action.retire:
            documents.retire(rows, id, current_only)


class _TaskState(msgspec.Struct):
    status: str


class _TaskStatus(msgspec.Struct):
    """The one field a task update needs of the task it replaces; the rest is skipped unbuilt."""

    state: _TaskState


_task_status_decoder: Final = codec.decoder(_TaskStatus)


def _task_status(raw: bytes, key: bytes) -> str:
    status: str
    try:
        status = _task_status_decoder.decode(raw).state.status
    except (msgspec.ValidationError, RecursionError):  # escaped objects (odd keys), deep values
        status = t.decode_row(t.any_decoder, raw, t.TASKS, key)["state"]["status"]
    except (msgspec.DecodeError, ValueError):
        raise CorruptProjectionError(t.TASKS, key) from None
    return status


def _plain_delta(action: DocumentAction) -> DeltaContent | None:
    """The delta of an action that is a delta to an existing document and nothing else (the
    commonest document command); else None."""

    content = action.content
    if action.create is None and not action.retire and isinstance(content, DeltaContent):
        return content
    return None


# ── shape checks: what the folds rely on, named precisely ─────────────────────


def _check_id(value: object, what: str, *parts: object) -> None:
    """``what.format(*parts)`` names the field, formatted only when the check fails (every
    commit passes here: an f-string per field would be built for nothing)."""

    if type(value) is not int or not 1 <= value <= MAX_SAFE_INTEGER:
        raise ValueError(f"{what.format(*parts)} must be a positive safe integer, not {value!r}")


def _object(value: object, what: str, *parts: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what.format(*parts)} must be an object, not {type(value).__name__}")
    return value


def _check_entry(write: EntryWrite) -> None:
    value = _object(write.value, "An entry write's value")
    _check_id(value.get("id"), "An entry's 'id'")
    _check_id(value.get("conversationId"), "Entry {}'s 'conversationId'", value["id"])


def _check_task(write: TaskWrite) -> None:
    value = _object(write.value, "A task write's value")
    _check_id(value.get("id"), "A task's 'id'")
    state = _object(value.get("state"), "Task {}'s 'state'", value["id"])
    if state.get("status") not in t.TASK_STATUS_KEYS:
        raise ValueError(f"Task {value['id']} has an unknown status {state.get('status')!r}")


def _check_submission(write: SubmissionWrite) -> None:
    value = _object(write.value, "A submission write's value")
    _check_id(value.get("id"), "A submission's 'id'")
    if value.get("status") not in t.SUBMISSION_STATUS_KEYS:
        raise ValueError(f"Submission {value['id']} has an unknown status {value.get('status')!r}")
    if value.get("requestId") is not None:
        _check_id(value.get("conversationId"), "Submission {}'s 'conversationId'", value["id"])


def _check_conversation(write: ConversationWrite) -> None:
    value = _object(write.value, "A conversation write's value")
    _check_id(value.get("id"), "A conversation's 'id'")
    for name, fields in (
        ("parent", ("conversationId", "at")),
        ("owner", ("conversationId", "taskId")),
    ):
        if name in value:
            part = _object(value[name], "Conversation {}'s '{}'", value["id"], name)
            for field_name in fields:
                _check_id(
                    part.get(field_name),
                    "Conversation {}'s '{}.{}'",
                    value["id"],
                    name,
                    field_name,
                )


def _check_document_record(write: DocumentCreateWrite | DocumentCopyWrite) -> None:
    record = _object(write.record, "A document write's record")
    _check_id(record.get("id"), "A document's 'id'")
    scope = _object(record.get("scope"), "Document {}'s 'scope'", record["id"])
    if "kind" not in record or "kind" not in scope:
        raise ValueError(f"Document {record['id']} needs a 'kind' and a 'scope.kind'")


def _check_document_command(write: DocumentChangeWrite | DocumentRetireWrite) -> None:
    _check_id(write.id, "A document command's 'id'")


_SHAPE_CHECKS: Final[dict[type, Callable[[Any], None]]] = {
    EntryWrite: _check_entry,
    TaskWrite: _check_task,
    SubmissionWrite: _check_submission,
    ConversationWrite: _check_conversation,
    DocumentCreateWrite: _check_document_record,
    DocumentCopyWrite: _check_document_record,
    DocumentChangeWrite: _check_document_command,
    DocumentRetireWrite: _check_document_command,
}
"""The shape check of each write type, by its exact type (the writes are decoded Structs, never
subclassed): one lookup where a ``match`` tried the types in turn."""


def _check_shape(write: Write) -> None:
    check = _SHAPE_CHECKS.get(type(write))
    if check is None:
        raise AssertionError(f"no shape check for a {type(write).__name__}")
    check(write)


__all__ = [
    "DocumentAction",
    "Plan",
    "Projector",
]
