"""The Merkle tree of RFC 9162 section 2.1 (the same as RFC 6962's): hashes, proofs, and their checks.

Leaves are hashed ``SHA-256(0x00 || data)``, interior nodes ``SHA-256(0x01 || left || right)``; the
root of ``n`` leaves splits them at the largest power of two below ``n``. Proofs are computed from
*stored hashes*: for each leaf, its hash and the hashes of the complete subtrees it completes, in
the order they become known (``stored_hash_index``), about two per leaf. Any complete, aligned
subtree's hash is then one read, and a root or a proof O(log n) of them, without rehashing the log.

Everything here is pure: a ``HashReader`` (indexes -> hashes) is all it needs of a store, and the
checks need nothing at all. A check that fails raises ``ProofError`` naming what does not hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Final

from ..errors import ProofError

HASH_SIZE: Final = 32
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
"""The root of the empty tree: the hash of the empty string (RFC 9162 section 2.1.1)."""

HashReader = Callable[[Sequence[int]], Sequence[bytes]]
"""Stored hashes by their indexes (``stored_hash_index``), in the order asked."""

_LEAF: Final = b"\x00"
_NODE: Final = b"\x01"


def leaf_hash(data: bytes) -> bytes:
    """The hash of a leaf whose data is ``data``."""

    return hashlib.sha256(_LEAF + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an interior node with children ``left`` and ``right``."""

    return hashlib.sha256(_NODE + left + right).digest()


def split_point(n: int) -> int:
    """The largest power of two strictly below ``n`` (``n`` > 1)."""

    return 1 << ((n - 1).bit_length() - 1)


def root_of(leaf_hashes: Sequence[bytes]) -> bytes:
    """The root over ``leaf_hashes`` straight from the definition (no stored hashes)."""

    if not leaf_hashes:
        return EMPTY_ROOT
    # Complete subtrees, as a stack of (size, hash): merging equal sizes as leaves arrive leaves
    # the sizes of n's binary digits, largest first; folding them from the right is the root.
    stack: list[tuple[int, bytes]] = []
    for leaf in leaf_hashes:
        size, value = 1, leaf
        while stack and stack[-1][0] == size:
            left = stack.pop()[1]
            size, value = size * 2, node_hash(left, value)
        stack.append((size, value))
    value = stack[-1][1]
    for _, left in reversed(stack[:-1]):
        value = node_hash(left, value)
    return value


# ── stored hashes ─────────────────────────────────────────────────────────────


def stored_hash_index(level: int, n: int) -> int:
    """Where the hash of the ``n``-th complete subtree of height ``level`` (leaves ``n * 2**level``
    to ``(n + 1) * 2**level - 1``) is stored: right after the last leaf it covers and the subtrees
    below it that this leaf completes."""

    last_leaf = ((n + 1) << level) - 1
    return stored_hash_count(last_leaf) + level


def stored_hash_count(size: int) -> int:
    """How many hashes a tree of ``size`` leaves stores: ``2 * size - popcount(size)`` (each leaf
    and each complete subtree above the leaves)."""

    return 2 * size - size.bit_count()


def tree_size_of(count: int) -> int:
    """The tree size whose stored hashes number ``count``; ``ValueError`` if no size does."""

    size = max(0, (count + 1) // 2)
    while stored_hash_count(size) < count:
        size += 1
    if stored_hash_count(size) != count:
        raise ValueError(f"{count} stored hashes is no tree's count")
    return size


def hashes_to_store(index: int, leaf: bytes, read: HashReader) -> list[bytes]:
    """The hashes that appending leaf ``index`` (hash ``leaf``) adds after the tree's first
    ``index`` leaves: the leaf's, then one per complete subtree it completes, lowest first."""

    levels = 0
    while (index >> levels) & 1:
        levels += 1
    lefts = read([stored_hash_index(level, (index >> level) - 1) for level in range(levels)])
    out = [leaf]
    for left in lefts:
        out.append(node_hash(left, out[-1]))
    return out


class TreeBuilder:
    """Appends leaves in order and says which hashes each adds to the store, keeping only the
    tree's frontier (the complete subtrees of its size, one per binary digit) in memory: a
    rebuild, a backfill or a check of a long log needs no reads and O(log n) memory."""

    def __init__(self, size: int = 0, frontier: Sequence[bytes] = ()) -> None:
        """A builder for a tree of ``size`` leaves whose complete subtrees (left to right, as
        ``frontier_indexes(size)`` names them) hash to ``frontier``."""

        parts = _subtrees(0, size)
        if len(parts) != len(frontier):
            raise ValueError(f"a tree of {size} leaves has {len(parts)} complete subtrees, not {len(frontier)}")
        self.size = size
        self._stack: list[tuple[int, bytes]] = [(level, bytes(value)) for (level, _), value in zip(parts, frontier)]

    def add(self, leaf: bytes) -> list[bytes]:
        """Append a leaf; the hashes it adds, as ``hashes_to_store`` gives them."""

        out = [leaf]
        level, value = 0, leaf
        while self._stack and self._stack[-1][0] == level:
            value = node_hash(self._stack.pop()[1], value)
            level += 1
            out.append(value)
        self._stack.append((level, value))
        self.size += 1
        return out

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        value = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            value = node_hash(left, value)
        return value


def frontier_indexes(size: int) -> list[int]:
    """The stored indexes of the complete subtrees a tree of ``size`` leaves splits into."""

    return [stored_hash_index(level, n) for level, n in _subtrees(0, size)]


def _subtrees(lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` as complete aligned subtrees ``(level, n)``, left to right: the largest
    aligned at ``lo`` first."""

    out = []
    while lo < hi:
        level = ((hi - lo).bit_length() - 1) if lo == 0 else min((lo & -lo).bit_length() - 1, (hi - lo).bit_length() - 1)
        out.append((level, lo >> level))
        lo += 1 << level
    return out


def subtree_hash(lo: int, hi: int, read: HashReader) -> bytes:
    """The RFC 9162 hash of leaves ``[lo, hi)``, a range of the kind the definition splits a tree
    into (``lo`` a multiple of a power of two at least ``hi - lo``): its complete subtrees,
    folded from the right."""

    if hi <= lo:
        raise ValueError(f"an empty range of leaves [{lo}, {hi}) has no subtree hash")
    parts = _subtrees(lo, hi)
    hashes = read([stored_hash_index(level, n) for level, n in parts])
    value = hashes[-1]
    for left in reversed(hashes[:-1]):
        value = node_hash(left, value)
    return value


def tree_hash(size: int, read: HashReader) -> bytes:
    """The root of the tree's first ``size`` leaves."""

    return EMPTY_ROOT if size == 0 else subtree_hash(0, size, read)


def inclusion_proof(index: int, size: int, read: HashReader) -> list[bytes]:
    """The audit path of leaf ``index`` in the tree of ``size`` leaves (RFC 9162 2.1.3.1)."""

    if not 0 <= index < size:
        raise ValueError(f"leaf {index} is not in a tree of {size} leaves")
    proof: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:  # PATH(m, D[lo:hi]), iteratively: siblings collected root-down
        k = split_point(hi - lo)
        if index < lo + k:
            proof.append(subtree_hash(lo + k, hi, read))
            hi = lo + k
        else:
            proof.append(subtree_hash(lo, lo + k, read))
            lo = lo + k
    proof.reverse()
    return proof


def consistency_proof(old: int, new: int, read: HashReader) -> list[bytes]:
    """The proof that the tree of ``old`` leaves is a prefix of the tree of ``new`` leaves
    (RFC 9162 2.1.4.1); empty when ``old`` is 0 or equals ``new``."""

    if not 0 <= old <= new:
        raise ValueError(f"no consistency proof from size {old} to size {new}")
    if old == 0 or old == new:
        return []
    proof: list[bytes] = []
    m, lo, hi, whole = old, 0, new, True
    while True:  # SUBPROOF(m, D[lo:hi], whole), iteratively
        if m == hi - lo:
            if not whole:
                proof.append(subtree_hash(lo, hi, read))
            break
        k = split_point(hi - lo)
        if m <= k:
            proof.append(subtree_hash(lo + k, hi, read))
            hi = lo + k
        else:
            proof.append(subtree_hash(lo, lo + k, read))
            m, lo, whole = m - k, lo + k, False
    proof.reverse()
    return proof


# ── checking proofs (RFC 9162 2.1.3.2 and 2.1.4.2) ───────────────────────────


def _check_hash(value: bytes, what: str) -> None:
    if not isinstance(value, (bytes, bytearray)) or len(value) != HASH_SIZE:
        raise ProofError(f"{what} is not a {HASH_SIZE}-byte hash")


def root_from_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The root that ``proof`` leads to from leaf ``index`` of a tree of ``size`` leaves;
    ``ProofError`` when the proof cannot be one (wrong length)."""

    _check_hash(leaf, "the leaf hash")
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} is not below the tree size {size}")
    fn, sn, r = index, size - 1, bytes(leaf)
    for number, p in enumerate(proof):
        _check_hash(p, f"proof hash {number}")
        if sn == 0:
            raise ProofError(f"the inclusion proof is longer than a tree of {size} leaves needs")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError(f"the inclusion proof is shorter than a tree of {size} leaves needs")
    return r


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """Check that leaf hash ``leaf`` is leaf ``index`` of the tree of ``size`` leaves whose root
    is ``root``; ``ProofError`` says what does not hold."""

    _check_hash(root, "the root hash")
    if root_from_inclusion(leaf, index, size, proof) != root:
        raise ProofError(f"the inclusion proof of leaf {index} does not lead to the root of size {size}")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check that the tree of ``old_size`` leaves with root ``old_root`` is a prefix of the tree of
    ``new_size`` leaves with root ``new_root``; ``ProofError`` says what does not hold."""

    _check_hash(old_root, "the old root")
    _check_hash(new_root, "the new root")
    if not 0 <= old_size <= new_size:
        raise ProofError(f"a tree of {new_size} leaves cannot extend one of {old_size}")
    if old_size == 0 or old_size == new_size:
        if proof:
            raise ProofError("a consistency proof from an empty or equal tree must be empty")
        if old_size == 0 and old_root != EMPTY_ROOT:
            raise ProofError("the old root is not the empty tree's")
        if old_size == new_size and old_root != new_root:
            raise ProofError(f"two different roots for the same size {old_size}")
        return
    if not proof:
        raise ProofError("the consistency proof is empty")
    for number, p in enumerate(proof):
        _check_hash(p, f"proof hash {number}")
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # an exact power of two: the old root is a node of the new tree
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the consistency proof is longer than the sizes need")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the consistency proof is shorter than the sizes need")
    if fr != old_root:
        raise ProofError(f"the consistency proof does not lead to the old root (size {old_size})")
    if sr != new_root:
        raise ProofError(f"the consistency proof does not lead to the new root (size {new_size})")
