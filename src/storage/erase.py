"""Erasing a conversation: its writes leave the log and the projections, its bytes the disk.

What belongs to a conversation: its conversation records, its entries, its tasks and submissions,
and the documents scoped to it or to one of its tasks, with every change and retirement of them.
A conversation forked from it, or owned by it, reads through it, so it is refused, named, unless
``with_forks`` erases it too (and, in turn, its own).

The log keeps every sequence and every leaf hash. Each record holding an erased write is replaced
by a *tombstone* (``log.records``, format 4): the record's other writes, encoded as they decode
today, its commit time, and the leaf hash it had, which its place in the Merkle tree keeps, so
every root, checkpoint and proof stays valid. A record that mixed the erased conversation's writes
with another's keeps the other's writes: they fold as before, so every read of that conversation,
now and as of every point, is what it was. Then an *erasure record* (format 5) is appended: the
conversations erased, the records it made tombstones, the count of writes removed and the
caller's words for who asked and why; it holds no writes and is a leaf of the tree like any
record.

All of it is one write transaction, which also marks the core projections for a rebuild: a process
killed after it commits leaves a log the next writer's open folds into fresh projections, so a
kill leaves the conversation either whole or erased everywhere. The rebuild follows at once, and
the stored user projections are dropped in the same transaction (their programs fold the log into
them again on their next open). A ``power`` writer takes a checkpoint right before the transaction
and another, on a fresh journal segment, right after it (``CommitJournal.checkpoint_rewrite``):
the rewritten records go to no frame, and a power cut before the second undoes the erasure whole.

Reads are then clean; the disk is not yet: LMDB's free pages, the journal's segments and the word
index still hold the bytes. ``scrub`` (which ``durable-log erase`` runs once the store is closed)
deletes the word index, writes zeros over every journal segment past its header, and swaps in
LMDB's compacting copy of ``data.mdb``, whose pages are written afresh.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

import lmdb
import msgspec

from ..log import Environment, WriteLog, codec
from ..log.compact import CompactReport, compact
from ..log.journal import HEADER_SIZE, JOURNAL_DIR
from ..log.records import (
    Erasure,
    decode_record,
    decode_record_builtins,
    encode_erasure,
    encode_tombstone,
    record_leaf,
)
from ..projections import StorageRequestError
from ..projections import userstate as us
from ..projections.rebuild import schedule_rebuild
from ..projections.search_index import INDEX_DIR

MAX_REASON: Final = 4096
"""Characters an erasure's reason (and its ``by``) may hold."""


class ErasureReport(msgspec.Struct, frozen=True, rename="camel"):
    """What an erasure did: its record's sequence, the conversations erased, the records made
    tombstones, and how many writes left the log."""

    seq: int
    conversations: list[int]
    records: list[int]
    writes: int


class ErasurePlan(msgspec.Struct):
    """The conversations to erase and, by record, the positions of the writes that go."""

    conversations: list[int]
    erased: dict[int, list[int]]
    writes: int


def _scope_owner(record: Any) -> tuple[str, int] | None:
    scope = record.get("scope") if isinstance(record, dict) else None
    if not isinstance(scope, dict):
        return None
    if scope.get("kind") == "conversation":
        return "conversation", scope.get("conversationId")  # type: ignore[return-value]
    if scope.get("kind") == "task":
        return "task", scope.get("taskId")  # type: ignore[return-value]
    return None


def plan_erasure(
    records: Callable[[], Iterable[dict[str, Any]]], conversation: int, with_forks: bool = False
) -> ErasurePlan:
    """What erasing ``conversation`` removes from the log, which ``records()`` reads (the plain
    records of ``decode_record_builtins``, every one, in order; read twice, never held whole). ``StorageRequestError`` when the log
    holds no such conversation; ``ValueError`` naming the forks (without ``with_forks``) or a document of
    another conversation copied from an erased one."""

    found = False
    through: dict[int, set[int]] = {}  # conversation -> the conversations it reads through
    task_conversations: dict[int, set[int]] = {}  # task -> the conversations its records name
    for record in records():
        for write in record["writes"]:
            kind = write.get("type")
            value: dict[str, Any] = write.get("value") or {}
            if kind == "task":
                task_conversations.setdefault(value.get("id", 0), set()).add(
                    value.get("conversationId", 0)
                )
            if kind != "conversation":
                continue
            id: int = value.get("id", 0)
            found = found or id == conversation
            origins = {(value.get(f) or {}).get("conversationId") for f in ("parent", "owner")}
            through.setdefault(id, set()).update(o for o in origins if o is not None and o != id)
    if not found:
        raise StorageRequestError(f"Unknown conversation: {conversation} (the log holds none)")
    # Closed over the whole log: a fork may be written before the conversation it reads through.
    erased_conversations = {conversation}
    forks: dict[int, int] = {}
    while True:
        more = {
            id: min(origins & erased_conversations)
            for id, origins in through.items()
            if id not in erased_conversations and origins & erased_conversations
        }
        if not more:
            break
        forks.update(more)
        erased_conversations.update(more)
    if forks and not with_forks:
        named = ", ".join(f"{id} (of {origin})" for id, origin in sorted(forks.items()))
        raise ValueError(
            f"Conversation {conversation} has forks or owned conversations: {named}; "
            "erase them too with --with-forks (with_forks=True)"
        )
    # A task's documents go with it wherever they stand in the log, before its record too.
    tasks = {id for id, named in task_conversations.items() if named & erased_conversations}
    documents: set[int] = set()
    erased: dict[int, list[int]] = {}
    count = 0
    for record in records():
        seq = int(record["seq"])
        for at, write in enumerate(record["writes"]):
            if _belongs(write, erased_conversations, tasks, documents, seq):
                erased.setdefault(seq, []).append(at)
                count += 1
    return ErasurePlan(sorted(erased_conversations), erased, count)


def _belongs(
    write: dict[str, Any], conversations: set[int], tasks: set[int], documents: set[int], seq: int
) -> bool:
    kind = write.get("type")
    value: dict[str, Any] = write.get("value") or {}
    if kind == "conversation":
        return bool(value.get("id") in conversations)
    if kind in ("entry", "submission"):
        return bool(value.get("conversationId") in conversations)
    if kind == "task":
        return bool(value.get("conversationId") in conversations)
    if kind in ("document.create", "document.copy"):
        record = write.get("record") or {}
        owner = _scope_owner(record)
        mine = owner is not None and (
            (owner[0] == "conversation" and owner[1] in conversations)
            or (owner[0] == "task" and owner[1] in tasks)
        )
        source = (write.get("source") or {}).get("id")
        if mine:
            documents.add(record["id"])
        elif source in documents:
            raise ValueError(
                f"Document {record.get('id')} (record {seq}) is a copy of document {source}, "
                "which the erasure removes; erase its conversation too"
            )
        return mine
    if kind in ("document.change", "document.retire"):
        return bool(write.get("id") in documents)
    return False


def check_reason(reason: object, by: object) -> tuple[str, str]:
    """The erasure's ``reason`` and ``by`` checked: text, the reason not blank, both short."""

    if not isinstance(reason, str) or not reason.strip():
        raise ValueError("An erasure needs a reason: the text of why (and on whose request)")
    if not isinstance(by, str):
        raise TypeError(f"by must be text, not {type(by).__name__}")
    if len(reason) > MAX_REASON or len(by) > MAX_REASON:
        raise ValueError(f"An erasure's reason and by hold at most {MAX_REASON} characters")
    return reason, by


def rewrite(
    txn: lmdb.Transaction[bytes],
    env: Environment,
    log: WriteLog,
    plan: ErasurePlan,
    reason: str,
    by: str,
    projections: list[str],
    committed_at: int | None = None,
) -> int:
    """Inside ``txn``: every record of ``plan`` replaced by its tombstone, the erasure record
    appended, the core projections marked for a rebuild and the stored user ``projections``
    (their names) dropped. Returns the erasure record's sequence."""

    head = log.head(txn)
    seq = head + 1
    at = time.time_ns() // 1_000_000 if committed_at is None else committed_at
    for number, positions in sorted(plan.erased.items()):
        data = log.record(txn, number)
        assert data is not None
        line = decode_record_builtins(number, data)
        gone = set(positions)
        kept = [write for index, write in enumerate(line["writes"]) if index not in gone]
        before = line.get("erased", {}).get("writes", 0)
        tombstone = encode_tombstone(
            codec.encode(kept),
            line["committedAt"],
            record_leaf(number, data),
            seq,
            before + len(gone),
        )
        log.replace(txn, number, tombstone)
    erasure = Erasure(plan.conversations, sorted(plan.erased), reason, plan.writes, by)
    record, _ = encode_erasure(erasure, at)
    log.append_record(txn, seq, record)  # in no journal frame, as the tombstones
    retire_projections(txn, env, projections)
    return seq


def retire_projections(
    txn: lmdb.Transaction[bytes], env: Environment, projections: list[str]
) -> None:
    """Inside ``txn``, once records were rewritten: the core projections marked for a rebuild
    and the stored user ``projections`` (their names) dropped."""

    schedule_rebuild(txn, env)
    dropped: list[str] = []
    for name in projections:
        dropped += us.drop_stored(env, txn, name, [n for n in projections if n != name])
    env.forget_dbs(dropped)


def records_in(txn: lmdb.Transaction[bytes], log: WriteLog) -> Iterator[dict[str, Any]]:
    """Every record of the log as ``txn`` sees it, as ``plan_erasure`` reads them."""

    for seq in range(1, log.head(txn) + 1):
        data = log.record(txn, seq)
        assert data is not None
        yield decode_record_builtins(seq, data)


def erasure_at(log: WriteLog, txn: lmdb.Transaction[bytes], seq: int) -> Erasure | None:
    """The erasure record ``seq`` is, if it is one."""

    data = log.record(txn, seq)
    return None if data is None else decode_record(seq, data).erasure


def erased_by(log: WriteLog, conversation: int) -> int | None:
    """The sequence of the erasure record that erased ``conversation``, if one did."""

    for commit in log.read(decode=decode_record):
        if commit.erasure is not None and conversation in commit.erasure.conversations:
            return commit.seq
    return None


def stored_projections(env: Environment) -> list[str]:
    """The names of the user projections the store holds, served or being built."""

    served, builds, _ = us.stored(env)
    return sorted(set(served) | set(builds))


def scrub(path: str | os.PathLike[str]) -> CompactReport:
    """Once an erasure committed and the store is closed everywhere: take the erased bytes off
    the disk. The word index is deleted (the next search folds the log into it again), every
    journal segment is written over with zeros past its header (a closed store's segments hold
    nothing recovery needs), and ``data.mdb`` is replaced by its compacting copy (``compact``):
    no free page is copied, and the unused middle of every page copied is zeros. Refused (``StoreInUseError``) while any process has it open."""

    path = os.path.abspath(os.fspath(path))
    report = compact(path, zero_gaps=True)  # refuses a store in use or a journal to replay first
    index = os.path.join(path, INDEX_DIR)
    if os.path.isdir(index) and not os.path.islink(index):
        shutil.rmtree(index)
    journal = os.path.join(path, JOURNAL_DIR)
    if os.path.isdir(journal):
        for name in sorted(os.listdir(journal)):
            file = os.path.join(journal, name)
            if name.endswith(".seg") and os.path.isfile(file) and not os.path.islink(file):
                _zero_past_header(file)
    return report


def _zero_past_header(file: str) -> None:
    fd = os.open(file, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        at = HEADER_SIZE if size >= HEADER_SIZE else 0
        zeros = bytes(1 << 20)
        while at < size:
            at += os.pwrite(fd, zeros[: min(len(zeros), size - at)], at)
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "MAX_REASON",
    "ErasurePlan",
    "ErasureReport",
    "check_reason",
    "erased_by",
    "erasure_at",
    "plan_erasure",
    "records_in",
    "retire_projections",
    "rewrite",
    "scrub",
    "stored_projections",
]
