"""The log's Merkle tree, stored: a projection of the log written in the commits' transactions.

The ``tlog`` database holds the tree's stored hashes (``tlog.merkle``: each leaf's hash followed by
the hashes of the complete subtrees that leaf completes, about two per record) in *tiles* of
``TILE`` leaves: key the tile's number (its first leaf index / ``TILE``) as 8 bytes big-endian, so
every tile is appended at the end; value the rows of its leaves in order, 32 bytes per hash (a
leaf ``i`` has ``1 + trailing ones of i`` of them, so where each row starts is computed, not
stored). The stored tree holds whole tiles only: its size is a multiple of ``TILE``.

Commits note each record's writes (the bytes they encode, no reread); the commit that completes a
tile hashes the leaves of the records noted since, one after another (a hash in a row with others
costs about half of one between two commits, whose other work evicts the hashing code from the
caches), and the commit that completes every ``WRITE_TILES``-th tile writes the tiles since the
last write, in its own transaction: one more table touched in a transaction costs it more than the
hashing (LMDB copies and writes that table's last page and path every time), so it is touched
rarely. The
records after the last stored tile, and all of a store written before the tree, are hashed from
the log when a root or proof needs them (``reader_at``); a writer's open and close write every
whole tile the tree lacks (``catch_up``). ``rebuild`` writes every tile again from the
log, over the stored ones (never a tree with a hole); ``check`` recomputes it and compares every
stored tile. After a trim (``log.base``) the leaves before the log's first record are in stored
tiles only (a trim drops whole tiles' records, and only those the tree stores): ``rebuild`` and
``check`` start at the first record, from the stored frontier there, and every root, inclusion
proof and consistency proof reads them as before.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterator, Sequence
from typing import Final, Protocol

import lmdb
import msgspec

from ..errors import CorruptRecordError, DamageError, ProjectionsBehind, ProofError
from ..tlog import merkle
from ..tlog.leaf import record_leaf_hash
from .environment import Environment
from .records import record_leaf


class Records(Protocol):
    """The log as its tree reads it (``writelog.WriteLog``): its head, and its stored records a
    chunk at a time."""

    def head(self, txn: lmdb.Transaction[bytes] | None = None) -> int: ...
    def first(self, txn: lmdb.Transaction[bytes] | None = None) -> int: ...
    def raw_chunk(
        self, first: int, last: int | None, limit: int = ...
    ) -> list[tuple[int, bytes]]: ...


TREE_DB: Final = "tlog"
LOG_DB: Final = "log"
"""The log's own database (``writelog.LOG_DB``), read for leaves this process did not note."""
TILE: Final = merkle.BLOCK
"""Leaves per stored tile: a tile's rows (31 to about 50 hashes) stay within one LMDB page; a
whole tile's rows are built at once (``TreeBuilder.add_block``)."""
WRITE_TILES: Final = 32
"""Tiles a commit writes at once: the commit whose record completes a multiple of
``WRITE_TILES * TILE`` leaves writes the tiles the stored tree lacks."""
_WRITE_EVERY: Final = WRITE_TILES * TILE
CHUNK: Final = 4096
"""Records hashed per write transaction while filling the tree in (a multiple of ``TILE``)."""
MAX_BEHIND: Final = 65_536
"""Records a read hashes from the log beyond the stored tree at most; further behind (a store
written by a version without the tree, never opened for writing since) it asks for a writer's
open."""
_KEY = struct.Struct(">Q")
_key: Final = _KEY.pack
_HASH: Final = merkle.HASH_SIZE

Progress = Callable[[int, int], None]
_logger = logging.getLogger(__name__)


def _hashes_before(index: int) -> int:
    """How many hashes the rows of leaves ``0 .. index - 1`` hold: ``2 * index - popcount(index)``."""

    return 2 * index - index.bit_count()


def _offset(leaf: int, level: int) -> int:
    """Where, in its tile, the hash of the subtree of height ``level`` that ``leaf`` completes is."""

    return _HASH * (_hashes_before(leaf) - _hashes_before(leaf - leaf % TILE) + level)


class InclusionProof(msgspec.Struct, rename="camel", frozen=True, omit_defaults=True):
    """That record ``seq`` is leaf ``leaf_index`` of the tree of ``tree_size`` leaves with root
    ``root_hash`` (RFC 9162 2.1.3; hashes in lowercase hex). ``erased``: the sequence of the
    erasure record that erased the record's content (a tombstone keeps its leaf hash), if any."""

    seq: int
    leaf_index: int
    tree_size: int
    leaf_hash: str
    inclusion: list[str]
    root_hash: str
    erased: int | None = None


class ConsistencyProof(msgspec.Struct, rename="camel", frozen=True):
    """That the tree of ``old_size`` leaves is a prefix of the tree of ``new_size`` leaves
    (RFC 9162 2.1.4; hashes in lowercase hex)."""

    old_size: int
    new_size: int
    old_root: str
    new_root: str
    consistency: list[str]


class TreeStore:
    """The stored tiles of one environment's log tree."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._db = env.db(TREE_DB) if not env.readonly or env.has_db(TREE_DB) else None
        self._noted: dict[int, tuple[int, bytes]] = {}
        """``(committed_at, writes)`` of the records appended by this process since the last
        whole tile, by sequence: hashed when a record completes a tile."""
        self._pending: dict[int, bytes] = {}
        """Leaves appended by this process past the stored tree, by sequence."""
        self._builder: merkle.TreeBuilder | None = None
        """The frontier after the last tile this process wrote; used only while the stored tree
        has its size (a tile whose transaction aborted leaves the tree smaller)."""

    @property
    def db(self) -> lmdb._Database | None:
        if self._db is None and self.env.has_db(TREE_DB):
            self._db = self.env.db(TREE_DB)
        return self._db

    # ── size and reads ──────────────────────────────────────────────────────

    def size(self, txn: lmdb.Transaction[bytes]) -> int:
        """How many leaves the stored tree holds, as ``txn`` sees it (a multiple of ``TILE``)."""

        db = self.db
        if db is None:
            return 0
        cursor = txn.cursor(db=db)
        return (_KEY.unpack(cursor.key())[0] + 1) * TILE if cursor.last() else 0

    def reader(self, txn: lmdb.Transaction[bytes]) -> merkle.HashReader:
        """Stored hashes of complete subtrees, from ``txn``; a missing one is damage (``ProofError``)."""

        db = self.db

        def read(subtrees: Sequence[tuple[int, int]]) -> list[bytes]:
            out = []
            for level, n in subtrees:
                last = ((n + 1) << level) - 1
                tile = None if db is None else txn.get(_key(last // TILE), db=db)
                at = _offset(last, level)
                if tile is None or len(tile) < at + _HASH:
                    raise ProofError(
                        f"the log tree lacks the hash of leaves {n << level} to {last} (tile "
                        f"{last // TILE}); the tree is damaged: run durable-log rebuild"
                    )
                out.append(bytes(tile[at : at + _HASH]))
            return out

        return read

    def reader_at(
        self,
        txn: lmdb.Transaction[bytes],
        log_db: lmdb._Database | None,
        head: int,
        size: int | None,
    ) -> tuple[int, merkle.HashReader]:
        """``(size, a reader of the tree of that size)``, ``size`` defaulting to ``head``: the
        stored tiles, and rows hashed from the log's records in ``txn`` beyond them."""

        wanted = head if size is None else size
        if isinstance(wanted, bool) or not isinstance(wanted, int) or not 0 <= wanted <= head:
            raise ValueError(
                f"A tree size must be an int from 0 to the log head {head}, not {wanted!r}"
            )
        stored = self.size(txn)
        read = self.reader(txn)
        if wanted <= stored:
            return wanted, read
        if wanted - stored > MAX_BEHIND or log_db is None:
            raise ProjectionsBehind(
                f"The log tree of {self.env.path} holds {stored} of {head} records; open the store "
                "for writing once (or run durable-log rebuild) to fill it in"
            )
        builder = merkle.TreeBuilder(stored, read(merkle.frontier(stored)))
        rows: dict[int, bytes] = {}
        cursor = txn.cursor(db=log_db)
        seq = stored + 1
        if cursor.set_key(_key(seq)):
            for key, data in cursor:
                if seq > wanted:
                    break
                if _KEY.unpack(key)[0] != seq:
                    break
                rows[seq - 1] = builder.add(record_leaf(seq, data))
                seq += 1
        if seq <= wanted:
            raise CorruptRecordError(seq, "missing between the log's first record and its head")

        def overlaid(subtrees: Sequence[tuple[int, int]]) -> list[bytes]:
            out = []
            for level, n in subtrees:
                row = rows.get(((n + 1) << level) - 1)
                out.append(
                    read([(level, n)])[0]
                    if row is None
                    else row[_HASH * level : _HASH * (level + 1)]
                )
            return out

        return wanted, overlaid

    # ── writing ─────────────────────────────────────────────────────────────

    def append_writes(
        self, txn: lmdb.Transaction[bytes], seq: int, committed_at: int, writes: bytes
    ) -> None:
        """Note record ``seq``, appended in ``txn`` with ``writes`` (its encoded writes, not to be
        changed) at ``committed_at``; the record that completes a tile hashes the leaves noted
        since the last (``tlog.leaf``), and ``append_leaf`` follows."""

        self._noted[seq] = (committed_at, writes)
        self._pending.pop(seq, None)  # hashed in a transaction that aborted: the note replaces it
        if seq % TILE:
            return
        pending, noted = self._pending, self._noted
        for at, (when, data) in noted.items():
            pending[at] = record_leaf_hash(at, when, data)
        noted.clear()
        if seq % _WRITE_EVERY == 0:
            self._write(txn, seq)

    def append_leaf(self, txn: lmdb.Transaction[bytes], seq: int, leaf: bytes) -> None:
        """Note record ``seq``'s leaf, appended in ``txn``; the record that completes a multiple of
        ``WRITE_TILES`` tiles writes, in ``txn``, every whole tile the stored tree lacks (a leaf
        this process did not note, appended before it opened the store, is hashed from the log).

        A leaf noted in a transaction that then aborts is replaced when its sequence is appended
        again, which it must be before the log reaches the end of its tile."""

        if self._noted:
            self._noted.pop(seq, None)  # noted by ``append_writes`` in a transaction that aborted
        self._pending[seq] = leaf
        if seq % _WRITE_EVERY == 0:
            self._write(txn, seq)

    def _write(self, txn: lmdb.Transaction[bytes], seq: int) -> None:
        """Write, in ``txn``, every whole tile up to record ``seq`` the stored tree lacks."""

        pending = self._pending
        size = self.size(txn)
        for old in [at for at in pending if at <= size]:
            del pending[old]
        if not size < seq <= size + CHUNK:
            if (
                seq > size
            ):  # far behind (a log appended to without the tree): a writer's open fills it
                pending.clear()
            return
        self._builder, builder = (
            None,
            self._builder,
        )  # until the tiles are in: an aborted transaction leaves none
        try:
            leaves = [
                pending.get(at) or self._leaf_from_log(txn, at) for at in range(size + 1, seq + 1)
            ]
            if builder is None or builder.size != size:  # else: the frontier the last tile left
                builder = merkle.TreeBuilder(size, self.reader(txn)(merkle.frontier(size)))
        except (
            DamageError
        ) as error:  # a damaged tree never refuses a commit: verify names it, rebuild mends it
            _logger.error(
                "the log tree of %s is not extended past %d records: %s", self.env.path, size, error
            )
            return
        cursor = txn.cursor(db=self._db)
        for tile, rows in enumerate(_tiles(builder, leaves), size // TILE):
            cursor.put(_key(tile), rows, append=True)
        self._builder = builder

    def _leaf_from_log(self, txn: lmdb.Transaction[bytes], seq: int) -> bytes:
        data = txn.get(_key(seq), db=self.env.db(LOG_DB))
        if data is None:
            raise CorruptRecordError(seq, "missing between the log's first record and its head")
        return record_leaf(seq, data)

    def catch_up(self, log: Records, progress: Progress | None = None) -> int:
        """Write every whole tile the tree lacks, a chunk of records per transaction; returns
        how many records it hashed."""

        self._builder = None
        with self.env.read() as txn:
            size, head = self.size(txn), log.head(txn)
            if size >= head - head % TILE:
                return 0
            builder = merkle.TreeBuilder(size, self.reader(txn)(merkle.frontier(size)))
        return self._write_tiles(log, builder, head, progress, append=True)

    def rebuild(self, log: Records, progress: Progress | None = None) -> int:
        """Write every tile again from the whole log, over the stored ones, then delete the tiles
        past the log's last whole tile. Never dropped first: a reader in another process (a
        ``verify``, a proof) sees the stored tree or the rebuilt one, never a tree with a hole."""

        self._builder = None
        db = self.env.db(TREE_DB)
        with self.env.read() as txn:
            head = log.head(txn)
            builder = self._past_trim(txn, log)
        done = self._write_tiles(log, builder, head, progress, append=False)

        def trim(txn: lmdb.Transaction[bytes]) -> None:
            cursor = txn.cursor(db=db)
            found = cursor.set_range(_key((head - head % TILE) // TILE))
            while found:
                found = cursor.delete()

        self.env.write(trim)
        return done

    def _write_tiles(
        self,
        log: Records,
        builder: merkle.TreeBuilder,
        head: int,
        progress: Progress | None,
        append: bool,
    ) -> int:
        """Hash the records from ``builder``'s size to the last whole tile before ``head`` and
        write their tiles, a chunk per transaction (``append``: past every stored tile, else over
        them); returns how many records it hashed."""

        db = self.env.db(TREE_DB)
        done = 0
        for chunk in _chunks(log, builder.size + 1, head - head % TILE):
            first = builder.size // TILE
            tiles = _tiles(builder, chunk)

            def put(
                txn: lmdb.Transaction[bytes], first: int = first, tiles: list[bytes] = tiles
            ) -> None:
                cursor = txn.cursor(db=db)
                for offset, tile in enumerate(tiles):
                    cursor.put(_key(first + offset), tile, append=append)

            self.env.write(put)
            done += len(chunk)
            if progress is not None:
                progress(builder.size, head)
        return done

    def _past_trim(self, txn: lmdb.Transaction[bytes], log: Records) -> merkle.TreeBuilder:
        """A builder at the log's first stored record: empty, or, once a trim dropped the
        records before it (always a whole number of tiles), at the stored tiles' frontier there:
        their leaves can no longer be hashed from the log, so the stored tiles are theirs."""

        first = log.first(txn)
        kept = first - 1 if first > 1 else 0
        if kept == 0:
            return merkle.TreeBuilder()
        if kept % TILE or kept > self.size(txn):
            raise ProofError(
                f"the log's first record is {first}, but the log tree holds {self.size(txn)} "
                "leaves in whole tiles: the leaves before it are lost"
            )
        return merkle.TreeBuilder(kept, self.reader(txn)(merkle.frontier(kept)))

    # ── checking ────────────────────────────────────────────────────────────

    def check(self, log: Records, head: int, limit: int = 20) -> tuple[list[str], int]:
        """Recompute the tree of the log's first ``head`` records and compare every stored tile
        with it (the records after the last stored tile are hashed from the log whenever they are
        read, so they are never stale): ``(the first differences, how many in all)``."""

        found: list[str] = []
        total = 0
        with (
            self.env.read() as txn
        ):  # one snapshot: a writer may append records and tiles meanwhile
            size, logged = self.size(txn), log.head(txn)
        if size > logged:  # tiles beyond the log's records: the tree of another, longer log
            total += 1
            found.append(f"the log tree holds {size} leaves, more than the log's {logged} records")
        size = min(
            size, head - head % TILE
        )  # tiles past the records this check covers were written since
        with self.env.read() as txn:
            builder = self._past_trim(txn, log)
        for chunk in _chunks(log, builder.size + 1, size):
            first = builder.size // TILE
            tiles = _tiles(builder, chunk)
            with self.env.read() as txn:
                for offset, tile in enumerate(tiles):
                    stored = txn.get(_key(first + offset), db=self.db)
                    if stored != tile:
                        total += 1
                        if len(found) < limit:
                            found.append(_difference(first + offset, stored))
        return found, total


def _tiles(builder: merkle.TreeBuilder, leaves: Sequence[bytes]) -> list[bytes]:
    """The tiles of ``leaves`` (whole tiles, appended to ``builder`` at a whole tile)."""

    return [builder.add_block(leaves[at : at + TILE]) for at in range(0, len(leaves), TILE)]


def _difference(tile: int, stored: bytes | None) -> str:
    records = f"records {tile * TILE + 1} to {(tile + 1) * TILE}"
    what = "missing" if stored is None else "differs from the hashes of the log's records"
    return f"the log tree's tile of {records} {what}"


def _chunks(log: Records, first: int, last: int) -> Iterator[list[bytes]]:
    """The leaf hashes of records ``first`` to ``last``, a chunk at a time (each chunk read in
    short transactions)."""

    seq = first
    while seq <= last:
        leaves: list[bytes] = []
        end = min(last, seq + CHUNK - 1)
        for at, data in _raw(log, seq, end):
            if at != seq + len(leaves):
                raise CorruptRecordError(
                    seq + len(leaves), "missing between the log's first record and its head"
                )
            leaves.append(record_leaf(at, data))
        if len(leaves) != end - seq + 1:
            raise CorruptRecordError(
                seq + len(leaves), "missing between the log's first record and its head"
            )
        yield leaves
        seq = end + 1


def _raw(log: Records, first: int, last: int) -> Iterator[tuple[int, bytes]]:
    seq = first
    while seq <= last:
        rows = log.raw_chunk(seq, last)
        if not rows:
            return
        yield from rows
        seq = rows[-1][0] + 1


__all__ = [
    "CHUNK",
    "LOG_DB",
    "MAX_BEHIND",
    "TILE",
    "TREE_DB",
    "WRITE_TILES",
    "ConsistencyProof",
    "InclusionProof",
    "Progress",
    "Records",
    "TreeStore",
]
