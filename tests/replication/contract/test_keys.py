"""The ``KeyValue`` role's promises (``log.stream.link``), the same tests on every engine: the
lease's compare-and-set and expiry by the engine's clock, and the other buckets' compare-and-set."""

from __future__ import annotations

import pytest
from pi_durable_lmdb.audit.witness import BUCKET
from pi_durable_lmdb.errors import StreamMissingError

from .conftest import Engine


async def test_a_lease_moves_only_from_the_revision_its_put_names(engine: Engine) -> None:
    keys = engine.link.keys
    assert await engine(keys.lease_get("store1")) == (None, 0)
    first = await engine(keys.lease_put("store1", b"one", 0, 60))
    assert first is not None and first > 0
    assert await engine(keys.lease_put("store1", b"two", 0, 60)) is None  # someone moved first
    assert await engine(keys.lease_get("store1")) == (b"one", first)
    second = await engine(keys.lease_put("store1", b"two", first, 60))
    assert second is not None and second > first
    assert await engine(keys.lease_put("store1", b"three", first, 60)) is None
    assert await engine(keys.lease_get("store1")) == (b"two", second)
    assert await engine(keys.lease_get("store2")) == (None, 0)


async def test_a_lease_deleted_at_its_revision_leaves_the_marker_s(engine: Engine) -> None:
    keys = engine.link.keys
    first = await engine(keys.lease_put("store1", b"one", 0, 60))
    await engine(keys.lease_delete("store1", first + 100))  # not at that revision: kept
    assert await engine(keys.lease_get("store1")) == (b"one", first)
    await engine(keys.lease_delete("store1", first))
    value, marker = await engine(keys.lease_get("store1"))
    assert value is None and marker > first
    assert await engine(keys.lease_put("store1", b"two", 0, 60)) is None
    again = await engine(keys.lease_put("store1", b"two", marker, 60))
    assert again is not None and again > marker


async def test_a_lease_is_dropped_its_ttl_after_the_put(engine: Engine) -> None:
    keys = engine.link.keys
    first = await engine(keys.lease_put("store1", b"one", 0, 1))
    assert first is not None
    await engine.lease_gone("store1", 1)
    assert await engine(keys.lease_get("store1")) == (None, 0)
    assert await engine(keys.lease_put("store1", b"late", first, 60)) is None  # it moved on
    assert await engine(keys.lease_put("store1", b"new", 0, 60)) is not None


async def test_a_lease_needs_the_stream(bare: Engine) -> None:
    """The lease is only ever of a store on the stream: without it, the stream is named missing."""

    with pytest.raises(StreamMissingError):
        await bare(bare.link.keys.lease_get("store1"))
    with pytest.raises(StreamMissingError):
        await bare(bare.link.keys.lease_put("store1", b"one", 0, 60))


async def test_a_bucket_put_names_the_revision_it_replaces(bare: Engine) -> None:
    """Buckets need no stream; their values never expire."""

    keys = bare.link.keys
    assert await bare(keys.kv_get(BUCKET, "a/b")) == (None, 0)
    first = await bare(keys.kv_put(BUCKET, "a/b", b"one", 0))
    assert first is not None and first > 0
    assert await bare(keys.kv_put(BUCKET, "a/b", b"two", 0)) is None  # someone put first
    assert await bare(keys.kv_get(BUCKET, "a/b")) == (b"one", first)
    second = await bare(keys.kv_put(BUCKET, "a/b", b"two", first))
    assert second is not None and second > first
    assert await bare(keys.kv_put(BUCKET, "a/b", b"three", first)) is None
    assert await bare(keys.kv_get(BUCKET, "a/b")) == (b"two", second)
    assert await bare(keys.kv_get(BUCKET, "other")) == (None, 0)
    assert await bare(keys.kv_get("elsewhere", "a/b")) == (None, 0)  # buckets do not mix


@pytest.mark.parametrize("key", ["a b", "a*b", "", ".a", "a..b", "a:b", "ü"])
async def test_a_key_the_engine_cannot_hold_is_refused_as_bad_input(
    engine: Engine, key: str
) -> None:
    """Keys are key-value keys (letters, digits, ``-/_=`` and inner dots): another one is the
    caller's mistake, not an engine that did not answer."""

    keys = engine.link.keys
    for call in (
        lambda: keys.kv_get(BUCKET, key),
        lambda: keys.kv_put(BUCKET, key, b"v", 0),
        lambda: keys.lease_get(key),
        lambda: keys.lease_put(key, b"v", 0, 60),
    ):
        with pytest.raises(ValueError, match="key"):
            await engine(call())
