"""Reliability, corruption, against real files (no mocks): damaged log records and
projection values are detected and named, and a rebuild repairs damaged projections.

``docs/reliability.md`` says what each of these promises. Known bugs are ``xfail(strict=True)``
with a reason starting "BUG": they turn into failures the day the bug is fixed, as a reminder.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.errors import CorruptProjectionError
from pi_durable_lmdb.log import CorruptRecordError, seq_key
from pi_durable_lmdb.projections import tables as t
from pi_durable_lmdb.storage import LmdbStorage

from ..support.reliability_helpers import CHILD_ENV, SEED, cli, kill, seeded

# ── 3. corruption ─────────────────────────────────────────────────────────────


def edit_on_disk(path: Path, key: bytes, value: bytes, damage: Callable[[bytes], bytes]) -> int:
    """Rewrite ``value`` where LMDB stored it after ``key`` (a leaf node: key, then value) in
    ``data.mdb``; returns how many copies were changed (stale copies on free pages too)."""

    damaged = damage(value)
    assert len(damaged) == len(value) and damaged != value
    file = path / "data.mdb"
    data = bytearray(file.read_bytes())
    needle = key + value
    hits = 0
    start = data.find(needle)
    while start != -1:
        data[start + len(key) : start + len(needle)] = damaged
        hits += 1
        start = data.find(needle, start + 1)
    assert hits >= 1, "the value was not found on disk"
    file.write_bytes(bytes(data))
    return hits


def raw_value(storage: LmdbStorage, table: str, key: bytes) -> bytes:
    with storage._env.read() as txn:
        value = txn.get(key, db=storage._model.db[table])
    assert value is not None
    return bytes(value)


async def test_a_damaged_log_record_is_named_and_never_served(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await seeded(path)
    target = 2  # the entry "hello"
    with storage._env.read() as txn:
        raw = bytes(txn.get(seq_key(target), db=storage.log.db))
    await storage.close()
    middle = len(raw) - 8
    edit_on_disk(
        path,
        seq_key(target),
        raw,
        lambda v: v[:middle] + bytes([v[middle] ^ 0x04]) + v[middle + 1 :],
    )

    storage = await LmdbStorage.open(path, readonly=True)
    try:
        with pytest.raises(
            CorruptRecordError, match="Log record 2 is corrupt: checksum mismatch"
        ) as caught:
            storage.log.get(target)
        assert caught.value.seq == target
        assert storage.log.get(1) is not None and storage.log.get(3) is not None
        served = []
        with pytest.raises(CorruptRecordError):
            for commit in storage.log.read(1):
                served.append(commit.seq)
        assert served == [1]
    finally:
        await storage.close()
    with pytest.raises(CorruptRecordError, match="Log record 2"):
        verify(path)
    for command in (["verify", path], ["tail", path, "--from", "1", "--json"], ["export", path]):
        done = cli(*command)
        assert done.returncode != 0, command
        assert "Log record 2 is corrupt" in done.stderr, (command, done.stderr)
        assert '"seq":2' not in done.stdout and "hello" not in done.stdout
    # the store still takes commits: the damage is old history, the head is intact
    storage = await LmdbStorage.open(path)
    try:
        assert (
            await storage.commit(
                [{"type": "entry", "value": {"id": 100, "conversationId": 1}}], CTX
            )
            == len(SEED) + 1
        )
    finally:
        await storage.close()


def _undecodable(value: bytes) -> bytes:
    return b"\xc1" + value[1:]  # 0xc1 is never used in MessagePack


def _plausible(value: bytes) -> bytes:
    return value.replace(b"running", b"runninG")


@pytest.mark.parametrize("damage", [_undecodable, _plausible], ids=["undecodable", "plausible"])
async def test_a_damaged_projection_is_found_by_verify_and_repaired_by_rebuild(
    tmp_path: Path, damage: Any
) -> None:
    path = tmp_path / "store"
    storage = await seeded(path)
    key = t.u64(3)
    raw = raw_value(storage, t.TASKS, key)
    expected = await storage.task(3, CTX)
    await storage.close()
    edit_on_disk(path, key, raw, damage)

    difference = verify(path)
    assert difference is not None
    assert difference.database == t.TASKS and difference.key == key, str(difference)
    assert str(difference) == "task 3 holds a value the log does not produce (table tasks)"
    done = cli("verify", path)
    assert (
        done.returncode == 1
        and "task 3 holds a value the log does not produce (table tasks)" in done.stderr
    )

    done = cli("rebuild", path)
    assert done.returncode == 0, done.stderr
    assert verify(path) is None
    assert cli("verify", path).returncode == 0
    storage = await LmdbStorage.open(path)
    try:
        assert await storage.task(3, CTX) == expected
    finally:
        await storage.close()


async def test_an_undecodable_projection_value_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await seeded(path)
    key = t.u64(3)
    raw = raw_value(storage, t.TASKS, key)
    await storage.close()
    edit_on_disk(path, key, raw, _undecodable)
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        with pytest.raises(CorruptProjectionError):
            await storage.task(3, CTX)
        with pytest.raises(CorruptProjectionError):
            await storage.scan_tasks({}, 10, None, CTX)
    finally:
        await storage.close()


async def test_a_plausibly_damaged_projection_value_is_not_served(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await seeded(path)
    raw = raw_value(storage, t.TASKS, t.u64(3))
    await storage.close()
    edit_on_disk(path, t.u64(3), raw, _plausible)
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        with pytest.raises(
            CorruptProjectionError, match="'tasks' holds a damaged value at key 0000000000000003"
        ):
            await storage.task(3, CTX)
        with pytest.raises(CorruptProjectionError):
            await storage.scan_tasks({}, 10, None, CTX)
    finally:
        await storage.close()
    assert verify(path) is not None, "verify finds it too"


async def test_a_failed_rebuild_leaves_the_store_writable(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await seeded(path)
    with storage._env.read() as txn:
        raw = bytes(txn.get(seq_key(2), db=storage.log.db))
    await storage.close()
    edit_on_disk(path, seq_key(2), raw, lambda v: v[:-1] + bytes([v[-1] ^ 0x01]))
    storage = await LmdbStorage.open(path)  # writable before the rebuild
    await storage.close()
    done = cli("rebuild", path)
    assert done.returncode == 1 and "Log record 2 is corrupt" in done.stderr  # 1: damage found
    storage = await LmdbStorage.open(path)  # BUG: raises CorruptRecordError (seq 2)
    await storage.close()


KILL_WHEN_BUILT = """
import asyncio, sys, time
from pi_durable_lmdb.projections import tables
tables.SCHEMA_VERSION += 1  # a newer program: its open rebuilds the projections
from pi_durable_lmdb.storage import LmdbStorage

def progress(folded, head):
    if folded >= head:  # the new generation is complete; the swap comes next
        print("built", flush=True)
        time.sleep(3600)

asyncio.run(LmdbStorage.open(sys.argv[1], progress=progress))
"""


async def test_a_rebuild_swap_that_fills_the_map_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    storage = await seeded(path)
    for id in range(100, 400):
        await storage.commit(
            [{"type": "entry", "value": {"id": id, "conversationId": 1, "text": "x" * 1000}}], CTX
        )
    await storage.close()
    builder = subprocess.Popen(
        [sys.executable, "-c", KILL_WHEN_BUILT, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )
    try:
        assert builder.stdout is not None and builder.stdout.readline().strip() == "built"
    finally:
        kill(builder)
    monkeypatch.setattr(t, "SCHEMA_VERSION", t.SCHEMA_VERSION + 1)
    # The map starts at the file's size, so the swap's transaction fills it and is retried.
    storage = await LmdbStorage.open(path, map_size=64 * 1024)  # BUG: InvalidParameterError
    try:
        assert storage.log.head() == len(SEED) + 300
    finally:
        await storage.close()
    assert verify(path) is None
