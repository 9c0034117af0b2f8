"""Witnessing a store's checkpoints beyond its machine: signed checkpoints published to a NATS
JetStream key-value bucket (``<stream>-checkpoints``, one key per log, the checkpoint's origin),
each only if the store's tree extends the last one there (docs/audit.md).

Before a put, the last checkpoint under the key is read and checked: signed by the same key, for
the same origin, of a tree no larger than the new one, and the store's own tree proves it a prefix
(an RFC 9162 consistency proof from its size to the new size, checked against its signed root).
Anything else refuses the publication (``CheckpointRefusedError``, logged as an error): a store
whose history was rewritten, or a fork shown to another publisher, cannot publish past the
checkpoint the bucket holds. The put names the revision it read (compare-and-set): two
publishers racing cannot both move the key from the same checkpoint; the one that lost reads the
new one and checks it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Sequence
from typing import Final

import msgspec

from ..errors import (
    BadInputError,
    CheckpointRefusedError,
    DamageError,
    NoteError,
    ProofError,
    ReplicationError,
)
from ..log import Environment, WriteLog
from ..log.stream.link import KV_KEY, StreamLink
from ..tlog import merkle
from ..tlog.note import Checkpoint, Signer, verify_checkpoint

BUCKET: Final = "checkpoints"
"""The bucket's name after the stream's: ``<stream>-checkpoints``."""
ATTEMPTS: Final = 5
"""Puts tried while other publishers keep moving the key first."""
_logger = logging.getLogger(__name__)


class PublishedCheckpoint(msgspec.Struct, rename="camel", frozen=True):
    """A checkpoint the bucket holds under ``key`` at ``revision``: ``published`` false when the
    bucket already held a checkpoint of this tree (nothing was put). ``previous_size``: the size of
    the checkpoint it replaced, checked consistent (None: the key was empty); ``note``: the signed
    checkpoint of ``tree_size``."""

    bucket: str
    key: str
    revision: int
    tree_size: int
    root_hash: str
    previous_size: int | None
    published: bool
    note: str


def witness_key(origin: str) -> str:
    """The bucket key of a log's checkpoints: its origin, which must be a NATS key-value key
    (letters, digits, ``-/_=`` and inner dots)."""

    if not KV_KEY.fullmatch(origin):
        raise BadInputError(
            f"A checkpoint's origin names its key in the witness bucket, so it is letters, digits, '-', '/', "
            f"'_', '=' and inner '.', not {origin!r:.80} (pass an origin such as audit.example.com/orders)"
        )
    return origin


async def publish(
    log: WriteLog,
    signer: Signer,
    link: StreamLink,
    origin: str | None = None,
    size: int | None = None,
) -> PublishedCheckpoint:
    """Sign a checkpoint of ``log`` (its first ``size`` records, default all) and put it in the
    witness bucket of ``link``'s stream, only if consistent with the checkpoint there.

    ``CheckpointRefusedError``: the bucket's checkpoint is not ``signer``'s, or the log does not
    extend it; ``NatsUnavailableError``: no answer; ``ReplicationError``: other publishers kept
    moving the key."""

    note = log.checkpoint(signer, origin, size)
    new = verify_checkpoint(note, signer.verifier())
    key = witness_key(new.origin)
    bucket = f"{link.stream}-{BUCKET}"
    for _ in range(ATTEMPTS):
        value, revision = await link.arun(link.keys.kv_get(BUCKET, key))
        previous = None if value is None else _check_previous(log, signer, new, value, bucket, key)
        if previous is not None and previous.size == new.size:  # the same tree (its root checked)
            return PublishedCheckpoint(
                bucket, key, revision, new.size, new.root.hex(), previous.size, False, note
            )
        put = await link.arun(link.keys.kv_put(BUCKET, key, note.encode(), revision))
        if put is not None:
            previous_size = None if previous is None else previous.size
            return PublishedCheckpoint(
                bucket, key, put, new.size, new.root.hex(), previous_size, True, note
            )
    raise ReplicationError(
        f"The checkpoint of {new.origin} was not published: other publishers moved {bucket} {key} {ATTEMPTS} times"
    )


def _check_previous(
    log: WriteLog, signer: Signer, new: Checkpoint, value: bytes, bucket: str, key: str
) -> Checkpoint:
    """The bucket's last checkpoint, once it is ``signer``'s and the log's tree at ``new.size``
    extends it; else ``CheckpointRefusedError``, logged."""

    where = f"the last checkpoint in {bucket} under {key}"
    try:
        previous = verify_checkpoint(value, signer.verifier(), new.origin)
    except (ProofError, NoteError) as error:
        raise _refused(
            f"{where} is not a checkpoint of {new.origin} signed by {signer.name}: {error}"
        ) from None
    if previous.size > new.size:
        raise _refused(
            f"{where} covers {previous.size} records, this one {new.size}: the store holds fewer records than "
            "were witnessed (a log cut short or replaced), or a smaller size was asked for"
        )
    if previous.size:
        try:
            proof = log.prove_consistency(previous.size, new.size)
            merkle.verify_consistency(
                previous.size,
                new.size,
                previous.root,
                new.root,
                [bytes.fromhex(value) for value in proof.consistency],
            )
        except DamageError as error:  # ProofError among them
            raise _refused(
                f"the store's log does not extend {where} (size {previous.size}, root {previous.root.hex()}): "
                f"{error}; its history forked from the witnessed one or was rewritten"
            ) from None
    return previous


def _refused(message: str) -> CheckpointRefusedError:
    _logger.error("refused to publish a checkpoint: %s", message)
    return CheckpointRefusedError(f"Refused to publish the checkpoint: {message}")


def publish_checkpoint(
    path: str | os.PathLike[str],
    signer: Signer,
    nats: str | Sequence[str],
    stream: str,
    origin: str | None = None,
    size: int | None = None,
) -> PublishedCheckpoint:
    """``publish`` for the store at ``path`` (opened read-only, never blocking its writer) to the
    bucket of ``stream`` on the NATS servers ``nats`` (``durable-log checkpoint --publish``)."""

    from ..log.stream.jetstream import JetStreamLink

    async def run() -> PublishedCheckpoint:
        link = JetStreamLink(nats, stream)
        try:
            await link.arun(link.connect())
            env = Environment(path, readonly=True)
            try:
                return await publish(WriteLog(env), signer, link, origin, size)
            finally:
                env.close()
        finally:
            await asyncio.to_thread(link.close)

    return asyncio.run(run())


__all__ = [
    "ATTEMPTS",
    "BUCKET",
    "PublishedCheckpoint",
    "publish",
    "publish_checkpoint",
    "witness_key",
]
