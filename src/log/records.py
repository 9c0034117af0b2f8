"""The persisted shapes of the log: one tagged union of writes, and the record header around a batch.

The wire names are the Storage contract's own (``type``, ``value``, ``record``, ``content``,
``source``, ``id``), so a batch of contract dicts encodes to exactly the bytes its Structs would,
and decoding validates it into Structs. JSON payloads (records, values, ops) stay ``Any``: they are
the caller's data, kept as written.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple, TypeAlias

import msgspec

from ..errors import CorruptRecordError
from ..formats import FORMAT_VERSION as FORMAT_VERSION
from ..tlog.leaf import record_leaf_hash
from . import codec, zstd
from .deflate import deflate, inflate

RAW_FORMAT: Final = 1
"""A record whose writes are stored as they were encoded."""
DEFLATED_FORMAT: Final = 2
"""A record whose writes are deflated against a preset dictionary (``log.deflate``)."""
ZSTD_FORMAT: Final = 3
"""A record whose writes are one zstd frame (``log.zstd``)."""
TOMBSTONE_FORMAT: Final = 4
"""A record some of whose writes were erased (``storage.erase``): the writes kept, as they were
encoded, and the leaf hash the record had before, which the log's Merkle tree keeps."""
ERASURE_FORMAT: Final = 5
"""The record of an erasure: what was erased, when, by whom and why (an ``Erasure``)."""

RAW_BELOW: Final = 160
"""Payloads shorter than this are stored raw (``RAW_FORMAT``), not compressed: a small batch
(a document delta, a submission, a task's status) saves about 50 bytes in zstd, for about
1.5 us of a commit of about 40; a turn's batch (about a kilobyte) saves hundreds of bytes and
stays compressed. Only writing looks at it: every format reads as before."""


class ConversationWrite(
    msgspec.Struct, tag="conversation", tag_field="type", forbid_unknown_fields=True
):
    """A conversation record, stored whole (``{"type": "conversation", "value": ...}``)."""

    value: Any


class EntryWrite(msgspec.Struct, tag="entry", tag_field="type", forbid_unknown_fields=True):
    """An entry of a conversation, stored whole."""

    value: Any


class TaskWrite(msgspec.Struct, tag="task", tag_field="type", forbid_unknown_fields=True):
    """A task record, stored whole: each write is the task as it now stands."""

    value: Any


class SubmissionWrite(
    msgspec.Struct, tag="submission", tag_field="type", forbid_unknown_fields=True
):
    """A submission record, stored whole."""

    value: Any


class BaseContent(msgspec.Struct, tag="base", tag_field="kind", forbid_unknown_fields=True):
    """A document's whole value at ``version``."""

    version: int
    value: Any


class DeltaContent(msgspec.Struct, tag="delta", tag_field="kind", forbid_unknown_fields=True):
    """The ops that turn a document's previous value into its value at ``version``."""

    version: int
    ops: Any


Content: TypeAlias = BaseContent | DeltaContent
"""A document's content in a write: a whole value or a delta."""


class CopySource(msgspec.Struct, forbid_unknown_fields=True):
    """The document a copy is made from, and the point it is read at: ``"current"``, or a
    number, compared with the log's sequences as the reference compares it (``3.5`` reads as
    ``3``, ``2**70`` past every sequence, ``True`` as ``1``), kept as it was written."""

    id: int
    at: Any

    def __post_init__(self) -> None:
        at = self.at
        if at != "current" and not isinstance(at, (int, float)):  # a bool is an int
            raise ValueError(f"source.at must be a number or 'current', not {at!r}")


class DocumentCreateWrite(
    msgspec.Struct, tag="document.create", tag_field="type", forbid_unknown_fields=True
):
    """A new document: its record (kind, scope, key, history) and its first content."""

    record: Any
    content: Content


class DocumentCopyWrite(
    msgspec.Struct, tag="document.copy", tag_field="type", forbid_unknown_fields=True
):
    """A new document whose first value is another's, read at the source's point."""

    record: Any
    source: CopySource


class DocumentChangeWrite(
    msgspec.Struct, tag="document.change", tag_field="type", forbid_unknown_fields=True
):
    """A new version of document ``id``: a whole value or a delta."""

    id: int
    content: Content


class DocumentRetireWrite(
    msgspec.Struct, tag="document.retire", tag_field="type", forbid_unknown_fields=True
):
    """Document ``id`` retired: no longer current, its past still readable where it keeps one."""

    id: int


Write: TypeAlias = (
    ConversationWrite
    | EntryWrite
    | TaskWrite
    | SubmissionWrite
    | DocumentCreateWrite
    | DocumentCopyWrite
    | DocumentChangeWrite
    | DocumentRetireWrite
)
"""One write of a batch, tagged by its ``type`` as the contract's writes are."""

WRITE_TYPES: Final = (
    "conversation",
    "entry",
    "task",
    "submission",
    "document.create",
    "document.copy",
    "document.change",
    "document.retire",
)
"""Every write ``type`` the log stores."""


class LogRecord(msgspec.Struct, array_like=True):
    """What one log key holds. ``checksum`` is the CRC-32 of ``committed_at`` (8 bytes
    big-endian) followed by ``payload``, the encoded writes as stored (deflated in format 2, a
    zstd frame in format 3, ``size`` their length once decompressed; a format-1 record has no
    ``size``)."""

    format: int
    committed_at: int
    checksum: int
    payload: bytes
    size: int = 0
    leaf: bytes = b""
    erasure: int = 0
    erased: int = 0


class TombstoneRecord(msgspec.Struct, array_like=True):
    """A record of format 4 as it is written: ``payload`` the writes kept (encoded, stored as
    they are), ``leaf`` the record's leaf hash before the erasure, ``erasure`` the sequence of
    the erasure record, ``erased`` how many writes it removed. The checksum covers
    ``committed_at``, ``leaf``, ``erasure``, ``erased`` and ``payload``."""

    format: int
    committed_at: int
    checksum: int
    payload: bytes
    size: int
    leaf: bytes
    erasure: int
    erased: int


class Erasure(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    """What an erasure record (format 5) holds: the conversations erased, the records it turned
    into tombstones, and the caller's words for who asked and why."""

    conversations: list[int]
    records: list[int]
    reason: str
    writes: int
    by: str = ""


class Tombstone(msgspec.Struct, frozen=True):
    """What a tombstone says of its record: its leaf hash before the erasure, the erasure
    record's sequence, and how many of its writes were erased."""

    leaf: bytes
    erasure: int
    erased: int


class CompressedRecord(msgspec.Struct, array_like=True):
    """A record of format 2 or 3 as it is written: five fields, byte for byte what earlier
    versions wrote and read."""

    format: int
    committed_at: int
    checksum: int
    payload: bytes
    size: int


class RawRecord(msgspec.Struct, array_like=True):
    """A format-1 record as it is written: four fields, byte for byte what earlier versions wrote
    and read (``LogRecord`` reads it, its ``size`` left 0)."""

    format: int
    committed_at: int
    checksum: int
    payload: bytes


class Commit(msgspec.Struct, frozen=True):
    """One decoded, verified log record."""

    seq: int
    committed_at: int
    writes: list[Write]
    tombstone: Tombstone | None = None
    """Set on a record some of whose writes were erased: ``writes`` are those kept."""
    erasure: Erasure | None = None
    """Set on an erasure record, which holds no writes."""


_batch_decoder: Final = codec.decoder(list[Write])
_record_decoder: Final = msgspec.msgpack.Decoder(LogRecord)
_record_encoder: Final = msgspec.msgpack.Encoder()
_erasure_decoder: Final = msgspec.msgpack.Decoder(Erasure)


class EncodedBatch(NamedTuple):
    """A batch ready for the log: its payload, and the validated Structs it decodes to."""

    payload: bytes
    writes: list[Write]


def encode_batch(writes: Sequence[Mapping[str, Any]]) -> EncodedBatch:
    """Check a batch of contract writes (strict JSON, then the write schema) and encode it.

    The Structs are decoded from the payload itself, so they are detached from the caller's
    values and are exactly what a later read of the log will see.
    """

    batch = list(writes)
    codec.check_json(batch)
    payload = codec.encode(batch)
    try:
        decoded: list[Write] = codec.decode_with(_batch_decoder, payload)
    except msgspec.ValidationError as error:
        raise ValueError(f"Invalid storage write: {error}") from None
    for write in decoded:
        if type(write) is DocumentChangeWrite and type(write.content) is DeltaContent:
            check_delta_depth(write.content.ops)
    return EncodedBatch(payload, decoded)


VALUE_DEPTH: Final = 3
"""The levels a document's value sits under in a commit (the batch, the write, its content):
``codec.check_json`` counts them, so a commit holds a value ``codec.MAX_DEPTH - 3`` deep."""


def check_delta_depth(ops: Any) -> None:
    """Refuse, as ``codec.check_json`` refuses a commit of such a value (``TypeError``), a delta
    op that would nest its document deeper than a commit may hold a value: a value set at a
    path of ``n`` segments sits ``n`` levels into the document (``s``), items spliced into the
    array there ``n + 1`` (``p``). Otherwise such a document could be neither stored nor read
    (nor its value committed again). It reads the op alone, not the document, so an op that
    would fail anyway (its path leads nowhere) is refused all the same. A path of 2 segments or
    fewer cannot nest too deep: ``check_json`` bounded the op's value deeper in the batch."""

    if type(ops) is not list:
        return
    for op in ops:
        if type(op) is not list or len(op) < 3 or type(op[1]) is not list or len(op[1]) <= 2:
            continue  # the applier refuses a malformed op as the reference does
        verb, path = op[0], op[1]
        if verb == "s" and len(op) == 3:
            if type(op[2]) is dict or type(op[2]) is list:
                codec.check_json_at(op[2], VALUE_DEPTH + len(path))
        elif verb == "p" and len(op) == 5 and type(op[4]) is list:
            for item in op[4]:
                if type(item) is dict or type(item) is list:
                    codec.check_json_at(item, VALUE_DEPTH + len(path) + 1)


def decode_batch(payload: bytes | memoryview) -> list[Write]:
    """Decode and validate a payload; a write that is not of the contract, or a payload nesting
    deeper than a commit may, raises ``ValueError``."""

    try:
        return codec.decode_bounded(payload, _batch_decoder)  # type: ignore[no-any-return]
    except msgspec.ValidationError as error:
        raise ValueError(f"Invalid storage write: {error}") from None


COMMITTED_AT_MIN: Final = -(2**63)
COMMITTED_AT_MAX: Final = 2**63 - 1
"""A record's commit time is Unix milliseconds in a signed 64-bit integer: its checksum covers
those 8 bytes, so nothing outside them may be written (it could never be read back)."""


def check_committed_at(value: object) -> int:
    """``value`` as a record's commit time, or ``TypeError``/``ValueError`` naming what is wrong;
    checked before anything is written, so every record written can be read back."""

    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"committed_at must be an integer of Unix milliseconds, not {type(value).__name__} {_short(value)}"
        )
    if not COMMITTED_AT_MIN <= value <= COMMITTED_AT_MAX:
        raise ValueError(
            f"committed_at must be Unix milliseconds from {COMMITTED_AT_MIN} to {COMMITTED_AT_MAX}, "
            f"not {value if value.bit_length() < 256 else f'an integer of {value.bit_length()} bits'}"
        )
    return int(value)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _checksum(committed_at: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(committed_at.to_bytes(8, "big", signed=True)))


def encode_record(payload: bytes, committed_at: int) -> bytes:
    """One record for the log; a header field it could not read back is refused here."""

    if type(committed_at) is not int or not COMMITTED_AT_MIN <= committed_at <= COMMITTED_AT_MAX:
        committed_at = check_committed_at(committed_at)  # raises, naming what is wrong
    if type(payload) is not bytes:
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise TypeError(f"A log record's payload must be bytes, not {type(payload).__name__}")
        payload = bytes(payload)
    stored, record_format = None, ZSTD_FORMAT
    if len(payload) >= RAW_BELOW:
        stored = zstd.compress(payload)
    if stored is not None and zstd.dense(stored, len(payload)):  # beyond what a reader accepts
        stored, record_format = deflate(payload), DEFLATED_FORMAT
    if stored is None:
        return _record_encoder.encode(
            RawRecord(RAW_FORMAT, committed_at, _checksum(committed_at, payload), payload)
        )
    return _record_encoder.encode(
        CompressedRecord(
            record_format, committed_at, _checksum(committed_at, stored), stored, len(payload)
        )
    )


def _tombstone_checksum(
    committed_at: int, leaf: bytes, erasure: int, erased: int, payload: bytes
) -> int:
    head = committed_at.to_bytes(8, "big", signed=True) + leaf
    head += erasure.to_bytes(8, "big") + erased.to_bytes(8, "big")
    return zlib.crc32(payload, zlib.crc32(head))


def encode_tombstone(
    payload: bytes, committed_at: int, leaf: bytes, erasure: int, erased: int
) -> bytes:
    """A tombstone record (format 4): the kept writes' ``payload`` (from ``codec.encode``, stored
    as they are: the erased writes' bytes are in no frame), the record's former ``leaf`` hash, the
    ``erasure`` record's sequence and the number of writes ``erased``."""

    committed_at = check_committed_at(committed_at)
    if len(leaf) != 32 or not 0 < erasure < 2**64 or not 0 < erased < 2**64:
        raise ValueError("A tombstone needs a 32-byte leaf hash, its erasure and a count erased")
    payload = bytes(payload)
    checksum = _tombstone_checksum(committed_at, leaf, erasure, erased, payload)
    return _record_encoder.encode(
        TombstoneRecord(
            TOMBSTONE_FORMAT, committed_at, checksum, payload, 0, bytes(leaf), erasure, erased
        )
    )


def encode_erasure(erasure: Erasure, committed_at: int) -> tuple[bytes, bytes]:
    """An erasure record (format 5) and the bytes its leaf hash is taken over."""

    committed_at = check_committed_at(committed_at)
    payload = _record_encoder.encode(erasure)
    record = RawRecord(ERASURE_FORMAT, committed_at, _checksum(committed_at, payload), payload)
    return _record_encoder.encode(record), payload


def decode_record(seq: int, data: bytes | memoryview) -> Commit:
    """Verify and decode one stored record; damage raises ``CorruptRecordError`` naming ``seq``."""

    record, payload = _verified(seq, data)
    if record.format == ERASURE_FORMAT:
        return Commit(seq, record.committed_at, [], erasure=_erasure(seq, payload))
    try:
        writes = codec.decode_bounded(payload, _batch_decoder)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as error:
        raise CorruptRecordError(seq, f"undecodable writes ({error})") from None
    return Commit(seq, record.committed_at, writes, _tombstone(record))


def _tombstone(record: LogRecord) -> Tombstone | None:
    if record.format != TOMBSTONE_FORMAT:
        return None
    return Tombstone(record.leaf, record.erasure, record.erased)


def _erasure(seq: int, payload: bytes) -> Erasure:
    try:
        return _erasure_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CorruptRecordError(seq, f"undecodable erasure ({error})") from None


def decode_record_builtins(seq: int, data: bytes | memoryview) -> dict[str, Any]:
    """A verified record as ``{"seq", "committedAt", "writes"}`` of plain values, for JSON: the
    writes exactly as committed, without building Structs (tailing and exporting)."""

    record, payload = _verified(seq, data)
    if record.format == ERASURE_FORMAT:
        erasure = msgspec.to_builtins(_erasure(seq, payload))
        return {"seq": seq, "committedAt": record.committed_at, "writes": [], "erasure": erasure}
    try:
        writes = codec.decode_bounded(payload)
    except (msgspec.DecodeError, ValueError) as error:
        raise CorruptRecordError(seq, f"undecodable writes ({error})") from None
    if not isinstance(writes, list):
        raise CorruptRecordError(seq, "the writes are not an array")
    line = {"seq": seq, "committedAt": record.committed_at, "writes": writes}
    if record.format == TOMBSTONE_FORMAT:
        line["erased"] = {
            "leaf": record.leaf.hex(),
            "erasure": record.erasure,
            "writes": record.erased,
        }
    return line


class _LegacyExt(Exception):
    pass


def _legacy_hook(code: int, data: memoryview) -> None:
    if code == codec.EXT_INT:
        raise _LegacyExt
    return None


_legacy_scan: Final = msgspec.msgpack.Decoder(ext_hook=_legacy_hook)
"""Decodes writes only to find a legacy extension value (``codec.EXT_INT``, written for integers
beyond 64 bits by early versions, which wrote only format-1 records)."""


def record_leaf(seq: int, data: bytes | memoryview) -> bytes:
    """The Merkle leaf hash of stored record ``seq`` (``tlog.leaf``), from its verified,
    decompressed writes in the encoding a commit gives them today (a record holding a legacy
    extension value is re-encoded first); damage raises ``CorruptRecordError``."""

    record, payload = _verified(seq, data)
    if record.format == TOMBSTONE_FORMAT:  # the hash of the record as it was committed
        return record.leaf
    if record.format != RAW_FORMAT:  # compressed formats came after the legacy extension left
        return record_leaf_hash(seq, record.committed_at, payload)
    try:
        codec.deep(_legacy_scan.decode, payload)
    except _LegacyExt:
        payload = codec.encode(codec.decode(payload))
    except (msgspec.DecodeError, ValueError, RecursionError) as error:
        raise CorruptRecordError(seq, f"undecodable writes ({error})") from None
    return record_leaf_hash(seq, record.committed_at, payload)


_FORMATS: Final = (RAW_FORMAT, DEFLATED_FORMAT, ZSTD_FORMAT, TOMBSTONE_FORMAT, ERASURE_FORMAT)
_STORED_AS_IS: Final = (RAW_FORMAT, TOMBSTONE_FORMAT, ERASURE_FORMAT)


def _verified(seq: int, data: bytes | memoryview) -> tuple[LogRecord, bytes]:
    """The record's header and its encoded writes (decompressed), once its checksum holds."""

    try:
        record = _record_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CorruptRecordError(seq, f"undecodable header ({error})") from None
    if record.format not in _FORMATS:
        raise CorruptRecordError(seq, f"unsupported record format {record.format}")
    if (record.format in _STORED_AS_IS) != (record.size == 0):
        raise CorruptRecordError(seq, f"a record of format {record.format} with size {record.size}")
    tombstone = record.format == TOMBSTONE_FORMAT
    if tombstone != (len(record.leaf) == 32) or tombstone != (record.erasure > 0 < record.erased):
        raise CorruptRecordError(
            seq, f"a record of format {record.format} with a tombstone's fields wrong"
        )
    try:
        if tombstone:
            checksum = _tombstone_checksum(
                record.committed_at, record.leaf, record.erasure, record.erased, record.payload
            )
        else:
            checksum = _checksum(record.committed_at, record.payload)
    except OverflowError:
        raise CorruptRecordError(seq, "commit time or tombstone out of range") from None
    if checksum != record.checksum:
        raise CorruptRecordError(seq, "checksum mismatch")
    if record.format in _STORED_AS_IS:
        return record, record.payload
    if record.format == ZSTD_FORMAT:
        try:
            return record, zstd.decompress(record.payload, record.size)
        except ValueError as error:
            raise CorruptRecordError(seq, f"compressed writes: {error}") from None
    try:
        return record, inflate(record.payload, record.size)
    except ValueError as error:
        raise CorruptRecordError(seq, f"deflated writes: {error}") from None


def write_to_builtins(write: Write) -> dict[str, Any]:
    """The contract dict of a write, exactly as it was committed."""

    return codec.deep(msgspec.to_builtins, write)


__all__ = [
    "COMMITTED_AT_MAX",
    "COMMITTED_AT_MIN",
    "DEFLATED_FORMAT",
    "ERASURE_FORMAT",
    "FORMAT_VERSION",
    "RAW_BELOW",
    "RAW_FORMAT",
    "TOMBSTONE_FORMAT",
    "VALUE_DEPTH",
    "WRITE_TYPES",
    "ZSTD_FORMAT",
    "BaseContent",
    "Commit",
    "CompressedRecord",
    "Content",
    "ConversationWrite",
    "CopySource",
    "DeltaContent",
    "DocumentChangeWrite",
    "DocumentCopyWrite",
    "DocumentCreateWrite",
    "DocumentRetireWrite",
    "EncodedBatch",
    "EntryWrite",
    "Erasure",
    "LogRecord",
    "RawRecord",
    "SubmissionWrite",
    "TaskWrite",
    "Tombstone",
    "TombstoneRecord",
    "Write",
    "check_committed_at",
    "check_delta_depth",
    "decode_batch",
    "decode_record",
    "decode_record_builtins",
    "encode_batch",
    "encode_erasure",
    "encode_record",
    "encode_tombstone",
    "record_leaf",
    "write_to_builtins",
]
