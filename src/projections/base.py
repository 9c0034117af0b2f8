"""The core tables and the log's base (``log.base``): the rows a trim keeps of the records it
drops, and the fold that starts from them.

``base_rows`` reads a generation folded up to a trim's point as the base's rows: every table's
rows but ``STATE`` (the fold's own state) and ``HISTORY`` (what keys held before commits the trim
drops: no view reads before the point). ``load_base`` puts them into a fresh generation, with the
point in its ``STATE`` table (``tables.TRIMMED_KEY``), and marks it folded to ``point - 1``: every fold of
the log (open, rebuild, verify) then goes on from there as it would have from sequence 1. A task
row (``tables.LOGGED_TABLES``) is kept led by writer 0, whatever commit before the point wrote it
(the trim drops that record); one of a base of schema 10 or 11, which held the encoded task alone,
is led by 0 as it is loaded, and a status row of such a base (empty) becomes one created at 0.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from ..errors import CorruptProjectionError, StoreStateError
from ..log import WriteLog
from ..log import base as log_base
from . import tables as t
from .readmodel import ReadModel


def base_rows(txn: lmdb.Transaction[bytes], model: ReadModel) -> Iterator[log_base.Row]:
    """Every row of ``model``'s tables a base keeps, table by table, in key order."""

    for name in t.TABLES:
        if name in (t.STATE, t.HISTORY):
            continue
        for key, value in txn.cursor(db=model.db[name]):
            if name in t.LOGGED_TABLES:  # its writer is a record the trim drops: none, 0
                unsealed = t.unseal(value, name, key)
                t.leading_seq(unsealed, name, key)  # damage is refused, not carried on
                yield name, bytes(key), t.seal(t.written_row(0, unsealed[t.WRITER_SIZE :]))
            else:
                yield name, bytes(key), bytes(value)


def load_base(model: ReadModel, log: WriteLog) -> int:
    """Put the base of ``log`` (none: nothing) into ``model``'s tables, fresh ones, a chunk per
    write transaction of ``model``'s environment, and mark them folded to the record before its
    point. Returns the point (0: the log has no base)."""

    env = model.env
    db = log_base.base_db(log.env)
    if db is None:
        return 0
    with log.env.read() as txn:
        header = log_base.read_header(db, txn)
    if header is None:
        return 0
    if header.shape not in t.READABLE_SCHEMAS:
        raise StoreStateError(
            f"The log's base at {log.env.path} holds the rows of projections schema "
            f"{header.shape}, and this program's projections are schema {t.SCHEMA_VERSION}, "
            f"which read the rows of schemas {', '.join(map(str, sorted(t.READABLE_SCHEMAS)))}: "
            "no conversion of a base between them exists, so the projections cannot be folded "
            "(open the store with a program of that schema)"
        )
    unled = header.shape < _WRITER_LED
    chunks = log_base.rows(log.env, header)
    last = header.chunks - 1
    for number, rows in enumerate(chunks):

        def put(
            txn: lmdb.Transaction[bytes], rows: list[log_base.Row] = rows, number: int = number
        ) -> None:
            for name, key, value in rows:
                if name not in model.db or name in (t.STATE, t.HISTORY):
                    raise CorruptProjectionError(log_base.BASE_DB, key)
                if unled and (name in t.LOGGED_TABLES or name in t.BORN_IN_VALUE):
                    value = _led(name, key, value)
                db = model.db[name]
                if not txn.put(key, value, db=db, append=True):  # in key order: fill pages
                    txn.put(key, value, db=db)
            if number == last:
                _finish(txn, model, header.point)

        env.write(put)
    if header.chunks == 0:
        env.write(lambda txn: _finish(txn, model, header.point))
    return header.point


_WRITER_LED = 12
"""The first schema whose ``LOGGED_TABLES`` rows are led by their writer's sequence."""


def _led(name: str, key: bytes, value: bytes) -> bytes:
    """A row of an earlier schema in this one's shape: a ``LOGGED_TABLES`` row (the encoded value
    alone) led by writer 0, as a base's rows are; a ``BORN_IN_VALUE`` row (empty) created at 0,
    before the point."""

    return t.seal(t.written_row(0, t.unseal(value, name, key)))


def _finish(txn: lmdb.Transaction[bytes], model: ReadModel, point: int) -> None:
    txn.put(t.TRIMMED_KEY, t.u64(point), db=model.db[t.STATE])
    state = t.ProjectionState(t.SCHEMA_VERSION, point - 1)
    txn.put(t.STATE_KEY, t.encode_state(state), db=model.db[t.STATE])


__all__ = [
    "base_rows",
    "load_base",
]
