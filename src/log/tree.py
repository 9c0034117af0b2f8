"""The log's Merkle tree, stored: a projection of the log kept in its own transactions.

The ``tlog`` database holds the tree's stored hashes (``tlog.merkle``: each leaf's hash and the
complete subtrees it completes, about two per record), keyed by their 8-byte big-endian index, so
every key is appended at the end. The tree's size is implied by how many hashes it holds; the
leaves are the records in sequence order (leaf index = sequence - 1).

A record appended while the tree is level with the log adds its hashes in the same transaction;
a store written by a version without the tree (or by one that skipped it) has a tree behind its
log, which a writer's open fills in (``catch_up``). ``rebuild`` drops it and refills it from the
log; ``check`` recomputes it from the log and compares every stored hash.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Final

import lmdb
import msgspec

from ..errors import CorruptRecordError, ProjectionsBehind, ProofError
from ..tlog import merkle
from .environment import Environment
from .records import record_leaf

if TYPE_CHECKING:
    from .writelog import WriteLog

TREE_DB: Final = "tlog"
CHUNK: Final = 4096
"""Records hashed per write transaction while filling the tree in."""
_KEY = struct.Struct(">Q")
_key: Final = _KEY.pack

Progress = Callable[[int, int], None]


class InclusionProof(msgspec.Struct, rename="camel", frozen=True):
    """That record ``seq`` is leaf ``leaf_index`` of the tree of ``tree_size`` leaves with root
    ``root_hash`` (RFC 9162 2.1.3; hashes in lowercase hex)."""

    seq: int
    leaf_index: int
    tree_size: int
    leaf_hash: str
    inclusion: list[str]
    root_hash: str


class ConsistencyProof(msgspec.Struct, rename="camel", frozen=True):
    """That the tree of ``old_size`` leaves is a prefix of the tree of ``new_size`` leaves
    (RFC 9162 2.1.4; hashes in lowercase hex)."""

    old_size: int
    new_size: int
    old_root: str
    new_root: str
    consistency: list[str]


class TreeStore:
    """The stored hashes of one environment's log tree."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self._db = env.db(TREE_DB) if not env.readonly or env.has_db(TREE_DB) else None

    @property
    def db(self) -> lmdb._Database | None:
        if self._db is None and self.env.has_db(TREE_DB):
            self._db = self.env.db(TREE_DB)
        return self._db

    # ── size and reads ──────────────────────────────────────────────────────

    def size(self, txn: lmdb.Transaction[bytes]) -> int:
        """How many leaves the stored tree holds, as ``txn`` sees it."""

        db = self.db
        if db is None:
            return 0
        cursor = txn.cursor(db=db)
        if not cursor.last():
            return 0
        return merkle.tree_size_of(_KEY.unpack(cursor.key())[0] + 1)

    def reader(self, txn: lmdb.Transaction[bytes]) -> merkle.HashReader:
        """Stored hashes by index, from ``txn``; a missing one is damage (``ProofError``)."""

        db = self.db

        def read(indexes: Sequence[int]) -> list[bytes]:
            out = []
            for index in indexes:
                value = None if db is None else txn.get(_key(index), db=db)
                if value is None or len(value) != merkle.HASH_SIZE:
                    raise ProofError(f"the log's tree lacks stored hash {index}; run durable-log rebuild")
                out.append(bytes(value))
            return out

        return read

    def level_size(self, txn: lmdb.Transaction[bytes], head: int, size: int | None) -> int:
        """``size`` (default: the log head) once the stored tree covers it, else ``ProjectionsBehind``."""

        wanted = head if size is None else size
        if isinstance(wanted, bool) or not isinstance(wanted, int) or not 0 <= wanted <= head:
            raise ValueError(f"A tree size must be an int from 0 to the log head {head}, not {wanted!r}")
        stored = self.size(txn)
        if stored < wanted:
            raise ProjectionsBehind(
                f"The log tree of {self.env.path} holds {stored} of {head} records; open the store "
                "for writing once (or run durable-log rebuild) to fill it in"
            )
        return wanted

    # ── writing ─────────────────────────────────────────────────────────────

    def append_leaf(self, txn: lmdb.Transaction[bytes], seq: int, leaf: bytes) -> None:
        """Add record ``seq``'s leaf in ``txn`` when the tree holds exactly the records before it;
        a tree behind the log is left for ``catch_up``."""

        db = self.db
        cursor = txn.cursor(db=db)
        count = _KEY.unpack(cursor.key())[0] + 1 if cursor.last() else 0
        if count != merkle.stored_hash_count(seq - 1):
            return
        index = seq - 1
        if not index & 1:  # an even leaf completes nothing: the common half needs no read
            cursor.put(_key(count), leaf, append=True)
            return
        for value in merkle.hashes_to_store(index, leaf, self.reader(txn)):
            cursor.put(_key(count), value, append=True)
            count += 1

    def _put_all(self, txn: lmdb.Transaction[bytes], first: int, hashes: list[bytes]) -> None:
        cursor = txn.cursor(db=self.db)
        for offset, value in enumerate(hashes):
            cursor.put(_key(first + offset), value, append=True)

    def catch_up(self, log: WriteLog, progress: Progress | None = None) -> int:
        """Add every record the tree lacks, a chunk per transaction; returns how many."""

        with self.env.read() as txn:
            size, head = self.size(txn), log.head(txn)
            if size >= head:
                return 0
            builder = merkle.TreeBuilder(size, self.reader(txn)(merkle.frontier_indexes(size)))
        done = 0
        for chunk in _chunks(log, size + 1, head):
            hashes: list[bytes] = []
            for leaf in chunk:
                hashes.extend(builder.add(leaf))
            first = merkle.stored_hash_count(builder.size - len(chunk))

            def put(txn: lmdb.Transaction[bytes], first: int = first, hashes: list[bytes] = hashes) -> None:
                self._put_all(txn, first, hashes)

            self.env.write(put)
            done += len(chunk)
            if progress is not None:
                progress(builder.size, head)
        return done

    def rebuild(self, log: WriteLog, progress: Progress | None = None) -> int:
        """Drop the stored tree and fill it in again from the whole log."""

        db = self.db
        if db is not None:
            self.env.write(lambda txn: txn.drop(db, delete=False))
        return self.catch_up(log, progress)

    # ── checking ────────────────────────────────────────────────────────────

    def check(self, log: WriteLog, head: int, limit: int = 20) -> tuple[list[str], int]:
        """Recompute the tree of the log's first ``head`` records and compare every stored hash:
        ``(the first differences, how many in all)``."""

        found: list[str] = []
        total = 0
        builder = merkle.TreeBuilder()
        index = 0
        for chunk in _chunks(log, 1, head):
            hashes: list[bytes] = []
            for leaf in chunk:
                hashes.extend(builder.add(leaf))
            with self.env.read() as txn:
                db = self.db
                for offset, value in enumerate(hashes):
                    stored = None if db is None else txn.get(_key(index + offset), db=db)
                    if stored != value:
                        total += 1
                        if len(found) < limit:
                            found.append(_difference(index + offset, stored, value))
            index += len(hashes)
        with self.env.read() as txn:
            extra = self.size(txn) - head if self.db is not None else 0
        if extra > 0:  # hashes beyond the records checked: a tree of another, longer log
            total += 1
            if len(found) < limit:
                found.append(f"the tree holds {extra} leaves beyond the {head} records checked")
        return found, total


def _difference(index: int, stored: bytes | None, expected: bytes) -> str:
    what = "missing" if stored is None else f"{bytes(stored).hex()[:16]}..., the log gives {expected.hex()[:16]}..."
    return f"stored hash {index} of the log tree: {what}"


def _chunks(log: WriteLog, first: int, last: int) -> Iterator[list[bytes]]:
    """The leaf hashes of records ``first`` to ``last``, a chunk at a time (each chunk read in
    short transactions)."""

    seq = first
    while seq <= last:
        leaves: list[bytes] = []
        end = min(last, seq + CHUNK - 1)
        for at, data in _raw(log, seq, end):
            if at != seq + len(leaves):
                raise CorruptRecordError(seq + len(leaves), "missing between the log's first record and its head")
            leaves.append(record_leaf(at, data))
        if len(leaves) != end - seq + 1:
            raise CorruptRecordError(seq + len(leaves), "missing between the log's first record and its head")
        yield leaves
        seq = end + 1


def _raw(log: WriteLog, first: int, last: int) -> Iterator[tuple[int, bytes]]:
    seq = first
    while seq <= last:
        rows = log.raw_chunk(seq, last)
        if not rows:
            return
        yield from rows
        seq = rows[-1][0] + 1
