"""How much a user projection's build grows a ``power`` store's file.

A build's chunks are write transactions that hold no log record, so they write no journal frame;
the pages each chunk frees can be reused only once a checkpoint moves the pin that keeps the
last checkpoint's pages (``log.journaled``). Without checkpoints during a build the file grew by
many times the projection's size; it must stay within about twice the projection's live bytes.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.projections.user import Projection, Tables
from pi_durable_lmdb.projections.userstate import db_names, stored
from pi_durable_lmdb.storage import LmdbStorage

COMMITS = 10_000
"""Commits in the store: enough chunks that a build without checkpoints grew the file ~4x."""
SLACK = 1 << 20
"""Bytes of growth allowed beyond twice the projection's live bytes: the status rows, the trees'
branch pages and LMDB's free-page list."""


class Notes(Projection):
    """One row of ~200 bytes per record, and a running count rewritten every record."""

    name = "notes"
    version = 1
    databases = ("main",)

    def fold(self, tables: Tables, commit: Commit) -> None:
        raw = tables.get("main", b"count")
        tables.put("main", b"count", str(0 if raw is None else int(raw) + 1).encode())
        tables.put(
            "main",
            commit.seq.to_bytes(8, "big"),
            (f"{self.version}:{commit.seq}:" * 20)[:200].encode(),
        )


class NotesV2(Notes):
    version = 2


def _entry(id: int) -> dict[str, object]:
    return {
        "type": "entry",
        "value": {"id": id, "conversationId": 1, "kind": "message", "text": "x" * 100},
    }


async def _fill(path: Path) -> None:
    storage = await LmdbStorage.open(path, durability="power")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for first in range(2, COMMITS + 1, 100):
            await asyncio.gather(
                *(storage.commit([_entry(n)], CTX) for n in range(first, first + 100))
            )
    finally:
        await storage.close()


async def _build(path: Path, projection: Projection) -> int:
    """Open with ``projection``, wait until it serves level with the log, close; its live bytes."""

    storage = await LmdbStorage.open(path, durability="power", projections=[projection])
    try:
        await asyncio.wait_for(storage.projections.wait(storage.log.head()), 120)
        served, _, _ = stored(storage._env)
        status = served[projection.name]
        assert status.version == projection.version
        names = db_names(projection.name, status.slot, status.databases or [])
        pages = storage._env.page_stats()
        live = sum(pages.dbs[name].bytes for name in names)
    finally:
        await storage.close()
    return live


def _size(path: Path) -> int:
    return os.path.getsize(path / "data.mdb")


async def test_a_power_build_grows_the_file_by_at_most_twice_the_projections_live_bytes(
    tmp_path: Path,
) -> None:
    """A build over 10,000 commits, then a second version's build beside it: each grows
    ``data.mdb`` by at most twice the served version's live bytes (and ``SLACK``)."""

    path = tmp_path / "store"
    await _fill(path)
    before = _size(path)
    live = await _build(path, Notes())
    grown = _size(path) - before
    assert grown <= 2 * live + SLACK, f"a build of {live} live bytes grew data.mdb by {grown} bytes"
    before = _size(path)
    live = await _build(path, NotesV2())
    grown = _size(path) - before
    assert grown <= 2 * live + SLACK, (
        f"a rebuild of {live} live bytes grew data.mdb by {grown} bytes"
    )
