"""Records of one kind, filtered by fields, now or as of an earlier point (``durable-log list``).

A filter is ``FIELD=VALUE``: FIELD a dotted path into the record as the store serves it
(``state.status``, ``owner.taskId``), checked against the contract's record types so a misspelt
one is refused naming the fields there are; VALUE compared as JSON when it parses as JSON (``3``,
``true``, ``null``, ``"3"``), else as the string itself (``running``). Equality is strict:
``1`` matches neither ``true`` nor ``"1"``.

The records come from the projections through an index when a filter fits one (tasks and
submissions by status, entries by conversation, conversations by owner), else from a scan of
the kind's table; either way every filter is applied to every record, so both give the same
records in the same order (ids ascending; entries conversation by conversation; documents every
incarnation, retired ones too)."""

from __future__ import annotations

import os
import types
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, NamedTuple

if TYPE_CHECKING:  # the store's modules load when a listing runs: ``LIST_KINDS`` costs nothing
    from ..storage.reads import StorageReads

LIST_KINDS: Final = ("conversations", "entries", "tasks", "submissions", "documents")
_RECORD_TYPES: Final = {
    "conversations": "ConversationRecord",
    "entries": "EntryRecord",
    "tasks": "TaskRecord",
    "submissions": "SubmissionRecord",
    "documents": "DocumentRecord",
}
PAGE: Final = 500
"""Records read per read transaction (each page is one short transaction)."""
MISSING: Final = object()
"""A path the record does not have (matches no filter)."""


class Where(NamedTuple):
    """One filter: the record's value at ``path`` equals ``value`` (``text`` as given)."""

    path: tuple[str, ...]
    value: Any
    text: str

    @property
    def field(self) -> str:
        return ".".join(self.path)

    def matches(self, record: Any) -> bool:
        return same(value_at(record, self.path), self.value)


def value_at(record: Any, path: tuple[str, ...]) -> Any:
    """The value at dotted ``path`` of ``record``; ``MISSING`` when it has none."""

    for name in path:
        if not isinstance(record, dict) or name not in record:
            return MISSING
        record = record[name]
    return record


def same(found: Any, wanted: Any) -> bool:
    """JSON equality: ``1`` is neither ``true`` nor ``1.5``, ``[1]`` not ``[true]``."""

    if found is MISSING:
        return False
    if isinstance(found, bool) or isinstance(wanted, bool):
        return type(found) is type(wanted) and found == wanted
    if isinstance(found, dict) and isinstance(wanted, dict):
        return found.keys() == wanted.keys() and all(same(found[k], wanted[k]) for k in found)
    if isinstance(found, list) and isinstance(wanted, list):
        return len(found) == len(wanted) and all(map(same, found, wanted))
    if isinstance(found, int | float) and isinstance(wanted, int | float):
        return found == wanted
    return type(found) is type(wanted) and found == wanted


# ── the fields a kind's records have (from the contract's record types) ─────────

_OPEN: Final = "open"
"""A value of any JSON shape (``data``, ``input``, a task's checkpoint): any path below it."""
_SCALAR: Final = "scalar"


def _members(annotation: Any) -> list[Any]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _members(arg)]
    if origin in (typing.NotRequired, typing.Required, typing.Annotated):
        return _members(typing.get_args(annotation)[0])
    return [] if annotation is typing.Never else [annotation]


def _shape(annotation: Any) -> dict[str, list[Any]] | str:
    """The fields of ``annotation`` (a record type, a union of them) with their types, or
    ``_OPEN`` (any JSON below it) or ``_SCALAR`` (nothing below it)."""

    fields: dict[str, list[Any]] = {}
    scalar = False
    for member in _members(annotation):
        base = typing.get_origin(member) or member
        if isinstance(base, type) and typing.is_typeddict(base):
            for name, field in typing.get_type_hints(base).items():
                found = _members(field)
                if found:
                    fields.setdefault(name, []).extend(found)
        elif base is dict or member is Any or isinstance(member, typing.TypeVar):
            return _OPEN
        else:
            scalar = True
    if not fields:
        return _SCALAR if scalar else _OPEN
    return fields


def record_fields(kind: str) -> list[str]:
    """The top-level fields of ``kind``'s records, in the contract's order."""

    shape = _shape(_record_type(kind))
    assert isinstance(shape, dict)
    return list(shape)


def _record_type(kind: str) -> Any:
    if kind not in LIST_KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(LIST_KINDS)}")
    import pi_durable.types

    return getattr(pi_durable.types, _RECORD_TYPES[kind])


def check_field(kind: str, field: str) -> tuple[str, ...]:
    """``field`` (dotted) as a path into ``kind``'s records; ``ValueError`` naming the fields
    there are where a step names none."""

    path = tuple(field.split("."))
    shape: dict[str, list[Any]] | str = _shape(_record_type(kind))
    for depth, name in enumerate(path):
        where = ".".join(path[:depth]) or kind
        if shape == _OPEN:
            break
        if not name:
            raise ValueError(f"field {field!r} has an empty step (write state.status)")
        if isinstance(shape, str):
            raise ValueError(f"field {field!r}: {where} is a plain value, it has no fields")
        if name not in shape:
            raise ValueError(
                f"unknown field {'.'.join(path[: depth + 1])!r} of {where}; "
                f"its fields: {', '.join(shape)}"
            )
        shape = _shape(typing.Union[tuple(shape[name])])  # noqa: UP007 - a runtime union
    return path


def parse_where(kind: str, text: str) -> Where:
    """``FIELD=VALUE``: the field checked against ``kind``'s records, the value read as JSON when
    it parses as JSON, else as the string."""

    field, equals, value = text.partition("=")
    if not equals or not field.strip():
        raise ValueError(f"--where {text!r} is not FIELD=VALUE (e.g. state.status=running)")
    path = check_field(kind, field.strip())
    from .jsonlines import from_json

    try:
        parsed = from_json(value)
    except (ValueError, RecursionError):
        parsed = value
    return Where(path, parsed, value)


# ── listing ───────────────────────────────────────────────────────────────────

Pages = Callable[[Any], Awaitable[Any]]
"""A page of records after a cursor (None: from the start); its ``next`` continues it."""


async def list_records(
    path: str | os.PathLike[str],
    kind: str,
    where: list[Where] | None = None,
    limit: int | None = None,
    as_of: int | None = None,
    as_of_time: int | None = None,
    use_index: bool = True,
) -> AsyncIterator[Any]:
    """The records of ``kind`` (one of ``LIST_KINDS``) that match every filter of ``where``, at
    most ``limit``, now, right after commit ``as_of`` or as of Unix ms ``as_of_time``; through an
    index when one fits (``use_index``), else a scan. Opens the store read-only."""

    if kind not in LIST_KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(LIST_KINDS)}")
    filters = list(where or [])
    if limit is not None and limit <= 0:
        return
    from ..storage.lmdb_storage import LmdbStorage
    from .export import read_as_of, seq_at

    storage = await LmdbStorage.open(path, readonly=True)
    try:
        if as_of_time is not None:
            as_of = seq_at(storage.log, as_of_time)
        source: StorageReads = await read_as_of(storage, as_of)
        found = 0
        async for record in _candidates(source, kind, filters if use_index else []):
            if all(condition.matches(record) for condition in filters):
                yield record
                found += 1
                if found == limit:
                    return
    finally:
        await storage.close()


def _indexed(filters: list[Where], path: tuple[str, ...], fits: Callable[[Any], bool]) -> Any:
    """The value of the first filter on ``path`` an index can take, or ``MISSING``."""

    for condition in filters:
        if condition.path == path and fits(condition.value):
            return condition.value
    return MISSING


def _is_id(value: Any) -> bool:
    return type(value) is int and value >= 1


async def _candidates(source: StorageReads, kind: str, filters: list[Where]) -> AsyncIterator[Any]:
    """``kind``'s records in the order listed, through the index the filters fit (none: all)."""

    from pi_durable.context import BACKGROUND_CONTEXT as CTX

    from ..projections.tables import SUBMISSION_STATUS_KEYS, TASK_STATUS_KEYS

    if kind == "entries":
        conversation = _indexed(filters, ("conversationId",), _is_id)
        if conversation is not MISSING:
            conversations: AsyncIterator[Any] = _one(conversation)
        else:
            conversations = _ids(
                _pages(lambda after: source.scan_conversations({}, PAGE, _cursor(after), CTX))
            )
        async for id in conversations:
            async for record in _pages(_own_entry_pages(source, id)):
                yield record
        return
    query: dict[str, Any] = {}
    if kind == "conversations":
        for name, key in (("conversationId", "ownerConversationId"), ("taskId", "ownerTaskId")):
            owner = _indexed(filters, ("owner", name), _is_id)
            if owner is not MISSING:
                query = {key: owner}
                break
        scan: Callable[..., Awaitable[Any]] = source.scan_conversations
    elif kind in ("tasks", "submissions"):
        path, statuses = (
            (("state", "status"), TASK_STATUS_KEYS)
            if kind == "tasks"
            else (("status",), SUBMISSION_STATUS_KEYS)
        )
        status = _indexed(filters, path, lambda value: isinstance(value, str) and value in statuses)
        query = {} if status is MISSING else {"status": status}
        if kind == "tasks":
            scan = source.scan_tasks
        else:
            scan = source.scan_submissions
    else:
        async for record in _pages(lambda after: source.scan_all_documents(PAGE, after)):
            yield record
        return
    async for record in _pages(lambda after: scan(query, PAGE, _cursor(after), CTX)):
        yield record


def _own_entry_pages(source: StorageReads, conversation: Any) -> Pages:
    return lambda after: source.scan_own_entries(conversation, PAGE, after)


def _cursor(after: int | None) -> Any:
    return None if after is None else {"after": after, "order": "ascending"}


async def _pages(pages: Pages) -> AsyncIterator[Any]:
    """Every record of the pages, page after page (each its own read transaction)."""

    after = None
    while True:
        page: dict[str, Any] = await pages(after)
        for record in page["items"]:
            yield record
        if "next" not in page:
            return
        after = page["next"]["after"]


async def _ids(records: AsyncIterator[Any]) -> AsyncIterator[int]:
    async for record in records:
        yield record["id"]


async def _one(value: int) -> AsyncIterator[int]:
    yield value


# ── columns ───────────────────────────────────────────────────────────────────

TABLE_COLUMNS: Final = {
    "conversations": (
        "id",
        "parent.conversationId",
        "parent.at",
        "owner.conversationId",
        "owner.taskId",
    ),
    "entries": ("id", "conversationId", "kind", "head", "byTaskId", "data"),
    "tasks": (
        "id",
        "conversationId",
        "kind",
        "state.status",
        "background",
        "abortRequested",
        "startedAt",
        "endedAt",
    ),
    "submissions": ("id", "conversationId", "type", "status", "requestId", "entry", "answer"),
    "documents": ("id", "kind", "key", "scope", "history", "fork", "createdAt", "retiredAt"),
}
"""What a table of each kind shows by default: the fields a person scans a list by."""


def columns(kind: str, where: list[Where], every_field: bool) -> list[str]:
    """The columns of a listing: every top-level field of the kind's records (``every_field``,
    for CSV) or its ``TABLE_COLUMNS``, and then each filtered field not among them."""

    chosen = record_fields(kind) if every_field else list(TABLE_COLUMNS[kind])
    for condition in where:
        if condition.field not in chosen and condition.path[0] not in chosen:
            chosen.append(condition.field)
    return chosen


__all__ = [
    "LIST_KINDS",
    "MISSING",
    "PAGE",
    "TABLE_COLUMNS",
    "Pages",
    "Where",
    "check_field",
    "columns",
    "list_records",
    "parse_where",
    "record_fields",
    "same",
    "value_at",
]
