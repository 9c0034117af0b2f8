"""Reading committed batches as an auditor does: from a local store (``Tail``, read-only, never
blocking the writer) or from a NATS stream with no local store (``StreamTail``), filtered by
conversation and write kind, as records, JSON lines or one readable line per batch.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from ..log import Commit, Environment, WriteLog, write_to_builtins
from ..log.records import WRITE_TYPES, decode_record, decode_record_builtins
from ..projections.rebuild import Following
from .jsonlines import to_json
from .numbers import format_time
from .words import plural

if TYPE_CHECKING:
    from ..log.stream.jetstream import JetStreamLink


def commit_to_builtins(commit: Commit, writes: Iterable[Any] | None = None) -> dict[str, Any]:
    """A commit as ``export`` writes it: a tombstone with its ``erased``, an erasure record
    with its ``erasure``."""

    line: dict[str, Any] = {
        "seq": commit.seq,
        "committedAt": commit.committed_at,
        "writes": [
            write_to_builtins(write) for write in (commit.writes if writes is None else writes)
        ],
    }
    if commit.tombstone is not None:
        line["erased"] = {
            "leaf": commit.tombstone.leaf.hex(),
            "erasure": commit.tombstone.erasure,
            "writes": commit.tombstone.erased,
        }
    if commit.erasure is not None:
        line["erasure"] = msgspec.to_builtins(commit.erasure)
    return line


# ── tail ──────────────────────────────────────────────────────────────────────


DocumentLookup = Callable[[int], Any]
"""``document_record(id)``: the record (``{"id", "kind", "scope", ...}``) of document ``id``, or
None when it is not known: how a filter finds the conversation of a write that names a document
only by its id (``document.change``, ``document.retire``)."""


@dataclass(frozen=True, slots=True)
class TailFilter:
    """Which writes an auditor wants: of one conversation, and/or of some write types.

    The same filter serves a local store (``Tail``, which looks documents up in its projections)
    and a NATS stream (``stream_commits``, which remembers the documents the stream created)."""

    conversation: int | None = None
    types: frozenset[str] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.types or ()) - set(WRITE_TYPES)
        if unknown:
            raise ValueError(
                f"Unknown write type(s) {sorted(unknown)}; known: {', '.join(WRITE_TYPES)}"
            )

    @property
    def everything(self) -> bool:
        return self.conversation is None and self.types is None

    def select(self, writes: Iterable[Any], document_record: DocumentLookup) -> list[Any]:
        """The ``writes`` (the tagged Structs of one commit) the filter keeps: all of them when
        there is no filter."""

        if self.everything:
            return list(writes)
        kept = []
        for write in writes:
            type_name = type(write).__struct_config__.tag
            if self.types is not None and type_name not in self.types:
                continue
            if (
                self.conversation is not None
                and conversation_of(write, document_record) != self.conversation
            ):
                continue
            kept.append(write)
        return kept


def conversation_of(write: Any, document_record: DocumentLookup) -> Any:
    """The conversation a write belongs to (a document's: its scope's), or None."""

    value = getattr(write, "value", None)
    if isinstance(value, dict):
        tag = type(write).__struct_config__.tag
        return value.get("id") if tag == "conversation" else value.get("conversationId")
    record = getattr(write, "record", None)
    if record is None:
        record = document_record(write.id)
    scope = record.get("scope") if isinstance(record, dict) else None
    if isinstance(scope, dict) and scope.get("kind") == "conversation":
        return scope.get("conversationId")
    return None


class Tail:
    """Committed batches from a sequence on, optionally following new commits, filtered."""

    def __init__(self, path: str | os.PathLike[str], filter: TailFilter | None = None) -> None:
        self.env = Environment(path, readonly=True)
        self.log = WriteLog(self.env)
        self.filter = filter or TailFilter()
        self._core = Following(self.env, self.log)

    def close(self) -> None:
        """Release the read-only environment (a tail holds no read transaction between reads)."""

        self.env.close()

    def head(self) -> int:
        """The newest committed sequence, as of now."""

        return self.log.head()

    def select(self, commit: Commit) -> list[Any]:
        """The writes of ``commit`` the filter keeps (all of them when there is no filter)."""

        return self.filter.select(commit.writes, self._document_record)

    def shown(self, commit: Commit, writes: list[Any]) -> bool:
        """Whether ``commit`` is shown: a kept write, or, unfiltered, an erasure record."""

        return bool(writes) or (commit.erasure is not None and self.filter.everything)

    def _document_record(self, id: int) -> Any:
        txn, model = self._core.read()  # a rebuild elsewhere may swap generations
        with txn:
            return model.document_record(txn, id)

    def last(
        self, count: int, first: int = 1, last: int | None = None
    ) -> list[tuple[Commit, list[Any]]]:
        """The last ``count`` commits from ``first`` to ``last`` (default: the head) with a kept
        write, oldest first, with their kept writes: what ``tail -n`` and ``git log -n`` show.
        Reads backwards in chunks, so a filter that matches rarely costs what it has to."""

        found: list[tuple[Commit, list[Any]]] = []
        high = self.head() if last is None else min(last, self.head())
        while high >= first and len(found) < count:
            low = max(first, high - 255)
            commits: Iterator[Commit] = self.log.read(low, high)
            chunk = [
                (commit, writes)
                for commit in commits
                if self.shown(commit, writes := self.select(commit))
            ]
            found[:0] = chunk
            high = low - 1
        return found[max(0, len(found) - count) :] if count else []

    async def commits(
        self,
        from_seq: int = 1,
        *,
        follow: bool = False,
        limit: int | None = None,
        last: int | None = None,
    ) -> AsyncIterator[tuple[Commit, list[Any]]]:
        """``(commit, kept writes)`` for each commit with at least one kept write, up to ``last``
        (default: the head) or, with ``follow``, on as new ones are committed; at most ``limit``."""

        shown = 0
        source: Any = (
            self.log.follow(from_seq) if follow else _as_async(self.log.read(from_seq, last))
        )
        if limit is not None and limit <= 0:
            return
        async for commit in source:
            writes = self.select(commit)
            if not self.shown(commit, writes):
                continue
            yield commit, writes
            shown += 1
            if limit is not None and shown >= limit:
                return

    async def json_lines(
        self,
        from_seq: int = 1,
        *,
        follow: bool = False,
        limit: int | None = None,
        last: int | None = None,
    ) -> AsyncIterator[str]:
        """The ``--json`` lines: ``{"seq", "committedAt", "writes"}``, the writes exactly as
        committed (only the kept ones when filtering)."""

        if not self.filter.everything:
            async for commit, writes in self.commits(
                from_seq, follow=follow, limit=limit, last=last
            ):
                yield to_json(commit_to_builtins(commit, writes))
            return
        if limit is not None and limit <= 0:
            return
        source: Any = (
            self.log.follow(from_seq, decode=decode_record_builtins)
            if follow
            else _as_async(self.log.read(from_seq, last, decode=decode_record_builtins))
        )
        shown = 0
        async for batch in source:  # unfiltered: no Structs are built, the fast path
            yield to_json(batch)
            shown += 1
            if limit is not None and shown >= limit:
                return


async def _as_async(commits: Iterator[Any]) -> AsyncIterator[Any]:
    for commit in commits:
        yield commit


# ── tail of a NATS stream ──────────────────────────────────────────────────────


async def open_stream(nats: str | Sequence[str], stream: str) -> JetStreamLink:
    """A link to an existing stream (never made here): connected, the stream checked. Unreachable
    servers raise ``NatsUnavailableError``, a missing stream ``StreamMissingError``."""

    from ..log.stream.jetstream import JetStreamLink

    link = JetStreamLink(nats, stream)
    try:
        await link.arun(link.connect())
        await link.arun(link.messages.ensure_stream(create=False))
    except BaseException:
        await asyncio.to_thread(link.close)
        raise
    return link


def stream_subject(stream: str, store: str | None) -> str:
    """The subject of one store's log on ``stream``, or (``store`` None) of every store's."""

    from ..log.stream.message import subject_of

    return f"{stream}.*.log" if store is None else subject_of(stream, store)


class StreamTail:
    """A store's committed batches (or every store's, ``store=None``) read from its NATS stream,
    with no local store: the records as the writer logged them (checksums checked), control
    messages skipped, filtered as ``Tail`` filters. ``lines`` runs on the link's loop.

    A filter by conversation places a ``document.change`` or ``document.retire`` by the
    ``document.create``/``document.copy`` the stream carried before it (a document created in
    messages the stream no longer retains is not placed)."""

    def __init__(
        self,
        link: JetStreamLink,
        store: str | None,
        filter: TailFilter | None = None,
        *,
        json: bool = False,
    ) -> None:
        self.link, self.store, self.json = link, store, json
        self.filter = filter or TailFilter()
        self.subject = stream_subject(link.stream, store)
        self.position = 0
        """The stream sequence of the last message read (record or control)."""
        self._documents: dict[tuple[str, int], Any] = {}

    async def lines(
        self,
        *,
        follow: bool = False,
        first: int = 1,
        since: int | None = None,
        until: int | None = None,
    ) -> AsyncIterator[str]:
        """One line per kept batch after ``self.position``: to the stream's end, or on with
        ``follow``; only records from log sequence ``first`` and committed between ``since``
        and ``until`` (Unix ms, inclusive). Without a store, each line carries its store id."""

        async for message, _pending in self.link.messages.read(
            self.subject, self.position, store=self.store, follow=follow
        ):
            self.position = message.stream_seq
            if message.kind != "record":
                continue  # a fence or an id reservation: nothing an auditor reads
            if self.json and self.filter.everything:
                batch = decode_record_builtins(
                    message.seq, message.data
                )  # no Structs: the fast path
                if not _in_range(message.seq, batch["committedAt"], first, since, until):
                    continue
                yield to_json(
                    batch if self.store is not None else {"store": message.store, **batch}
                )
                continue
            commit = decode_record(message.seq, message.data)
            if self.filter.conversation is not None:
                self._note_documents(message.store, commit.writes)
            if not _in_range(commit.seq, commit.committed_at, first, since, until):
                continue
            store = message.store
            writes = self.filter.select(commit.writes, lambda id: self._documents.get((store, id)))
            if not writes:
                continue
            if self.json:
                batch = commit_to_builtins(commit, writes)
                yield to_json(batch if self.store is not None else {"store": store, **batch})
            else:
                text = (
                    summarize(commit, writes)
                    if self.store is not None
                    else f"{store}  {summarize(commit, writes)}"
                )
                yield text.encode("utf-8", "backslashreplace").decode("utf-8")

    def _note_documents(self, store: str, writes: Iterable[Any]) -> None:
        for write in writes:
            record = getattr(write, "record", None)
            if isinstance(record, dict) and isinstance(record.get("id"), int):
                self._documents[(store, record["id"])] = {"scope": record.get("scope")}


def _in_range(
    seq: int, committed_at: int, first: int, since: int | None, until: int | None
) -> bool:
    return (
        seq >= first
        and (since is None or committed_at >= since)
        and (until is None or committed_at <= until)
    )


def summarize(commit: Commit, writes: list[Any]) -> str:
    """One readable line: sequence, UTC time, and a short phrase per write."""

    parts = [_describe(write) for write in writes]
    if commit.tombstone is not None:
        parts.append(
            f"{plural(commit.tombstone.erased, 'write')} erased (erasure {commit.tombstone.erasure})"
        )
    if commit.erasure is not None:
        erasure = commit.erasure
        parts.append(
            f"erasure of conversation {', '.join(map(str, erasure.conversations))}: "
            f"{plural(erasure.writes, 'write')} from {plural(len(erasure.records), 'record')}"
            f" ({erasure.reason!r})"
        )
    return f"{commit.seq:>8}  {format_time(commit.committed_at)}  " + "; ".join(parts)


def _describe(write: Any) -> str:
    tag = type(write).__struct_config__.tag
    value: Any = getattr(write, "value", None)
    if tag == "conversation":
        parent = value.get("parent") if isinstance(value, dict) else None
        fork = (
            f" fork of {parent['conversationId']}@{parent['at']}"
            if isinstance(parent, dict)
            else ""
        )
        return f"conversation {value.get('id')}{fork}"
    if tag == "entry":
        head = " head" if "head" in value else ""
        return (
            f"entry {value.get('id')} in {value.get('conversationId')} ({value.get('kind')}){head}"
        )
    if tag == "task":
        state = value.get("state") if isinstance(value.get("state"), dict) else {}
        return f"task {value.get('id')} {value.get('kind')} {state.get('status')}"
    if tag == "submission":
        return f"submission {value.get('id')} {value.get('status')}"
    if tag == "document.create":
        record = write.record
        return f"document {record.get('id')} created ({record.get('kind')}, definition version {write.content.version})"
    if tag == "document.copy":
        return f"document {write.record.get('id')} copied from {write.source.id}@{write.source.at}"
    if tag == "document.change":
        content = write.content
        ops = getattr(content, "ops", None)
        detail = plural(len(ops), "op") if isinstance(ops, list) else "new base"
        return f"document {write.id} changed ({detail}, definition version {content.version})"
    return f"document {write.id} retired"


__all__ = [
    "DocumentLookup",
    "StreamTail",
    "Tail",
    "TailFilter",
    "commit_to_builtins",
    "conversation_of",
    "open_stream",
    "stream_subject",
    "summarize",
]
