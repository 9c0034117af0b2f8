"""The ``SnapshotStore`` role's promises (``log.stream.link``), the same tests on every engine."""

from __future__ import annotations

import io
import os

import pytest
from pi_durable_lmdb.errors import ReplicationError, StreamMissingError

from .conftest import Engine


async def get(engine: Engine, name: str) -> bytes:
    sink = io.BytesIO()
    await engine(engine.link.snapshots.get(name, sink))
    return sink.getvalue()


async def test_a_snapshot_goes_in_whole_and_comes_back_the_same(engine: Engine) -> None:
    snapshots = engine.link.snapshots
    assert await engine(snapshots.names()) == []
    big = os.urandom(1_300_000)  # more than one chunk of the object store
    await engine(snapshots.put("s1.b", io.BytesIO(big)))
    await engine(snapshots.put("s1.a", io.BytesIO(b"small")))
    assert await engine(snapshots.names()) == ["s1.a", "s1.b"]
    assert await get(engine, "s1.b") == big
    assert await get(engine, "s1.a") == b"small"


async def test_a_put_takes_its_source_from_where_it_stands_and_replaces(engine: Engine) -> None:
    snapshots = engine.link.snapshots
    await engine(snapshots.put("s1.a", io.BytesIO(b"first")))
    source = io.BytesIO(b"skip:second")
    source.seek(5)
    await engine(snapshots.put("s1.a", source))
    assert await engine(snapshots.names()) == ["s1.a"]
    assert await get(engine, "s1.a") == b"second"


async def test_an_empty_snapshot_is_one_too(engine: Engine) -> None:
    await engine(engine.link.snapshots.put("s1.empty", io.BytesIO(b"")))
    assert await engine(engine.link.snapshots.names()) == ["s1.empty"]
    assert await get(engine, "s1.empty") == b""


async def test_a_missing_snapshot_is_refused_and_a_delete_forgets_one(engine: Engine) -> None:
    snapshots = engine.link.snapshots
    with pytest.raises(ReplicationError):
        await get(engine, "s1.none")
    await engine(snapshots.delete("s1.none"))  # nothing to delete: nothing happens
    await engine(snapshots.put("s1.a", io.BytesIO(b"a")))
    await engine(snapshots.put("s1.b", io.BytesIO(b"b")))
    with pytest.raises(ReplicationError):
        await get(engine, "s1.none")
    await engine(snapshots.delete("s1.a"))
    assert await engine(snapshots.names()) == ["s1.b"]
    with pytest.raises(ReplicationError):
        await get(engine, "s1.a")


async def test_without_the_stream_there_are_no_snapshots_and_none_goes_in(bare: Engine) -> None:
    """The bucket is made beside the stream, with its replicas: a put needs the stream; with no
    bucket there is nothing to list, get or delete."""

    snapshots = bare.link.snapshots
    assert await bare(snapshots.names()) == []
    with pytest.raises(ReplicationError):
        await get(bare, "s1.a")
    await bare(snapshots.delete("s1.a"))
    with pytest.raises(StreamMissingError):
        await bare(snapshots.put("s1.a", io.BytesIO(b"a")))
    assert await bare(snapshots.names()) == []


async def test_a_snapshot_that_lost_part_of_itself_is_refused(engine: Engine) -> None:
    big = os.urandom(1_300_000)
    await engine(engine.link.snapshots.put("s1.a", io.BytesIO(big)))
    await engine.lose_chunks("s1.a")
    with pytest.raises(ReplicationError, match="does not match"):
        await get(engine, "s1.a")
