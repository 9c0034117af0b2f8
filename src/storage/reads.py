"""The Storage contract's reads, served from the projections' read model.

``StorageReads`` answers every read of the contract inside one short read transaction each; the
store (``LmdbStorage``) and its views as of an earlier commit (``StorageView``) share it and differ
only in the transaction they read in and the tables they read (``_read``, ``_model``). Results are
detached values; invalid requests raise ``StorageRequestError`` where the reference raises it.
"""

from __future__ import annotations

import functools
import inspect
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast, overload

import msgspec
from pi_durable.context import Context
from pi_durable.types import (
    ConversationId,
    ConversationQuery,
    ConversationRecord,
    Cursor,
    DocumentAddress,
    DocumentId,
    DocumentPoint,
    DocumentQuery,
    DocumentRecord,
    EntryId,
    EntryLookup,
    EntryQuery,
    EntryRecord,
    EntryWithHead,
    Page,
    Seq,
    StoredDocument,
    SubmissionId,
    SubmissionQuery,
    SubmissionRecord,
    TaskId,
    TaskQuery,
    TaskRecord,
)

from ..errors import HistoryTrimmed
from ..log import base as log_base
from ..projections import ReadModel, StorageRequestError
from ..projections import tables as t
from ..projections.readmodel import address_key, as_key_id, is_alive_at, point_bound, scope_key
from .scan import cursor_after, is_safe_int, page_of, reference_page, scan_start, take_page

T = TypeVar("T")

TASK_FILTERS: Final = ("conversationId", "kind", "abortRequested", "background")


class StorageReads:
    """Every read of the contract, over whatever ``_read()`` yields: the live tables in a short
    read transaction, or (``StorageView``) the same tables as of an earlier commit."""

    _model: ReadModel

    def _read(self) -> Any:
        raise NotImplementedError

    def _lookup(self, read: Callable[..., T], *args: Any) -> T:
        """``read(model, txn, *args)`` in a read transaction of its own (point reads); the model
        is the one that transaction is served by."""

        with self._read() as txn:
            return read(self._model, txn, *args)

    def check_open(self) -> None:
        """Raise ``StoreClosedError`` once the store is closed (each backend says how)."""

        raise NotImplementedError

    async def conversation(self, id: ConversationId, context: Context) -> ConversationRecord | None:
        """One conversation by exact id, detached (decoded afresh from its row)."""

        return self._lookup(ReadModel.conversation, id)

    async def scan_conversations(
        self, query: ConversationQuery, limit: int, cursor: Cursor | None, context: Context
    ) -> Page[ConversationRecord, Cursor]:
        """Conversations by id, through an owner index when the query names an owner."""

        owner_task = query.get("ownerTaskId")
        owner_conversation = query.get("ownerConversationId")
        with self._read() as txn:
            start = scan_start(query.get("order"), cursor, "ascending")
            descending = start.order == "descending"
            index: str | None
            owner: int | None
            if owner_task is not None:
                index, owner = t.CONVERSATIONS_BY_OWNER_TASK, owner_task
            elif owner_conversation is not None:
                index, owner = t.CONVERSATIONS_BY_OWNER_CONVERSATION, owner_conversation
            else:
                index, owner = None, None
            if index is not None and as_key_id(owner) is None:
                return {"items": []}
            prefix = b"" if index is None or owner is None else t.u64(owner)
            records = self._model.scan_table(
                txn, t.CONVERSATIONS, index, prefix, start.after, descending
            )
            keep = None
            if owner_conversation is not None:
                keep = lambda record: (  # noqa: E731
                    record.get("owner") is not None
                    and record["owner"]["conversationId"] == owner_conversation
                )
            return cast(
                "Page[ConversationRecord, Cursor]", take_page(records, limit, start.order, keep)
            )

    @overload
    async def entry(self, id: EntryId, context: Context, /) -> EntryLookup | None: ...

    @overload
    async def entry(
        self, conversation_id: ConversationId, id: EntryId, context: Context, /
    ) -> EntryLookup | None: ...

    async def entry(
        self,
        id_or_conversation_id: EntryId | ConversationId | int,
        id_or_context: EntryId | Context | None = None,
        context: Context | None = None,
    ) -> EntryLookup | None:
        """``entry(id, context)`` globally, or ``entry(conversation_id, id, context)`` through
        the conversation's fork ancestry (the contract's two forms, told apart by arity)."""

        if context is not None:
            return await self._entry_through(id_or_conversation_id, id_or_context)
        id = positive_id(id_or_conversation_id)
        row = self._lookup(ReadModel.entry_row, id)
        if row is None:
            return None
        found: EntryLookup = {"entry": row.record, "commitSeq": Seq(row.commit_seq)}
        return found

    async def _entry_through(self, conversation_id: Any, id: Any) -> EntryLookup | None:
        self.check_open()
        if not is_safe_int(id):
            raise StorageRequestError("Storage.entry() requires an entry ID")
        conversation_id = positive_id(conversation_id)
        id = positive_id(id)
        with self._read() as txn:
            rows, _ = self._model.entry_page(txn, conversation_id, id, id, True, 1)
            if not rows:
                return None
            found: EntryLookup = {"entry": rows[0].record, "commitSeq": Seq(rows[0].commit_seq)}
            return found

    async def find_latest_head_marker(
        self,
        conversation_id: ConversationId,
        at_or_before_entry_id: EntryId | None,
        context: Context,
    ) -> EntryWithHead | None:
        """The newest head marker visible from the conversation, walking up its forks."""

        with self._read() as txn:
            return self._model.latest_head_marker(txn, conversation_id, at_or_before_entry_id)

    async def scan_entries(
        self, query: EntryQuery, limit: int, cursor: Cursor | None, context: Context
    ) -> Page[EntryRecord, Cursor]:
        """Entries visible in a conversation (its own and its ancestors' up to each fork point)."""

        with self._read() as txn:
            start = scan_start(query.get("order"), cursor, "descending")
            min_entry_id: int | None = query.get("minEntryId")
            max_entry_id: int | None = query.get("maxEntryId")
            if start.after is not None and start.order == "descending":
                bound = start.after if max_entry_id is None else max_entry_id
                max_entry_id = min(bound, start.after - 1)
            if start.after is not None and start.order == "ascending":
                bound = start.after if min_entry_id is None else min_entry_id
                min_entry_id = max(bound, start.after + 1)
            descending = start.order == "descending"
            if not isinstance(limit, int):  # the reference's loop, compare for compare
                rows, _ = self._model.entry_page(
                    txn, query["conversationId"], min_entry_id, max_entry_id, descending, -1
                )
                values = []
                for row in rows:
                    values.append(row.record)
                    if len(values) > limit:
                        break
                return reference_page(values, limit, start.order)
            rows, more = self._model.entry_page(
                txn,
                query["conversationId"],
                min_entry_id,
                max_entry_id,
                descending,
                max(
                    limit, 0
                ),  # below 1, "more" is any entry: the page then fails as the reference's
            )
            return cast(
                "Page[EntryRecord, Cursor]",
                page_of([row.record for row in rows], more, start.order),
            )

    async def task(self, id: TaskId, context: Context) -> TaskRecord | None:
        """The latest record of one task."""

        return self._lookup(ReadModel.task, id)

    async def scan_tasks(
        self, query: TaskQuery, limit: int, cursor: Cursor | None, context: Context
    ) -> Page[TaskRecord, Cursor]:
        """Tasks matching every filter of the query, through the status index when it has one."""

        return self._scan_by_status(
            query, limit, cursor, t.TASKS, t.TASKS_BY_STATUS, t.TASK_STATUS_KEYS, TASK_FILTERS
        )

    async def submission(self, id: SubmissionId, context: Context) -> SubmissionRecord | None:
        """The latest record of one admitted submission."""

        return self._lookup(ReadModel.submission, id)

    async def scan_submissions(
        self, query: SubmissionQuery, limit: int, cursor: Cursor | None, context: Context
    ) -> Page[SubmissionRecord, Cursor]:
        """Submissions matching every filter of the query, through the status index when it has one."""

        return self._scan_by_status(
            query,
            limit,
            cursor,
            t.SUBMISSIONS,
            t.SUBMISSIONS_BY_STATUS,
            t.SUBMISSION_STATUS_KEYS,
            ("conversationId",),
        )

    def _scan_by_status(
        self,
        query: Any,
        limit: int,
        cursor: Cursor | None,
        table: str,
        by_status: str,
        status_keys: dict[str, bytes],
        filters: tuple[str, ...],
    ) -> Page[Any, Cursor]:
        """Tasks or submissions in id order, through the status index when the query has one,
        filtered as the reference filters them."""

        with self._read() as txn:
            start = scan_start(query.get("order"), cursor, "ascending")
            status = query.get("status")
            index, prefix = (None, b"") if status is None else (by_status, status_keys[status])
            records = self._model.scan_table(
                txn, table, index, prefix, start.after, start.order == "descending"
            )
            wanted = [(name, query[name]) for name in filters if name in query]
            keep = None
            if wanted:
                keep = lambda record: all(record[name] == value for name, value in wanted)  # noqa: E731
            return cast("Page[Any, Cursor]", take_page(records, limit, start.order, keep))

    async def submission_by_request(
        self, conversation_id: ConversationId, request_id: str, context: Context
    ) -> SubmissionRecord | None:
        """A submission by the host's per-conversation deduplication key."""

        with self._read() as txn:
            id = self._model.submission_id_by_request(txn, conversation_id, request_id)
            return None if id is None else self._model.submission(txn, id)

    # ── document reads ──────────────────────────────────────────────────────

    async def find_document(
        self, address: DocumentAddress, at: DocumentPoint, context: Context
    ) -> DocumentRecord | None:
        """The incarnation occupying one logical address now, or at commit ``at``."""

        with self._read() as txn:
            key = address_key(address)
            if at == "current":
                id = self._model.current_document_id(txn, key)
                return None if id is None else self._model.document_record(txn, id)
            for id in self._model.incarnations(txn, key):
                record = self._model.document_record(txn, id)
                if is_alive_at(record, at):
                    return record
            return None

    async def document(
        self, id: DocumentId, at: DocumentPoint, context: Context
    ) -> StoredDocument | None:
        """One incarnation's value and version, materialized from its nearest base and deltas."""

        with self._read() as txn:
            found = cast("StoredDocument | None", self._model.materialize(txn, id, at))
        if at != "current":  # a point the read accepted: before a trim's, it is gone
            point = log_base.point(self._model.env)
            try:
                bound = point_bound(at) if point else None
            except (TypeError, ValueError):  # not a number: no point the log ever had
                bound = None
            if bound is not None and bound < point:
                raise HistoryTrimmed(point, bound)
        return found

    async def scan_documents(
        self, query: DocumentQuery, limit: int, cursor: Cursor | None, context: Context
    ) -> Page[DocumentRecord, Cursor]:
        """Incarnations alive in one exact scope at the selected point, by id."""

        with self._read() as txn:
            scope = scope_key(query["scope"])
            after = cursor_after(cursor)
            records = self._model.scan_table(
                txn, t.DOCUMENTS, t.DOCUMENTS_BY_SCOPE, scope, after, False
            )
            kind_filter = "kind" in query
            kind, at = query.get("kind"), query["at"]
            return cast(
                "Page[DocumentRecord, Cursor]",
                take_page(
                    records,
                    limit,
                    "ascending",
                    lambda record: (
                        (not kind_filter or record["kind"] == kind) and is_alive_at(record, at)
                    ),
                ),
            )

    # ── browsing (not in the contract: what a viewer of the whole store needs) ──

    async def scan_all_documents(
        self, limit: int, after: int | None = None
    ) -> Page[DocumentRecord, Cursor]:
        """Every incarnation of every scope by id (retired ones too), ``limit`` after id ``after``."""

        with self._read() as txn:
            records = self._model.scan_table(txn, t.DOCUMENTS, None, b"", after, False)
            return cast(
                "Page[DocumentRecord, Cursor]", take_page(records, limit, "ascending", None)
            )

    async def scan_own_entries(
        self, conversation_id: ConversationId, limit: int, after: int | None = None
    ) -> Page[EntryRecord, Cursor]:
        """The entries one conversation holds itself (not those it sees through its forks), by
        id, ``limit`` after id ``after``: every entry of the store once, conversation by
        conversation."""

        with self._read() as txn:
            records, more = self._model.own_entries(txn, conversation_id, after, limit)
            return cast("Page[EntryRecord, Cursor]", page_of(records, more, "ascending"))

    async def document_revisions(self, id: DocumentId) -> list[DocumentRevision]:
        """The stored versions of one incarnation, oldest first."""

        with self._read() as txn:
            return [
                DocumentRevision(
                    seq=Seq(seq), version=revision.version, kind=revision.kind, body=revision.body
                )
                for seq, revision in self._model.revisions(txn, id)
            ]


def _releasing(read: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """``read``, letting go of its read transaction when it raises. py-lmdb keeps an ended read
    transaction's slot in LMDB's reader table (126 per store, shared by every process) until
    the object is freed, and an exception's traceback holds the frames that held it: a caller
    keeping a few hundred refusals (``gather(..., return_exceptions=True)`` over unknown ids)
    would leave no slot for any reader of the store. The frames' locals are cleared instead
    (the traceback still names every line)."""

    @functools.wraps(read)
    async def released(*args: Any, **kwargs: Any) -> T:
        try:
            return await read(*args, **kwargs)
        except BaseException as error:
            _clear_frames(error)
            raise

    return released


def _clear_frames(error: BaseException) -> None:
    """Clear the locals of the finished frames ``error`` passed through, and of those of the
    exceptions chained to it inside them (a caller's own exception it was raised while
    handling keeps its frames)."""

    inside: set[int] = set()
    chained: BaseException | None = error
    while chained is not None and id(chained) not in inside:
        tb = chained.__traceback__
        if chained is not error and (tb is None or id(tb.tb_frame) not in inside):
            return
        while tb is not None:
            inside.add(id(tb.tb_frame))
            tb = tb.tb_next
        inside.add(id(chained))
        traceback.clear_frames(chained.__traceback__)  # skips the frames still running
        chained = chained.__cause__ or chained.__context__


for _name, _method in list(vars(StorageReads).items()):  # every read of the contract and more
    if not _name.startswith("_") and inspect.iscoroutinefunction(_method):
        setattr(StorageReads, _name, _releasing(_method))


class DocumentRevision(msgspec.Struct, frozen=True):
    """One stored version of a document incarnation: the log sequence that wrote it, the
    document definition's version, and ``kind`` "base" (``body`` is the value) or "delta"
    (``body``: the ops applied to the version before)."""

    seq: Seq
    version: int
    kind: str
    body: Any


def positive_id(value: Any) -> int:
    if type(value) is int and value >= 1:
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise TypeError(f"{value!r} is not a positive ID")
    return value


__all__ = [
    "TASK_FILTERS",
    "DocumentRevision",
    "StorageReads",
    "positive_id",
]
