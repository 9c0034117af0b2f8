"""A projected value forged with a valid checksum (XXH3 has no key: anyone who can write the file
can compute it) that does not decode is damage like any other: ``CorruptProjectionError`` naming
the table and key, from point reads and scans, never a decoder's own exception."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from pi_durable_lmdb.errors import CorruptProjectionError
from pi_durable_lmdb.log import codec
from pi_durable_lmdb.projections import tables as t
from pi_durable_lmdb.storage import LmdbStorage

from ..support.reliability_helpers import CTX, seeded, task
from .test_reliability_corruption import edit_on_disk, raw_value


def _never_msgpack(body: bytes) -> bytes:
    return b"\xc1" + body[1:]  # 0xc1 is never used in MessagePack


def _surrogate_object_holding_text(body: bytes) -> bytes:
    """An object with surrogate keys whose payload is a string, not a flat array (ext 8, str 8)."""

    text = b"\xd9" + bytes([len(body) - 5]) + b"x" * (len(body) - 5)
    return b"\xc7" + bytes([len(text)]) + bytes([codec.EXT_OBJECT]) + text


@pytest.mark.parametrize(
    "forge",
    [_never_msgpack, _surrogate_object_holding_text],
    ids=["not-msgpack", "surrogate-object-of-text"],
)
async def test_a_forged_projected_value_with_a_valid_checksum_is_corrupt_projection(
    tmp_path: Path, forge: Callable[[bytes], bytes]
) -> None:
    path = tmp_path / "store"
    storage = await seeded(path)
    key = t.u64(3)
    raw = raw_value(storage, t.TASKS, key)
    await storage.close()
    led = t.SUM_SIZE + t.WRITER_SIZE  # a task row is led by the sequence that wrote it
    body = raw[t.SUM_SIZE : led] + forge(raw[led:])
    assert len(body) == len(raw) - t.SUM_SIZE
    with pytest.raises((msgspec.DecodeError, ValueError)):
        codec.decode(body[t.WRITER_SIZE :])
    assert edit_on_disk(path, key, raw, lambda _: t.seal(body)) >= 1
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        with pytest.raises(
            CorruptProjectionError, match="'tasks' holds a damaged value at key 0000000000000003"
        ):
            await storage.task(3, CTX)
        with pytest.raises(CorruptProjectionError, match="'tasks'"):
            await storage.scan_tasks({}, 10, None, CTX)
    finally:
        await storage.close()


@pytest.mark.parametrize(
    "forge",
    [_never_msgpack, _surrogate_object_holding_text],
    ids=["not-msgpack", "surrogate-object-of-text"],
)
async def test_a_commit_over_a_forged_projected_value_is_refused_as_corrupt_projection(
    tmp_path: Path, forge: Callable[[bytes], bytes]
) -> None:
    """Folding a task update reads the task's previous value (for its status index): a forged one
    is damage, and the commit is refused with nothing written."""

    path = tmp_path / "store"
    storage = await seeded(path)
    key = t.u64(3)
    raw = raw_value(storage, t.TASKS, key)
    await storage.close()
    led = t.SUM_SIZE + t.WRITER_SIZE
    edit_on_disk(path, key, raw, lambda _: t.seal(raw[t.SUM_SIZE : led] + forge(raw[led:])))
    storage = await LmdbStorage.open(path, durability="process")
    try:
        head = storage.log.head()
        with pytest.raises(
            CorruptProjectionError, match="'tasks' holds a damaged value at key 0000000000000003"
        ):
            await storage.commit([task(3, "waiting")], CTX)
        assert storage.log.head() == head
    finally:
        await storage.close()
