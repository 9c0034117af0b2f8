"""The messages of a store's subject: their layout (headers and body) and their checking.

A store's records go to ``<stream>.<store id>.log``, one message per record, the body being the
record exactly as the local log stores it (``LogRecord``: its CRC-32 is checked on every receipt).
Headers carry what the body does not: the store, the record's sequence, the writer's epoch, and
``Nats-Msg-Id`` = ``<store>:<seq>`` so a stream drops a record sent twice. Control messages
(a fence, an id reservation) are msgspec Structs, tagged. The same for every link (``link.py``).
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Callable
from typing import Final, Literal, NamedTuple

import msgspec

from ...errors import (
    CorruptRecordError,
    DamageError,
    ForeignMessageError,
    ProjectionsBehind,
    ReplicationError,
)
from ..records import Commit, decode_record

MESSAGE_FORMAT: Final = 1
"""The version of the message layout (headers and body); every message carries it."""

H_FORMAT: Final = "Pd-Format"
H_STORE: Final = "Pd-Store"
H_SEQ: Final = "Pd-Seq"
H_KIND: Final = "Pd-Kind"
H_EPOCH: Final = "Pd-Epoch"
H_MSG_ID: Final = "Nats-Msg-Id"
H_EXPECTED: Final = "Nats-Expected-Last-Subject-Sequence"
"""NATS's condition on a publish: the subject's last stream sequence must be this one (for a
key-value put, the key's revision)."""
H_ROOT: Final = "Pd-Tree-Root"
"""On some records (optional): the writer's log tree root of the first ``seq`` records, lowercase
hex; a follower refuses the record when its own tree with it has another root."""
ROOT_EVERY: Final = 512
"""A writer puts ``Pd-Tree-Root`` on the records whose sequence is a multiple of this (where its
tree has just stored its tiles, so the root costs a few reads)."""
_ROOT_HEX: Final = re.compile(r"[0-9a-f]{64}")
_logger = logging.getLogger(__name__)

Kind = Literal["record", "fence", "ids", "tombstones"]
KINDS: Final = ("record", "fence", "ids", "tombstones")
"""``record``: a log record. ``fence``: a new writer's first message, which moves the subject on
so that no earlier writer's conditional append can land after it. ``ids``: an id block reserved.
``tombstones``: right after an erasure record, the tombstones it put over earlier records (whose
own messages are then deleted from the stream)."""

_MAX_SEQ: Final = 2**64 - 1
"""Log sequences are unsigned 64-bit (big-endian keys)."""
_STREAM_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,200}")


class Fence(msgspec.Struct, tag="fence", forbid_unknown_fields=True):
    epoch: int
    holder: str


class IdReservation(msgspec.Struct, tag="ids", forbid_unknown_fields=True):
    epoch: int
    upto: int


class Tombstones(msgspec.Struct, tag="tombstones", forbid_unknown_fields=True):
    """The tombstones (log sequence, record as the log stores it) an erasure record put in
    place: a reader that holds those records puts them over its own, one that meets a deleted
    record's gap takes them instead."""

    erasure: int
    records: list[tuple[int, bytes]]


Control = Fence | IdReservation | Tombstones
_CONTROL_TYPES: Final = {"fence": Fence, "ids": IdReservation, "tombstones": Tombstones}
_control_encoder: Final = msgspec.msgpack.Encoder()
_control_decoder: Final = msgspec.msgpack.Decoder(Control)


def encode_control(control: Control) -> bytes:
    return _control_encoder.encode(control)


class StreamMessage(NamedTuple):
    """One verified message of a store's subject."""

    stream_seq: int
    store: str
    kind: Kind
    epoch: int
    seq: int
    """The record's log sequence (``record``), else the log head the control message follows."""
    data: bytes
    """The record as the log stores it (``record``), else the encoded control message."""
    commit: Commit | None = None
    """A record's decoded batch (decoded once, when its checksum was checked)."""
    root: bytes | None = None
    """The writer's tree root of the first ``seq`` records, when the record carries it (``H_ROOT``)."""

    @property
    def control(self) -> Control:
        return _control_decoder.decode(self.data)


class RawMessage(NamedTuple):
    """One message of a store's subject as the stream gave it, not checked yet: a catch-up reads
    these in bulk and checks them (``parse_message``) off the link's loop."""

    stream_seq: int
    headers: dict[str, str] | None
    data: bytes
    pending: int = 0
    """How many more messages of the subject the stream held when it sent this one."""


def subject_of(stream: str, store: str) -> str:
    return f"{stream}.{store}.log"


def stream_subjects(stream: str) -> list[str]:
    return [f"{stream}.*.log"]


def check_stream_name(stream: object) -> str:
    if not isinstance(stream, str) or not _STREAM_NAME.fullmatch(stream):
        raise ValueError(
            f"A stream name is letters, digits, '-' or '_' (NATS stream names), not {stream!r:.80}"
        )
    return stream


def record_headers(store: str, seq: int, epoch: int, root: bytes | None = None) -> dict[str, str]:
    headers = {
        H_MSG_ID: f"{store}:{seq}",
        H_FORMAT: str(MESSAGE_FORMAT),
        H_STORE: store,
        H_KIND: "record",
        H_SEQ: str(seq),
        H_EPOCH: str(epoch),
    }
    if root is not None:
        headers[H_ROOT] = root.hex()
    return headers


def carried_root(seq: int, root: Callable[[], bytes]) -> bytes | None:
    """The tree root record ``seq`` carries to its followers (``root()`` on every ``ROOT_EVERY``-th
    record), or None: a tree that cannot give it (damaged, far behind) never holds a record back."""

    if seq % ROOT_EVERY:
        return None
    try:
        return root()
    except (DamageError, ProjectionsBehind) as error:
        _logger.error("record %d goes to the stream without its tree root: %s", seq, error)
        return None


def control_headers(store: str, kind: Kind, epoch: int, head: int) -> dict[str, str]:
    """A control message's headers; ``Pd-Seq`` is the log head it follows."""

    return {
        H_MSG_ID: f"{store}:{kind}:{epoch}:{secrets.token_hex(6)}",
        H_FORMAT: str(MESSAGE_FORMAT),
        H_STORE: store,
        H_KIND: kind,
        H_SEQ: str(head),
        H_EPOCH: str(epoch),
    }


def parse_message(
    stream: str,
    stream_seq: int,
    headers: dict[str, str] | None,
    data: bytes | None,
    store: str | None,
) -> StreamMessage:
    """Check one message of a store's subject (its headers, and a record's checksum); anything
    else raises ``ForeignMessageError`` naming its stream sequence."""

    headers = headers or {}
    body = data or b""

    def refuse(reason: str) -> ForeignMessageError:
        return ForeignMessageError(stream, stream_seq, reason)

    if headers.get(H_FORMAT) != str(MESSAGE_FORMAT):
        raise refuse(
            f"it has no {H_FORMAT}: {MESSAGE_FORMAT} header (not written by pi-durable-lmdb)"
        )
    found = headers.get(H_STORE)
    if found is None or (store is not None and found != store):
        raise refuse(f"it belongs to store {found!r}, not {store!r}")
    kind = headers.get(H_KIND)
    if kind not in KINDS:
        raise refuse(f"unknown kind {kind!r}")
    try:
        epoch = int(headers.get(H_EPOCH, "0"))
    except (ValueError, TypeError):
        raise refuse(f"its epoch {headers.get(H_EPOCH)!r:.80} is not an integer") from None
    raw_seq = headers.get(H_SEQ, "")  # a client may hand a non-ASCII value as another type
    ok = isinstance(raw_seq, str) and raw_seq.isascii() and raw_seq.isdigit() and len(raw_seq) <= 20
    seq = int(raw_seq) if ok else -1
    if not (1 if kind == "record" else 0) <= seq <= _MAX_SEQ:
        raise refuse(f"its {H_SEQ} {raw_seq!r:.80} is not a log sequence")
    if kind != "record":
        try:
            control = _control_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise refuse(f"an undecodable {kind} message ({error})") from None
        if not isinstance(control, _CONTROL_TYPES[kind]):
            raise refuse(
                f"its body is a {type(control).__name__}, not what a {kind!r} message carries"
            )
        return StreamMessage(stream_seq, found, kind, epoch, seq, body)
    if headers.get(H_MSG_ID) != f"{found}:{seq}":
        raise refuse(
            f"its {H_MSG_ID} {headers.get(H_MSG_ID)!r} does not name record {seq} of store {found}"
        )
    root = headers.get(H_ROOT)
    if root is not None and not (isinstance(root, str) and _ROOT_HEX.fullmatch(root)):
        raise refuse(f"its {H_ROOT} {root!r:.80} is not a tree root (64 lowercase hex digits)")
    try:
        commit = decode_record(seq, body)
    except CorruptRecordError as error:
        raise refuse(f"record {seq}: {error.reason}") from None
    return StreamMessage(
        stream_seq,
        found,
        "record",
        epoch,
        seq,
        body,
        commit,
        None if root is None else bytes.fromhex(root),
    )


RECORD_HEADROOM: Final = 1024
"""Bytes kept below a stream's largest message for a record message's headers and framing."""


def too_big(size: int, limit: int) -> str | None:
    """Why a record of ``size`` bytes can never be published to a stream taking messages of at
    most ``limit`` bytes (0: not known yet); None when it fits. One rule for every mode: such a
    batch is refused before it is acknowledged."""

    if limit and size + RECORD_HEADROOM > limit:
        return (
            f"a record of {size} bytes is too big for the stream: the NATS server takes messages "
            f"of at most {limit} bytes (max_payload), headers included"
        )
    return None


def check_size(size: int, limit: int) -> None:
    """Refuse, before it is committed, a batch whose record the stream could not take."""

    reason = too_big(size, limit)
    if reason is not None:
        raise ReplicationError(f"A batch was refused: {reason}; nothing was committed")


__all__ = [
    "H_EPOCH",
    "H_EXPECTED",
    "H_FORMAT",
    "H_KIND",
    "H_MSG_ID",
    "H_ROOT",
    "H_SEQ",
    "H_STORE",
    "KINDS",
    "MESSAGE_FORMAT",
    "RECORD_HEADROOM",
    "ROOT_EVERY",
    "Control",
    "Fence",
    "IdReservation",
    "Kind",
    "RawMessage",
    "StreamMessage",
    "Tombstones",
    "carried_root",
    "check_size",
    "check_stream_name",
    "control_headers",
    "encode_control",
    "parse_message",
    "record_headers",
    "stream_subjects",
    "subject_of",
    "too_big",
]
