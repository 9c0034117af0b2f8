"""Reading the tables as they were right after an earlier commit.

``HISTORY`` holds, under ``code + key + seq``, what ``key`` held just before commit ``seq``
changed it (``ABSENT`` when the commit created it, unless the key itself tells when it was
created, ``tables.BORN_KNOWN``, or its row does, ``tables.BORN_IN_VALUE``). So as of sequence
``S`` a key holds nothing if it was created after ``S``, else the before-image of its first change
after ``S`` (for ``BORN_IN_VALUE``: if that row was created at or before ``S``), else its live
value.
``AsOfTxn`` offers the two calls the read model makes, ``get`` and ``cursor``, with that meaning,
so every read query runs unchanged against the past. Cost: one extra seek per key read, and
nothing at all to open a view.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from ..log import Environment, codec
from ..log.records import TaskWrite, decode_record
from ..log.writelog import LOG_DB, seq_key
from . import tables as t


def log_rows(txn: lmdb.Transaction[bytes], env: Environment) -> t.LogRows:
    """``tables.LogRows`` reading the log in ``txn``: a ``LOGGED`` history value's row."""

    def row(table: str, key: bytes, seq: int) -> bytes | None:
        if table != t.TASKS or len(key) != 8 or not env.has_db(LOG_DB):
            return None
        data = txn.get(seq_key(seq), db=env.db(LOG_DB))
        if data is None:
            return None
        id = t.read_u64(key)
        for write in reversed(decode_record(seq, data).writes):  # the commit's last write of it
            if (
                isinstance(write, TaskWrite)
                and isinstance(write.value, dict)
                and write.value.get("id") == id
            ):
                return codec.encode(write.value)
        return None

    return row


_AFTER_ALL_SEQS = b"\xff" * 8


class AsOfTxn:
    """A read transaction's view of the tables as of ``seq``."""

    def __init__(
        self,
        txn: lmdb.Transaction[bytes],
        db: dict[str, lmdb._Database],
        seq: int,
        env: Environment,
    ) -> None:
        self.txn = txn
        self._log_rows = log_rows(txn, env)
        self.seq = seq
        self._history = db[t.HISTORY]
        self._tables = {id(handle): name for name, handle in db.items()}
        self._db = db
        self._seek = txn.cursor(db=self._history)
        self._has_history: dict[str, bool] = {}

    @property
    def horizon(self) -> int:
        """The last sequence this view sees: no key written later is visible."""

        return self.seq

    def _table(self, db: lmdb._Database) -> str:
        return self._tables[id(db)]

    def get(self, key: bytes, db: lmdb._Database, default: bytes | None = None) -> bytes | None:
        table = self._table(db)
        if table == t.DOCUMENT_VALUES:
            return default  # not versioned: documents are replayed from their revisions
        if table == t.RECORD_IDS:  # not versioned: an id is seen from the commit that claimed it
            return default if self._claimed_at(key) > self.seq else self.txn.get(key, db=db)
        value = self.value(table, key)
        return default if value is None else value

    def value(self, table: str, key: bytes) -> bytes | None:
        if table in t.BORN_KNOWN and self._born(table, key) > self.seq:
            return None
        code = t.TABLE_CODES.get(table)
        if code is None:  # no history (a document's snapshots): the live row, once born
            return self.txn.get(key, db=self._db[table])
        cursor = self._seek
        value: bytes | None
        if cursor.set_range(code + key + t.u64(self.seq + 1)):
            found = cursor.key()
            if found[:-8] == code + key:
                value = t.history_before(cursor.value(), found, self._log_rows)
                return self._created(table, key, value)
        value = self.txn.get(key, db=self._db[table])
        return self._created(table, key, value)

    def _created(self, table: str, key: bytes, value: bytes | None) -> bytes | None:
        """``value`` (sealed), unless it is a row of ``BORN_IN_VALUE`` created after the view."""

        if value is None or table not in t.BORN_IN_VALUE:
            return value
        if t.leading_seq(t.unseal(value, table, key), table, key) > self.seq:
            return None
        return value

    def _born(self, table: str, key: bytes) -> int:
        """The commit that created ``key`` (tables in ``BORN_KNOWN``); past any view if unknown."""

        if table in t.BORN_WITH_TRAILING_SEQ:
            return t.read_u64(key, len(key) - 8)
        return self._claimed_at(key if table in t.BORN_WITH_ID else key[-8:])

    def _claimed_at(self, id_key: bytes) -> int:
        """The commit that first wrote a record id; past any view if none did."""

        registered = self.txn.get(id_key, db=self._db[t.RECORD_IDS])
        if registered is None:
            return t.MAX_ID
        return t.read_u64(t.unseal(registered, t.RECORD_IDS, id_key), 1)

    def has_history(self, table: str) -> bool:
        """Whether any key of ``table`` was ever overwritten or deleted."""

        known = self._has_history.get(table)
        if known is None:
            code = t.TABLE_CODES.get(table)
            found = code is not None and self._seek.set_range(code)
            known = self._has_history[table] = found and self._seek.key()[:1] == code
        return known

    def cursor(self, db: lmdb._Database) -> _AsOfCursor:
        return _AsOfCursor(self, self._table(db))


class _AsOfCursor:
    """An LMDB-cursor lookalike over the keys of one table as of the view's sequence.

    Candidate keys are the live table's keys merged with the keys that have history; a
    candidate is visible when ``AsOfTxn.value`` finds a value for it.
    """

    def __init__(self, view: AsOfTxn, table: str) -> None:
        self._view = view
        self._table = table
        self._code = t.TABLE_CODES.get(table, b"")
        self._live = view.txn.cursor(db=view._db[table])
        self._history = view.txn.cursor(db=view._history)
        self._has_history = view.has_history(table)
        self._key: bytes | None = None
        self._value: bytes | None = None

    def key(self) -> bytes:
        assert self._key is not None
        return self._key

    def value(self) -> bytes:
        assert self._value is not None
        return self._value

    # ── moves: each finds the nearest candidate, then the nearest visible one ──

    def set_range(self, key: bytes) -> bool:
        return self._forward(self._first_at_or_after(key))

    def next(self) -> bool:
        return self._key is not None and self._forward(self._first_after(self._key))

    def prev(self) -> bool:
        return self._key is not None and self._backward(self._last_before(self._key))

    def last(self) -> bool:
        return self._backward(self._last())

    def seek_at_or_before(self, key: bytes) -> bool:
        """The last visible key ``<= key``, found walking down (``set_range`` would walk up over
        every key written after the view)."""

        return self._backward(self._last_at_or_before(key))

    def first(self) -> bool:
        return self._forward(self._first_at_or_after(b""))

    def iternext(self) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` from the current row up, as an LMDB cursor yields them."""

        found = self._key is not None
        while found:
            yield self.key(), self.value()
            found = self.next()

    def iterprev(self) -> Iterator[tuple[bytes, bytes]]:
        found = self._key is not None
        while found:
            yield self.key(), self.value()
            found = self.prev()

    def _forward(self, candidate: bytes | None) -> bool:
        while candidate is not None:
            if self._visit(candidate):
                return True
            candidate = self._first_after(candidate)
        self._key = None
        return False

    def _backward(self, candidate: bytes | None) -> bool:
        while candidate is not None:
            if self._visit(candidate):
                return True
            candidate = self._last_before(candidate)
        self._key = None
        return False

    def _visit(self, key: bytes) -> bool:
        value = self._view.value(self._table, key)
        if value is None:
            return False
        self._key, self._value = key, value
        return True

    # ── candidates: the smaller (or larger) of the live and the history key ──
    # A table with no history rows (one only ever inserted into) has only live candidates.

    def _first_at_or_after(self, key: bytes) -> bytes | None:
        live = self._live.key() if self._live.set_range(key) else None
        if not self._has_history:
            return live
        return _smaller(live, self._history_group(self._history.set_range(self._code + key)))

    def _first_after(self, key: bytes) -> bytes | None:
        if self._live.key() == key:  # walking: the live cursor is already there
            found = self._live.next()
        elif self._live.set_range(key):
            found = self._live.key() != key or self._live.next()
        else:
            found = False
        live = self._live.key() if found else None
        if not self._has_history:
            return live
        group = self._history_group(self._history.set_range(self._code + key + _AFTER_ALL_SEQS))
        return _smaller(live, group)

    def _last_before(self, key: bytes) -> bytes | None:
        if self._live.key() == key:  # walking: the live cursor is already there
            found = self._live.prev()
        else:
            found = self._live.prev() if self._live.set_range(key) else self._live.last()
        live = self._live.key() if found else None
        if not self._has_history:
            return live
        if self._history.set_range(self._code + key):
            found = self._history.prev()
        else:
            found = self._history.last()
        return _larger(live, self._history_group(found))

    def _last_at_or_before(self, key: bytes) -> bytes | None:
        if self._live.set_range(key):
            found = self._live.key() == key or self._live.prev()
        else:
            found = self._live.last()
        live = self._live.key() if found else None
        if not self._has_history:
            return live
        if self._history.set_range(self._code + key + _AFTER_ALL_SEQS):
            found = self._history.prev()
        else:
            found = self._history.last()
        return _larger(live, self._history_group(found))

    def _last(self) -> bytes | None:
        live = self._live.key() if self._live.last() else None
        if not self._has_history:
            return live
        next_code = bytes([self._code[0] + 1])
        found = self._history.prev() if self._history.set_range(next_code) else self._history.last()
        return _larger(live, self._history_group(found))

    def _history_group(self, found: bool) -> bytes | None:
        if not found:
            return None
        key = self._history.key()
        if key[:1] != self._code:
            return None
        return key[1:-8]


def _smaller(a: bytes | None, b: bytes | None) -> bytes | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _larger(a: bytes | None, b: bytes | None) -> bytes | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


__all__ = [
    "AsOfTxn",
    "log_rows",
]
