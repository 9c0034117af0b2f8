"""One record as the Storage contract reads it, now or as of an earlier point (``durable-log show``)."""

from __future__ import annotations

import os
from typing import Any

import msgspec
from pi_durable.context import BACKGROUND_CONTEXT

from ..storage.lmdb_storage import LmdbStorage
from .export import read_as_of, seq_at
from .unreadable import Unreadable, document_record, read_document

SHOW_KINDS = ("conversation", "entry", "task", "submission", "document")


class UnreadableDocument(msgspec.Struct, frozen=True):
    """What ``show`` gives for a document whose value cannot be read: its record, and why."""

    record: Any
    unreadable: Unreadable


async def show(
    path: str | os.PathLike[str],
    kind: str,
    id: int,
    as_of: int | None = None,
    as_of_time: int | None = None,
) -> tuple[Any | None, int | None]:
    """One record as the contract reads it (a document with its value), now, right after commit
    ``as_of``, or as of Unix ms ``as_of_time``; and the sequence it was read at (None: now).
    The record is None when there is none."""

    storage = await LmdbStorage.open(path, readonly=True)
    try:
        if as_of_time is not None:
            as_of = seq_at(storage.log, as_of_time)
        source: Any = await read_as_of(storage, as_of)
        return await _read_one(source, kind, id), as_of
    finally:
        await storage.close()


async def _read_one(source: Any, kind: str, id: int) -> Any | None:
    if kind == "conversation":
        return await source.conversation(id, BACKGROUND_CONTEXT)
    if kind == "entry":
        return await source.entry(id, BACKGROUND_CONTEXT)
    if kind == "task":
        return await source.task(id, BACKGROUND_CONTEXT)
    if kind == "submission":
        return await source.submission(id, BACKGROUND_CONTEXT)
    if kind == "document":
        found = await read_document(source, id, "current")
        if isinstance(found, Unreadable):
            return UnreadableDocument(await document_record(source, id), found)
        return found
    raise ValueError(f"Unknown kind {kind!r}; one of {', '.join(SHOW_KINDS)}")


__all__ = [
    "SHOW_KINDS",
    "show",
]
