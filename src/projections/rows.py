"""The writes of one commit to the projected tables, remembering what each key held before
(``HISTORY``), so a view as of an earlier sequence can read it (``projections.history``)."""

from __future__ import annotations

import lmdb

from ..errors import CorruptProjectionError
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
        previous: bytes | None
        if table in t.APPENDED and self.txn.put(key, sealed, db=db, append=True):
            previous = None  # appended: the key sorts after all others, so it was not there
        else:
            previous = self.txn.replace(key, sealed, db=db)
        if previous != sealed and (previous is not None or table not in t.BORN_KNOWN):
            self._remember(table, key, previous)
        return None if previous is None else t.unseal(previous, table, key)

    def delete(self, table: str, key: bytes) -> None:
        previous = self.txn.pop(key, db=self.db[table])
        if previous is not None:
            self._remember(table, key, previous)

    def _remember(self, table: str, key: bytes, previous: bytes | None) -> None:
        if table in t.UNVERSIONED or (previous is None and table in t.BORN_KNOWN):
            return
        history_key = t.history_key(table, key, self.seq)
        before = None
        if previous is not None and table in t.LOGGED_TABLES:
            writer = self._writer(table, key, history_key)
            if writer is None:
                return  # this commit already kept what the key held before it
            # A value this commit wrote itself is no commit's last write; one written before a
            # trim's point is in no record the log keeps (nor is its writer known): kept whole.
            if writer < self.seq and writer >= self._trimmed():
                before = t.history_logged(writer, previous)
        if before is None:
            before = t.history_value(previous)
        # The first change in a commit holds the value from before the commit; keep it.
        if not self.txn.put(history_key, before, db=self._history, append=True):
            self.txn.put(history_key, before, db=self._history, overwrite=False)

    def _trimmed(self) -> int:
        """The point of the log's base these tables were folded from (``projections.base``)."""

        return t.trimmed_point(self.txn, self.db)

    def _writer(self, table: str, key: bytes, history_key: bytes) -> int | None:
        """The commit that wrote ``key``'s live value: the newest one that changed it (its
        newest ``HISTORY`` key), else the one that created it (the id registry); ``None`` when
        this commit already kept the key's previous value."""

        cursor = self.txn.cursor(db=self._history)
        if cursor.set_range(history_key):
            if cursor.key() == history_key:
                return None
            found = cursor.prev()
        else:
            found = cursor.last()
        prefix = history_key[:-8]
        if found and cursor.key()[:-8] == prefix:
            return t.read_u64(cursor.key(), len(prefix))
        claimed = self.txn.get(key, db=self.db[t.RECORD_IDS])
        if claimed is None:
            raise CorruptProjectionError(t.RECORD_IDS, key)
        return t.read_u64(t.unseal(claimed, t.RECORD_IDS, key), 1)


__all__ = [
    "Rows",
]
