"""What a user projection's fold and its readers are given: ``Tables``, the projection's own
databases inside one transaction, and ``CoreView``, the store's own records as they stood right
after the batch being folded (read in the fold's transaction through the history tables)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import lmdb

from .history import AsOfTxn
from .readmodel import ReadModel


class CoreView:
    """The store's own records as they stood right after one commit, read in the fold's own
    transaction (``tables.core``): each call returns the record as the contract does, or None."""

    def __init__(self, txn: lmdb.Transaction[bytes], model: ReadModel, seq: int) -> None:
        self._view = AsOfTxn(txn, model.db, seq, model.env)
        self._model = model
        self.seq = seq

    def conversation(self, id: int) -> Any | None:
        return self._model.conversation(self._view, id)  # type: ignore[arg-type]

    def task(self, id: int) -> Any | None:
        return self._model.task(self._view, id)  # type: ignore[arg-type]

    def submission(self, id: int) -> Any | None:
        return self._model.submission(self._view, id)  # type: ignore[arg-type]

    def document(self, id: int) -> Any | None:
        """The document's record (its address, kind, history mode), not its content."""

        return self._model.document_record(self._view, id)  # type: ignore[arg-type]

    def entry(self, id: int) -> Any | None:
        row = self._model.entry_row(self._view, id)  # type: ignore[arg-type]
        return None if row is None else row.record


CoreSource = Callable[["lmdb.Transaction[bytes]", int], CoreView]


class Tables:
    """A projection's own databases inside one transaction: writable during ``fold``, read-only
    in ``storage.projections.read(name)``. Keys and values are bytes; keys sort bytewise, so
    encode integers big-endian to keep them in numeric order. ``version`` is the version these
    rows are of and ``folded_seq`` the log sequence they are level with."""

    def __init__(
        self,
        txn: lmdb.Transaction[bytes],
        dbs: dict[str, lmdb._Database],
        version: int = 0,
        folded_seq: int = 0,
        core: CoreSource | None = None,
    ) -> None:
        self._txn = txn
        self._dbs = dbs
        self.version = version
        self.folded_seq = folded_seq
        self._core = core
        self._seq = folded_seq
        self._view: CoreView | None = None

    def at(self, seq: int) -> None:
        """The fold moves on to record ``seq`` (``core`` then reads as of it)."""

        self._seq = seq
        self._view = None

    @property
    def core(self) -> CoreView:
        """The core records as of the batch being folded (only inside ``fold``)."""

        if self._core is None:
            raise RuntimeError("tables.core is offered inside fold() only")
        if self._view is None:
            self._view = self._core(self._txn, self._seq)
        return self._view

    def _db(self, name: str) -> lmdb._Database:
        try:
            return self._dbs[name]
        except KeyError:
            raise KeyError(
                f"This projection has no database {name!r}; it declares {sorted(self._dbs)}"
            ) from None

    def get(self, db: str, key: bytes) -> bytes | None:
        """The value at ``key`` in database ``db``, or None."""

        return self._txn.get(key, db=self._db(db))

    def put(self, db: str, key: bytes, value: bytes) -> None:
        """Set ``key`` to ``value`` (only inside ``fold``)."""

        self._txn.put(key, value, db=self._db(db))

    def delete(self, db: str, key: bytes) -> None:
        """Remove ``key`` if present (only inside ``fold``)."""

        self._txn.delete(key, db=self._db(db))

    def items(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` pairs whose key starts with ``prefix``, in key order."""

        cursor = self._txn.cursor(db=self._db(db))
        if not cursor.set_range(prefix):
            return
        for key, value in cursor:
            if not key.startswith(prefix):
                return
            yield key, value


class StagedTables(Tables):
    """``Tables`` over a read transaction whose writes are kept aside (and read back by ``get``
    and ``items``) until ``apply`` puts them in a write transaction: a fold runs outside the
    store's write exclusion, and the write transaction that follows only puts its rows, so a
    commit waits for a few puts rather than for the folds."""

    def __init__(
        self,
        txn: lmdb.Transaction[bytes],
        dbs: dict[str, lmdb._Database],
        version: int = 0,
        folded_seq: int = 0,
        core: CoreSource | None = None,
    ) -> None:
        super().__init__(txn, dbs, version, folded_seq, core)
        self.staged: dict[str, dict[bytes, bytes | None]] = {}
        """Per database, each key written: its value, or None where it was deleted."""

    def get(self, db: str, key: bytes) -> bytes | None:
        rows = self.staged.get(db)
        if rows is not None:
            key = bytes(key)
            if key in rows:
                return rows[key]
        return super().get(db, key)

    def put(self, db: str, key: bytes, value: bytes) -> None:
        self._db(db)
        self.staged.setdefault(db, {})[bytes(key)] = bytes(value)

    def delete(self, db: str, key: bytes) -> None:
        self._db(db)
        self.staged.setdefault(db, {})[bytes(key)] = None

    def items(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]:
        rows = self.staged.get(db)
        if not rows:
            yield from super().items(db, prefix)
            return
        staged = sorted((key, value) for key, value in rows.items() if key.startswith(prefix))
        stored = super().items(db, prefix)
        stored_row = next(stored, None)
        index = 0
        while stored_row is not None or index < len(staged):
            if index < len(staged) and (stored_row is None or staged[index][0] <= stored_row[0]):
                key, value = staged[index]
                index += 1
                if stored_row is not None and stored_row[0] == key:
                    stored_row = next(stored, None)
                if value is not None:
                    yield key, value
            else:
                assert stored_row is not None
                yield stored_row
                stored_row = next(stored, None)

    def apply(self, txn: lmdb.Transaction[bytes]) -> None:
        """Put the staged writes in ``txn`` (a write transaction), in the order they were made."""

        for db, rows in self.staged.items():
            handle = self._dbs[db]
            for key, value in rows.items():
                if value is None:
                    txn.delete(key, db=handle)
                else:
                    txn.put(key, value, db=handle)


__all__ = [
    "CoreSource",
    "CoreView",
    "StagedTables",
    "Tables",
]
