"""The log by sequence and by time: the range a time window covers, and the export's lines
(``durable-log export``, ``tail --since``); ``durable-log import`` reads them back (migrate)."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

from ..log import CorruptRecordError, Environment, WriteLog
from ..log.records import decode_record_builtins
from .jsonlines import to_json

if TYPE_CHECKING:
    from ..storage.lmdb_storage import LmdbStorage


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


async def read_as_of(storage: LmdbStorage, as_of: int | None) -> Any:
    """What reads ``storage`` as it was right after log sequence ``as_of`` (None: now); a
    sequence past the log's head is refused naming it and the head, in a reader's words."""

    if as_of is None:
        return storage
    head = storage.log.head()
    if as_of > head:
        raise ValueError(
            f"log sequence {as_of} is not in the log yet: the log's head is {head} "
            f"(a sequence from 0 to {head})"
        )
    return await storage.as_of(as_of)


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


ROOT_TRAILER: Final = "treeSize"
"""The first key of an export's trailer line, ``{"treeSize": N, "rootHash": hex}``."""


def export_lines(
    path: str | os.PathLike[str],
    first: int = 1,
    last: int | None = None,
    *,
    since: int | None = None,
    until: int | None = None,
    root: bool = False,
) -> Iterator[str]:
    """The log from ``first`` to ``last`` (and/or between two times) as JSON Lines,
    ``{"seq", "committedAt", "writes"}`` per line; ``jsonlines.from_json`` reads a line back.

    ``root``: a last line ``{"treeSize": N, "rootHash": hex}`` gives the Merkle root of the
    records exported (docs/audit.md), which ``import`` checks; the export must then start at
    sequence 1 (a root covers a prefix of the log)."""

    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        low, high = seq_range(log, first, last, since, until)
        point = log.trimmed_before()
        if low < point and low <= high:  # the range reaches records the trim dropped
            raise ValueError(
                f"The log's records before {point} were trimmed into its base, which an export "
                f"does not carry: export from sequence {point} on (--first {point}), without --root"
            )
        if root and low != 1:
            raise ValueError(
                f"An export with its root starts at sequence 1 (a root covers the log's first records), not {low}"
            )
        if low <= high:
            for batch in log.read(low, high, decode=decode_record_builtins):
                yield to_json(batch)
            if root:
                yield to_json({ROOT_TRAILER: high, "rootHash": log.root(high).hex()})
    finally:
        env.close()


__all__ = [
    "ROOT_TRAILER",
    "export_lines",
    "read_as_of",
    "seq_at",
    "seq_range",
]
