"""The writes of one commit to the projected tables, remembering what each key held before
(``HISTORY``), so a view as of an earlier sequence can read it (``projections.history``)."""

from __future__ import annotations

import lmdb

from . import tables as t


class Rows:
    """Writes of one commit to the tables, keeping in ``HISTORY`` what each key held before, so a
    view can read any table as of an earlier sequence."""

    __slots__ = ("_history", "db", "seq", "txn")

    def __init__(
        self, txn: lmdb.Transaction[bytes], db: dict[str, lmdb._Database], seq: int
    ) -> None:
        self.txn, self.db, self.seq = txn, db, seq
        self._history = db[t.HISTORY]

    def get(self, table: str, key: bytes) -> bytes | None:
        raw = self.txn.get(key, db=self.db[table])
        return None if raw is None else t.unseal(raw, table, key)

    def claim(self, key: bytes, record_type: str, detail: bytes = b"") -> None:
        """Register an id with its type and the commit that first wrote it (kept thereafter)."""

        value = t.seal(t.RECORD_TYPES[record_type] + t.u64(self.seq) + detail)
        db = self.db[t.RECORD_IDS]
        if not self.txn.put(key, value, db=db, append=True):  # ids mostly grow: fill pages
            self.txn.put(key, value, db=db, overwrite=False)

    def put(self, table: str, key: bytes, value: bytes) -> None:
        self.replace(table, key, value)

    def replace(self, table: str, key: bytes, value: bytes) -> bytes | None:
        """Store ``value`` (sealed) and return what the key held before, checked."""

        sealed = t.seal(value)
        db = self.db[table]
        if table in t.APPENDED and self.txn.put(key, sealed, db=db, append=True):
            return None  # appended: the key sorts after all others, so it was not there
        previous = self.txn.replace(key, sealed, db=db)
        if previous is None:
            if table not in t.BORN_KNOWN and table not in t.BORN_IN_VALUE:
                self._remember(table, key, None)
            return None
        before = t.unseal(previous, table, key)
        if table in t.LOGGED_TABLES:
            t.leading_seq(before, table, key)  # its writer is read: checked first
            if before[t.WRITER_SIZE :] == value[t.WRITER_SIZE :]:
                # The same value again: the row keeps naming the commit that wrote it, which a
                # later change in this commit must find to keep the value from before it.
                self.txn.put(key, previous, db=db)
            else:
                self._remember(table, key, previous)
        elif previous != sealed:
            self._remember(table, key, previous)
        return before

    def delete(self, table: str, key: bytes) -> None:
        previous = self.txn.pop(key, db=self.db[table])
        if previous is None:
            return
        if table in t.BORN_IN_VALUE:
            created = t.leading_seq(t.unseal(previous, table, key), table, key)
            if created == self.seq:
                return  # created by this commit: no view saw it
        if table in t.LOGGED_TABLES:
            t.leading_seq(t.unseal(previous, table, key), table, key)  # read next: checked first
        self._remember(table, key, previous)

    def _remember(self, table: str, key: bytes, previous: bytes | None) -> None:
        """Keep in ``HISTORY`` what ``key`` held before this commit: ``previous``, as stored and
        checked (``None``: nothing)."""

        if table in t.UNVERSIONED:
            return
        kept: bytes | None = None
        if previous is not None and table in t.LOGGED_TABLES:
            writer = t.read_u64(previous, t.SUM_SIZE)
            if writer == self.seq:
                return  # this commit wrote the live value: it already kept the one before it
            # A row written before a trim's point (led by 0) is in no record the log keeps: whole.
            if writer:
                kept = t.history_logged(writer, previous)
        if kept is None:
            kept = t.history_value(previous)
        history_key = t.history_key(table, key, self.seq)
        # The first change in a commit holds the value from before the commit; keep it.
        if not self.txn.put(history_key, kept, db=self._history, append=True):
            self.txn.put(history_key, kept, db=self._history, overwrite=False)


__all__ = [
    "Rows",
]
