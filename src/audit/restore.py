"""Building a store from its NATS JetStream stream alone: disaster recovery, to the stream's end or
to a point in time (``durable-log restore``).

The store starts from the newest snapshot of it in the stream's snapshot bucket that verifies
(``storage.snapshot``: a compacted copy and the stream position it holds), when there is one, and
takes in only the subject's messages after it; else from nothing. The records come from the
store's subject (``<stream>.<store id>.log``) as its writer logged them, byte for byte, their
checksums checked on receipt, and enter the new store the way a replica takes them in
(``Follower.catch_up``: each chunk appended and folded in one LMDB transaction together with the
stream position it reaches). The new store has the store's id and that position, so it can go on
as a replica (``LmdbStorage.open_replica``) or, after the loss of the writer, as its writer
(``LmdbStorage.open(..., durability="replicated")`` first takes in whatever the stream holds beyond
it). Like an import, it is built in a temporary directory beside its target without a sync per
commit, synced once and renamed into place: a failed restore leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence

from ..errors import StreamMissingError
from ..log.environment import check_store_id
from ..log.stream.jetstream import parse_servers
from ..log.stream.message import check_stream_name, subject_of
from ..storage.replica import Follower
from ..storage.snapshot import seed, snapshots_of
from .migrate import new_store, refuse_existing
from .numbers import format_time
from .tail import open_stream

Progress = Callable[[int, int], None]
"""Called with (records taken in so far, records known to come)."""


async def restore(
    nats: str | Sequence[str],
    stream: str,
    store: str,
    path: str | os.PathLike[str],
    to_seq: int | None = None,
    progress: Progress | None = None,
    snapshots: bool = True,
    to_time: int | None = None,
) -> int:
    """Build in the new directory ``path`` store ``store`` from ``stream`` on the NATS servers
    ``nats``: every record the stream holds, up to record ``to_seq``, or up to the last record
    committed at or before Unix ms ``to_time``; from the newest snapshot that verifies (and ends
    by that point) unless ``snapshots`` is false. Returns the new store's head sequence.

    ``ValueError``: ``path`` is not empty, the stream holds no record ``to_seq`` or none
    committed by ``to_time``, both are given, or the point is before an erasure of records
    before it (the stream holds only their tombstones);
    ``NatsUnavailableError``: no server answered; ``StreamMissingError``: no such stream, or it
    holds nothing of ``store``; ``ForeignMessageError``: a message of the subject is not a sound
    record of the store (nothing is left behind)."""

    parse_servers(nats)
    check_stream_name(stream)
    check_store_id(store)
    if to_seq is not None and (type(to_seq) is not int or to_seq < 1):
        raise ValueError(f"to_seq is a log sequence, 1 or more, not {to_seq!r}")
    if to_time is not None and (type(to_time) is not int or to_seq is not None):
        raise ValueError(f"to_time is Unix milliseconds, without to_seq, not {to_time!r}")
    target = os.path.abspath(os.fspath(path))
    refuse_existing(target, "restore")  # before any connection: a refusal costs nothing
    link = await open_stream(nats, stream)
    try:
        subject = subject_of(stream, store)
        last = await link.arun(link.messages.last(subject, store))
        if last is None and not (
            snapshots and snapshots_of(await link.arun(link.snapshots.names()), store)
        ):
            raise StreamMissingError(
                f"Stream {stream!r} holds no messages of store {store} (subject {subject}); "
                f"`durable-log tail --nats ... --stream {stream}` lists the stores it carries"
            )
        seeded = (
            (lambda directory: seed(link, store, directory, to_seq, to_time)) if snapshots else None
        )
        async with new_store(target, verb="restore", store=store, seed=seeded) as storage:
            follower = Follower(link, storage, store)
            head = await link.arun(
                follower.catch_up(to_seq=to_seq, progress=progress, to_time=to_time)
            )
            if to_time is not None and head == 0:
                raise ValueError(
                    f"Stream {stream!r} holds no record of store {store} committed at or before "
                    f"{format_time(to_time)} (or its log before a later snapshot was trimmed); "
                    "nothing was restored"
                )
            if follower.applier.erasure_ahead > head:
                raise ValueError(
                    f"Records of store {store} up to {head} include records erased by erasure "
                    f"record {follower.applier.erasure_ahead}, which comes later: the stream holds "
                    f"only their tombstones; restore to {follower.applier.erasure_ahead} or later "
                    "(nothing was restored)"
                )
            if to_seq is not None and head < to_seq:
                raise ValueError(
                    f"Stream {stream!r} holds the records of store {store} up to {head}, not {to_seq} (or its "
                    "log before a later snapshot was trimmed); nothing was restored"
                )
        return head
    finally:
        await asyncio.to_thread(link.close)


__all__ = [
    "Progress",
    "restore",
]
