"""LMDB map growth while other threads of the process read (tests/support/growth_child.py).

``mdb_env_set_mapsize`` (a growth, or a reader adopting a map another process grew) replaces the
memory map, and LMDB requires that no transaction of the process be active meanwhile. Reads run
inline on their callers' threads, so the environment must keep them out while the map changes:
no read may fail, crash or see wrong data, and every acknowledged commit must be there.
Each case runs in a child process: where the binding does not guard the remap, a reader touching
the old map dies with SIGSEGV.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import MapBusyError
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log import environment
from pi_durable_lmdb.storage import LmdbStorage

from ..support import growth_child

ROOT = Path(__file__).resolve().parents[2]
SMALL = 64 * 1024


def _child(*args: str, stdin: Any = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.growth_child", *args],
        cwd=ROOT,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str], stdin: str | None = None) -> dict[str, Any]:
    try:
        out, err = proc.communicate(stdin, timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the child hung; stderr: {err[-4000:]}") from None
    assert proc.returncode == 0, f"the child died ({proc.returncode}); stderr: {err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _assert_clean(result: dict[str, Any]) -> None:
    errors = result["errors"]
    assert not errors, f"{len(errors)} reader thread(s) failed; the first:\n{errors[0]}"
    assert result["reads"] > 0


def test_map_growth_while_reader_threads_read(tmp_path: Path) -> None:
    """A tiny map grows at least four times (group commits on the writer thread and direct ones)
    while four threads, each on its own loop, read the store without a pause."""

    path = tmp_path / "store"
    result = _result(
        _child("writer", str(path), "--map-size", str(SMALL), "--readers", "4", "--commits", "600")
    )
    _assert_clean(result)
    assert result["growths"] >= 4 and result["end_size"] > result["start_size"], result
    assert result["acked"] == 600 and result["lost"] == []
    assert verify(path) is None


def test_reader_threads_adopt_a_map_grown_by_another_process(tmp_path: Path) -> None:
    """A read-only process reads from four threads while the writer (this process) grows the
    map: its threads adopt the new size (``MapResizedError``) while the others hold reads."""

    path = tmp_path / "store"

    async def seed() -> LmdbStorage:
        storage = await LmdbStorage.open(path, durability="process", map_size=SMALL)
        await storage.commit(growth_child.seed_writes(), CTX)
        await storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
        return storage

    storage = asyncio.run(seed())
    try:
        proc = _child(
            "reader", str(path), "--map-size", str(SMALL), "--readers", "4", stdin=subprocess.PIPE
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        acked = asyncio.run(growth_child.commit_many(storage, 600, 6000, 8))
        head = storage.log.head()
    finally:
        asyncio.run(storage.close())
    result = _result(proc, "")
    _assert_clean(result)
    assert len(acked) == 600
    assert result["head"] == head
    assert result["end_size"] >= 2**6 * result["start_size"], (
        result
    )  # the reader adopted a grown map
    assert verify(path) is None


async def test_a_read_held_open_fails_the_growing_commit_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read transaction left open on the committing thread: the map cannot change under it, so
    the commit that needs a bigger map fails with ``MapBusyError`` (writing nothing) once the
    growth's patience runs out, rather than waiting for ever; after the read ends it succeeds."""

    monkeypatch.setattr(environment, "REMAP_PATIENCE", 0.3)
    storage = await LmdbStorage.open(tmp_path / "store", durability="process", map_size=SMALL)
    try:
        await storage.commit(growth_child.seed_writes(), CTX)
        await storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
        size = storage._env.env.info()["map_size"]
        held = storage._env.read()
        try:
            with pytest.raises(MapBusyError):
                for n in range(1000):
                    await storage.commit([growth_child.big_entry(10_000 + n, 20_000)], CTX)
            failed = 10_000 + n
            head = storage.log.head()  # reads still work meanwhile
            together = await asyncio.gather(  # a group on the writer thread fails as a whole, once
                *(
                    storage.commit([growth_child.big_entry(20_000 + k, 20_000)], CTX)
                    for k in range(8)
                ),
                return_exceptions=True,
            )
            assert all(isinstance(outcome, MapBusyError) for outcome in together), together
            assert storage.log.head() == head
        finally:
            held.abort()
        assert storage._env.env.info()["map_size"] == size
        assert await storage.entry(failed, CTX) is None  # the failed commit wrote nothing
        seq = await storage.commit([growth_child.big_entry(failed, 20_000)], CTX)
        assert seq == head + 1
        # Grown, or not even needed: once the read ends, the pages it kept are free again.
        assert storage._env.env.info()["map_size"] >= size
    finally:
        await storage.close()
    assert verify(tmp_path / "store") is None
