"""Bringing the projections level with the log: after a crash between steps, an older program, or a
schema change (then the tables are dropped and folded again from the first record)."""

from __future__ import annotations

from collections.abc import Callable

import lmdb

from log import Environment, WriteLog

from . import tables as t
from .projector import Projector

FOLD_CHUNK = 512
"""Records folded per write transaction while catching up."""


def projection_state(txn: lmdb.Transaction, projector: Projector) -> t.ProjectionState | None:
    raw = txn.get(t.STATE_KEY, db=projector.db[t.STATE])
    return None if raw is None else t.state_decoder.decode(raw)


def behind(env: Environment, log: WriteLog, projector: Projector) -> tuple[bool, int, int]:
    """``(schema differs, folded sequence, log head)``."""

    with env.read() as txn:
        state = projection_state(txn, projector)
        head = log.head(txn)
    if state is None:
        return False, 0, head
    return state.schema_version != t.SCHEMA_VERSION, state.folded_seq, head


def drop_tables(txn: lmdb.Transaction, projector: Projector) -> None:
    for name in t.TABLES:
        txn.drop(projector.db[name], delete=False)


def catch_up(
    env: Environment,
    log: WriteLog,
    projector: Projector,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Fold every record the projections lack; returns how many were folded."""

    schema_differs, folded, head = behind(env, log, projector)
    if schema_differs:
        env.write(lambda txn: drop_tables(txn, projector))
        folded = 0
    done = 0
    while folded < head:
        commits = list(_take(log, folded + 1, head, FOLD_CHUNK))

        def fold_chunk(txn: lmdb.Transaction) -> None:
            for commit in commits:
                projector.fold(txn, commit)

        env.write(fold_chunk)
        folded = commits[-1].seq
        done += len(commits)
        if progress is not None:
            progress(folded, head)
    return done


def _take(log: WriteLog, first: int, last: int, count: int) -> list:  # type: ignore[type-arg]
    result = []
    for commit in log.read(first, last):
        result.append(commit)
        if len(result) >= count:
            break
    return result
