"""The log as a transparency log: an RFC 9162 Merkle tree over its records, C2SP signed checkpoints.

Pure and store-independent (it imports nothing of the store; the log layer uses it): leaf and node
hashes, roots, inclusion and consistency proofs computed from stored hashes, and their checks
(``verify_inclusion``, ``verify_consistency``, ``verify_checkpoint``), which need no store at all.
docs/audit.md has the design and the leaf encoding.
"""

from .leaf import LEAF_FORMAT, leaf_data, leaf_header, record_leaf_hash
from .merkle import (
    BLOCK,
    EMPTY_ROOT,
    HASH_SIZE,
    HashReader,
    TreeBuilder,
    consistency_proof,
    frontier,
    hashes_to_store,
    inclusion_proof,
    leaf_hash,
    node_hash,
    root_from_inclusion,
    root_of,
    subtree_hash,
    tree_hash,
    verify_consistency,
    verify_inclusion,
)
from .note import (
    Checkpoint,
    Signer,
    Verifier,
    generate_signer,
    open_note,
    parse_checkpoint,
    parse_signer,
    parse_verifier,
    sign_checkpoint,
    sign_note,
    verify_checkpoint,
)

__all__ = [
    "BLOCK",
    "EMPTY_ROOT",
    "HASH_SIZE",
    "LEAF_FORMAT",
    "Checkpoint",
    "HashReader",
    "Signer",
    "TreeBuilder",
    "Verifier",
    "consistency_proof",
    "frontier",
    "generate_signer",
    "hashes_to_store",
    "inclusion_proof",
    "leaf_data",
    "leaf_hash",
    "leaf_header",
    "node_hash",
    "open_note",
    "parse_checkpoint",
    "parse_signer",
    "parse_verifier",
    "record_leaf_hash",
    "root_from_inclusion",
    "root_of",
    "sign_checkpoint",
    "sign_note",
    "subtree_hash",
    "tree_hash",
    "verify_checkpoint",
    "verify_consistency",
    "verify_inclusion",
]
