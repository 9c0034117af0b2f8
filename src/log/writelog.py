"""The sequenced write log: append in a caller's transaction, read ranges, follow live.

Key: the commit sequence as 8 bytes big-endian, so LMDB's byte order is numeric order and
appends go to the end of the tree. Value: one ``LogRecord``. Only a trim deletes records, the
oldest ones and never the head, so the last key plus one is always a fresh sequence, across
reopen and crashes alike; the records it drops are folded into the log's base (``log.base``) and
their leaves stay in the stored tree. The one rewrite is an erasure's, which puts a tombstone
keeping the record's leaf hash over it (``replace``).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final, TypeVar

import lmdb

from ..errors import CorruptRecordError, LogError
from ..tlog import merkle
from ..tlog.note import Checkpoint, Signer, parse_signer, sign_checkpoint
from . import base
from .environment import Environment
from .records import Commit, decode_record, encode_record, record_leaf
from .threads import Waiters
from .tree import ConsistencyProof, InclusionProof, TreeStore

T = TypeVar("T")

LOG_DB: Final = "log"
"""The LMDB database holding the records, keyed by sequence."""
READ_CHUNK: Final = 256
"""Records read per read transaction: transactions stay short however long the range is."""

_SEQ = struct.Struct(">Q")


def seq_key(seq: int) -> bytes:
    """The log key of sequence ``seq``: 8 bytes big-endian, so keys sort as sequences do."""
    return _SEQ.pack(seq)


MAX_SEQ: Final = 2**64 - 1
"""The highest sequence a log key can hold."""


def _position(value: object, name: str) -> int:
    """A sequence argument of a read: an int (any: out of range it just matches no record)."""

    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{name} must be a log sequence (an int), not {type(value).__name__} {value!r:.40}"
        )
    return int(value)


def key_seq(key: bytes) -> int:
    """The sequence a log key holds (``seq_key`` read back)."""
    return _SEQ.unpack(key)[0]  # type: ignore[no-any-return]


class WriteLog:
    """Append-only records in the ``log`` database of one environment."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._db = env.db(LOG_DB) if not env.readonly or env.has_db(LOG_DB) else None
        self.tree = TreeStore(env)
        """The log's Merkle tree (``log.tree``): every append adds its leaf in the same transaction."""
        self._waiters = Waiters()

    @property
    def db(self) -> lmdb._Database | None:
        """The log database; a reader opened before the first commit finds it once it exists."""

        if self._db is None and self.env.has_db(LOG_DB):
            self._db = self.env.db(LOG_DB)
        return self._db

    # ── writing ─────────────────────────────────────────────────────────────

    def append(
        self,
        txn: lmdb.Transaction[bytes],
        payload: bytes,
        committed_at: int | None = None,
        after: int | None = None,
    ) -> int:
        """Append one batch's payload (from ``encode_batch``) inside ``txn``; the sequence is
        durable once ``txn`` commits.

        The sequence comes from ``txn`` itself, never from a cache: another thread's commit may
        have moved the head since this process last looked. ``after``: the sequence the previous
        append *in this same transaction* returned (a group's batches), which saves looking the
        head up again; LMDB's append still refuses any key not above the head."""

        db = self.db
        if after is None:
            cursor = txn.cursor(db=db)
            seq = key_seq(cursor.key()) + 1 if cursor.last() else 1
        else:
            seq = after + 1
        if committed_at is None:
            committed_at = time.time_ns() // 1_000_000
        record = encode_record(payload, committed_at)
        if not txn.put(seq_key(seq), record, db=db, append=True):
            raise LogError(
                f"The log refused to append sequence {seq} after its head; nothing was committed"
            )
        self.tree.append_writes(txn, seq, committed_at, payload)
        journal = self.env.journal
        if journal is not None:
            journal.stage(seq, record)  # flushed to the journal before txn commits
        return seq

    def append_record(self, txn: lmdb.Transaction[bytes], seq: int, data: bytes) -> int:
        """Append a record exactly as another copy of this log stores it (a replica taking it from
        the stream), at ``seq``, which must be the head plus one; the caller verified ``data``.
        Returns ``seq``, as ``append`` returns the sequence it gave."""

        cursor = txn.cursor(db=self.db)
        head = key_seq(cursor.key()) if cursor.last() else 0
        if seq != head + 1 or not cursor.put(seq_key(seq), data, append=True):
            raise LogError(
                f"Record {seq} cannot follow the log's head {head}; nothing was committed"
            )
        self.tree.append_leaf(txn, seq, record_leaf(seq, data))
        return seq

    def replace(self, txn: lmdb.Transaction[bytes], seq: int, data: bytes) -> None:
        """Put ``data`` over record ``seq`` inside ``txn``: only an erasure does, with a tombstone
        (``records.encode_tombstone``) that keeps the record's leaf hash, so the tree stays as it
        is. The journal is not told: the erasure makes its transaction durable itself."""

        old = txn.get(seq_key(seq), db=self.db)
        if old is None:
            raise LogError(f"The log holds no record {seq} to replace; nothing was committed")
        if record_leaf(seq, data) != record_leaf(seq, old):
            raise LogError(
                f"The record put over {seq} does not keep its leaf hash; nothing was committed"
            )
        txn.put(seq_key(seq), data, db=self.db)

    def drop_before(self, txn: lmdb.Transaction[bytes], point: int) -> int:
        """Delete, inside ``txn``, every record before ``point`` (a trim, which writes the base
        of ``point`` in the same transaction); ``point`` must not pass the head. Returns how
        many records went."""

        head = self.head(txn)
        if not 1 <= point <= head:
            raise LogError(f"A trim keeps the log's head: sequence {point} is not from 1 to {head}")
        cursor = txn.cursor(db=self.db)
        dropped = 0
        found = cursor.first()
        while found and key_seq(cursor.key()) < point:
            found = cursor.delete()
            dropped += 1
        return dropped

    def trimmed_before(self) -> int:
        """The first sequence the log keeps since a trim (``log.base``); 0 if never trimmed."""

        return base.point(self.env)

    def record(self, txn: lmdb.Transaction[bytes], seq: int) -> bytes | None:
        """The stored bytes of record ``seq``, as ``txn`` sees them."""

        if self.db is None:
            return None
        data = txn.get(seq_key(seq), db=self.db)
        return None if data is None else bytes(data)

    def committed(self) -> None:
        """Call after a transaction holding appends commits, from any thread: wakes this
        process's followers. Another process's followers find out by polling."""

        self.wake()

    def wake(self) -> None:
        """Wake this process's followers, from any thread: after a commit, or a close that
        ends them."""

        self._waiters.wake()

    # ── reading ─────────────────────────────────────────────────────────────

    def head(self, txn: lmdb.Transaction[bytes] | None = None) -> int:
        """The last committed sequence, 0 for an empty log."""

        if self.db is None:
            return 0
        if txn is None:
            with self.env.read() as read_txn:
                return self.head(read_txn)
        cursor = txn.cursor(db=self.db)
        return key_seq(cursor.key()) if cursor.last() else 0

    def first(self, txn: lmdb.Transaction[bytes] | None = None) -> int:
        """The first stored sequence (above 1 once trimmed), 0 for an empty log."""

        if self.db is None:
            return 0
        if txn is None:
            with self.env.read() as read_txn:
                return self.first(read_txn)
        cursor = txn.cursor(db=self.db)
        return key_seq(cursor.key()) if cursor.first() else 0

    def count(self) -> int:
        if self.db is None:
            return 0
        with self.env.read() as txn:
            return txn.stat(self.db)["entries"]

    def get(self, seq: int) -> Commit | None:
        seq = _position(seq, "seq")
        if self.db is None or not 0 <= seq <= MAX_SEQ:
            return None
        with self.env.read() as txn:
            data = txn.get(seq_key(seq), db=self.db)
        return None if data is None else decode_record(seq, data)

    def raw_chunk(
        self, first: int, last: int | None, limit: int = READ_CHUNK
    ) -> list[tuple[int, bytes]]:
        """Up to ``limit`` stored records with ``first <= seq <= last``, from one short transaction."""

        first = _position(first, "first")
        if last is not None:
            last = _position(last, "last")
        limit = _position(limit, "limit")
        if (
            self.db is None
            or limit <= 0
            or first > MAX_SEQ
            or (last is not None and last < max(first, 0))
        ):
            return []
        rows: list[tuple[int, bytes]] = []
        with self.env.read() as txn:
            cursor = txn.cursor(db=self.db)
            if not cursor.set_range(seq_key(max(first, 0))):
                return rows
            previous = max(first, 0) - 1
            for key, value in cursor:
                seq = key_seq(key)
                if seq <= previous:  # LMDB keeps keys in order: only damaged pages give this
                    raise CorruptRecordError(
                        seq, f"found after record {previous}: the log's index is out of order"
                    )
                if last is not None and seq > last:
                    break
                rows.append((seq, value))
                previous = seq
                if len(rows) >= limit:
                    break
        return rows

    def take(self, first: int, last: int | None, count: int) -> list[Commit]:
        """At most ``count`` verified records from ``first`` on (to ``last``, inclusive)."""

        return [decode_record(seq, data) for seq, data in self.raw_chunk(first, last, count)]

    def read(
        self,
        first: int = 1,
        last: int | None = None,
        decode: Callable[[int, bytes], T] = decode_record,  # type: ignore[assignment]
    ) -> Iterator[T]:
        """Verified records from ``first`` to ``last`` (inclusive; ``None``: the head when
        reached), each made by ``decode(seq, stored bytes)``: a ``Commit`` by default."""

        next_seq = _position(first, "first")
        while True:
            rows = self.raw_chunk(next_seq, last)
            if not rows:
                return
            for seq, data in rows:
                yield decode(seq, data)
            next_seq = rows[-1][0] + 1

    async def follow(
        self,
        from_seq: int,
        *,
        poll_interval: float = 0.01,
        max_poll_interval: float = 0.1,
        decode: Callable[[int, bytes], T] = decode_record,  # type: ignore[assignment]
    ) -> AsyncIterator[T]:
        """Yield every record from ``from_seq`` on, forever, as it is committed (``decode``
        turns each verified record into what is yielded: a ``Commit`` by default).

        Idle, it holds no transaction: it polls the head with a short one, backing off from
        ``poll_interval`` to ``max_poll_interval``; a commit in this process wakes it at once.
        """

        next_seq = _position(from_seq, "from_seq")
        interval = poll_interval
        while True:
            rows = self.raw_chunk(next_seq, None)
            if rows:
                interval = poll_interval
                for seq, data in rows:
                    yield decode(seq, data)
                next_seq = rows[-1][0] + 1
                continue
            if not await self.wait_commit(interval):
                interval = min(interval * 1.5, max_poll_interval)

    # ── the Merkle tree (docs/audit.md) ─────────────────────────────────────

    def tree_root(
        self, txn: lmdb.Transaction[bytes], size: int, leaf: bytes | None = None
    ) -> bytes:
        """The root of the tree of the first ``size`` records as ``txn`` sees them (a write
        transaction's own appends included), with ``leaf`` appended when given: the root a record
        about to be appended after ``size`` would make."""

        size, read = self.tree.reader_at(txn, self.db, self.head(txn), size)
        if leaf is None:
            return merkle.tree_hash(size, read)
        builder = merkle.TreeBuilder(size, read(merkle.frontier(size)))
        builder.add(leaf)
        return builder.root()

    def root(self, size: int | None = None) -> bytes:
        """The root hash of the tree of the log's first ``size`` records (default: all)."""

        with self.env.read() as txn:
            size, read = self.tree.reader_at(txn, self.db, self.head(txn), size)
            return merkle.tree_hash(size, read)

    def prove(self, seq: int, size: int | None = None) -> InclusionProof:
        """The inclusion proof of record ``seq`` in the tree of ``size`` records (default: all)."""

        seq = _position(seq, "seq")
        with self.env.read() as txn:
            size, read = self.tree.reader_at(txn, self.db, self.head(txn), size)
            if not 1 <= seq <= size:
                raise ValueError(
                    f"Record {seq} is not in the tree of {size} records (sequences 1 to {size})"
                )
            leaf = read([(0, seq - 1)])[0]
            path = merkle.inclusion_proof(seq - 1, size, read)
            root = merkle.tree_hash(size, read)
            data = txn.get(seq_key(seq), db=self.db)
            tombstone = None if data is None else decode_record(seq, data).tombstone
        return InclusionProof(
            seq,
            seq - 1,
            size,
            leaf.hex(),
            [value.hex() for value in path],
            root.hex(),
            None if tombstone is None else tombstone.erasure,
        )

    def prove_consistency(self, old: int, new: int | None = None) -> ConsistencyProof:
        """The consistency proof from the tree of ``old`` records to that of ``new`` (default: all)."""

        old = _position(old, "old")
        with self.env.read() as txn:
            new, read = self.tree.reader_at(txn, self.db, self.head(txn), new)
            if not 0 <= old <= new:
                raise ValueError(
                    f"No consistency proof from size {old} to size {new}: the old size must be from 0 to {new}"
                )
            path = merkle.consistency_proof(old, new, read)
            old_root, new_root = merkle.tree_hash(old, read), merkle.tree_hash(new, read)
        return ConsistencyProof(
            old, new, old_root.hex(), new_root.hex(), [value.hex() for value in path]
        )

    def checkpoint(
        self, key: Signer | str, origin: str | None = None, size: int | None = None
    ) -> str:
        """A C2SP ``tlog-checkpoint`` of the tree of ``size`` records (default: all), signed by
        ``key`` (a ``tlog.Signer`` or its text); ``origin`` defaults to the key's name."""

        signer = parse_signer(key) if isinstance(key, str) else key
        with self.env.read() as txn:
            size, read = self.tree.reader_at(txn, self.db, self.head(txn), size)
            root = merkle.tree_hash(size, read)
        return sign_checkpoint(
            Checkpoint(signer.name if origin is None else origin, size, root), signer
        )

    async def wait_commit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a commit of this process (or a close); returns
        whether one woke it. Another process's commits are seen by polling after a timeout."""

        waiter = self._waiters.add()
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.discard(waiter)


__all__ = [
    "LOG_DB",
    "MAX_SEQ",
    "READ_CHUNK",
    "WriteLog",
    "key_seq",
    "seq_key",
]
