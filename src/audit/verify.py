"""Checking a store against its own log: every record's checksum and order, and the live
projections against a fresh fold of the whole log, key by key (``durable-log verify``)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import lmdb
import msgspec

from ..errors import CorruptProjectionError
from ..log import Commit, Environment, WriteLog, key_seq, seq_key
from ..log.records import decode_record
from ..log.storedir import replace_file
from ..log.tree import TILE, TREE_DB
from ..log.writelog import LOG_DB
from ..projections import Projector, ReadModel
from ..projections import tables as t
from ..projections.base import load_base
from ..projections.history import log_rows
from ..projections.rebuild import Progress, begin_following, mark_lockstep, open_core
from .unreadable import Unreadable, failing_change
from .words import plural

# ── verify ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Difference:
    database: str
    key: bytes
    seq: int | None
    detail: str

    def __str__(self) -> str:
        where = f", log sequence {self.seq}" if self.seq is not None else ""
        return (
            f"{describe_key(self.database, self.key)} {self.detail} (table {self.database}{where})"
        )


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
    head: int = 0
    """The last log sequence checked."""
    unreadable: list[Unreadable] = field(default_factory=list)
    """Live documents whose value cannot be read (a committed change fails to apply): not damage,
    the store holds what was committed, but no reader gets their value until a new base."""
    more_unreadable: int = 0

    @property
    def sound(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        checked = (
            f"{plural(self.records, 'log record')} (checksums and order) and "
            f"{plural(self.keys, 'projection key')} in {plural(self.tables, 'table')}, in {self.seconds:.1f} s"
        )
        if self.sound:
            lines = [f"verified {checked}: the projections match the log"]
        else:
            found = plural(len(self.differences) + self.more, "difference")
            lines = [f"checked {checked}: {found}"]
            lines += [f"  {difference}" for difference in self.differences]
            if self.more:
                lines.append(f"  ... and {self.more} more")
        if self.unreadable:
            count = plural(len(self.unreadable) + self.more_unreadable, "live document")
            lines.append(f"{count} cannot be read: a committed change fails to apply")
            lines += [f"  {document.describe()}" for document in self.unreadable]
            if self.more_unreadable:
                lines.append(f"  ... and {self.more_unreadable} more")
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

    if table == TREE_DB:
        return "the log's Merkle tree:"
    if table == LOG_DB:
        return "the log:"
    if len(key) == 8 and table in _ROW_KINDS:
        return f"{_ROW_KINDS[table]} {t.read_u64(key)}"
    if len(key) == 8 and table == t.RECORD_IDS:
        return f"id {t.read_u64(key)} in the id registry"
    if len(key) == 8 and table == t.CONVERSATION_PARENTS:
        return f"the fork parent of conversation {t.read_u64(key)}"
    if len(key) == 12 and table == t.DOCUMENT_VALUES:
        return f"chunk {int.from_bytes(key[8:], 'big')} of the current value of document {t.read_u64(key)}"
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


def verify(path: str | os.PathLike[str], progress: Progress | None = None) -> Difference | None:
    """The first difference ``check`` finds, or None when the store is sound."""

    report = check(path, progress, limit=1)
    return report.differences[0] if report.differences else None


def check(
    path: str | os.PathLike[str], progress: Progress | None = None, limit: int = 20
) -> VerifyReport:
    """Check every record, fold them all into scratch projections, compare key by key.

    Keeps the first ``limit`` differences and counts the rest. A writer may keep committing:
    the last records and the live tables are read from one snapshot, so they agree.
    ``progress(done, total)`` is told the sequence folded so far.
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
            report = progress or _silent
            expected = log.head()  # a writer may commit more meanwhile
            point = load_base(projector.model, log)  # a trimmed log folds on from its base
            folded, records = max(point - 1, 0), 0
            erased = _Erasures(point)
            while True:  # the bulk, in chunks, each from its own short read transaction
                commits = log.take(folded + 1, None, 512)
                if len(commits) < 512:
                    break
                _fold_into(scratch, projector, commits, erased)
                folded = commits[-1].seq
                records += len(commits)
                report(folded, max(folded, expected))
            txn, live, _ = begin_following(env, live)  # a rebuild elsewhere may have swapped
            with txn:  # the rest and the live tables: one snapshot
                head = log.head(txn)
                cursor = txn.cursor(db=log.db)
                rest: list[Commit] = []
                if cursor.set_range(seq_key(folded + 1)):
                    rest = [decode_record(key_seq(key), value) for key, value in cursor]
                _fold_into(scratch, projector, rest, erased)
                scratch.write(lambda scratch_txn: mark_lockstep(scratch_txn, projector.model))
                report(head, head)
                result = VerifyReport(
                    records=records + len(rest), tables=len(t.TABLES) + 1, head=head
                )
                _compare(txn, live, projector.model, result, limit)
                erased.compare(result, limit)
                if result.sound:  # rows that differ from the log may name what is not there
                    _find_unreadable(txn, live, result, limit)
            _compare_tree(log, head, result, limit)
        finally:
            scratch.close()
    finally:
        env.close()
        shutil.rmtree(scratch_dir, ignore_errors=True)
    result.seconds = time.monotonic() - started
    return result


LAST_VERIFY_FILE: Final = "last-verify.json"
"""Beside the store: what ``durable-log verify`` found last (``durable-log serve`` shows it)."""


class VerifyOutcome(msgspec.Struct, forbid_unknown_fields=True):
    """The outcome of the last ``durable-log verify`` of a store, kept beside it."""

    format: int
    at: int
    """When it finished, Unix ms."""
    head: int
    sound: bool
    differences: int
    summary: str


def record_outcome(path: str | os.PathLike[str], report: VerifyReport) -> None:
    """Keep ``report``'s outcome beside the store, for whoever looks next. Best effort: an
    auditor may verify a store whose directory it cannot write, and verifying still counts."""

    outcome = VerifyOutcome(
        1,
        int(time.time() * 1000),
        report.head,
        report.sound,
        len(report.differences) + report.more,
        report.summary(),
    )
    try:
        replace_file(
            os.path.join(os.fspath(path), LAST_VERIFY_FILE),
            msgspec.json.encode(outcome),
            durable=False,
        )
    except OSError:
        pass


def last_outcome(path: str | os.PathLike[str]) -> VerifyOutcome | None:
    """What the last ``durable-log verify`` found, or None (never verified, or unreadable)."""

    try:
        with open(os.path.join(os.fspath(path), LAST_VERIFY_FILE), "rb") as handle:
            return msgspec.json.decode(handle.read(1 << 20), type=VerifyOutcome)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def _find_unreadable(
    txn: lmdb.Transaction[bytes], model: ReadModel, report: VerifyReport, limit: int
) -> None:
    """The live documents whose current value is marked as failing to apply, each with the
    change it fails at."""

    for record in model.scan_table(txn, t.DOCUMENTS, None, b"", None, False):
        current = None if "retiredAt" in record else model.current_value(txn, record["id"])
        if current is None or not current.broken:
            continue
        if len(report.unreadable) >= limit:
            report.more_unreadable += 1
            continue
        found = failing_change(record["id"], model.revisions(txn, record["id"]))
        report.unreadable.append(found or Unreadable(record["id"], "its value is marked broken"))


def _silent(done: int, total: int) -> None:
    pass


def _fold_into(
    scratch: Environment, projector: Projector, commits: list[Commit], erased: _Erasures
) -> None:
    erased.note(commits)
    if commits:
        scratch.write(lambda txn: projector.fold(txn, commits))


class _Erasures:
    """The log's tombstones and erasure records, by sequence: each tombstone must name an
    erasure record that lists it, and each record an erasure lists must be a tombstone (of it,
    or of a later erasure)."""

    def __init__(self, point: int = 0) -> None:
        self.point = point
        """The log's first record after a trim: the records before it are in its base."""
        self.tombstones: dict[int, int] = {}
        self.erasures: dict[int, set[int]] = {}

    def note(self, commits: list[Commit]) -> None:
        for commit in commits:
            if commit.tombstone is not None:
                self.tombstones[commit.seq] = commit.tombstone.erasure
            if commit.erasure is not None:
                self.erasures[commit.seq] = set(commit.erasure.records)

    def compare(self, report: VerifyReport, limit: int) -> None:
        found = [
            (seq, f"is a tombstone of erasure {erasure}, which is no erasure record listing it")
            for seq, erasure in sorted(self.tombstones.items())
            if seq not in self.erasures.get(erasure, ())
        ] + [
            (seq, f"is listed by erasure {erasure} but is not a tombstone of it")
            for erasure, listed in sorted(self.erasures.items())
            for seq in sorted(listed)
            if seq >= self.point and self.tombstones.get(seq, 0) < erasure
        ]
        kept = found[: max(limit - len(report.differences), 0)]
        report.differences.extend(
            Difference(LOG_DB, seq_key(seq), seq, f"record {seq} {detail}") for seq, detail in kept
        )
        report.more += len(found) - len(kept)


def _compare_tree(log: WriteLog, head: int, report: VerifyReport, limit: int) -> None:
    """The log's Merkle tree (``log.tree``): every stored tile recomputed from the records."""

    found, total = log.tree.check(log, head, limit=max(limit - len(report.differences), 1))
    kept = found[: max(limit - len(report.differences), 0)]
    report.differences.extend(Difference(TREE_DB, b"", None, detail) for detail in kept)
    report.more += total - len(kept)
    with log.env.read() as txn:
        report.keys += log.tree.size(txn) // TILE


def _compare(
    live_txn: lmdb.Transaction[bytes],
    live: ReadModel,
    scratch: ReadModel,
    report: VerifyReport,
    limit: int,
) -> None:
    def found(name: str, key: bytes, detail: str) -> None:
        if len(report.differences) < limit:
            report.differences.append(Difference(name, key, _seq_of(name, key), detail))
        else:
            report.more += 1

    rows = log_rows(live_txn, live.env)  # both sides' history refers to the one log
    for name in t.TABLES:
        if name == t.DOCUMENT_VALUES:
            _compare_values(live_txn, live, scratch, report, found)
            continue
        with scratch.env.read() as scratch_txn:
            ours = iter(live_txn.cursor(db=live.db[name]))
            theirs = iter(scratch_txn.cursor(db=scratch.db[name]))
            a, b = next(ours, None), next(theirs, None)
            while a is not None or b is not None:
                report.keys += 1
                if a is None or (b is not None and a[0] > b[0]):
                    if not _pending_snapshot(name, b[0]):  # type: ignore[index]
                        found(name, b[0], "is missing from the live projection")  # type: ignore[index]
                    b = next(theirs, None)
                elif b is None or a[0] < b[0]:
                    found(name, a[0], "is in the live projection but not in the log")
                    a = next(ours, None)
                else:
                    if a[1] != b[1] and (_comparable(name, a, rows) or b"?") != _comparable(
                        name, b, rows
                    ):
                        found(name, a[0], "holds a value the log does not produce")
                    a, b = next(ours, None), next(theirs, None)


def _pending_snapshot(name: str, key: bytes) -> bool:
    """A document snapshot the log's fold places and the store lacks is a shortcut not taken,
    not a difference: the writer packs long documents' snapshots after their commit and puts
    them in a later transaction (or packs them again after a crash), and drops one whose head
    no longer names it (retired, rebased or passed before it was put); reads replay without it
    (``projections.documents``). One the store holds is compared byte for byte."""

    return name == t.DOCUMENT_SNAPSHOTS and len(key) == 16


def _compare_values(
    live_txn: lmdb.Transaction[bytes],
    live: ReadModel,
    scratch: ReadModel,
    report: VerifyReport,
    found: Callable[[str, bytes, str], None],
) -> None:
    """Documents' current values, compared whole: a long one is chunked, and a store written
    before chunks kept it as one row."""

    name = t.DOCUMENT_VALUES
    with scratch.env.read() as scratch_txn:
        ids = {key for key, _ in live_txn.cursor(db=live.db[name]) if len(key) == 8}
        ids |= {key for key, _ in scratch_txn.cursor(db=scratch.db[name]) if len(key) == 8}
        for key in sorted(ids):
            report.keys += 1
            id = t.read_u64(key)
            try:
                ours = t.get_value(live_txn, live.db[name], id, t.unseal)
            except CorruptProjectionError:
                found(name, key, "holds a damaged value")
                continue
            theirs = t.get_value(scratch_txn, scratch.db[name], id, t.unseal)
            if theirs is None:
                found(name, key, "is in the live projection but not in the log")
            elif ours is None:
                found(name, key, "is missing from the live projection")
            elif ours != theirs:
                found(name, key, "holds a value the log does not produce")


def _comparable(table: str, row: tuple[bytes, bytes], log_rows: t.LogRows) -> bytes | None:
    """A row's value as every layout version stores it alike (an older version kept history and
    snapshots undeflated); ``None`` for a damaged one, which then differs from the log's."""

    try:
        return t.comparable(table, row[0], row[1], log_rows)
    except CorruptProjectionError:
        return None


def _seq_of(table: str, key: bytes) -> int | None:
    if table == t.DOCUMENT_REVISIONS and len(key) == 16:
        return t.read_u64(key, 8)
    return None


__all__ = [
    "LAST_VERIFY_FILE",
    "Difference",
    "VerifyOutcome",
    "VerifyReport",
    "check",
    "describe_key",
    "last_outcome",
    "record_outcome",
    "verify",
]
