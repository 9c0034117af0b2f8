"""Lists that help an auditor find things: tasks with a facet per status, documents filtered by
kind and scope, and a window on a long document's versions. Each reads a bounded amount: a facet
counts up to ``FACET_CAP`` tasks, a filtered document list looks at up to ``SCAN_CAP`` documents
for a page (and says so when it stopped)."""

from __future__ import annotations

from typing import Any, Final

import msgspec
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from ..errors import BadQueryError
from ..projections.tables import TASK_STATUSES
from ..storage.reads import StorageReads

PAGE: Final = 100
FACET_CAP: Final = 1000
"""Tasks counted per status (more: shown as "1,000+")."""
SCAN_CAP: Final = 5000
"""Documents looked at to fill one filtered page."""
VERSIONS: Final = 40
"""Versions of a document listed at once (the rest: paged)."""


class ListPage(msgspec.Struct, frozen=True):
    """A page of a list (rows as the store reads them) and the id the next page starts after
    (the contract's cursor value; None: this is the last)."""

    items: list[Any]
    after: Any


class FilteredPage(msgspec.Struct, frozen=True):
    """A page of filtered documents; ``stopped``: the scan stopped before filling the page
    (``after`` is where the next one goes on)."""

    items: list[Any]
    after: int | None
    stopped: bool


def status_of(text: str | None) -> str | None:
    """``?status=``: one of the task statuses, or none."""

    if text is None or not text.strip():
        return None
    if text.strip() not in TASK_STATUSES:
        raise BadQueryError(f"status={text!r}: one of {', '.join(TASK_STATUSES)}")
    return text.strip()


async def task_facets(reader: StorageReads, kind: str | None) -> list[tuple[str, int, bool]]:
    """``(status, count, capped)`` for each task status (of ``kind`` when given)."""

    found = []
    for status in TASK_STATUSES:
        query: dict[str, Any] = {"status": status}
        if kind:
            query["kind"] = kind
        page = await reader.scan_tasks(query, FACET_CAP, None, CTX)  # type: ignore[arg-type]
        found.append((status, len(page["items"]), "next" in page))
    return found


async def tasks(
    reader: StorageReads, status: str | None, kind: str | None, after: int | None
) -> ListPage:
    query: dict[str, Any] = {}
    if status:
        query["status"] = status
    if kind:
        query["kind"] = kind
    cursor = None if after is None else {"after": after, "order": "ascending"}
    page = await reader.scan_tasks(query, PAGE, cursor, CTX)  # type: ignore[arg-type]
    return ListPage(items=page["items"], after=page["next"]["after"] if "next" in page else None)


def scope_filter(text: str | None) -> tuple[str, int | None] | None:
    """``?scope=``: a scope kind (``session``, ``conversation``...) or ``conversation:N``."""

    if text is None or not text.strip():
        return None
    kind, _, rest = text.strip().partition(":")
    if not rest:
        return kind, None
    if not rest.isdigit():
        raise BadQueryError(f"scope={text!r}: a scope kind, or conversation:ID")
    return kind, int(rest)


def _in_scope(record: Any, wanted: tuple[str, int | None]) -> bool:
    scope = record.get("scope") if isinstance(record, dict) else None
    if not isinstance(scope, dict) or scope.get("kind") != wanted[0]:
        return False
    return wanted[1] is None or scope.get("conversationId") == wanted[1]


async def documents(
    reader: StorageReads, kind: str | None, scope: tuple[str, int | None] | None, after: int | None
) -> FilteredPage:
    """A page of documents by id, of ``kind`` and in ``scope`` when given; ``stopped``: the id
    the scan stopped at before filling the page (the next page goes on from there)."""

    items: list[Any] = []
    looked = 0
    cursor = after
    while len(items) < PAGE and looked < SCAN_CAP:
        page = await reader.scan_all_documents(500, cursor)
        for record in page["items"]:
            looked += 1
            cursor = record["id"]
            if (not kind or record.get("kind") == kind) and (
                scope is None or _in_scope(record, scope)
            ):
                items.append(record)
                if len(items) >= PAGE:
                    break
        if "next" not in page:
            if len(items) < PAGE:
                return FilteredPage(items=items, after=None, stopped=False)
            break
    return FilteredPage(items=items, after=cursor, stopped=len(items) < PAGE)


def version_window(
    versions: list[Any], picked: Any, before: int | None
) -> tuple[list[Any], int | None, int | None]:
    """The versions to list (newest first): ``VERSIONS`` of them ending at number ``before``
    (None: a window holding the picked version), and the ``before`` of the newer and older windows."""

    count = len(versions)
    if before is None:
        index = count if picked is None else versions.index(picked) + 1
        top = min(count, max(index + VERSIONS // 2, VERSIONS))
    else:
        top = max(1, min(count, before))
    low = max(0, top - VERSIONS)
    shown = list(reversed(versions[low:top]))
    newer = min(count, top + VERSIONS) if top < count else None
    older = low if low > 0 else None
    return shown, newer, older


__all__ = [
    "FACET_CAP",
    "PAGE",
    "SCAN_CAP",
    "VERSIONS",
    "FilteredPage",
    "ListPage",
    "documents",
    "scope_filter",
    "status_of",
    "task_facets",
    "tasks",
    "version_window",
]
