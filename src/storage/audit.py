"""What auditors and operators run against a store, possibly while another process writes to it:
tailing committed batches, verifying the log against the projections, statistics, export and
import. Read-side functions open the store read-only: they never take the writer lock.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import lmdb
import msgspec

from ..log import Commit, Environment, WriteLog, key_seq, seq_key, write_to_builtins
from ..log.records import decode_record, decode_record_builtins
from ..log.records import FORMAT_VERSION, WRITE_TYPES
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

_json_encoder = msgspec.json.Encoder()


def to_json(value: Any) -> str:
    """One line of JSON; lone surrogates become ``\\udXXX`` escapes, so nothing is lost."""

    try:
        return _json_encoder.encode(value).decode()
    except (UnicodeEncodeError, OverflowError):
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def commit_to_builtins(commit: Commit, writes: Iterable[Any] | None = None) -> dict[str, Any]:
    return {
        "seq": commit.seq,
        "committedAt": commit.committed_at,
        "writes": [write_to_builtins(write) for write in (commit.writes if writes is None else writes)],
    }


# ── tail ──────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class TailFilter:
    """Which writes an auditor wants: of one conversation, and/or of some write types."""

    conversation: int | None = None
    types: frozenset[str] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.types or ()) - set(WRITE_TYPES)
        if unknown:
            raise ValueError(f"Unknown write type(s) {sorted(unknown)}; known: {', '.join(WRITE_TYPES)}")

    @property
    def everything(self) -> bool:
        return self.conversation is None and self.types is None


class Tail:
    """Committed batches from a sequence on, optionally following new commits, filtered."""

    def __init__(self, path: str | os.PathLike[str], filter: TailFilter | None = None) -> None:
        self.env = Environment(path, readonly=True)
        self.log = WriteLog(self.env)
        self.filter = filter or TailFilter()
        self._model: ReadModel | None = None

    def close(self) -> None:
        self.env.close()

    def head(self) -> int:
        return self.log.head()

    def select(self, commit: Commit) -> list[Any]:
        """The writes of ``commit`` the filter keeps (all of them when there is no filter)."""

        if self.filter.everything:
            return list(commit.writes)
        kept = []
        for write in commit.writes:
            type_name = type(write).__struct_config__.tag
            if self.filter.types is not None and type_name not in self.filter.types:
                continue
            if self.filter.conversation is not None and self._conversation_of(write) != self.filter.conversation:
                continue
            kept.append(write)
        return kept

    def _conversation_of(self, write: Any) -> Any:
        value = getattr(write, "value", None)
        if isinstance(value, dict):
            tag = type(write).__struct_config__.tag
            return value.get("id") if tag == "conversation" else value.get("conversationId")
        record = getattr(write, "record", None)
        if record is None:
            record = self._document_record(write.id)
        scope = record.get("scope") if isinstance(record, dict) else None
        if isinstance(scope, dict) and scope.get("kind") == "conversation":
            return scope.get("conversationId")
        return None

    def _document_record(self, id: int) -> Any:
        header = read_header(self.env)
        if self._model is None or header is None or header.generation != self._model.generation:
            self._model = open_core(self.env, self.log)  # a rebuild elsewhere swapped generations
        with self.env.read() as txn:
            return self._model.document_record(txn, id)

    async def commits(
        self, from_seq: int = 1, *, follow: bool = False, limit: int | None = None
    ) -> AsyncIterator[tuple[Commit, list[Any]]]:
        """``(commit, kept writes)`` for each commit with at least one kept write."""

        shown = 0
        source: Any = self.log.follow(from_seq) if follow else _as_async(self.log.read(from_seq))
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
        self, from_seq: int = 1, *, follow: bool = False, limit: int | None = None
    ) -> AsyncIterator[str]:
        """The ``--json`` lines: ``{"seq", "committedAt", "writes"}``, the writes exactly as
        committed (only the kept ones when filtering)."""

        if not self.filter.everything:
            async for commit, writes in self.commits(from_seq, follow=follow, limit=limit):
                yield to_json(commit_to_builtins(commit, writes))
            return
        if limit is not None and limit <= 0:
            return
        source: Any = (
            self.log.follow(from_seq, decode=decode_record_builtins)
            if follow
            else _as_async(self.log.read(from_seq, decode=decode_record_builtins))
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


def summarize(commit: Commit, writes: list[Any]) -> str:
    """One readable line: sequence, UTC time, and a short phrase per write."""

    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(commit.committed_at / 1000))
    parts = [_describe(write) for write in writes]
    return f"{commit.seq:>8}  {stamp}.{commit.committed_at % 1000:03d}Z  " + "; ".join(parts)


def _describe(write: Any) -> str:
    tag = type(write).__struct_config__.tag
    value = getattr(write, "value", None)
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
        return f"document {write.record.get('id')} created ({write.record.get('kind')}, v{write.content.version})"
    if tag == "document.copy":
        return f"document {write.record.get('id')} copied from {write.source.id}@{write.source.at}"
    if tag == "document.change":
        content = write.content
        detail = f"{len(content.ops)} ops" if hasattr(content, "ops") and isinstance(content.ops, list) else "base"
        return f"document {write.id} changed ({detail}, v{content.version})"
    return f"document {write.id} retired"


# ── stats ─────────────────────────────────────────────────────────────────────


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
        return {
            "path": env.path,
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
                }
            },
        }
    finally:
        env.close()


def format_stats(info: dict[str, Any]) -> str:
    def when(ms: int | None) -> str:
        return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))

    core = info["projections"]["core"]
    lines = [
        f"store            {info['path']}",
        f"format version   {info['formatVersion']}",
        f"head sequence    {info['headSeq']}",
        f"log records      {info['records']}",
        f"first commit     {when(info['firstCommittedAt'])}",
        f"last commit      {when(info['lastCommittedAt'])}",
        f"file size        {_bytes(info['fileBytes'])}",
        f"log size         {_bytes(info['logBytes'])}",
        f"projection size  {_bytes(info['projectionBytes'])}",
        "records          "
        + ", ".join(f"{count} {name}" for name, count in info["counts"].items()),
        f"live documents   {info['liveDocuments']}",
        f"projections      core: schema {core['schemaVersion']}, folded to {core['foldedSeq']}",
    ]
    return "\n".join(lines)


def _bytes(size: int) -> str:
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
        where = f" (log sequence {self.seq})" if self.seq is not None else ""
        return f"{self.database}: key {self.key.hex()} {self.detail}{where}"


class Progress:
    """Records/s and an ETA on stderr, at most a few times a second."""

    def __init__(self, label: str, total: int, enabled: bool) -> None:
        self.label, self.total, self.enabled = label, total, enabled
        self.started = self.last = time.monotonic()

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        total = self.total if total is None else total
        if now - self.last < 0.25 and done < total:
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        eta = (total - done) / rate if rate > 0 else 0.0
        end = "\n" if done >= total else ""
        print(f"\r{self.label}: {done}/{total} records, {rate:,.0f} records/s, ETA {eta:.0f} s ", end=end, file=sys.stderr, flush=True)


def verify(path: str | os.PathLike[str], progress: bool = False) -> Difference | None:
    """Check every record, fold them all into scratch projections, compare key by key.

    Returns the first difference, or None when the store is sound. A writer may keep committing:
    the last records and the live tables are read from one snapshot, so they agree.
    """

    env = Environment(path, readonly=True)
    scratch_dir = tempfile.mkdtemp(prefix="durable-verify-")
    try:
        log = WriteLog(env)
        live = open_core(env, log)
        scratch = Environment(os.path.join(scratch_dir, "store"), durability="process")
        try:
            projector = Projector(ReadModel(scratch, 0))
            report = Progress("verify", log.head(), progress)
            folded = 0
            while True:  # the bulk, in chunks, each from its own short read transaction
                commits = log.take(folded + 1, None, 512)
                if len(commits) < 512:
                    break
                _fold_into(scratch, projector, commits)
                folded = commits[-1].seq
                report(folded, max(folded, report.total))
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
                return _compare(txn, live, projector.model)
        finally:
            scratch.close()
    finally:
        env.close()
        shutil.rmtree(scratch_dir, ignore_errors=True)


def _fold_into(scratch: Environment, projector: Projector, commits: list[Commit]) -> None:
    if commits:
        scratch.write(lambda txn: projector.fold(txn, commits))


def _compare(live_txn: lmdb.Transaction, live: ReadModel, scratch: ReadModel) -> Difference | None:
    for name in t.TABLES:
        with scratch.env.read() as scratch_txn:
            ours = iter(live_txn.cursor(db=live.db[name]))
            theirs = iter(scratch_txn.cursor(db=scratch.db[name]))
            while True:
                a, b = next(ours, None), next(theirs, None)
                if a is None and b is None:
                    break
                if a is None:
                    return Difference(name, b[0], _seq_of(name, b[0]), "is missing from the live projection")  # type: ignore[index]
                if b is None or a[0] < b[0]:
                    return Difference(name, a[0], _seq_of(name, a[0]), "is in the live projection but not in the log")
                if a[0] > b[0]:
                    return Difference(name, b[0], _seq_of(name, b[0]), "is missing from the live projection")
                if a[1] != b[1]:
                    return Difference(name, a[0], _seq_of(name, a[0]), "holds a value the log does not produce")
    return None


def _seq_of(table: str, key: bytes) -> int | None:
    if table == t.DOCUMENT_REVISIONS and len(key) == 16:
        return t.read_u64(key, 8)
    return None


# ── export and import ─────────────────────────────────────────────────────────


def export_lines(path: str | os.PathLike[str], first: int = 1, last: int | None = None) -> Iterator[str]:
    env = Environment(path, readonly=True)
    try:
        for batch in WriteLog(env).read(first, last, decode=decode_record_builtins):
            yield to_json(batch)
    finally:
        env.close()
