"""Documents whose stored changes cannot be applied: what the tools show instead of their value.

The contract accepts a change whose path resolves to nothing (``["a", ["nope"], "x"]``); from
then on reading the document raises ``PathError``, as pi-durable's ``MemoryStorage`` does, until a
new base replaces the value. One agent's bad change must not take a command or a page down: the
tools read documents through ``read_document``, which names the error and the revision (the log
sequence of the change) replay fails at, and everything else answers as usual.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from ..projections.documents import APPLY_ERRORS, RevisionLike, failing_revision

UNREADABLE_ERRORS: Final = APPLY_ERRORS
"""What reading a document whose change cannot be applied raises (``documents.APPLY_ERRORS``).
A read raising one of them is unreadable only if a change is found to fail."""


class Unreadable(msgspec.Struct, frozen=True):
    """A document that cannot be read at a point: its id, the error reading it raises, and the
    change replay fails at (its log sequence and the document definition's version), when found."""

    id: int
    error: str
    seq: int | None = None
    version: int | None = None

    def describe(self) -> str:
        where = "" if self.seq is None else f" at its change of log sequence {self.seq}"
        return f"document {self.id} cannot be read: replaying it fails{where} ({self.error})"


def failing_change(id: int, revisions: Iterable[tuple[int, RevisionLike]]) -> Unreadable | None:
    """The ``Unreadable`` of the change of ``revisions`` (oldest first) that replay fails at
    (``documents.failing_revision``), or None if every one applies."""

    found = failing_revision(revisions)
    if found is None:
        return None
    return Unreadable(id, _name(found.error), found.seq, found.revision.version)


async def read_document(reader: Any, id: int, at: Any) -> Any:
    """``reader.document(id, at)`` (``reader``: a store or a view of it), or an ``Unreadable``
    naming why it cannot be read there."""

    try:
        return await reader.document(id, at, CTX)
    except UNREADABLE_ERRORS as error:
        return await explain(reader, id, error, None if at == "current" else at)


async def explain(reader: Any, id: int, error: BaseException, upto: Any = None) -> Unreadable:
    """The ``Unreadable`` for ``error``, raised reading document ``id`` at ``upto`` (None: the
    newest revision ``reader`` sees), with the change it fails at; ``error`` itself, raised again,
    when no change fails (a refusal of the request, not of the document). A backend that lists
    no revisions (pi-durable's own, read by an import with ids it served) gets only the error."""

    listed = getattr(reader, "document_revisions", None)
    if listed is None:
        return Unreadable(id, _name(error))
    revisions = [(row.seq, row) for row in await listed(id) if upto is None or row.seq <= upto]
    found = failing_change(id, revisions)
    if found is None:
        raise error
    return found


async def document_record(reader: Any, id: int) -> Any | None:
    """Document ``id``'s record (retired or not) as ``reader`` lists it, or None: what is shown of
    a document whose value cannot be read."""

    page = await reader.scan_all_documents(1, id - 1)
    return next((record for record in page["items"] if record["id"] == id), None)


def _name(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


__all__ = [
    "UNREADABLE_ERRORS",
    "Unreadable",
    "document_record",
    "explain",
    "failing_change",
    "read_document",
]
