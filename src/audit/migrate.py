"""Building a store from elsewhere: a ``durable-log export`` (every batch replayed through the
normal commit path, so everything is validated again), or a pi-durable SQLite or JSONL store read
through its own ``Storage`` API (which shows final states, not the history that led to them).

A new store is built in a temporary directory beside its target without a sync per commit, synced
once at the end and renamed into place: an import is as fast as ``process`` durability allows, and
a failed or interrupted one leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from pi_durable.context import BACKGROUND_CONTEXT

from ..errors import WriterLockedError
from ..log.records import (
    check_committed_at,
)
from ..log.storedir import sync_directory, take_writer_lock
from ..storage.lmdb_storage import LmdbStorage
from .export import ROOT_TRAILER
from .jsonlines import from_json
from .pisource import SQLITE_HEADER
from .tombstones import erased_parts, take_in_erased
from .unreadable import Unreadable, read_document
from .words import plural

_BATCH = 256
"""Records per commit when a source has no commit grouping of its own."""

Progress = Callable[[int], None]
"""Called with the number of commits made so far."""


@dataclass
class ImportReport:
    commits: int = 0
    records: dict[str, int] = field(default_factory=dict)
    renumbered: list[tuple[int, int, int]] = field(default_factory=list)
    """Runs ``(export_first, new_first, length)`` of batches whose sequence changed, in order."""
    lacking: list[str] = field(default_factory=list)
    read: dict[str, int] | None = None
    """Records read from a pi-durable source, per kind (None: an export, read batch by batch)."""
    root: str | None = None
    """What became of the export's root (its trailer line), if it had one."""

    def count(self, kind: str, n: int = 1) -> None:
        self.records[kind] = self.records.get(kind, 0) + n

    def note_sequence(self, exported: int, new: int) -> None:
        """Record that export sequence ``exported`` became ``new`` (runs kept compact)."""

        if exported == new:
            return
        if self.renumbered:
            first, new_first, length = self.renumbered[-1]
            if first + length == exported and new_first + length == new:
                self.renumbered[-1] = (first, new_first, length + 1)
                return
        self.renumbered.append((exported, new, 1))

    def __str__(self) -> str:
        counts = (
            ", ".join(plural(n, kind, _PLURALS.get(kind)) for kind, n in self.records.items())
            or "nothing"
        )
        lines = [f"imported {plural(self.commits, 'commit')} ({counts})"]
        if self.read is not None:
            lines.append(
                f"read {_counts(self.read)} from the source; the new store serves as many of each"
            )
        if self.renumbered:
            moved = sum(length for _, _, length in self.renumbered)
            lines.append(
                f"renumbered {plural(moved, 'batch', 'batches')} of {self.commits} (export sequence -> new sequence):"
            )
            for first, new_first, length in self.renumbered[:_RUNS_SHOWN]:
                if length == 1:
                    lines.append(f"  {first} -> {new_first}")
                else:
                    lines.append(
                        f"  {first}-{first + length - 1} -> {new_first}-{new_first + length - 1}"
                    )
            if len(self.renumbered) > _RUNS_SHOWN:
                rest = self.renumbered[_RUNS_SHOWN:]
                lines.append(
                    f"  ... and {plural(len(rest), 'more run')} ({plural(sum(n for _, _, n in rest), 'batch', 'batches')})"
                )
        lines.extend(f"not carried over: {what}" for what in self.lacking)
        if self.root is not None:
            lines.append(self.root)
        return "\n".join(lines)


_RUNS_SHOWN: Final = 20
"""Renumbered runs listed one by one in an import's report; the rest are counted."""


_PLURALS: Final = {"entry": "entries"}


def refuse_existing(target: str, verb: str = "import") -> None:
    if os.path.isdir(target):
        held = sorted(os.listdir(target))
        if held:
            shown = ", ".join(held[:5]) + (", ..." if len(held) > 5 else "")
            raise ValueError(
                f"{target} is not empty (it holds {shown}); {verb} only into a new store"
            )
    elif os.path.lexists(target):
        raise ValueError(f"{target} exists and is not a directory; {verb} only into a new store")


logger = logging.getLogger(__name__)
PARTIAL_VERBS: Final = ("import", "restore")


def remove_stale_partials(final: str) -> list[str]:
    """Remove the partial stores an import or restore into ``final`` left when it was killed;
    returns their paths. A partial is provably stale when no process holds its writer lock (a
    live build holds it from its first commit to its rename): one still held is left alone."""

    parent, name = os.path.split(final)
    removed: list[str] = []
    try:
        entries = os.listdir(parent)
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not any(entry.startswith(f".{name}.{verb}-partial-") for verb in PARTIAL_VERBS):
            continue
        partial = os.path.join(parent, entry)
        if not os.path.isdir(partial) or os.path.islink(partial):
            continue
        try:
            fd = take_writer_lock(partial)
        except WriterLockedError:
            continue  # another import or restore is building it right now
        try:
            shutil.rmtree(partial)
        finally:
            os.close(fd)
        logger.warning(
            "Removed %s, the partial store of an import or restore that was killed", partial
        )
        removed.append(partial)
    if removed:
        sync_directory(parent)
    return removed


@asynccontextmanager
async def new_store(
    target: str | os.PathLike[str],
    *,
    verb: str = "import",
    store: str | None = None,
    seed: Callable[[str], object] | None = None,
) -> AsyncIterator[LmdbStorage]:
    """A store built in a temporary directory beside ``target`` (which must not exist, or be an
    empty directory), synced once and renamed to ``target`` when the block ends without error;
    removed when it raises. ``store``: the new store's id (default: a fresh one); ``verb`` names
    the command in refusals (``import``, ``restore``); ``seed``, run on a worker thread with the
    empty directory before the store is opened in it, may leave a copy of a store there."""

    final = os.path.abspath(os.fspath(target))
    refuse_existing(final, verb)
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    remove_stale_partials(final)
    building = tempfile.mkdtemp(prefix=f".{os.path.basename(final)}.{verb}-partial-", dir=parent)
    try:
        if seed is not None:
            await asyncio.to_thread(seed, building)
        storage = await LmdbStorage.open(building, durability="process", store=store)
        try:
            yield storage
        finally:
            await storage.close()  # syncs the store once, as a process-durability store does
        refuse_existing(final, verb)  # someone may have made it meanwhile
        os.rename(building, final)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    sync_directory(parent)  # the rename itself survives power loss


def parse_batch(number: int, line: str) -> tuple[int, int, list[Any]]:
    """``(seq, committedAt, writes)`` of one export line; a ``ValueError`` naming the line and
    the field when it is not a batch this program could have written."""

    def refuse(why: str) -> ValueError:
        return ValueError(f"Line {number} of the export is not a batch: {why}")

    try:
        batch = from_json(line)
    except (ValueError, RecursionError) as error:
        raise refuse(f"not JSON ({error})") from None
    if not isinstance(batch, dict):
        raise refuse(f"a JSON {type(batch).__name__}, not an object")
    missing = [name for name in ("seq", "committedAt", "writes") if name not in batch]
    if missing:
        raise refuse(f"no {', '.join(repr(name) for name in missing)}")
    seq, committed_at, writes = batch["seq"], batch["committedAt"], batch["writes"]
    if type(seq) is not int or seq < 1:
        raise refuse(f"'seq' must be a positive integer, not {_shown(seq)}")
    try:
        check_committed_at(committed_at)  # the engine's own rule: what it would refuse to write
    except (TypeError, ValueError) as error:
        raise refuse(f"'committedAt': {error}") from None
    if not isinstance(writes, list):
        raise refuse(f"'writes' must be an array, not {_shown(writes)}")
    return seq, committed_at, writes


def _shown(value: Any) -> str:
    """A value as a refusal shows it, in at most 40 characters. An integer past the interpreter's
    digit limit (4,300) has no ``repr``: it is named by its size."""

    if type(value) is int and value.bit_length() >= 256:
        return f"an integer of {value.bit_length():,} bits"
    try:
        text = repr(value)
    except ValueError:  # an integer past the digit limit inside it
        return f"a {type(value).__name__} holding an integer too long to show"
    return text if len(text) <= 40 else text[:37] + "..."


def decode_line(number: int, line: bytes | str) -> str:
    """An export line as text: strict UTF-8 (an export never holds anything else: surrogates are
    written as escapes), so a damaged byte is named instead of read as a surrogate code point."""

    if isinstance(line, str):
        return line
    if number == 1 and line.startswith(SQLITE_HEADER):
        raise ValueError(
            "The source is a SQLite database, not a durable-log export: "
            "read a pi-durable SQLite store with `durable-log import --from-pi-durable SOURCE NEWPATH`"
        )
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        bad = line[error.start : error.end].hex(" ")
        raise ValueError(
            f"Line {number} of the export is not UTF-8: byte {error.start + 1} ({bad}) {error.reason}"
        ) from None


def _out_of_order(number: int, seq: int, expected: int) -> ValueError:
    if expected == 1:
        what = f"is sequence {seq}, not 1: the export does not start at the log's first batch"
    elif seq < expected:
        what = f"is sequence {seq} again, after {expected - 1}: a repeated (or out-of-order) batch"
    else:
        missing = f"{expected}" if seq == expected + 1 else f"{expected}-{seq - 1}"
        what = f"is sequence {seq}, after {expected - 1}: sequence {missing} is missing"
    return ValueError(
        f"Line {number} of the export {what}. Nothing was imported; "
        "pass --renumber to import the batches anyway, numbered 1, 2, 3, ... in line order"
    )


async def import_export(
    lines: Iterable[bytes | str],
    target: str | os.PathLike[str],
    progress: Progress | None = None,
    *,
    renumber: bool = False,
) -> ImportReport:
    """Replay an export's batches, keeping their commit times. Its sequences must run 1, 2, 3, ...
    (a skipped or repeated one is a lost or duplicated batch, refused naming its line) unless
    ``renumber``: then the report lists every batch whose sequence changed."""

    report = ImportReport()
    trailer: tuple[int, int, bytes] | None = None
    async with new_store(target) as storage:
        expected = 1
        for number, raw in enumerate(lines, 1):
            line = decode_line(number, raw)
            if not line.strip():
                continue
            if trailer is not None:
                raise ValueError(
                    f"Line {number} of the export follows its root line {trailer[0]}: the root line is the last"
                )
            if line.startswith('{"' + ROOT_TRAILER + '"'):
                trailer = (number, *parse_root(number, line))
                continue
            seq, committed_at, writes = parse_batch(number, line)
            if seq != expected and not renumber:
                raise _out_of_order(number, seq, expected)
            erased = erased_parts(number, line)
            try:
                if erased is not None:
                    if seq != expected:
                        raise ValueError(
                            "a tombstone or an erasure keeps its sequence (its leaf hash covers "
                            "it): it cannot be renumbered"
                        )
                    new_seq = await take_in_erased(storage, seq, committed_at, writes, erased)
                else:
                    new_seq = await storage.commit(
                        writes, BACKGROUND_CONTEXT, committed_at=committed_at
                    )
            except (ValueError, TypeError) as error:
                raise ValueError(
                    f"Line {number} of the export (sequence {seq}) is refused: {error}"
                ) from None
            expected = new_seq + 1
            report.note_sequence(seq, new_seq)
            report.commits += 1
            for write in writes:
                report.count(write["type"])
            if progress is not None:
                progress(report.commits)
        if trailer is not None:
            report.root = _check_root(storage, report, *trailer)
    return report


def parse_root(number: int, line: str) -> tuple[int, bytes]:
    """``(treeSize, root)`` of an export's root line."""

    try:
        value = from_json(line)
    except (ValueError, RecursionError) as error:
        raise ValueError(
            f"Line {number} of the export is not a root line: not JSON ({error})"
        ) from None
    size, root = (
        (value.get(ROOT_TRAILER), value.get("rootHash"))
        if isinstance(value, dict)
        else (None, None)
    )
    if (
        type(size) is not int
        or size < 0
        or not isinstance(root, str)
        or not re.fullmatch("[0-9a-f]{64}", root)
    ):
        raise ValueError(
            f'Line {number} of the export is not a root line {{"treeSize": N, "rootHash": 64 hex digits}}'
        )
    return size, bytes.fromhex(root)


def _check_root(
    storage: LmdbStorage, report: ImportReport, number: int, size: int, root: bytes
) -> str:
    """The import holds what the exporter's root covers, or ``ValueError`` (nothing is imported)."""

    if report.renumbered:
        return "the export's root was not checked: renumbered records have other leaves"
    head = storage.log.head()
    if size != head:
        raise ValueError(
            f"Line {number} of the export gives the root of {size} records, the export holds {head}. Nothing was imported"
        )
    if storage.log.root(size) != root:
        raise ValueError(
            f"The records imported do not have the exporter's root (line {number}): the export was altered "
            "after it was written. Nothing was imported"
        )
    return f"the records imported have the exporter's root {root.hex()} (tree of {size} records)"


async def _pages(scan: Any, query: dict[str, Any], limit: int = 500) -> AsyncIterator[Any]:
    cursor = None
    while True:
        page = await scan(query, limit, cursor, None)
        for item in page["items"]:
            yield item
        cursor = page.get("next")
        if cursor is None:
            return


async def import_pi_durable(
    source: Any, target: str | os.PathLike[str], progress: Progress | None = None
) -> ImportReport:
    """Copy what a pi-durable ``Storage`` serves: conversations, entries grouped by their original
    commits, tasks and submissions in their final state, and live documents' current values (of
    any scope, its owner recorded or not). What the new store holds is read back and counted
    against what was read: a difference is an error, and nothing is imported."""

    async with new_store(target) as storage:
        report, scopes = await _copy_pi_durable(source, storage, progress)
        read, written = report.read or {}, (await _served(storage, scopes)).counts
        if written != read:
            raise ValueError(
                f"The new store serves {_counts(written)}, the source served {_counts(read)}. "
                "Nothing was imported"
            )
        return report


@dataclass
class _Served:
    """What a ``Storage`` serves, read through its own API: counts per kind, the ids of its
    records (documents aside), and the documents' scopes found from its conversations and tasks."""

    counts: dict[str, int] = field(default_factory=dict)
    conversations: list[Any] = field(default_factory=list)
    entries: dict[int, list[Any]] = field(default_factory=dict)
    """Each commit's entries, by its sequence."""
    tasks: list[Any] = field(default_factory=list)
    submissions: list[Any] = field(default_factory=list)
    ids: set[int] = field(default_factory=set)
    scopes: list[dict[str, Any]] = field(default_factory=list)

    def count(self, kind: str, n: int = 1) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + n


async def _served(storage: Any, scopes: list[dict[str, Any]] | None = None) -> _Served:
    """Every record ``storage`` serves, but documents; with ``scopes``, its live documents of
    those scopes too (counted)."""

    found = _Served()
    found.conversations = [record async for record in _pages(storage.scan_conversations, {})]
    found.count("conversation", len(found.conversations))
    for conversation in found.conversations:
        async for entry in _pages(
            storage.scan_entries, {"conversationId": conversation["id"], "order": "ascending"}
        ):
            if entry["conversationId"] != conversation["id"]:
                continue  # an ancestor's entry, served through the fork
            lookup = await storage.entry(entry["id"], None)
            found.entries.setdefault(lookup["commitSeq"], []).append(entry)
            found.ids.add(entry["id"])
            found.count("entry")
    found.tasks = [record async for record in _pages(storage.scan_tasks, {})]
    found.submissions = [record async for record in _pages(storage.scan_submissions, {})]
    found.count("task", len(found.tasks))
    found.count("submission", len(found.submissions))
    for records in (found.conversations, found.tasks, found.submissions):
        found.ids.update(record["id"] for record in records)
    found.scopes = [{"kind": "session"}]
    found.scopes += [
        {"kind": "conversation", "conversationId": c["id"]} for c in found.conversations
    ]
    found.scopes += [{"kind": "task", "taskId": task["id"]} for task in found.tasks]
    for scope in scopes or []:
        async for _ in _pages(storage.scan_documents, {"scope": scope, "at": "current"}):
            found.count("document")
    return found


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(plural(n, kind, _PLURALS.get(kind)) for kind, n in counts.items()) or "nothing"


async def _orphan_scopes(source: Any, served: _Served) -> tuple[list[dict[str, Any]], list[int]]:
    """The scopes of live documents owned by a conversation or task the source holds no record
    of (the contract allows them; no scan finds them from a record), and the ids of documents
    whose value cannot be read, so their scope is not known. Every id below the source's next
    one that is no other record is asked for as a document."""

    known = {_scope_key(scope) for scope in served.scopes}
    scopes: list[dict[str, Any]] = []
    unreadable: list[int] = []
    for id in range(1, await source.mint_id()):  # mint_id: the copy's counter; nothing written
        if id in served.ids:
            continue
        stored = await read_document(source, id, "current")
        if isinstance(stored, Unreadable):
            unreadable.append(id)
            continue
        if stored is not None and _scope_key(stored["record"]["scope"]) not in known:
            known.add(_scope_key(stored["record"]["scope"]))
            scopes.append(stored["record"]["scope"])
    return scopes, unreadable


def _scope_key(scope: dict[str, Any]) -> tuple[Any, ...]:
    return (scope["kind"], scope.get("conversationId"), scope.get("taskId"))


async def _copy_pi_durable(
    source: Any, storage: LmdbStorage, progress: Progress | None
) -> tuple[ImportReport, list[dict[str, Any]]]:
    """The copy, and the scopes of documents it read (the new store is counted over them)."""

    report = ImportReport(
        lacking=[
            "the order of commits other than entries' (tasks and submissions keep only their final state)",
            "document history: each live document starts at its current value; retired documents are dropped",
            "commit sequences and times: the new store numbers its own commits",
        ]
    )

    async def commit(writes: list[Any]) -> None:
        await storage.commit(writes, BACKGROUND_CONTEXT)
        report.commits += 1
        if progress is not None:
            progress(report.commits)

    served = await _served(source)
    report.read = dict(served.counts)
    for start in range(0, len(served.conversations), _BATCH):
        chunk = served.conversations[start : start + _BATCH]
        await commit([{"type": "conversation", "value": record} for record in chunk])
        report.count("conversation", len(chunk))
    for seq in sorted(served.entries):
        await commit([{"type": "entry", "value": entry} for entry in served.entries[seq]])
        report.count("entry", len(served.entries[seq]))
    for kind, records in (("task", served.tasks), ("submission", served.submissions)):
        for start in range(0, len(records), _BATCH):
            chunk = records[start : start + _BATCH]
            await commit([{"type": kind, "value": record} for record in chunk])
            report.count(kind, len(chunk))

    orphans, unscoped = await _orphan_scopes(source, served)
    scopes = served.scopes + orphans
    left_out: dict[int, str] = {}
    for scope in scopes:
        async for record in _pages(source.scan_documents, {"scope": scope, "at": "current"}):
            stored = await read_document(source, record["id"], "current")
            if isinstance(stored, Unreadable):
                left_out[record["id"]] = f"{stored.error} (scope {scope})"
                continue
            if stored is None:
                continue
            report.read["document"] = report.read.get("document", 0) + 1
            create = {k: v for k, v in record.items() if k not in ("createdAt", "retiredAt")}
            content = {"kind": "base", "version": stored["version"], "value": stored["value"]}
            await commit([{"type": "document.create", "record": create, "content": content}])
            report.count("document")
    for id in unscoped:
        left_out.setdefault(id, "its value and its scope cannot be read")
    if left_out:
        report.lacking.append(
            f"{plural(len(left_out), 'live document')} the source itself cannot read "
            "(a committed change fails to apply): "
            + "; ".join(f"document {id}: {why}" for id, why in sorted(left_out.items()))
        )
    return report, scopes


__all__ = [
    "PARTIAL_VERBS",
    "ImportReport",
    "Progress",
    "decode_line",
    "import_export",
    "import_pi_durable",
    "new_store",
    "parse_batch",
    "parse_root",
    "refuse_existing",
    "remove_stale_partials",
]
