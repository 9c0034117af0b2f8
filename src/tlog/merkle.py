"""The Merkle tree of RFC 9162 section 2.1 (the same as RFC 6962's): hashes, proofs, and their checks.

Leaves are hashed ``SHA-256(0x00 || data)``, interior nodes ``SHA-256(0x01 || left || right)``; the
root of ``n`` leaves splits them at the largest power of two below ``n``. Proofs are computed from
*stored hashes*: for each leaf, its hash and the hashes of the complete subtrees it completes (the
subtrees whose last leaf it is), about two per leaf. Any complete, aligned subtree's hash is then
one read, and a root or a proof O(log n) of them, without rehashing the log.

Everything here is pure: a ``HashReader`` (indexes -> hashes) is all it needs of a store, and the
checks need nothing at all. A check that fails raises ``ProofError`` naming what does not hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Final

from ..errors import ProofError

HASH_SIZE: Final = 32
"""Bytes in a leaf, node or root hash (SHA-256)."""
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
"""The root of the empty tree: the hash of the empty string (RFC 9162 section 2.1.1)."""

HashReader = Callable[[Sequence[tuple[int, int]]], Sequence[bytes]]
"""The stored hashes of complete subtrees ``(level, n)`` (leaves ``n * 2**level`` to
``(n + 1) * 2**level - 1``), in the order asked."""

_LEAF: Final = b"\x00"
_NODE: Final = b"\x01"
_sha256: Final = hashlib.sha256
BLOCK: Final = 16
"""Leaves ``TreeBuilder.add_block`` appends at once."""
_BLOCK_LEVEL: Final = 4
"""The height of a block's subtree: ``BLOCK == 1 << _BLOCK_LEVEL``."""


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


def hashes_to_store(index: int, leaf: bytes, read: HashReader) -> list[bytes]:
    """The hashes that appending leaf ``index`` (hash ``leaf``) adds after the tree's first
    ``index`` leaves: the leaf's, then one per complete subtree it completes, lowest first
    (``read`` gives the left siblings)."""

    levels = 0
    while (index >> levels) & 1:
        levels += 1
    lefts = read([(level, (index >> level) - 1) for level in range(levels)])
    out = [leaf]
    for left in lefts:
        out.append(node_hash(left, out[-1]))
    return out


class TreeBuilder:
    """Appends leaves in order and gives each leaf's stored hashes, keeping only the tree's
    frontier (the complete subtrees of its size, one per binary digit) in memory: a rebuild, a
    backfill or a check of a long log needs no reads and O(log n) memory."""

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = ()) -> None:
        """A builder for a tree of ``size`` leaves whose complete subtrees (left to right, as
        ``frontier(size)`` names them) hash to ``hashes``."""

        parts = _subtrees(0, size)
        if len(parts) != len(hashes):
            raise ValueError(
                f"a tree of {size} leaves has {len(parts)} complete subtrees, not {len(hashes)}"
            )
        self.size = size
        self._levels: list[bytes] = [EMPTY_ROOT] * size.bit_length()
        """``_levels[l]``: the complete subtree of height ``l`` on the frontier (when bit ``l`` of
        the size is set)."""
        for (level, _), value in zip(parts, hashes):
            self._levels[level] = bytes(value)

    def add(self, leaf: bytes) -> bytes:
        """Append a leaf; its row: the leaf hash, then the hashes of the subtrees it completes,
        lowest first (``hashes_to_store`` joined)."""

        size, levels = self.size, self._levels
        row = value = leaf
        level = 0
        while (size >> level) & 1:
            value = _sha256(_NODE + levels[level] + value).digest()
            row += value
            level += 1
        if level == len(levels):
            levels.append(value)
        else:
            levels[level] = value
        self.size = size + 1
        return row

    def add_block(self, leaves: Sequence[bytes]) -> bytes:
        """Append ``BLOCK`` leaves at a size that is a multiple of ``BLOCK``; their rows joined, as
        ``add`` gives them. The block's 15 interior hashes are computed pair by pair without a
        loop (about a third less time per leaf than ``add``: a tree's whole tiles are built here)."""

        size, levels, sha, node = self.size, self._levels, _sha256, _NODE
        if size % BLOCK or len(leaves) != BLOCK:
            raise ValueError(
                f"a block is {BLOCK} leaves appended at a multiple of {BLOCK}, not {len(leaves)} at {size}"
            )
        l0, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15 = leaves
        a = sha(node + l0 + l1).digest()
        b = sha(node + l2 + l3).digest()
        ab = sha(node + a + b).digest()
        c = sha(node + l4 + l5).digest()
        d = sha(node + l6 + l7).digest()
        cd = sha(node + c + d).digest()
        a_d = sha(node + ab + cd).digest()
        e = sha(node + l8 + l9).digest()
        f = sha(node + l10 + l11).digest()
        ef = sha(node + e + f).digest()
        g = sha(node + l12 + l13).digest()
        h = sha(node + l14 + l15).digest()
        gh = sha(node + g + h).digest()
        e_h = sha(node + ef + gh).digest()
        value = sha(node + a_d + e_h).digest()
        rows = [
            l0,
            l1,
            a,
            l2,
            l3,
            b,
            ab,
            l4,
            l5,
            c,
            l6,
            l7,
            d,
            cd,
            a_d,
            l8,
            l9,
            e,
            l10,
            l11,
            f,
            ef,
            l12,
            l13,
            g,
            l14,
            l15,
            h,
            gh,
            e_h,
            value,
        ]
        level = _BLOCK_LEVEL
        while (size >> level) & 1:  # the subtrees above the block its last leaf completes
            value = sha(node + levels[level] + value).digest()
            rows.append(value)
            level += 1
        if level >= len(levels):
            levels.extend([EMPTY_ROOT] * (level + 1 - len(levels)))
        levels[level] = value
        self.size = size + BLOCK
        return b"".join(rows)

    def root(self) -> bytes:
        size = self.size
        if not size:
            return EMPTY_ROOT
        value: bytes | None = None
        for level in range(size.bit_length()):
            if (size >> level) & 1:
                value = (
                    self._levels[level] if value is None else node_hash(self._levels[level], value)
                )
        assert value is not None
        return value


def frontier(size: int) -> list[tuple[int, int]]:
    """The complete subtrees ``(level, n)`` a tree of ``size`` leaves splits into, left to right."""

    return _subtrees(0, size)


def _subtrees(lo: int, hi: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` as complete aligned subtrees ``(level, n)``, left to right: the largest
    aligned at ``lo`` first."""

    out: list[tuple[int, int]] = []
    while lo < hi:
        level = (
            ((hi - lo).bit_length() - 1)
            if lo == 0
            else min((lo & -lo).bit_length() - 1, (hi - lo).bit_length() - 1)
        )
        out.append((level, lo >> level))
        lo += 1 << level
    return out


def subtree_hash(lo: int, hi: int, read: HashReader) -> bytes:
    """The RFC 9162 hash of leaves ``[lo, hi)``, a range of the kind the definition splits a tree
    into (``lo`` a multiple of a power of two at least ``hi - lo``): its complete subtrees,
    folded from the right."""

    if hi <= lo:
        raise ValueError(f"an empty range of leaves [{lo}, {hi}) has no subtree hash")
    hashes = read(_subtrees(lo, hi))
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


def verify_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes
) -> None:
    """Check that leaf hash ``leaf`` is leaf ``index`` of the tree of ``size`` leaves whose root
    is ``root``; ``ProofError`` says what does not hold."""

    _check_hash(root, "the root hash")
    if root_from_inclusion(leaf, index, size, proof) != root:
        raise ProofError(
            f"the inclusion proof of leaf {index} does not lead to the root of size {size}"
        )


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
    if (
        old_size & (old_size - 1) == 0
    ):  # an exact power of two: the old root is a node of the new tree
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


__all__ = [
    "BLOCK",
    "EMPTY_ROOT",
    "HASH_SIZE",
    "HashReader",
    "TreeBuilder",
    "consistency_proof",
    "frontier",
    "hashes_to_store",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "root_from_inclusion",
    "root_of",
    "split_point",
    "subtree_hash",
    "tree_hash",
    "verify_consistency",
    "verify_inclusion",
]
