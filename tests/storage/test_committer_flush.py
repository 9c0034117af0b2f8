"""Where a commit's device flush runs: never on the caller's event loop.

A ``power`` commit waits for the journal's flush (an ``fdatasync`` of a segment), milliseconds on
most devices; run on the loop's thread, it stalls every other task of the loop, even when the
commit has the store to itself. The flushes are observed at the ``os`` seam the I/O-fault tooling
wraps (``tools/iofaults/inject.py``), by the thread that makes each one.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage

from tools.harness.iofaults.inject import Injector


def _entry(id: int) -> dict[str, Any]:
    return {"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "message"}}


async def test_a_lone_power_commit_flushes_the_journal_off_the_event_loop_thread(
    tmp_path: Path,
) -> None:
    """Sequential commits with nothing else about (the case that ran on the caller's thread):
    each is acknowledged after its frame's flush, and no flush ran on the loop's thread."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        flushers: list[int] = []

        def observe(kind: str) -> None:
            if kind == "flush":
                flushers.append(threading.get_ident())

        with Injector("flush", 0, errno.EIO, observe=observe):  # nth 0: observes, fails nothing
            seqs = []
            for n in range(5):
                seqs.append(await storage.commit([_entry(100 + n)], CTX))
                await asyncio.sleep(0)
        assert len(flushers) >= 5, f"5 commits made {len(flushers)} journal flushes"
        assert threading.get_ident() not in flushers, (
            "a journal flush ran on the event loop's thread"
        )
        for n, seq in enumerate(seqs):
            assert (await storage.entry(100 + n, CTX))["commitSeq"] == seq
    finally:
        await storage.close()


async def test_a_lone_process_commit_keeps_the_direct_path(tmp_path: Path) -> None:
    """``process`` commits flush nothing: one sequential committer runs them on its own thread
    (no writer thread is started), the hand-off costing more than the commit."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for n in range(20):
            await storage.commit([_entry(100 + n)], CTX)
        assert storage._committer._thread is None, (
            "a lone process-mode committer went to the writer thread"
        )
    finally:
        await storage.close()
