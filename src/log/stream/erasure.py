"""An erasure on a store's stream: its tombstones travel beside the erasure record, and the
erased records' messages leave the stream.

A replicated writer publishes the erasure record (log format 5) and, in the same atomic batch
right after it, ``tombstones`` messages (``message.Tombstones``): each tombstone it put over an
earlier record, exactly as its log stores it. A reader holding those records puts the tombstones
over them (each keeps the record's leaf hash, which the log checks), so every replica rewrites its
log to the same bytes. Then the writer deletes from the stream, with JetStream's secure delete,
the messages of the erased records and any earlier ``tombstones`` message holding one of them (a
record erased twice: the first tombstone kept writes the second erasure removes; the other
tombstones of such a message travel again in the new batch, so every one stays on the stream).

A reader that later meets the gap of a deleted record (a new replica, a restore) takes the
record's tombstone from the ``tombstones`` message that covers it, further on the subject
(``TombstoneLookup``: one scan to the subject's end, then served from memory).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Final

from ...errors import ReplicationError
from .link import StreamLink
from .message import (
    H_KIND,
    H_SEQ,
    RECORD_HEADROOM,
    Tombstones,
    control_headers,
    encode_control,
    parse_message,
)

SCAN_BATCH: Final = 4096
"""Messages per batched read while an erasure or a lookup scans a subject."""
TOMBSTONES_BYTES: Final = 256 << 10
"""Bytes of tombstones one message carries at most (fewer where the server takes less)."""


def tombstone_messages(
    store: str, epoch: int, erasure: int, tombstones: list[tuple[int, bytes]], limit: int
) -> list[tuple[dict[str, str], bytes]]:
    """The ``tombstones`` messages (headers, body) that follow erasure record ``erasure``, as few
    as the server's largest message (``limit``, 0: not known) allows; a tombstone too big for
    one message alone raises ``ReplicationError``."""

    budget = min(TOMBSTONES_BYTES, limit - RECORD_HEADROOM) if limit else TOMBSTONES_BYTES
    chunks: list[list[tuple[int, bytes]]] = [[]]
    size = 0
    for seq, data in sorted(tombstones):
        if len(data) + 64 > budget:
            raise ReplicationError(
                f"The tombstone of record {seq} ({len(data)} bytes) is too big for a message of "
                f"the stream (at most {budget} bytes of tombstones): nothing was erased"
            )
        if chunks[-1] and size + len(data) + 64 > budget:
            chunks.append([])
            size = 0
        chunks[-1].append((seq, data))
        size += len(data) + 64
    return [
        (
            control_headers(store, "tombstones", epoch, erasure),
            encode_control(Tombstones(erasure, chunk)),
        )
        for chunk in chunks
        if chunk
    ]


async def scan_subject(
    link: StreamLink, subject: str, store: str, after: int = 0
) -> tuple[dict[int, int], list[tuple[int, Tombstones]]]:
    """One pass over ``subject`` after stream sequence ``after``: the stream sequence of each
    record's message by log sequence, and the ``tombstones`` messages with their stream sequence.
    Records are not decoded: only their headers are read."""

    records: dict[int, int] = {}
    found: list[tuple[int, Tombstones]] = []
    while True:
        raws = await link.messages.fetch(subject, after, batch=SCAN_BATCH)
        if not raws:
            return records, found
        for raw in raws:
            headers = raw.headers or {}
            kind = headers.get(H_KIND)
            if kind == "record":
                seq = headers.get(H_SEQ, "")
                if isinstance(seq, str) and seq.isdigit():
                    records[int(seq)] = raw.stream_seq
            elif kind == "tombstones":
                message = parse_message(link.stream, raw.stream_seq, raw.headers, raw.data, store)
                control = message.control
                assert isinstance(control, Tombstones)
                found.append((raw.stream_seq, control))
        after = raws[-1].stream_seq
        if raws[-1].pending == 0:
            return records, found


def held_elsewhere(
    tombstones: list[tuple[int, Tombstones]], erased: Iterable[int]
) -> tuple[list[int], set[int]]:
    """Of the ``tombstones`` messages found (stream sequence, body): those holding one of the
    ``erased`` records, which an erasure deletes, and the other records they hold, whose current
    tombstones it publishes again."""

    gone = set(erased)
    doomed: list[int] = []
    again: set[int] = set()
    for stream_seq, message in tombstones:
        held = {seq for seq, _ in message.records}
        if held & gone:
            doomed.append(stream_seq)
            again |= held - gone
    return doomed, again


async def delete_erased(
    link: StreamLink, subject: str, store: str, erasure: int, records: Iterable[int]
) -> int:
    """Delete from the stream (secure delete) the messages of ``records``, which erasure record
    ``erasure`` made tombstones, and the earlier ``tombstones`` messages holding one of them.
    Idempotent: what is gone already is skipped. Returns how many messages it deleted."""

    erased = set(records)
    by_seq, tombstones = await scan_subject(link, subject, store)
    deadline, pause = time.monotonic() + link.timeout, 0.01
    while erasure not in by_seq and time.monotonic() < deadline:
        # The stream acknowledged the erasure record's message once most of its replicas held
        # it: the scan's consumer may read one that has not stored it yet. It comes.
        await asyncio.sleep(pause)
        pause = min(2 * pause, 0.25)
        by_seq, tombstones = await scan_subject(link, subject, store)
    at = by_seq.get(erasure)
    if at is None:
        raise ReplicationError(
            f"Stream {link.stream!r} holds no message of erasure record {erasure} of store "
            f"{store}: its erased records' messages were not deleted"
        )
    doomed = [by_seq[seq] for seq in sorted(erased) if seq in by_seq and by_seq[seq] < at]
    earlier = [(stream_seq, body) for stream_seq, body in tombstones if stream_seq < at]
    doomed += held_elsewhere(earlier, erased)[0]
    for stream_seq in sorted(doomed):
        await link.messages.delete(stream_seq)
    return len(doomed)


class TombstoneLookup:
    """The tombstones a reader needs where a record's message was deleted: every ``tombstones``
    message after a stream sequence, read once to the subject's end (the latest tombstone of a
    record wins), then served from memory until a gap beyond what was read."""

    def __init__(self, link: StreamLink, subject: str, store: str) -> None:
        self.link, self.subject, self.store = link, subject, store
        self.found: dict[int, bytes] = {}

    def __call__(self, after: int, seqs: Iterable[int]) -> dict[int, bytes]:
        """The tombstones of ``seqs`` (those found) from the messages after stream sequence
        ``after``; from a worker thread, never the link's loop."""

        wanted = list(seqs)
        if any(seq not in self.found for seq in wanted):
            self.link.run(self._scan(after))
        return {seq: self.found[seq] for seq in wanted if seq in self.found}

    async def _scan(self, after: int) -> None:
        _, tombstones = await scan_subject(self.link, self.subject, self.store, after)
        for _, message in tombstones:
            for seq, data in message.records:
                self.found[seq] = data


__all__ = [
    "SCAN_BATCH",
    "TOMBSTONES_BYTES",
    "TombstoneLookup",
    "delete_erased",
    "held_elsewhere",
    "scan_subject",
    "tombstone_messages",
]
