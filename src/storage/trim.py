"""Trimming old history: the log's records before a point leave the store, folded into its base.

``trim`` (``LmdbStorage.trim``, ``durable-log trim``, ``keep_history=``) keeps the log's records
from a *point* on and, in their place, the state they folded to: the log's *base* (``log.base``),
the rows of the core projections right after record ``point - 1``. Every fold of the log (a
rebuild, verify, a fresh store's open) starts from the base and goes on with the kept records, so
the log stays the source of truth and the projections come out the same.

The point is rounded down to a whole tile of the log's Merkle tree that the tree stores
(``log.tree``: ``TILE`` leaves): the dropped records' leaves stay in the stored tiles, so every
root, every inclusion proof of a kept record and every consistency proof between any two sizes
is what it was. Reads now are unchanged; a read as of a sequence before the point raises
``HistoryTrimmed``.

The base is folded first, beside the store (a scratch environment in ``SCRATCH_DIR`` of the
store's directory: the base of an earlier trim, then the records up to the point). Then one write transaction writes the
base, deletes the records before the point and marks the core projections for a rebuild, which
follows at once (from the base and the kept records; the history rows before the point are not
in it). A kill before that transaction commits leaves the store untrimmed; after, trimmed, and
the next writer's open finishes the rebuild. A ``power`` writer takes a checkpoint right before it
and another on a fresh journal segment right after (as an erasure does), so a power cut undoes
the trim whole or keeps it. LMDB keeps the file's size, its freed pages for later commits:
``durable-log trim`` compacts the closed store (``compact``) so the file shrinks.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from typing import Final

import lmdb
import msgspec

from ..log import Environment, WriteLog
from ..log import base as log_base
from ..log.records import decode_record
from ..log.tree import TILE
from ..projections import tables as t
from ..projections.base import base_rows
from ..projections.readmodel import ReadModel
from ..projections.rebuild import Progress, catch_up, schedule_rebuild

SCRATCH_DIR: Final = "trim.scratch"
"""In the store's directory: where a trim folds its base, removed once it is folded; a trim
killed meanwhile leaves it to the next trim or writer's open, which remove it."""
KEEP_MARGIN: Final = 0.5
"""``keep_history=N`` trims once the log holds more than ``N * (1 + KEEP_MARGIN)`` records (back to
``N``, give or take a tile): a trim's cost is spread over ``N * KEEP_MARGIN`` commits."""


class TrimReport(msgspec.Struct, frozen=True, rename="camel"):
    """What a trim did: ``point``, the log's first record now (the point asked for rounded down to
    the tree's tile); ``asked``; ``records`` dropped by this trim (0: it kept all); ``rows`` the
    base holds."""

    point: int
    asked: int
    records: int
    rows: int


def check_before(before: object) -> int:
    """A trim's point as asked: a sequence, an int of at least 1."""

    if isinstance(before, bool) or not isinstance(before, int):
        raise TypeError(f"before must be a log sequence (an int), not {type(before).__name__}")
    if before < 1:
        raise ValueError(f"A trim keeps the records from a sequence of at least 1, not {before}")
    return before


def reach(log: WriteLog, txn: lmdb.Transaction[bytes], before: int) -> int:
    """The point a trim before ``before`` reaches: the head always kept, and the dropped records
    a whole number of the tiles the log tree stores."""

    dropped = min(before, log.head(txn)) - 1
    dropped = min(dropped, log.tree.size(txn))
    dropped -= dropped % TILE
    return dropped + 1


def fold_base(
    log: WriteLog, point: int, progress: Progress | None = None
) -> tuple[list[bytes], int]:
    """The base of ``point``: the log's base and records before ``point`` folded into scratch
    tables in the store's directory (``SCRATCH_DIR``), their rows as stored chunks (``log.base.chunked``), and
    how many rows."""

    scratch_dir = os.path.join(log.env.path, SCRATCH_DIR)
    discard_scratch(log.env.path)
    os.mkdir(scratch_dir, 0o700)
    try:
        scratch = Environment(os.path.join(scratch_dir, "store"), durability="process")
        try:
            model = ReadModel(scratch, 0)
            try:
                catch_up(scratch, log, model, progress, last=point - 1)
                count = [0]

                def counted(rows: Iterator[log_base.Row]) -> Iterator[log_base.Row]:
                    for row in rows:
                        count[0] += 1
                        yield row

                with scratch.read() as txn:
                    chunks = list(log_base.chunked(counted(base_rows(txn, model))))
            finally:
                model.documents.close()
        finally:
            scratch.close()
    finally:
        discard_scratch(log.env.path)
    log_base.base_db(log.env, create=True)  # its handle, before the trim's transaction
    return chunks, count[0]


def discard_scratch(path: str) -> None:
    """Remove what a trim left in the store's directory at ``path`` (the writer's to call)."""

    scratch = os.path.join(path, SCRATCH_DIR)
    if os.path.isdir(scratch) and not os.path.islink(scratch):
        shutil.rmtree(scratch, ignore_errors=True)


def commit_trim(
    txn: lmdb.Transaction[bytes],
    env: Environment,
    log: WriteLog,
    point: int,
    chunks: list[bytes],
    rows: int,
) -> int:
    """Inside ``txn``: the base of ``point`` written, the records before it deleted and the core
    projections marked for a rebuild. Returns how many records went."""

    data = log.record(txn, point - 1)
    if data is None:
        raise ValueError(f"The log holds no record {point - 1}: it is trimmed past it already")
    committed_at = decode_record(point - 1, data).committed_at
    db = log_base.base_db(env)
    assert db is not None, "made before the transaction (fold_base)"
    log_base.write(
        db, txn, point, chunks, rows, committed_at, time.time_ns() // 1_000_000, t.SCHEMA_VERSION
    )
    dropped = log.drop_before(txn, point)
    schedule_rebuild(txn, env)
    return dropped


def keep_window(keep: object) -> int | None:
    """``keep_history=`` checked: ``None``, or how many of the last records to keep (an int of
    at least ``TILE``)."""

    if keep is None:
        return None
    if isinstance(keep, bool) or not isinstance(keep, int):
        raise TypeError(f"keep_history must be an int (records to keep), not {type(keep).__name__}")
    if keep < TILE:
        raise ValueError(
            f"keep_history keeps at least {TILE} records (one tile of the log tree), not {keep}"
        )
    return keep


def due(first: int, head: int, keep: int) -> int | None:
    """The point ``keep_history=keep`` trims to now, or ``None`` while the log is within its margin."""

    held = head - max(first, 1) + 1
    if held <= keep + int(keep * KEEP_MARGIN):
        return None
    return head - keep + 1


__all__ = [
    "KEEP_MARGIN",
    "SCRATCH_DIR",
    "TrimReport",
    "check_before",
    "commit_trim",
    "discard_scratch",
    "due",
    "fold_base",
    "keep_window",
    "reach",
]
