"""JetStream's key-value role (``link.KeyValue``): the lease's bucket and the others beside a
stream.

The lease is one key (the store id) of the bucket ``<stream>-leases``, keeping one value per key,
each put conditional on the key's revision and carrying a per-message TTL, so the server drops it
by its own clock (``lease.WriterLease``).

Other buckets, ``<stream>-<bucket>``: values that never expire, each put conditional on the key's
revision (a compare-and-set, so two writers cannot both move a key from the same value).
``audit.witness`` keeps the last signed checkpoint of each log there. A bucket is made on first
use, with the stream's replicas when the stream exists (a bucket needs no stream of the store's),
keeping the last ``HISTORY`` values of each key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from ...errors import NatsUnavailableError, ReplicationError, StreamMissingError
from .connection import NatsConnection
from .link import check_key
from .message import H_EXPECTED

HISTORY: Final = 64
"""Values a key keeps (NATS's most): an auditor can read the last 64 checkpoints put."""
WRONG_LAST_SEQUENCE: Final = frozenset({10071, 10164})
"""A conditional put whose key is no longer at the revision it named (``jetstream.MOVED_CODES``'
first two)."""


class JetStreamKeys:
    """The key-value role of a ``JetStreamLink``: coroutines of the link's loop."""

    def __init__(self, connection: NatsConnection) -> None:
        self.connection = connection
        self.clock: Callable[[], float] = time.monotonic
        self._lease_bucket: Any = None
        self._buckets: dict[str, Any] = {}

    async def _leases(self) -> Any:
        """The lease bucket, made (one value per key, the stream's replicas) when missing;
        ``StreamMissingError`` without the stream, as the lease is only ever of a store on it."""

        if self._lease_bucket is None:
            import nats.js.errors
            from nats.js.api import KeyValueConfig

            js, stream = self.connection.js, self.connection.stream
            try:
                self._lease_bucket = await js.key_value(f"{stream}-leases")
            except nats.js.errors.BucketNotFoundError:
                try:
                    info = await js.stream_info(stream)
                except nats.js.errors.NotFoundError:
                    raise StreamMissingError(f"NATS has no stream {stream!r}") from None
                self._lease_bucket = await js.create_key_value(
                    KeyValueConfig(
                        bucket=f"{stream}-leases",
                        history=1,
                        replicas=info.config.num_replicas or 1,
                    )
                )
        return self._lease_bucket

    async def lease_get(self, key: str) -> tuple[bytes | None, int]:
        check_key(key)
        import nats.errors
        import nats.js.errors

        try:
            kv = await self._leases()
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError as error:
            return None, _revision_of_missing(error)
        except (TimeoutError, nats.errors.Error, nats.js.errors.Error) as error:
            raise NatsUnavailableError(
                f"NATS did not answer for the lease {key} ({type(error).__name__}: {error})"
            ) from None
        return entry.value, int(entry.revision)

    async def lease_put(self, key: str, value: bytes, revision: int, ttl: float) -> int | None:
        check_key(key)
        import nats.errors
        import nats.js.errors

        await self._leases()
        try:
            ack = await self.connection.js.publish(
                f"$KV.{self.connection.stream}-leases.{key}",
                value,
                headers={H_EXPECTED: str(revision)},
                msg_ttl=float(ttl),
            )
        except nats.js.errors.APIError as error:
            if error.err_code in WRONG_LAST_SEQUENCE:
                return None
            raise ReplicationError(f"NATS refused the lease {key}: {error}") from None
        except (TimeoutError, nats.errors.Error) as error:
            raise NatsUnavailableError(
                f"NATS did not answer for the lease {key} ({type(error).__name__})"
            ) from None
        return int(ack.seq)

    async def lease_delete(self, key: str, revision: int) -> None:
        import nats.errors
        import nats.js.errors

        try:
            kv = await self._leases()
            await kv.delete(key, last=revision)
        except (TimeoutError, nats.js.errors.Error, nats.errors.Error):
            pass  # it expires by itself

    async def kv_get(self, bucket: str, key: str) -> tuple[bytes | None, int]:
        """``(value, revision)`` of ``key``; ``(None, 0)`` when it was never set (``None`` and the
        delete marker's revision when it was deleted)."""

        check_key(key)
        import nats.errors
        import nats.js.errors

        try:
            kv = await self._bucket(bucket)
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError as error:
            return None, _revision_of_missing(error)
        except (TimeoutError, nats.errors.Error) as error:
            raise _failed(f"{self.connection.stream}-{bucket}", key, error) from None
        return bytes(entry.value or b""), int(entry.revision)

    async def kv_put(self, bucket: str, key: str, value: bytes, revision: int) -> int | None:
        """Set ``key`` to ``value`` only if its revision is ``revision`` (0: never set): the new
        revision, or ``None`` when the key moved."""

        check_key(key)
        import nats.errors
        import nats.js.errors

        name = f"{self.connection.stream}-{bucket}"
        try:
            await self._bucket(bucket)
            ack = await self.connection.js.publish(
                f"$KV.{name}.{key}",
                value,
                headers={H_EXPECTED: str(revision)},
            )
        except nats.js.errors.APIError as error:
            if error.err_code in WRONG_LAST_SEQUENCE:
                return None
            raise _failed(name, key, error) from None
        except (TimeoutError, nats.errors.Error) as error:
            raise _failed(name, key, error) from None
        return int(ack.seq)

    async def _bucket(self, bucket: str) -> Any:
        """The bucket ``<stream>-<bucket>``, made on first use (the stream's replicas when it
        exists, ``HISTORY`` values a key)."""

        import nats.js.errors
        from nats.js.api import KeyValueConfig

        js, stream = self.connection.js, self.connection.stream
        name = f"{stream}-{bucket}"
        kv = self._buckets.get(name)
        if kv is None:
            try:
                kv = await js.key_value(name)
            except nats.js.errors.BucketNotFoundError:
                try:
                    replicas = (await js.stream_info(stream)).config.num_replicas or 1
                except nats.js.errors.NotFoundError:
                    replicas = 1
                kv = await js.create_key_value(
                    KeyValueConfig(bucket=name, history=HISTORY, replicas=replicas)
                )
            self._buckets[name] = kv
        return kv


def _revision_of_missing(error: BaseException) -> int:
    """The revision of a key nats-py found missing: 0 when it was never set, its delete
    marker's when it was deleted (``KeyDeletedError``, a ``KeyNotFoundError``, carries it)."""

    found = getattr(error, "entry", None)
    return 0 if found is None or not found.revision else int(found.revision)


def _failed(bucket: str, key: str, error: BaseException) -> ReplicationError:
    import nats.js.errors

    if isinstance(error, nats.js.errors.APIError) and not isinstance(
        error, nats.js.errors.ServiceUnavailableError
    ):
        return ReplicationError(
            f"NATS refused the key {key} of bucket {bucket}: {error.description or error}"
        )
    return NatsUnavailableError(
        f"NATS did not answer for the key {key} of bucket {bucket} ({type(error).__name__}: {error})"
    )


__all__ = [
    "HISTORY",
    "WRONG_LAST_SEQUENCE",
    "JetStreamKeys",
]
