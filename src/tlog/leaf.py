"""The leaf of one log record: what the tree commits to, independent of how the record is stored.

Leaf data (docs/audit.md gives it byte for byte)::

    0x01                      leaf format version
    seq                       8 bytes, unsigned, big-endian
    committed_at              8 bytes, signed (two's complement), big-endian: Unix milliseconds
    writes                    the batch's writes in the log's MessagePack encoding

The writes are the bytes a commit encodes (``log.codec``), before any compression: a record stored
raw, deflated or as a zstd frame, compacted, exported and imported, replicated or restored has the
same leaf.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

LEAF_FORMAT: Final = 1
"""The version of the leaf layout, hashed into every leaf after its ``0x00`` prefix."""
_HEADER: Final = struct.Struct(">BQq")
_LEAF_PREFIX: Final = hashlib.sha256(bytes((0, LEAF_FORMAT)))
"""The leaf hash's prefix (``0x00``) and the leaf format, hashed once: each leaf hash starts from
a copy (cheaper than a new hash object and a header that repeats them)."""
_seq_time: Final = struct.Struct(">Qq").pack


def leaf_header(seq: int, committed_at: int) -> bytes:
    """The leaf data's first 17 bytes: format, sequence, commit time."""

    return _HEADER.pack(LEAF_FORMAT, seq, committed_at)


def leaf_data(seq: int, committed_at: int, writes: bytes) -> bytes:
    """The whole leaf data of record ``seq`` (``writes``: its encoded writes, uncompressed)."""

    return leaf_header(seq, committed_at) + writes


def record_leaf_hash(seq: int, committed_at: int, writes: bytes | memoryview) -> bytes:
    """``SHA-256(0x00 || leaf data)``, without copying ``writes`` (a commit hashes each record's
    leaf: one copy, one pack, two updates)."""

    digest = _LEAF_PREFIX.copy()
    digest.update(_seq_time(seq, committed_at))
    digest.update(writes)
    return digest.digest()


__all__ = [
    "LEAF_FORMAT",
    "leaf_data",
    "leaf_header",
    "record_leaf_hash",
]
