"""The Merkle tree of RFC 9162 section 2.1: roots against Certificate Transparency's published test
vectors and a brute-force reference written from the RFC's recursive definitions; every proof the
tree gives verifies, and any change to a proof, a hash, a size or an index fails."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable_lmdb import tlog
from pi_durable_lmdb.errors import ProofError

# RFC 6962 test leaves and the roots of their first 1..8 (certificate-transparency's merkle tests).
CT_LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    bytes(range(0x50, 0x58)),
    bytes(range(0x60, 0x70)),
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


# ── the reference: RFC 9162 2.1.1, 2.1.3.1, 2.1.4.1 word for word ───────────


def _k(n: int) -> int:
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(d: list[bytes]) -> bytes:
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return hashlib.sha256(b"\x00" + d[0]).digest()
    k = _k(len(d))
    return hashlib.sha256(b"\x01" + mth(d[:k]) + mth(d[k:])).digest()


def path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) <= 1:
        return []
    k = _k(len(d))
    if m < k:
        return path(m, d[:k]) + [mth(d[k:])]
    return path(m - k, d[k:]) + [mth(d[:k])]


def subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    if m == len(d):
        return [] if b else [mth(d)]
    k = _k(len(d))
    if m <= k:
        return subproof(m, d[:k], b) + [mth(d[k:])]
    return subproof(m - k, d[k:], False) + [mth(d[:k])]


class Stored:
    """A tree kept as the store keeps it: one row per leaf (its hash, then the subtrees it completes)."""

    def __init__(self, data: list[bytes]) -> None:
        self.rows: list[list[bytes]] = []
        for index, item in enumerate(data):
            self.rows.append(tlog.hashes_to_store(index, tlog.leaf_hash(item), self.read))

    def read(self, subtrees: object) -> list[bytes]:
        return [self.rows[((n + 1) << level) - 1][level] for level, n in subtrees]  # type: ignore[attr-defined]


DATA = [bytes([i % 256, i // 256]) * (i % 5) for i in range(70)]
STORED = Stored(DATA)


def test_roots_match_certificate_transparency_vectors() -> None:
    hashes = [tlog.leaf_hash(leaf) for leaf in CT_LEAVES]
    stored = Stored(CT_LEAVES)
    for n in range(1, 9):
        assert tlog.root_of(hashes[:n]).hex() == CT_ROOTS[n - 1]
        assert tlog.tree_hash(n, stored.read).hex() == CT_ROOTS[n - 1]
    assert tlog.root_of([]) == tlog.EMPTY_ROOT == hashlib.sha256(b"").digest()


def test_roots_and_proofs_equal_the_definition_for_every_size_up_to_70() -> None:
    builder = tlog.TreeBuilder()
    for n in range(len(DATA) + 1):
        root = mth(DATA[:n])
        assert tlog.tree_hash(n, STORED.read) == root
        assert tlog.TreeBuilder(n, STORED.read(tlog.frontier(n))).root() == root
        assert builder.root() == root
        for m in range(n):
            assert tlog.inclusion_proof(m, n, STORED.read) == path(m, DATA[:n])
        for m in range(1, n):
            assert tlog.consistency_proof(m, n, STORED.read) == subproof(m, DATA[:n], True)
        if n < len(DATA):
            assert builder.add(tlog.leaf_hash(DATA[n])) == b"".join(STORED.rows[n])


BLOCK_DATA = [i.to_bytes(2, "big") * (i % 3) for i in range(16 * 11)]
BLOCK_STORED = Stored(BLOCK_DATA)


def test_blocks_give_the_rows_of_their_leaves_and_the_definitions_root() -> None:
    """``add_block`` (16 leaves at a multiple of 16) gives the rows the stored-hash scheme gives
    leaf by leaf, carries into the subtrees above the block (sizes 16 to 176 cover one to three
    carries), and mixes with ``add``; a block out of place is refused."""

    leaves = [tlog.leaf_hash(item) for item in BLOCK_DATA]
    builder = tlog.TreeBuilder()
    for at in range(0, len(leaves), tlog.BLOCK):
        if at // tlog.BLOCK % 3 == 2:  # every third block a leaf at a time
            rows = b"".join(builder.add(leaf) for leaf in leaves[at : at + tlog.BLOCK])
        else:
            rows = builder.add_block(leaves[at : at + tlog.BLOCK])
        assert rows == b"".join(b"".join(row) for row in BLOCK_STORED.rows[at : at + tlog.BLOCK])
        assert builder.size == at + tlog.BLOCK
        assert builder.root() == mth(BLOCK_DATA[: at + tlog.BLOCK])
    resumed = tlog.TreeBuilder(48, BLOCK_STORED.read(tlog.frontier(48)))
    resumed.add_block(leaves[48:64])
    assert resumed.root() == mth(BLOCK_DATA[:64])
    builder.add(leaves[0])
    with pytest.raises(ValueError, match="multiple of 16"):
        builder.add_block(leaves[:16])
    with pytest.raises(ValueError, match="not 15"):
        tlog.TreeBuilder().add_block(leaves[:15])


def _altered(data: st.DataObject, proof: list[bytes]) -> list[bytes] | None:
    """``proof`` with one hash flipped, dropped or added (None: nothing to flip or drop)."""

    bad = list(proof)
    change = data.draw(st.sampled_from(["flip", "drop", "add"]))
    if change != "add" and not bad:
        return None
    if change == "flip":
        at, bit = data.draw(st.integers(0, len(bad) - 1)), data.draw(st.integers(0, 255))
        bad[at] = bytes(b ^ (1 << (bit % 8)) if i == bit // 8 else b for i, b in enumerate(bad[at]))
    elif change == "drop":
        del bad[data.draw(st.integers(0, len(bad) - 1))]
    else:
        bad.insert(data.draw(st.integers(0, len(bad))), hashlib.sha256(b"x").digest())
    return bad


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_inclusion_proof_verifies_and_any_alteration_fails(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, len(DATA)))
    m = data.draw(st.integers(0, n - 1))
    root = tlog.tree_hash(n, STORED.read)
    leaf = tlog.leaf_hash(DATA[m])
    proof = tlog.inclusion_proof(m, n, STORED.read)
    tlog.verify_inclusion(leaf, m, n, proof, root)
    assert tlog.root_from_inclusion(leaf, m, n, proof) == root
    change = data.draw(st.sampled_from(["proof", "index", "size", "leaf", "root"]))
    claim = (leaf, m, n, proof, root)
    if change == "proof":
        bad = _altered(data, proof)
        if bad is None:
            return
        claim = (leaf, m, n, bad, root)
    elif change == "index":
        index = data.draw(st.integers(0, n))
        if index == m or (
            index < n
            and tlog.inclusion_proof(index, n, STORED.read) == proof
            and DATA[index] == DATA[m]
        ):
            return
        claim = (leaf, index, n, proof, root)
    elif change == "size":  # a claim about the tree of another size, with that tree's root
        size = data.draw(st.integers(m + 1, len(DATA)))
        if tlog.inclusion_proof(m, size, STORED.read) == proof:
            return
        claim = (leaf, m, size, proof, tlog.tree_hash(size, STORED.read))
    elif change == "leaf":
        claim = (tlog.leaf_hash(DATA[m] + b"!"), m, n, proof, root)
    else:
        claim = (leaf, m, n, proof, hashlib.sha256(root).digest())
    with pytest.raises(ProofError):
        tlog.verify_inclusion(*claim)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_consistency_proof_verifies_and_any_alteration_fails(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, len(DATA)))
    m = data.draw(st.integers(0, n))
    old, new = tlog.tree_hash(m, STORED.read), tlog.tree_hash(n, STORED.read)
    proof = tlog.consistency_proof(m, n, STORED.read)
    tlog.verify_consistency(m, n, old, new, proof)
    change = data.draw(st.sampled_from(["proof", "old", "new", "old_size", "new_size"]))
    if change == "proof":
        bad = _altered(data, proof)
        if bad is None:
            return
        claim = (m, n, old, new, bad)
    elif change == "old":
        claim = (m, n, hashlib.sha256(old).digest(), new, proof)
    elif change == "new":
        if m == 0:
            return  # every tree extends the empty one: its proof binds no new root
        claim = (m, n, old, hashlib.sha256(new).digest(), proof)
    elif change == "old_size":  # a claim about another old size, with that tree's root
        m2 = data.draw(st.integers(0, n).filter(lambda s: s != m))
        if tlog.consistency_proof(m2, n, STORED.read) == proof and m2 != 0:
            return
        if m2 == 0 and not proof:
            return
        claim = (m2, n, tlog.tree_hash(m2, STORED.read), new, proof)
    else:
        n2 = data.draw(st.integers(m, len(DATA)).filter(lambda s: s != n))
        if m == 0 or tlog.consistency_proof(m, n2, STORED.read) == proof:
            return
        claim = (m, n2, old, tlog.tree_hash(n2, STORED.read), proof)
    with pytest.raises(ProofError):
        tlog.verify_consistency(*claim)


def test_a_forked_history_has_no_consistency_proof() -> None:
    forked = DATA[:30] + [b"rewritten"] + DATA[31:]
    other = Stored(forked)
    for m in (31, 32, 40):
        proof = tlog.consistency_proof(m, 70, other.read)
        with pytest.raises(ProofError):
            tlog.verify_consistency(
                m, 70, tlog.tree_hash(m, STORED.read), tlog.tree_hash(70, other.read), proof
            )
    # up to the rewritten record the two histories agree
    proof = tlog.consistency_proof(30, 70, other.read)
    tlog.verify_consistency(
        30, 70, tlog.tree_hash(30, STORED.read), tlog.tree_hash(70, other.read), proof
    )


@pytest.mark.parametrize(
    "args",
    [
        (b"short", 0, 1, [], tlog.EMPTY_ROOT),
        (tlog.EMPTY_ROOT, 1, 1, [], tlog.EMPTY_ROOT),
        (tlog.EMPTY_ROOT, -1, 1, [], tlog.EMPTY_ROOT),
        (tlog.EMPTY_ROOT, 0, 1, [b"x"], tlog.EMPTY_ROOT),
    ],
)
def test_malformed_inclusion_arguments_are_proof_errors(args: tuple[object, ...]) -> None:
    with pytest.raises(ProofError):
        tlog.verify_inclusion(*args)  # type: ignore[arg-type]


def test_proofs_refuse_ranges_outside_the_tree() -> None:
    with pytest.raises(ValueError):
        tlog.inclusion_proof(5, 5, STORED.read)
    with pytest.raises(ValueError):
        tlog.consistency_proof(6, 5, STORED.read)
    assert tlog.consistency_proof(0, 5, STORED.read) == []
    assert tlog.consistency_proof(5, 5, STORED.read) == []
    with pytest.raises(ProofError):
        tlog.verify_consistency(
            5, 5, tlog.tree_hash(5, STORED.read), tlog.tree_hash(5, STORED.read), [tlog.EMPTY_ROOT]
        )
    with pytest.raises(ProofError):
        tlog.verify_consistency(
            0, 5, tlog.tree_hash(4, STORED.read), tlog.tree_hash(5, STORED.read), []
        )
