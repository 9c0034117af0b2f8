"""The versions of the formats the engine persists that its readers check: the log record layout
(``log.records``) and the projections' schema (``projections.tables``), which re-export them.

Kept apart from the code that reads and writes them, with nothing imported, so that
``durable-log --version`` names them without loading the engine.
"""

from __future__ import annotations

from typing import Final

FORMAT_VERSION: Final = 5
"""The newest version of the log record layout; every record carries its own:

1. ``[1, committed_at, checksum, payload]``: the encoded writes as they are.
2. ``[2, committed_at, checksum, deflated, size]``: the encoded writes deflated (``log.deflate``,
   its preset dictionary), ``size`` bytes once inflated.
3. ``[3, committed_at, checksum, frame, size]``: the encoded writes as one zstd frame with the same
   preset dictionary (``log.zstd``: half deflate's CPU on the commit path).
4. ``[4, committed_at, checksum, kept, 0, leaf, erasure, erased]``: a tombstone, what an erasure
   (``storage.erase``) leaves of a record: the writes it kept, as encoded, the leaf hash the
   record had (the Merkle tree keeps it), the erasure record's sequence and how many writes it
   removed; the checksum covers every field after it.
5. ``[5, committed_at, checksum, erasure]``: an erasure record, an ``Erasure`` (the conversations
   erased, the records made tombstones, the caller's reason); it holds no writes.

A writer stores a batch as format 1, which every version reads, when its payload is shorter
than ``log.records.RAW_BELOW`` or compressing would not save bytes; as format 2 when its frame
would be too dense for a reader to accept (``log.zstd.MAX_EXPANSION``: long runs of one value);
else as format 3; all five are read. Only an erasure writes formats 4
and 5, so a store nobody erased from stays readable by versions that know formats 1 to 3. The checksum covers the stored
bytes, so damage is caught before anything is decompressed."""

SCHEMA_VERSION: Final = 12
"""Bump when any table of ``projections.tables`` changes shape: the projections are then rebuilt
from the log. Version 6 keys document addresses and scopes by the reference's text of them;
version 7 spaces a document's snapshots by the bytes of its deltas as well (``SNAPSHOT_SHARE``);
version 8 keeps a long document's row as a head (``CurrentValue.held``, ``documents``), not its
value; version 9 names the chain of the snapshot a head placed (``CurrentValue.snapshot_chain``)
and keeps snapshots without history rows (a snapshot is a shortcut to a value the revisions
hold, put after its commit or never); version 10 keeps entry rows zstd-compressed
(``tables.pack_entry``: a third fewer bytes for a conversation's entries); version 11 keeps a
packed entry row as its zstd frame alone, which declares its own size (no marker byte and size
before it: a page of entries reads faster), and reads version 10's rows, so a log's base
trimmed under version 10 still folds (``READABLE_SCHEMAS``); version 12 leads a task row with the
sequence of the commit that wrote it, which its ``HISTORY`` value refers to when a commit
replaces it (no walk of ``HISTORY`` to find it), and a task's or a submission's status row holds the sequence that
created it, so a status change keeps one ``HISTORY`` row, not two."""

READABLE_SCHEMAS: Final = frozenset({10, 11, SCHEMA_VERSION})
"""The projections schemas whose rows this program reads: a log's base holding the rows of one of
them (``log.base``, what a trim kept) folds into this schema's tables (``projections.base``: a
task row of 10 or 11 is led by writer 0 as it is loaded, and a task's or a submission's status
row holds creation 0; every other row as it is)."""


__all__ = [
    "FORMAT_VERSION",
    "READABLE_SCHEMAS",
    "SCHEMA_VERSION",
]
