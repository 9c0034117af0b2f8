"""JetStream's snapshot role (``link.SnapshotStore``): an object store named ``<stream>-snapshots``.

JetStream's object store cuts an object into chunks on a stream of its own and publishes its
description (size, chunk count, SHA-256 digest) last: an object whose upload was cut short has no
description, so it is never listed, and a reader checks the digest of what it got against it.
The bucket is made, with as many replicas as the stream, the first time a snapshot goes in.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Any, BinaryIO, Final

from ...errors import NatsUnavailableError, ReplicationError, StreamMissingError
from .connection import NatsConnection
from .direct import direct_batch
from .message import RawMessage

CHUNK: Final = 512 * 1024
"""Bytes per chunk of an object (under the server's default largest message, 1 MiB)."""
CHUNKS_PER_BATCH: Final = 32
"""Chunks per batched direct get while reading an object back."""
DIGEST_PREFIX: Final = "SHA-256="
"""How the object store writes an object's digest (URL-safe base64 after it)."""


class JetStreamSnapshots:
    """The snapshot role of a ``JetStreamLink``: coroutines of the link's loop."""

    def __init__(self, connection: NatsConnection) -> None:
        self.connection = connection

    async def put(self, name: str, source: BinaryIO) -> None:
        await put(self.connection.js, self.connection.stream, name, source)

    async def names(self) -> list[str]:
        return await names(self.connection.js, self.connection.stream)

    async def get(self, name: str, sink: BinaryIO) -> None:
        connection = self.connection
        await get(connection.js, connection.nc, connection.stream, name, sink, connection.timeout)

    async def delete(self, name: str) -> None:
        connection = self.connection
        await delete(connection.js, connection.nc, connection.stream, name, connection.timeout)


def bucket_name(stream: str) -> str:
    return f"{stream}-snapshots"


async def bucket(js: Any, stream: str, create: bool) -> Any | None:
    """The stream's snapshot bucket; made (as many replicas as the stream) when ``create``,
    else ``None`` when there is none."""

    import nats.errors
    import nats.js.errors
    from nats.js.api import ObjectStoreConfig, StorageType

    name = bucket_name(stream)
    try:
        try:
            return await js.object_store(name)
        except nats.js.errors.BucketNotFoundError:
            if not create:
                return None
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                raise StreamMissingError(
                    f"NATS has no stream {stream!r} to keep snapshots beside"
                ) from None
            config = ObjectStoreConfig(
                bucket=name,
                replicas=info.config.num_replicas or 1,
                storage=StorageType.FILE,
                description=f"snapshots of the stores on stream {stream}",
            )
            return await js.create_object_store(name, config=config)
    except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError) as error:
        raise NatsUnavailableError(
            f"NATS did not answer for the bucket {name} ({type(error).__name__})"
        ) from None
    except nats.errors.Error as error:
        raise ReplicationError(f"NATS refused the bucket {name}: {error}") from None


async def put(js: Any, stream: str, name: str, source: BinaryIO) -> None:
    """Upload ``source`` (from where it stands to its end) as object ``name``."""

    import nats.errors
    from nats.js.api import ObjectMeta, ObjectMetaOptions

    store = await bucket(js, stream, create=True)
    assert store is not None
    try:
        await store.put(
            name,
            source,
            meta=ObjectMeta(name=name, options=ObjectMetaOptions(max_chunk_size=CHUNK)),
        )
    except (TimeoutError, nats.errors.TimeoutError) as error:
        raise NatsUnavailableError(
            f"NATS did not take the snapshot {name} ({type(error).__name__})"
        ) from None
    except nats.errors.Error as error:
        raise ReplicationError(f"NATS refused the snapshot {name}: {error}") from None


async def names(js: Any, stream: str) -> list[str]:
    """The names of the bucket's complete objects (none: no bucket, or nothing in it)."""

    import nats.errors
    import nats.js.errors

    store = await bucket(js, stream, create=False)
    if store is None:
        return []
    try:
        entries = await store.list(ignore_deletes=True)
    except nats.js.errors.NotFoundError:
        return []
    except (TimeoutError, nats.errors.TimeoutError) as error:
        raise NatsUnavailableError(
            f"NATS did not list the snapshots of {stream} ({type(error).__name__})"
        ) from None
    return sorted(entry.name for entry in entries if not entry.deleted)


async def get(js: Any, nc: Any, stream: str, name: str, sink: BinaryIO, timeout: float) -> None:
    """Write object ``name`` to ``sink``; ``ReplicationError`` when it is missing or its
    content does not match its digest. Its chunks come in batched direct gets (``direct``: the
    bucket's stream allows them), the next batch fetched while this one is written."""

    import nats.errors
    import nats.js.errors

    store = await bucket(js, stream, create=False)
    if store is None:
        raise ReplicationError(f"Stream {stream} has no snapshot bucket ({bucket_name(stream)})")
    try:
        info = await store.get_info(name)
    except nats.js.errors.NotFoundError:
        raise ReplicationError(f"The snapshot {name} is not in {bucket_name(stream)}") from None
    except (TimeoutError, nats.errors.Error) as error:
        raise NatsUnavailableError(
            f"NATS did not describe the snapshot {name} ({type(error).__name__})"
        ) from None
    chunks, size = int(info.chunks or 0), int(info.size or 0)
    digest = str(info.digest or "")
    if not info.nuid or not digest.upper().startswith(DIGEST_PREFIX.upper()):
        raise ReplicationError(f"The snapshot {name} has no chunks or digest in its description")
    subject, objects = f"$O.{bucket_name(stream)}.C.{info.nuid}", f"OBJ_{bucket_name(stream)}"
    hashed, got, written, after = hashlib.sha256(), 0, 0, 0

    def write(batch: list[RawMessage]) -> int:
        count = 0
        for message in batch:
            hashed.update(message.data)
            sink.write(message.data)
            count += len(message.data)
        return count

    fetching: asyncio.Future[list[RawMessage]] | None = asyncio.ensure_future(
        direct_batch(
            nc, objects, subject, after, CHUNKS_PER_BATCH, CHUNKS_PER_BATCH * CHUNK, timeout
        )
    )
    try:
        while fetching is not None:
            batch = await fetching
            fetching = None
            if not batch:
                break
            got += len(batch)
            if got < chunks:
                fetching = asyncio.ensure_future(
                    direct_batch(
                        nc,
                        objects,
                        subject,
                        batch[-1].stream_seq,
                        CHUNKS_PER_BATCH,
                        CHUNKS_PER_BATCH * CHUNK,
                        timeout,
                    )
                )
            written += await asyncio.to_thread(write, batch)
    finally:
        if fetching is not None:
            fetching.cancel()
    encoded = digest[len(DIGEST_PREFIX) :].rstrip("=")
    expected = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    if got != chunks or written != size or hashed.digest() != expected:
        raise ReplicationError(
            f"The snapshot {name} does not match its description ({got} of {chunks} chunks, {written} of {size} bytes"
            + (")" if written != size or got != chunks else ", another digest)")
        )


async def _erase_chunks(
    js: Any, nc: Any, store: Any, stream: str, name: str, timeout: float
) -> None:
    """Delete object ``name``'s chunks one by one with JetStream's secure delete (the server
    overwrites each), before the object store's own delete purges what is left: a snapshot
    dropped after an erasure leaves none of its bytes in the bucket's stream."""

    info = await store.get_info(name)
    if not info.nuid:
        return
    subject, objects = f"$O.{bucket_name(stream)}.C.{info.nuid}", f"OBJ_{bucket_name(stream)}"
    after = 0
    while True:
        batch = await direct_batch(
            nc, objects, subject, after, CHUNKS_PER_BATCH, CHUNKS_PER_BATCH * CHUNK, timeout
        )
        if not batch:
            return
        for chunk in batch:
            await js.delete_msg(objects, chunk.stream_seq)
        after = batch[-1].stream_seq


async def delete(js: Any, nc: Any, stream: str, name: str, timeout: float) -> None:
    import nats.errors
    import nats.js.errors

    store = await bucket(js, stream, create=False)
    if store is None:
        return
    try:
        await _erase_chunks(js, nc, store, stream, name, timeout)
        await store.delete(name)
    except nats.js.errors.NotFoundError:
        pass
    except (TimeoutError, nats.errors.Error) as error:
        raise NatsUnavailableError(
            f"NATS did not delete the snapshot {name} ({type(error).__name__})"
        ) from None


__all__ = [
    "CHUNK",
    "CHUNKS_PER_BATCH",
    "DIGEST_PREFIX",
    "JetStreamSnapshots",
    "bucket",
    "bucket_name",
    "delete",
    "get",
    "names",
    "put",
]
