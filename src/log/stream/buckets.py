"""Key-value buckets beside a stream on NATS JetStream, ``<stream>-<bucket>``, other than the
lease's: values that never expire, each put conditional on the key's revision (a compare-and-set,
so two writers cannot both move a key from the same value). ``audit.witness`` keeps the last
signed checkpoint of each log there.

A bucket is made on first use, with the stream's replicas when the stream exists (a bucket needs
no stream of the store's), keeping the last ``HISTORY`` values of each key.
"""

from __future__ import annotations

from typing import Any, Final

from ...errors import NatsUnavailableError, ReplicationError

HISTORY: Final = 64
"""Values a key keeps (NATS's most): an auditor can read the last 64 checkpoints put."""
WRONG_LAST_SEQUENCE: Final = frozenset({10071, 10164})
"""A conditional put whose key is no longer at the revision it named (``jetstream.MOVED_CODES``'
first two)."""


async def _bucket(js: Any, stream: str, bucket: str, cache: dict[str, Any]) -> Any:
    import nats.js.errors
    from nats.js.api import KeyValueConfig

    name = f"{stream}-{bucket}"
    kv = cache.get(name)
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
        cache[name] = kv
    return kv


async def get(
    js: Any, stream: str, bucket: str, key: str, cache: dict[str, Any]
) -> tuple[bytes | None, int]:
    """``(value, revision)`` of ``key``; ``(None, 0)`` when it was never set (``None`` and the
    delete marker's revision when it was deleted)."""

    import nats.errors
    import nats.js.errors

    try:
        kv = await _bucket(js, stream, bucket, cache)
        entry = await kv.get(key)
    except nats.js.errors.KeyNotFoundError as error:  # KeyDeletedError too: its marker's revision
        found = getattr(error, "entry", None)
        return None, 0 if found is None or not found.revision else int(found.revision)
    except (TimeoutError, nats.errors.Error) as error:
        raise _failed(f"{stream}-{bucket}", key, error) from None
    return bytes(entry.value or b""), int(entry.revision)


async def put(
    js: Any, stream: str, bucket: str, key: str, value: bytes, revision: int, cache: dict[str, Any]
) -> int | None:
    """Set ``key`` to ``value`` only if its revision is ``revision`` (0: never set): the new
    revision, or ``None`` when the key moved."""

    import nats.errors
    import nats.js.errors

    name = f"{stream}-{bucket}"
    try:
        await _bucket(js, stream, bucket, cache)
        ack = await js.publish(
            f"$KV.{name}.{key}",
            value,
            headers={"Nats-Expected-Last-Subject-Sequence": str(revision)},
        )
    except nats.js.errors.APIError as error:
        if error.err_code in WRONG_LAST_SEQUENCE:
            return None
        raise _failed(name, key, error) from None
    except (TimeoutError, nats.errors.Error) as error:
        raise _failed(name, key, error) from None
    return int(ack.seq)


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
    "get",
    "put",
]
