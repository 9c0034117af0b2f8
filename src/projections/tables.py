"""The named databases the projector folds the log into, their keys and their row shapes.

Integer parts of keys are 8-byte big-endian, so LMDB's byte order is numeric order and a prefix
cursor walks one conversation's entries (or one status's tasks) in id order. Composite keys are
``prefix + id``; string parts are encoded with the log's lossless codec, which is prefix-free.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from typing import Any, Final

import lmdb
import msgspec
import xxhash

from ..errors import CorruptProjectionError
from ..formats import READABLE_SCHEMAS as READABLE_SCHEMAS
from ..formats import SCHEMA_VERSION as SCHEMA_VERSION
from ..log import codec, zstd
from ..log.deflate import deflate, inflate


def db_name(generation: int, table: str) -> str:
    """Each rebuild writes a new generation of tables beside the active one, then swaps."""

    return f"p{generation}.{table}"


RECORD_IDS: Final = "record_ids"
CONVERSATIONS: Final = "conversations"
CONVERSATIONS_BY_OWNER_CONVERSATION: Final = "conversations.by_owner_conversation"
CONVERSATIONS_BY_OWNER_TASK: Final = "conversations.by_owner_task"
CONVERSATION_PARENTS: Final = "conversations.parents"
"""Conversation id -> ``u64_pair(parent id, fork point)``, empty for a root: every entry page walks
the fork ancestry, and these 16 bytes are read without decoding whole conversation records."""
ENTRIES_BY_CONVERSATION: Final = "entries.by_conversation"
"""Entry rows keyed by conversation and id, so a page of a conversation is one cursor walk; an
entry's conversation is found in its ``RECORD_IDS`` value."""
HEADS_BY_CONVERSATION: Final = "entries.heads_by_conversation"
TASKS: Final = "tasks"
TASKS_BY_STATUS: Final = "tasks.by_status"
SUBMISSIONS: Final = "submissions"
SUBMISSIONS_BY_STATUS: Final = "submissions.by_status"
SUBMISSIONS_BY_REQUEST: Final = "submissions.by_request"
DOCUMENTS: Final = "documents"
DOCUMENT_INCARNATIONS: Final = "documents.incarnations"
DOCUMENT_CURRENT: Final = "documents.current"
DOCUMENTS_BY_SCOPE: Final = "documents.by_scope"
DOCUMENT_REVISIONS: Final = "documents.revisions"
DOCUMENT_VALUES: Final = "documents.values"
DOCUMENT_SNAPSHOTS: Final = "documents.snapshots"
STATE: Final = "state"
HISTORY: Final = "history"

TABLES: Final = (
    RECORD_IDS,
    CONVERSATIONS,
    CONVERSATIONS_BY_OWNER_CONVERSATION,
    CONVERSATIONS_BY_OWNER_TASK,
    CONVERSATION_PARENTS,
    ENTRIES_BY_CONVERSATION,
    HEADS_BY_CONVERSATION,
    TASKS,
    TASKS_BY_STATUS,
    SUBMISSIONS,
    SUBMISSIONS_BY_STATUS,
    SUBMISSIONS_BY_REQUEST,
    DOCUMENTS,
    DOCUMENT_INCARNATIONS,
    DOCUMENT_CURRENT,
    DOCUMENTS_BY_SCOPE,
    DOCUMENT_REVISIONS,
    DOCUMENT_VALUES,
    DOCUMENT_SNAPSHOTS,
    STATE,
    HISTORY,
)


UNVERSIONED: Final = frozenset({RECORD_IDS, DOCUMENT_VALUES, DOCUMENT_SNAPSHOTS, STATE, HISTORY})
"""Tables without history: no read uses the id registry, and views replay document values from
their revisions instead (a snapshot, keyed by its sequence, is read only at or before it: one
deleted later is a shortcut a view replays without)."""
BORN_WITH_ID: Final = frozenset(
    {CONVERSATIONS, CONVERSATION_PARENTS, TASKS, SUBMISSIONS, DOCUMENTS}
)
"""Keyed by a record id: a key exists from the commit that first wrote that id."""
BORN_WITH_TRAILING_ID: Final = frozenset(
    {
        CONVERSATIONS_BY_OWNER_CONVERSATION,
        CONVERSATIONS_BY_OWNER_TASK,
        ENTRIES_BY_CONVERSATION,
        HEADS_BY_CONVERSATION,
        DOCUMENT_INCARNATIONS,
        DOCUMENTS_BY_SCOPE,
    }
)
"""Keys ending in a record id, written once, when that record is."""
BORN_WITH_TRAILING_SEQ: Final = frozenset({DOCUMENT_REVISIONS, DOCUMENT_SNAPSHOTS})
"""Keys ending in the sequence that wrote them."""
BORN_KNOWN: Final = BORN_WITH_ID | BORN_WITH_TRAILING_ID | BORN_WITH_TRAILING_SEQ
"""Tables whose keys' first commit is known from the key, so ``HISTORY`` need not mark their
creation: it keeps only what later commits overwrote or deleted."""
BORN_IN_VALUE: Final = frozenset({TASKS_BY_STATUS, SUBMISSIONS_BY_STATUS})
"""Tables whose row is the 8-byte sequence of the commit that created the key (an index row
holding nothing else), so ``HISTORY`` need not mark a creation either: a view as of ``S`` sees a
row (live, or the one a later change kept) only if it was created at or before ``S``. A task's
or a submission's status change then keeps one ``HISTORY`` row, the old status's, not two
(schema 12 on)."""
APPENDED: Final = (
    BORN_WITH_TRAILING_ID | BORN_WITH_TRAILING_SEQ | {CONVERSATIONS, CONVERSATION_PARENTS}
)
"""Tables whose new keys mostly sort after every key they hold (ids and sequences grow): a put
tries LMDB's append first, which fills pages instead of splitting them in half, and
falls back to an ordinary put when the key is not the last."""
TABLE_CODES: Final = {
    name: bytes([code]) for code, name in enumerate(TABLES) if name not in UNVERSIONED
}
"""The one-byte prefix of a table's rows in ``HISTORY``."""
CODE_TABLES: Final = {code: name for name, code in TABLE_CODES.items()}
ABSENT: Final = b"\x00"
PRESENT: Final = b"\x01"
DEFLATED: Final = b"\x02"
LOGGED: Final = b"\x03"
"""A ``HISTORY`` value is one of these (a store may hold any mix of them; all are read):

- ``ABSENT``: the key held nothing;
- ``PRESENT`` + the sealed previous value;
- ``DEFLATED`` + 4-byte size + the sealed previous value deflated;
- ``LOGGED`` + 8-byte sequence ``W`` + the previous value's 8-byte checksum: the row is the one
  commit ``W`` left, re-encoded from the log (its last write of the record) behind ``W``, and
  checked against the checksum. Only for ``LOGGED_TABLES``, whose rows are a write's value
  encoded as it is behind the sequence that wrote it: a task rewritten every turn then costs the
  history 17 bytes, not a copy of the task (a trim keeps no record before its point, so a row
  written before it, led by 0, is kept whole)."""
LOGGED_TABLES: Final = frozenset({TASKS})
"""Tables whose rows are ``u64(W)`` + the encoded value commit ``W`` wrote (``written_row``), ``W``
0 for a row loaded from the log's base: the commit a replaced row's ``HISTORY`` value refers to
is read from the row itself, not found by a walk of ``HISTORY`` (schema 12 on)."""
WRITER_SIZE: Final = 8
"""The bytes of the writer's sequence that leads a ``LOGGED_TABLES`` row."""
_LOGGED = struct.Struct(">QQ")

LogRows = Callable[[str, bytes, int], "bytes | None"]
"""``(table, key, seq)``: the encoded row of ``key`` that commit ``seq`` left in ``table``,
re-encoded from the log (``None``: the log has no such write)."""
PACKED: Final = b"\xc1"
"""Leads a packed row (``pack_row``: deflated; ``pack_entry``: zstd): msgpack never uses this
byte, so an encoded row never starts with it."""
_SIZE = struct.Struct(">I")


def pack_row(encoded: bytes) -> bytes:
    """A rarely read row (a document snapshot) deflated when that saves bytes: ``PACKED`` +
    4-byte size + deflated bytes; else ``encoded`` itself."""

    deflated = deflate(encoded) if len(encoded) < 1 << 32 else None
    return encoded if deflated is None else PACKED + _SIZE.pack(len(encoded)) + deflated


def unpack_row(value: bytes, table: str, key: bytes) -> bytes:
    """The encoded row ``pack_row`` kept (a row not led by ``PACKED`` is stored as it is)."""

    if value[:1] != PACKED:
        return value
    try:
        return inflate(value[1 + _SIZE.size :], _SIZE.unpack_from(value, 1)[0])
    except (ValueError, struct.error):
        raise CorruptProjectionError(table, key) from None


def pack_entry(encoded: bytes) -> bytes:
    """An entry row zstd-compressed (the log's preset dictionary, at ``zstd.FAST_LEVEL``: every
    page of entries a host reads decompresses each row, and that level's frames decompress
    several times faster) when that saves bytes: the zstd frame alone, which declares its own
    size and starts with ``zstd.MAGIC`` (an encoded ``EntryRow``, a msgpack array, never does);
    else ``encoded`` itself. Entry rows are most of a conversation store's bytes (a ~0.8 KB
    model message: 4 rows a 4 KiB page; packed, ~0.6 KB: 6)."""

    frame = zstd.compress(encoded, fast=True) if len(encoded) < 1 << 32 else None
    if frame is None or zstd.dense(frame, len(encoded)):
        return encoded
    return frame


FRAMED: Final = zstd.MAGIC[:1]
"""The first byte of a packed entry row (schema 11 on): its frame's."""


def unpack_entry(value: bytes, table: str, key: bytes) -> bytes:
    """The encoded entry row ``pack_entry`` kept: a row led by ``FRAMED`` is one zstd frame; one
    led by ``PACKED`` is schema 10's form (``PACKED`` + 4-byte size + the frame), which a log's
    base trimmed under that schema still holds; any other is stored as it is. A frame that does
    not hold what it declares raises ``CorruptProjectionError``."""

    first = value[:1]
    if first != FRAMED and first != PACKED:
        return value
    try:
        if first == FRAMED:
            return zstd.unframe(value)
        return zstd.decompress(value[1 + _SIZE.size :], _SIZE.unpack_from(value, 1)[0], False)
    except (ValueError, struct.error):
        raise CorruptProjectionError(table, key) from None


CHUNK: Final = 2 * 4096 - 16 - 8
"""A document's current value longer than this is kept in chunks of this size: LMDB rewrites a
long value's overflow pages whole on every change, and keeps about five copies of them free in
the file; a delta appending to a long text changes only the head and last chunks. Two overflow
pages each, exactly (a page header and the seal's checksum included): a document that grows
every turn rewrites two pages per change, not a run of up to seventeen; in ``power`` mode every
page a commit writes is a new page until the next checkpoint (and goes to the device then), and
a long run needs free pages that are contiguous, which a file whose free pages are many short
runs does not have, so it grows instead. A read of a long value gets more rows in exchange."""
CHUNKED: Final = b"\xc1"
"""Leads a chunked ``DOCUMENT_VALUES`` row: 4-byte chunk count + 8-byte total size + the XXH3-64
of the whole value; chunk ``i`` is at the value's key + 4-byte ``i``. (A value's own row never
starts with it: msgpack never does.) Since schema 8 a long document's row is a head without its
value (``documents``), so only a short value that its revisions undercount is chunked."""
_U32 = struct.Struct(">I")
_HEAD = struct.Struct(">IQQ")


def put_value(
    txn: lmdb.Transaction[bytes],
    db: lmdb._Database,
    id: int,
    encoded: bytes,
    stored: bytes | None = None,
) -> None:
    """Store document ``id``'s current value (encoded): one sealed row, or chunked when long,
    writing only the chunks that changed. ``stored``: the encoded value the table holds now, if
    the caller read it in this transaction (``get_value``); the chunks are then compared in
    memory, not read back one by one, which made a commit to a long document cost a read of
    every chunk."""

    key = u64(id)
    # A value read whole was one row: only a value longer than a chunk is ever chunked.
    old_chunks = 0 if stored is not None and len(stored) <= CHUNK else _chunk_count(txn, db, key)
    if old_chunks == 0 and len(encoded) <= CHUNK:
        txn.put(key, seal(encoded), db=db)
        return
    chunks = range(0, len(encoded), CHUNK) if len(encoded) > CHUNK else range(0)
    for index, at in enumerate(chunks):
        chunk = encoded[at : at + CHUNK]
        if index < old_chunks:
            if stored is not None:
                if stored[at : at + CHUNK] == chunk:
                    continue
            elif txn.get(key + _U32.pack(index), db=db) == seal(chunk):
                continue
        txn.put(key + _U32.pack(index), seal(chunk), db=db)
    for index in range(len(chunks), old_chunks):
        txn.delete(key + _U32.pack(index), db=db)
    if chunks:
        digest = checksum(encoded)
        head = CHUNKED + _HEAD.pack(len(chunks), len(encoded), digest)
    else:
        head = encoded
    txn.put(key, seal(head), db=db)


def delete_value(txn: lmdb.Transaction[bytes], db: lmdb._Database, id: int) -> None:
    key = u64(id)
    for index in range(_chunk_count(txn, db, key)):
        txn.delete(key + _U32.pack(index), db=db)
    txn.delete(key, db=db)


def get_value(
    txn: lmdb.Transaction[bytes],
    db: lmdb._Database,
    id: int,
    unseal_with: Callable[[bytes, str, bytes], bytes],
) -> bytes | None:
    """Document ``id``'s encoded current value row, its chunks joined and each checked."""

    key = u64(id)
    raw = txn.get(key, db=db)
    if raw is None:
        return None
    head = unseal_with(raw, DOCUMENT_VALUES, key)
    if head[:1] != CHUNKED:
        return head
    if len(head) != 1 + _HEAD.size:
        raise CorruptProjectionError(DOCUMENT_VALUES, key)
    count, total, _ = _HEAD.unpack_from(head, 1)
    parts = []
    for index in range(count):
        chunk_key = key + _U32.pack(index)
        chunk = txn.get(chunk_key, db=db)
        if chunk is None:
            raise CorruptProjectionError(DOCUMENT_VALUES, chunk_key)
        parts.append(unseal_with(chunk, DOCUMENT_VALUES, chunk_key))
    value = b"".join(parts)
    if len(value) != total:
        raise CorruptProjectionError(DOCUMENT_VALUES, key)
    return value


def _chunk_count(txn: lmdb.Transaction[bytes], db: lmdb._Database, key: bytes) -> int:
    raw = txn.get(key, db=db)
    if (
        raw is None
        or raw[SUM_SIZE : SUM_SIZE + 1] != CHUNKED
        or len(raw) != SUM_SIZE + 1 + _HEAD.size
    ):
        return 0
    count: int = _HEAD.unpack_from(raw, SUM_SIZE + 1)[0]
    return count


def history_value(previous: bytes | None) -> bytes:
    """What ``HISTORY`` keeps of a key's sealed previous value (``None``: it had none)."""

    if previous is None:
        return ABSENT
    deflated = deflate(previous) if len(previous) < 1 << 32 else None
    if deflated is None:
        return PRESENT + previous
    return DEFLATED + _SIZE.pack(len(previous)) + deflated


def leading_seq(value: bytes, table: str, key: bytes) -> int:
    """The sequence that leads an unsealed ``LOGGED_TABLES`` or ``BORN_IN_VALUE`` row; a row too
    short to hold one (damage its checksum did not catch) raises ``CorruptProjectionError``."""

    if len(value) < WRITER_SIZE:
        raise CorruptProjectionError(table, key)
    return read_u64(value)


def record_type_name(value: bytes, key: bytes) -> str:
    """The record type an unsealed ``RECORD_IDS`` row names; an unknown type byte raises
    ``CorruptProjectionError``."""

    name = RECORD_TYPE_NAMES.get(value[:1])
    if name is None:
        raise CorruptProjectionError(RECORD_IDS, key)
    return name


def written_row(seq: int, encoded: bytes) -> bytes:
    """A ``LOGGED_TABLES`` row: the value ``encoded`` behind the sequence ``seq`` that wrote it."""

    return _U64.pack(seq) + encoded


def row_body(table: str, value: bytes) -> bytes:
    """The encoded value of an unsealed row of ``table``: past the writer's sequence that leads a
    ``LOGGED_TABLES`` row, else the row itself."""

    return value[WRITER_SIZE:] if table in LOGGED_TABLES else value


def history_logged(seq: int, previous: bytes) -> bytes:
    """The ``LOGGED`` history value of ``previous`` (sealed), which commit ``seq`` wrote."""

    return LOGGED + _LOGGED.pack(seq, checksum_of(previous)[0])


def history_before(value: bytes, key: bytes, log_rows: LogRows) -> bytes | None:
    """The sealed value a ``HISTORY`` value (at history key ``key``) keeps (``None``: the key
    held nothing); ``log_rows`` re-encodes a ``LOGGED`` one from the log."""

    kind = value[:1]
    if kind == ABSENT and len(value) == 1:
        return None
    if kind == PRESENT:
        return value[1:]
    if kind == DEFLATED:
        try:
            return inflate(value[1 + _SIZE.size :], _SIZE.unpack_from(value, 1)[0])
        except (ValueError, struct.error):
            pass
    if kind == LOGGED and len(value) == 1 + _LOGGED.size:
        table = CODE_TABLES.get(key[:1])
        if table in LOGGED_TABLES:
            seq, sum = _LOGGED.unpack_from(value, 1)
            encoded = log_rows(table, key[1:-8], seq)
            if encoded is not None:
                return _SUM.pack(sum) + _U64.pack(seq) + encoded  # unsealing it checks it
    raise CorruptProjectionError(HISTORY, key)


def comparable(table: str, key: bytes, raw: bytes, log_rows: LogRows) -> bytes:
    """A stored value in the one form each layout version shares (``verify`` compares a store's
    rows with a fresh fold's, which may pack a row the store keeps unpacked)."""

    if table == HISTORY:
        before = history_before(raw, key, log_rows)
        return ABSENT if before is None else PRESENT + unseal(before, table, key)
    if table == DOCUMENT_SNAPSHOTS:
        return unpack_row(unseal(raw, table, key), table, key)
    if table == ENTRIES_BY_CONVERSATION:
        return unpack_entry(unseal(raw, table, key), table, key)
    return raw


RECORD_TYPES: Final = {
    "conversation": b"c",
    "entry": b"e",
    "task": b"t",
    "submission": b"s",
    "document": b"d",
}
RECORD_TYPE_NAMES: Final = {code: name for name, code in RECORD_TYPES.items()}
"""``RECORD_IDS`` values are a type code and the 8-byte sequence that first wrote the id; an
entry's then holds its 8-byte conversation id (entries are never rewritten)."""

TASK_STATUSES: Final = ("pending", "running", "waiting", "sleeping", "completing", "terminal")
SUBMISSION_STATUSES: Final = ("queued", "placed", "done", "unanswered")
TASK_STATUS_KEYS: Final = {status: bytes([index]) for index, status in enumerate(TASK_STATUSES)}
SUBMISSION_STATUS_KEYS: Final = {
    status: bytes([index]) for index, status in enumerate(SUBMISSION_STATUSES)
}

MAX_ID: Final = 2**64 - 1
_U64 = struct.Struct(">Q")
_U64_PAIR = struct.Struct(">QQ")
_MAX_KEY_PART: Final = 400
"""LMDB keys are at most 511 bytes; longer string parts are replaced by a digest."""


u64: Final[Callable[[int], bytes]] = _U64.pack
"""An id or sequence as a key part (the bound ``pack`` itself: a commit makes ~7 of these calls,
and a Python wrapper around each is a frame for nothing)."""
u64_pair: Final[Callable[[int, int], bytes]] = _U64_PAIR.pack


def read_u64(data: bytes, offset: int = 0) -> int:
    return _U64.unpack_from(data, offset)[0]  # type: ignore[no-any-return]


def text_key(value: Any) -> bytes:
    """A prefix-free key part for any JSON value, hashed when too long for LMDB."""

    encoded = codec.encode(value)
    if len(encoded) <= _MAX_KEY_PART:
        return encoded
    return b"\xff" + hashlib.blake2b(encoded, digest_size=32).digest()


_SUM = struct.Struct(">Q")
SUM_SIZE: Final = _SUM.size
checksum: Final = xxhash.xxh3_64_intdigest
"""XXH3-64 of a value's bytes: every read checks one, so it is a fast non-cryptographic hash
(cheaper than zlib's CRC-32 on rows of a kilobyte, with twice the bits); it detects damage, not
tampering (the log's Merkle tree does that)."""
checksum_of: Final = _SUM.unpack_from
"""``checksum_of(raw)[0]``: the checksum a sealed value was stored with."""
seal_of: Final = xxhash.xxh3_64_digest
"""``seal_of(value)``: the bytes ``seal`` puts before ``value`` (xxh3's digest is big-endian, as
the seal packs it): a scan loop compares them with ``raw[:SUM_SIZE]``, one call and no unpacking,
and a row shorter than the seal simply differs."""


def seal(value: bytes) -> bytes:
    """Every projected value is stored behind the checksum of its bytes."""

    return _SUM.pack(checksum(value)) + value


def unseal(raw: bytes, table: str, key: bytes) -> bytes:
    """The value a sealed one holds; damage raises ``CorruptProjectionError`` naming the key."""

    value = raw[SUM_SIZE:]
    if len(raw) < SUM_SIZE or checksum(value) != checksum_of(raw)[0]:
        raise CorruptProjectionError(table, key)
    return value


def decode_row(decoder: msgspec.msgpack.Decoder[Any], value: bytes, table: str, key: bytes) -> Any:
    """A projected value decoded; bytes that do not decode (a forged value whose checksum holds)
    raise ``CorruptProjectionError`` naming the key, like any other damage."""

    try:
        return codec.decode_with(decoder, value)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
        raise CorruptProjectionError(table, key) from None


def decode_entry(value: bytes, key: bytes) -> EntryRow:
    """An ``ENTRIES_BY_CONVERSATION`` value (unsealed, packed or not) decoded; damage raises
    ``CorruptProjectionError`` naming the key."""

    return decode_row(  # type: ignore[no-any-return]
        entry_decoder,
        unpack_entry(value, ENTRIES_BY_CONVERSATION, key),
        ENTRIES_BY_CONVERSATION,
        key,
    )


def history_key(table: str, key: bytes, seq: int) -> bytes:
    """Where the value ``key`` held *before* commit ``seq`` changed it is kept."""

    return TABLE_CODES[table] + key + _U64.pack(seq)


class EntryRow(msgspec.Struct, array_like=True):
    commit_seq: int
    record: Any


class Revision(msgspec.Struct, array_like=True):
    """One stored document content command: a base value or a batch of delta ops."""

    kind: str
    version: int
    body: Any


class CurrentValue(msgspec.Struct, array_like=True):
    """The materialized current value of a live document, so ``current`` reads decode once.

    ``broken`` marks a delta that failed to apply: reads then replay the revisions, raising as the
    reference does, until the next base.
    """

    version: int
    deltas_since_base: int
    value: Any
    broken: bool = False
    tail: int = 0
    """Deltas since the last snapshot (or the base)."""
    tail_bytes: int = 0
    """Their stored bytes."""
    size: int = 0
    """The value's bytes at the last snapshot or base, as the revisions count them (the base's
    stored bytes, plus each snapshot's ``tail_bytes``): what ``documents.SNAPSHOT_SHARE`` compares with,
    known without encoding the value at every delta."""
    seq: int = 0
    """The sequence of the last revision."""
    chain: str = ""
    """The revisions since the base, linked (``documents.link``): names the value."""
    held: bool = False
    """A head: ``value`` is not stored (None); it is the newest snapshot or base at or before
    ``seq`` with the deltas after it (``documents``), once ``size + tail_bytes`` passes
    ``CHUNK``."""
    snapshot: int = 0
    """The sequence of the newest snapshot the policy placed (0: none since the base): a live
    commit leaves writing it to ``documents.Documents.land``, after the commit."""
    snapshot_chain: str = ""
    """The chain at that snapshot's revision: ``land`` puts a packed snapshot only under it."""


class CoreHeader(msgspec.Struct):
    """Which generation of the core tables serves reads, and a rebuild in progress, if any."""

    generation: int
    schema_version: int
    building: int | None = None


class ProjectionState(msgspec.Struct):
    """Beside the tables: which schema they are in and the last log sequence folded into them.

    ``lockstep``: every commit folds in the log's own transaction, so the tables are level with
    the log head without writing a checkpoint per commit (``folded_seq`` is then 0, unused).
    Catch-ups and rebuilds, which fold in chunks, write ``folded_seq`` until they are level.
    """

    schema_version: int
    folded_seq: int
    lockstep: bool = False


STATE_KEY: Final = b"core"
TRIMMED_KEY: Final = b"trimmed"
"""In ``STATE``: the point of the log's base the tables were folded from (``projections.base``);
absent when they were folded from sequence 1."""


_encoder: Final = msgspec.msgpack.Encoder()
any_decoder: Final = codec.decoder()
entry_decoder: Final = codec.decoder(EntryRow)
revision_decoder: Final = codec.decoder(Revision)
current_decoder: Final = codec.decoder(CurrentValue)
state_decoder: Final = msgspec.msgpack.Decoder(ProjectionState)
header_decoder: Final = msgspec.msgpack.Decoder(CoreHeader)


def encode_row(row: msgspec.Struct) -> bytes:
    return codec.encode(row)


def encode_state(state: ProjectionState | CoreHeader) -> bytes:
    return _encoder.encode(state)


__all__ = [
    "ABSENT",
    "APPENDED",
    "BORN_IN_VALUE",
    "BORN_KNOWN",
    "BORN_WITH_ID",
    "BORN_WITH_TRAILING_ID",
    "BORN_WITH_TRAILING_SEQ",
    "CHUNK",
    "CHUNKED",
    "CODE_TABLES",
    "CONVERSATIONS",
    "CONVERSATIONS_BY_OWNER_CONVERSATION",
    "CONVERSATIONS_BY_OWNER_TASK",
    "CONVERSATION_PARENTS",
    "DEFLATED",
    "DOCUMENTS",
    "DOCUMENTS_BY_SCOPE",
    "DOCUMENT_CURRENT",
    "DOCUMENT_INCARNATIONS",
    "DOCUMENT_REVISIONS",
    "DOCUMENT_SNAPSHOTS",
    "DOCUMENT_VALUES",
    "ENTRIES_BY_CONVERSATION",
    "FRAMED",
    "HEADS_BY_CONVERSATION",
    "HISTORY",
    "LOGGED",
    "LOGGED_TABLES",
    "MAX_ID",
    "PACKED",
    "PRESENT",
    "READABLE_SCHEMAS",
    "RECORD_IDS",
    "RECORD_TYPES",
    "RECORD_TYPE_NAMES",
    "SCHEMA_VERSION",
    "STATE",
    "STATE_KEY",
    "SUBMISSIONS",
    "SUBMISSIONS_BY_REQUEST",
    "SUBMISSIONS_BY_STATUS",
    "SUBMISSION_STATUSES",
    "SUBMISSION_STATUS_KEYS",
    "SUM_SIZE",
    "TABLES",
    "TABLE_CODES",
    "TASKS",
    "TASKS_BY_STATUS",
    "TASK_STATUSES",
    "TASK_STATUS_KEYS",
    "TRIMMED_KEY",
    "UNVERSIONED",
    "WRITER_SIZE",
    "CoreHeader",
    "CurrentValue",
    "EntryRow",
    "LogRows",
    "ProjectionState",
    "Revision",
    "any_decoder",
    "checksum",
    "checksum_of",
    "comparable",
    "current_decoder",
    "db_name",
    "decode_entry",
    "decode_row",
    "delete_value",
    "encode_row",
    "encode_state",
    "entry_decoder",
    "get_value",
    "header_decoder",
    "history_before",
    "history_key",
    "history_logged",
    "history_value",
    "leading_seq",
    "pack_entry",
    "pack_row",
    "put_value",
    "read_u64",
    "record_type_name",
    "revision_decoder",
    "row_body",
    "seal",
    "seal_of",
    "state_decoder",
    "text_key",
    "u64",
    "u64_pair",
    "unpack_entry",
    "unpack_row",
    "unseal",
    "written_row",
]
