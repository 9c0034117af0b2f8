"""Shared fixtures: which Storage backend the tests open.

The default backend is ``LmdbStorage`` (``from pi_durable_lmdb import LmdbStorage``); when it cannot be
imported the tests fail, they never skip. ``PI_DURABLE_LMDB_TEST_BACKEND`` selects a stand-in
while the engine is being written:

* ``lmdb`` (default): ``await LmdbStorage.open(directory, durability="process")``
* ``sqlite``: pi_durable's ``SqliteStorage`` on ``<directory>/durable.sqlite``
* ``memory``: pi_durable's ``MemoryStorage``; reopening a directory hands a new instance the
  closed one's state, so close-and-reopen tests have something to reopen.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

BACKEND = (os.environ.get("PI_DURABLE_LMDB_TEST_BACKEND") or "lmdb").strip().lower()
if BACKEND not in ("lmdb", "sqlite", "memory"):
    raise RuntimeError(
        f"PI_DURABLE_LMDB_TEST_BACKEND must be lmdb, sqlite or memory; got {BACKEND!r}"
    )

OpenStorage = Callable[[str], Awaitable[Any]]

# memory stand-in: the last instance opened on each directory.
_memory_stores: dict[str, Any] = {}


async def _open_memory(path: str) -> Any:
    from pi_durable.storage.memory import MemoryStorage

    os.makedirs(path, exist_ok=True)
    key = os.path.realpath(path)
    storage = MemoryStorage()
    previous = _memory_stores.get(key)
    if previous is not None:
        if not previous._closed:
            raise RuntimeError(f"memory stand-in: {path} is still open")
        storage._state = previous._state
        storage._next_id = previous._next_id
        storage._next_seq = previous._next_seq
    _memory_stores[key] = storage
    return storage


async def _open_sqlite(path: str) -> Any:
    from pi_durable.storage.sqlite.posix import open_posix_sqlite_storage

    os.makedirs(path, exist_ok=True)
    return await open_posix_sqlite_storage(os.path.join(path, "durable.sqlite"))


async def _open_lmdb(path: str) -> Any:
    from pi_durable_lmdb.storage import LmdbStorage  # an ImportError here fails the test

    return await LmdbStorage.open(path, durability="process")


async def open_storage_at(path: str) -> Any:
    """Open (or reopen) the selected backend on one directory."""

    if BACKEND == "memory":
        return await _open_memory(path)
    if BACKEND == "sqlite":
        return await _open_sqlite(path)
    return await _open_lmdb(path)


@pytest.fixture
def backend() -> str:
    """Name of the backend under test: ``lmdb``, ``sqlite`` or ``memory``."""

    return BACKEND


@pytest.fixture
def open_storage() -> OpenStorage:
    """``await open_storage(directory)`` opens or reopens the backend under test there."""

    return open_storage_at
