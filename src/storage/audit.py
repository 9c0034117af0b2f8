"""What auditors and operators run against a store, possibly while another process writes to it:
tailing committed batches, verifying the log against the projections, statistics, export, look-ups
by time, backups. Read-side functions open the store read-only: they never take the writer lock,
and never create a store.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import lmdb
from pi_durable.context import BACKGROUND_CONTEXT

from ..log import Commit, CorruptRecordError, Environment, WriteLog, key_seq, seq_key, write_to_builtins
from ..log.records import decode_record, decode_record_builtins
from ..log.records import FORMAT_VERSION, WRITE_TYPES
from ..log.stream.position import stored_position
from ..log.stream.shipper import stopped_reason
from ..projections import Projector, ReadModel
from ..projections import tables as t
from ..projections.rebuild import (
    begin_following,
    folded_seq,
    mark_lockstep,
    open_core,
    projection_state,
    read_header,
)
from ..projections.user import stored_statuses

from .jsonlines import to_json
from .lmdb_storage import LmdbStorage

if TYPE_CHECKING:
    from ..log.stream.jetstream import JetStreamLink

def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 op``, ``2 ops``: every count a person reads goes through here."""

    return f"{count} {one if count == 1 else (many or one + 's')}"


def commit_to_builtins(commit: Commit, writes: Iterable[Any] | None = None) -> dict[str, Any]:
    return {
        "seq": commit.seq,
        "committedAt": commit.committed_at,
        "writes": [write_to_builtins(write) for write in (commit.writes if writes is None else writes)],
    }


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
            raise ValueError(f"Unknown write type(s) {sorted(unknown)}; known: {', '.join(WRITE_TYPES)}")

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
            if self.conversation is not None and conversation_of(write, document_record) != self.conversation:
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
        self._model: ReadModel | None = None

    def close(self) -> None:
        """Release the read-only environment (a tail holds no read transaction between reads)."""

        self.env.close()

    def head(self) -> int:
        """The newest committed sequence, as of now."""

        return self.log.head()

    def select(self, commit: Commit) -> list[Any]:
        """The writes of ``commit`` the filter keeps (all of them when there is no filter)."""

        return self.filter.select(commit.writes, self._document_record)

    def _document_record(self, id: int) -> Any:
        header = read_header(self.env)
        if self._model is None or header is None or header.generation != self._model.generation:
            self._model = open_core(self.env, self.log)  # a rebuild elsewhere swapped generations
        with self.env.read() as txn:
            return self._model.document_record(txn, id)

    def last(self, count: int, first: int = 1, last: int | None = None) -> list[tuple[Commit, list[Any]]]:
        """The last ``count`` commits from ``first`` to ``last`` (default: the head) with a kept
        write, oldest first, with their kept writes: what ``tail -n`` and ``git log -n`` show.
        Reads backwards in chunks, so a filter that matches rarely costs what it has to."""

        found: list[tuple[Commit, list[Any]]] = []
        high = self.head() if last is None else min(last, self.head())
        while high >= first and len(found) < count:
            low = max(first, high - 255)
            commits: Iterator[Commit] = self.log.read(low, high)
            chunk = [(commit, writes) for commit in commits if (writes := self.select(commit))]
            found[:0] = chunk
            high = low - 1
        return found[max(0, len(found) - count) :] if count else []

    async def commits(
        self, from_seq: int = 1, *, follow: bool = False, limit: int | None = None, last: int | None = None
    ) -> AsyncIterator[tuple[Commit, list[Any]]]:
        """``(commit, kept writes)`` for each commit with at least one kept write, up to ``last``
        (default: the head) or, with ``follow``, on as new ones are committed; at most ``limit``."""

        shown = 0
        source: Any = self.log.follow(from_seq) if follow else _as_async(self.log.read(from_seq, last))
        if limit is not None and limit <= 0:
            return
        async for commit in source:
            writes = self.select(commit)
            if not writes:
                continue
            yield commit, writes
            shown += 1
            if limit is not None and shown >= limit:
                return


    async def json_lines(
        self, from_seq: int = 1, *, follow: bool = False, limit: int | None = None, last: int | None = None
    ) -> AsyncIterator[str]:
        """The ``--json`` lines: ``{"seq", "committedAt", "writes"}``, the writes exactly as
        committed (only the kept ones when filtering)."""

        if not self.filter.everything:
            async for commit, writes in self.commits(from_seq, follow=follow, limit=limit, last=last):
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
        await link.arun(link.ensure_stream(create=False))
    except BaseException:
        await asyncio.to_thread(link.close)
        raise
    return link


async def lease_of(nats: str | Sequence[str], stream: str, store: str | None) -> dict[str, Any] | None:
    """Who holds store ``store``'s writer lease on ``stream`` now (``None``: nobody)."""

    from ..log.stream.lease import WriterLease

    if store is None:
        return None
    link = await open_stream(nats, stream)
    try:
        lease = WriterLease(link, store, "")
        current, revision = await link.arun(lease.current())
        if current is None:
            return None
        return {
            "holder": current.holder,
            "epoch": current.epoch,
            "ttl": current.ttl,
            "revision": revision,
            "expires": f"within {current.ttl} s of its holder's last renewal",
        }
    finally:
        await asyncio.to_thread(link.close)


def stream_subject(stream: str, store: str | None) -> str:
    """The subject of one store's log on ``stream``, or (``store`` None) of every store's."""

    from ..log.stream.jetstream import subject_of

    return f"{stream}.*.log" if store is None else subject_of(stream, store)


class StreamTail:
    """A store's committed batches (or every store's, ``store=None``) read from its NATS stream,
    with no local store: the records as the writer logged them (checksums checked), control
    messages skipped, filtered as ``Tail`` filters. ``lines`` runs on the link's loop.

    A filter by conversation places a ``document.change`` or ``document.retire`` by the
    ``document.create``/``document.copy`` the stream carried before it (a document created in
    messages the stream no longer retains is not placed)."""

    def __init__(self, link: JetStreamLink, store: str | None, filter: TailFilter | None = None, *, json: bool = False) -> None:
        self.link, self.store, self.json = link, store, json
        self.filter = filter or TailFilter()
        self.subject = stream_subject(link.stream, store)
        self.position = 0
        """The stream sequence of the last message read (record or control)."""
        self._documents: dict[tuple[str, int], Any] = {}

    async def lines(
        self, *, follow: bool = False, first: int = 1, since: int | None = None, until: int | None = None
    ) -> AsyncIterator[str]:
        """One line per kept batch after ``self.position``: to the stream's end, or on with
        ``follow``; only records from log sequence ``first`` and committed between ``since``
        and ``until`` (Unix ms, inclusive). Without a store, each line carries its store id."""

        async for message, _pending in self.link.read(self.subject, self.position, store=self.store, follow=follow):
            self.position = message.stream_seq
            if message.kind != "record":
                continue  # a fence or an id reservation: nothing an auditor reads
            if self.json and self.filter.everything:
                batch = decode_record_builtins(message.seq, message.data)  # no Structs: the fast path
                if not _in_range(message.seq, batch["committedAt"], first, since, until):
                    continue
                yield to_json(batch if self.store is not None else {"store": message.store, **batch})
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
                text = summarize(commit, writes) if self.store is not None else f"{store}  {summarize(commit, writes)}"
                yield text.encode("utf-8", "backslashreplace").decode("utf-8")

    def _note_documents(self, store: str, writes: Iterable[Any]) -> None:
        for write in writes:
            record = getattr(write, "record", None)
            if isinstance(record, dict) and isinstance(record.get("id"), int):
                self._documents[(store, record["id"])] = {"scope": record.get("scope")}


def _in_range(seq: int, committed_at: int, first: int, since: int | None, until: int | None) -> bool:
    return seq >= first and (since is None or committed_at >= since) and (until is None or committed_at <= until)


def summarize(commit: Commit, writes: list[Any]) -> str:
    """One readable line: sequence, UTC time, and a short phrase per write."""

    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(commit.committed_at / 1000))
    parts = [_describe(write) for write in writes]
    return f"{commit.seq:>8}  {stamp}.{commit.committed_at % 1000:03d}Z  " + "; ".join(parts)


def _describe(write: Any) -> str:
    tag = type(write).__struct_config__.tag
    value: Any = getattr(write, "value", None)
    if tag == "conversation":
        parent = value.get("parent") if isinstance(value, dict) else None
        fork = f" fork of {parent['conversationId']}@{parent['at']}" if isinstance(parent, dict) else ""
        return f"conversation {value.get('id')}{fork}"
    if tag == "entry":
        head = " head" if "head" in value else ""
        return f"entry {value.get('id')} in {value.get('conversationId')} ({value.get('kind')}){head}"
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


# ── stats ─────────────────────────────────────────────────────────────────────


def require_store(path: str | os.PathLike[str]) -> None:
    """Refuse a path that holds no store, before a command that takes the writer lock (which
    would create one): no read-or-repair command creates a store."""

    Environment(path, readonly=True).close()


def stored_projections(path: str | os.PathLike[str]) -> list[str]:
    """The names of the user projections a store holds rows for."""

    env = Environment(path, readonly=True)
    try:
        return sorted(stored_statuses(env))
    finally:
        env.close()


def stats(path: str | os.PathLike[str]) -> dict[str, Any]:
    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        model = open_core(env, log)
        head, first, count = log.head(), log.first(), log.count()
        first_commit = log.get(first) if first else None
        last_commit = log.get(head) if head else None
        sizes = env.stat_sizes()
        txn, model, _ = begin_following(env, model)  # a rebuild elsewhere may have swapped
        with txn:
            counts = {
                "conversations": txn.stat(model.db[t.CONVERSATIONS])["entries"],
                "entries": txn.stat(model.db[t.ENTRIES_BY_CONVERSATION])["entries"],
                "tasks": txn.stat(model.db[t.TASKS])["entries"],
                "submissions": txn.stat(model.db[t.SUBMISSIONS])["entries"],
                "documents": txn.stat(model.db[t.DOCUMENTS])["entries"],
            }
            live_documents = txn.stat(model.db[t.DOCUMENT_CURRENT])["entries"]
            state = projection_state(txn, model)
            position = _stored_position(txn, env)
        users = stored_statuses(env)
        shipping_stopped = stopped_reason(env.path)
        return {
            "path": env.path,
            "storeId": env.store_id,
            "formatVersion": FORMAT_VERSION,
            "headSeq": head,
            "records": count,
            "firstCommittedAt": None if first_commit is None else first_commit.committed_at,
            "lastCommittedAt": None if last_commit is None else last_commit.committed_at,
            "fileBytes": sizes["file"],
            "logBytes": sizes.get("log", 0),
            "projectionBytes": sum(size for name, size in sizes.items() if name.startswith("p")),
            "counts": counts,
            "liveDocuments": live_documents,
            "projections": {
                "core": {
                    "generation": model.generation,
                    "schemaVersion": None if state is None else state.schema_version,
                    "foldedSeq": None if state is None else folded_seq(env, log, model),
                },
                "user": {
                    name: {
                        "version": status.version,
                        "foldedSeq": status.folded_seq,
                        "failedSeq": status.failed_seq,
                        "error": status.error,
                    }
                    for name, status in sorted(users.items())
                },
            },
            **(
                {}
                if position is None
                else {
                    "replication": {
                        "stream": position.stream,
                        "streamSeq": position.stream_seq,
                        "seq": position.seq,
                        "epoch": position.epoch,
                    }
                }
            ),
            **({} if shipping_stopped is None else {"shipping": {"stopped": True, "reason": shipping_stopped}}),
        }
    finally:
        env.close()


def _stored_position(txn: lmdb.Transaction[bytes], env: Environment) -> Any:
    import msgspec

    from ..errors import ReplicationError

    try:
        return stored_position(txn, env.db("meta"))
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ReplicationError(f"The replication position of the store at {env.path} is unreadable ({error})") from None


def format_stats(info: dict[str, Any]) -> str:
    def when(ms: int | None) -> str:
        return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))

    core = info["projections"]["core"]
    lines = [
        f"store            {info['path']}",
        f"store id         {info['storeId'] or '- (its next writer assigns one)'}",
        f"format version   {info['formatVersion']}",
        f"head sequence    {info['headSeq']}",
        f"log records      {info['records']:,}",
        f"first commit     {when(info['firstCommittedAt'])}",
        f"last commit      {when(info['lastCommittedAt'])}",
        f"file size        {format_bytes(info['fileBytes'])}",
        f"log size         {format_bytes(info['logBytes'])}",
        f"projection size  {format_bytes(info['projectionBytes'])}",
        "records          "
        + ", ".join(plural(count, *_KINDS[name]) for name, count in info["counts"].items()),
        f"live documents   {info['liveDocuments']:,}",
        f"projections      core: schema {core['schemaVersion']}, folded to sequence {core['foldedSeq']}",
    ]
    for name, user in info["projections"].get("user", {}).items():
        state = f"version {user['version']}, folded to sequence {user['foldedSeq']}"
        if user["error"] is not None:
            state += f", stopped at sequence {user['failedSeq']}: {user['error']}"
        lines.append(f"                 {name}: {state}")
    replication = info.get("replication")
    if replication is not None:
        lines.append(
            f"replication      stream {replication['stream']}: log sequence {replication['seq']} at stream message "
            f"{replication['streamSeq']}, writer epoch {replication['epoch']}"
        )
    if "shipping" in info:
        lines.append(f"shipping         STOPPED: {info['shipping']['reason']}")
    if "lease" in info:
        lease = info["lease"]
        lines.append(
            "writer lease     "
            + ("none (nobody writes the store now)" if lease is None else
               f"held by {lease['holder']}, epoch {lease['epoch']}, {lease['expires']}")
        )
    return "\n".join(lines)


_KINDS = {
    "conversations": ("conversation", "conversations"),
    "entries": ("entry", "entries"),
    "tasks": ("task", "tasks"),
    "submissions": ("submission", "submissions"),
    "documents": ("document", "documents"),
}


def format_bytes(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)


# ── verify ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Difference:
    database: str
    key: bytes
    seq: int | None
    detail: str

    def __str__(self) -> str:
        where = f", log sequence {self.seq}" if self.seq is not None else ""
        return f"{describe_key(self.database, self.key)} {self.detail} (table {self.database}{where})"


@dataclass(slots=True)
class VerifyReport:
    """What ``check`` looked at and what it found; ``differences`` holds at most ``limit``."""

    records: int = 0
    keys: int = 0
    tables: int = 0
    seconds: float = 0.0
    differences: list[Difference] = field(default_factory=list)
    more: int = 0
    """Differences found beyond the ones kept."""

    @property
    def sound(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        checked = (
            f"{plural(self.records, 'log record')} (checksums and order) and "
            f"{plural(self.keys, 'projection key')} in {plural(self.tables, 'table')}, in {self.seconds:.1f} s"
        )
        if self.sound:
            return f"verified {checked}: the projections match the log"
        found = plural(len(self.differences) + self.more, "difference")
        lines = [f"checked {checked}: {found}"]
        lines += [f"  {difference}" for difference in self.differences]
        if self.more:
            lines.append(f"  ... and {self.more} more")
        return "\n".join(lines)


_ROW_KINDS = {
    t.CONVERSATIONS: "conversation",
    t.TASKS: "task",
    t.SUBMISSIONS: "submission",
    t.DOCUMENTS: "document",
}
_INDEXES = {
    t.CONVERSATIONS_BY_OWNER_CONVERSATION: ("conversation", "conversations by owner conversation"),
    t.CONVERSATIONS_BY_OWNER_TASK: ("conversation", "conversations by owner task"),
    t.TASKS_BY_STATUS: ("task", "tasks by status"),
    t.SUBMISSIONS_BY_STATUS: ("submission", "submissions by status"),
    t.DOCUMENT_INCARNATIONS: ("document", "documents by address"),
    t.DOCUMENTS_BY_SCOPE: ("document", "documents by scope"),
}


def describe_key(table: str, key: bytes) -> str:
    """A projection key in words (``task 9``, ``entry 1005 of conversation 2``), from the key
    layouts of ``projections.tables``; raw bytes only for what has no simpler name."""

    if len(key) == 8 and table in _ROW_KINDS:
        return f"{_ROW_KINDS[table]} {t.read_u64(key)}"
    if len(key) == 8 and table == t.RECORD_IDS:
        return f"id {t.read_u64(key)} in the id registry"
    if len(key) == 8 and table == t.CONVERSATION_PARENTS:
        return f"the fork parent of conversation {t.read_u64(key)}"
    if len(key) == 8 and table == t.DOCUMENT_VALUES:
        return f"the current value of document {t.read_u64(key)}"
    if len(key) == 16 and table == t.ENTRIES_BY_CONVERSATION:
        return f"entry {t.read_u64(key, 8)} of conversation {t.read_u64(key)}"
    if len(key) == 16 and table == t.HEADS_BY_CONVERSATION:
        return f"head marker {t.read_u64(key, 8)} of conversation {t.read_u64(key)}"
    if len(key) == 16 and table == t.DOCUMENT_REVISIONS:
        return f"the revision of document {t.read_u64(key)} at sequence {t.read_u64(key, 8)}"
    if len(key) == 16 and table == t.DOCUMENT_SNAPSHOTS:
        return f"the kept value of document {t.read_u64(key)} at sequence {t.read_u64(key, 8)}"
    if len(key) >= 8 and table in _INDEXES:
        kind, index = _INDEXES[table]
        return f"{kind} {t.read_u64(key, len(key) - 8)} in the index of {index}"
    if table == t.DOCUMENT_CURRENT:
        return f"the current-document row of address key {key.hex()}"
    if table == t.STATE:
        return f"the projection state row {key.decode(errors='replace')!r}"
    if table == t.HISTORY:
        return f"the history row {key.hex()} (kept for as_of views)"
    return f"key {key.hex()}"


class Progress:
    """Progress of a long command on stderr, at most a few times a second: done/total, rate and
    an ETA, or just done and rate when the total is unknown. Silent unless ``enabled``."""

    def __init__(self, label: str, total: int | None, enabled: bool, unit: str = "records") -> None:
        self.label, self.total, self.enabled, self.unit = label, total, enabled, unit
        self.started = self.last = time.monotonic()

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        total = self.total if total is None else total
        finished = total is not None and done >= total
        if now - self.last < 0.25 and not finished:
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        if total is None:
            text = f"{done:,} {self.unit}, {rate:,.0f} {self.unit}/s"
        else:
            eta = (total - done) / rate if rate > 0 else 0.0
            text = f"{done:,}/{total:,} {self.unit}, {rate:,.0f} {self.unit}/s, ETA {eta:.0f} s"
        print(f"\r{self.label}: {text} ", end="\n" if finished else "", file=sys.stderr, flush=True)

    def finish(self, done: int) -> None:
        """End the progress line (when the total was not known up front)."""

        if self.enabled and (self.total is None or done < self.total):
            self.total = done
            self.last = 0.0
            self(done, done)


def verify(path: str | os.PathLike[str], progress: bool = False) -> Difference | None:
    """The first difference ``check`` finds, or None when the store is sound."""

    report = check(path, progress, limit=1)
    return report.differences[0] if report.differences else None


def check(path: str | os.PathLike[str], progress: bool = False, limit: int = 20) -> VerifyReport:
    """Check every record, fold them all into scratch projections, compare key by key.

    Keeps the first ``limit`` differences and counts the rest. A writer may keep committing:
    the last records and the live tables are read from one snapshot, so they agree.
    """

    started = time.monotonic()
    env = Environment(path, readonly=True)
    scratch_dir = tempfile.mkdtemp(prefix="durable-verify-")
    try:
        log = WriteLog(env)
        live = open_core(env, log)
        scratch = Environment(os.path.join(scratch_dir, "store"), durability="process")
        try:
            projector = Projector(ReadModel(scratch, 0))
            report = Progress("verify", log.head(), progress)
            folded = records = 0
            while True:  # the bulk, in chunks, each from its own short read transaction
                commits = log.take(folded + 1, None, 512)
                if len(commits) < 512:
                    break
                _fold_into(scratch, projector, commits)
                folded = commits[-1].seq
                records += len(commits)
                report(folded, max(folded, report.total or 0))
            txn, live, _ = begin_following(env, live)  # a rebuild elsewhere may have swapped
            with txn:  # the rest and the live tables: one snapshot
                head = log.head(txn)
                cursor = txn.cursor(db=log.db)
                rest: list[Commit] = []
                if cursor.set_range(seq_key(folded + 1)):
                    rest = [decode_record(key_seq(key), value) for key, value in cursor]
                _fold_into(scratch, projector, rest)
                scratch.write(lambda scratch_txn: mark_lockstep(scratch_txn, projector.model))
                report(head, head)
                result = VerifyReport(records=records + len(rest), tables=len(t.TABLES))
                _compare(txn, live, projector.model, result, limit)
        finally:
            scratch.close()
    finally:
        env.close()
        shutil.rmtree(scratch_dir, ignore_errors=True)
    result.seconds = time.monotonic() - started
    return result


def _fold_into(scratch: Environment, projector: Projector, commits: list[Commit]) -> None:
    if commits:
        scratch.write(lambda txn: projector.fold(txn, commits))


def _compare(
    live_txn: lmdb.Transaction[bytes], live: ReadModel, scratch: ReadModel, report: VerifyReport, limit: int
) -> None:
    def found(name: str, key: bytes, detail: str) -> None:
        if len(report.differences) < limit:
            report.differences.append(Difference(name, key, _seq_of(name, key), detail))
        else:
            report.more += 1

    for name in t.TABLES:
        with scratch.env.read() as scratch_txn:
            ours = iter(live_txn.cursor(db=live.db[name]))
            theirs = iter(scratch_txn.cursor(db=scratch.db[name]))
            a, b = next(ours, None), next(theirs, None)
            while a is not None or b is not None:
                report.keys += 1
                if a is None or (b is not None and a[0] > b[0]):
                    found(name, b[0], "is missing from the live projection")  # type: ignore[index]
                    b = next(theirs, None)
                elif b is None or a[0] < b[0]:
                    found(name, a[0], "is in the live projection but not in the log")
                    a = next(ours, None)
                else:
                    if a[1] != b[1]:
                        found(name, a[0], "holds a value the log does not produce")
                    a, b = next(ours, None), next(theirs, None)


def _seq_of(table: str, key: bytes) -> int | None:
    if table == t.DOCUMENT_REVISIONS and len(key) == 16:
        return t.read_u64(key, 8)
    return None


# ── time ──────────────────────────────────────────────────────────────────────

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse_time(text: str) -> int:
    """Unix milliseconds of an ISO 8601 timestamp (``2026-12-02T18:30:00Z``, ``2026-12-02``,
    ``...+02:00``); one without a zone is UTC, as every time the CLI prints is."""

    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a timestamp; write ISO 8601, e.g. 2026-12-02T18:30:00Z") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def seq_at(log: WriteLog, ms: int) -> int:
    """The last sequence committed at or before Unix ms ``ms``, or the one before the first.

    Commit times follow the log's order (a writer stamps its clock; an import keeps its source's
    times), so this is a binary search; a clock that stepped back makes the answer one of the
    commits around the step.
    """

    first, head = log.first(), log.head()
    if not first:
        return 0
    seqs = range(first, head + 1)
    return first - 1 + bisect.bisect_right(seqs, ms, key=lambda seq: _committed_at(log, seq))


def _committed_at(log: WriteLog, seq: int) -> int:
    commit = log.get(seq)
    if commit is None:
        raise CorruptRecordError(seq, "missing between the log's first record and its head")
    return commit.committed_at


def seq_range(
    log: WriteLog,
    first: int | None = None,
    last: int | None = None,
    since: int | None = None,
    until: int | None = None,
) -> tuple[int, int]:
    """``(first, last)`` sequences from explicit sequences and/or times (Unix ms, inclusive)."""

    low = 1 if first is None else first
    high = log.head() if last is None else last
    if since is not None:
        low = max(low, seq_at(log, since - 1) + 1)
    if until is not None:
        high = min(high, seq_at(log, until))
    return low, high


# ── export, show, backup ──────────────────────────────────────────────────────


def export_lines(
    path: str | os.PathLike[str], first: int = 1, last: int | None = None, *, since: int | None = None, until: int | None = None
) -> Iterator[str]:
    """The log from ``first`` to ``last`` (and/or between two times) as JSON Lines,
    ``{"seq", "committedAt", "writes"}`` per line; ``jsonlines.from_json`` reads a line back."""

    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        low, high = seq_range(log, first, last, since, until)
        if low <= high:
            for batch in log.read(low, high, decode=decode_record_builtins):
                yield to_json(batch)
    finally:
        env.close()


SHOW_KINDS = ("conversation", "entry", "task", "submission", "document")


async def show(
    path: str | os.PathLike[str], kind: str, id: int, as_of: int | None = None, as_of_time: int | None = None
) -> tuple[Any | None, int | None]:
    """One record as the contract reads it (a document with its value), now, right after commit
    ``as_of``, or as of Unix ms ``as_of_time``; and the sequence it was read at (None: now).
    The record is None when there is none."""

    storage = await LmdbStorage.open(path, readonly=True)
    try:
        if as_of_time is not None:
            as_of = seq_at(storage.log, as_of_time)
        source: Any = storage if as_of is None else await storage.as_of(as_of)
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
        return await source.document(id, "current", BACKGROUND_CONTEXT)
    raise ValueError(f"Unknown kind {kind!r}; one of {', '.join(SHOW_KINDS)}")


def backup(path: str | os.PathLike[str], dest: str | os.PathLike[str], compact: bool = False) -> int:
    """A consistent copy of a store, live or not, in the new directory ``dest``: LMDB's own copy
    from one read snapshot (``compact`` leaves out free pages, so the copy is as small as the data).

    The copy is made beside ``dest`` and renamed into place once synced, so a failed backup leaves
    nothing. Returns the copy's size in bytes.
    """

    target = os.path.abspath(os.fspath(dest))
    if os.path.lexists(target):
        raise FileExistsError(f"{target} already exists; back up into a new directory")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"No directory {parent} to hold the backup")
    env = Environment(path, readonly=True)
    building = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.partial-", dir=parent)
    try:
        env.copy(building, compact=compact)
        data = os.path.join(building, "data.mdb")
        _fsync(data)
        _fsync(building)  # data.mdb's name: without it a cut after the rename can leave DEST empty
        os.rename(building, target)
        _fsync(parent)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    finally:
        env.close()
    return os.path.getsize(os.path.join(target, "data.mdb"))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
