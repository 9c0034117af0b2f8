"""A write transaction owns its effects: a commit that fails after its checks leaves nothing
behind, in memory or on disk, that a later reader could take for a committed value.

The commit that would place a long document's snapshot is failed at each point a commit passes
after its checks: in its own work (alone, and in a group run again batch by batch), at the
journal frame's flush, at LMDB's commit and at the stream's publish (a request the stream never
stored). The next good commit then takes the same log sequence with another change. Afterwards
the writer's own reads, a fresh handle's reads (now and at every point) and ``verify`` must all
agree with ``MemoryStorage`` given only the acknowledged commits.
"""

from __future__ import annotations

import asyncio
import errno
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log.journal import Journal
from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryStream
from pi_durable_lmdb.projections import Projector, documents
from pi_durable_lmdb.projections.tables import DOCUMENT_SNAPSHOTS

from tests.projections.test_documents import rows_of
from tools.bench.workloads import ROOT, conversation, document_create
from tools.harness.faults import commit_fails, failing

MARK = "FAIL-THIS-COMMIT"
PLACES = 64
"""The delta that would place the document's first snapshot: the 64th
(``documents.SNAPSHOT_EVERY``), made heavy enough to bring the deltas to an eighth of the base
(``SNAPSHOT_SHARE``). The light one committed in its place does not, so nothing but the failed
commit ever asks for a snapshot at that sequence."""
DELTAS = 90


def change(n: int, text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "document.change",
            "id": 2,
            "content": {"kind": "delta", "version": 1, "ops": [["a", ["text"], text]]},
        }
    ]


def base() -> list[dict[str, Any]]:
    return [
        {
            "type": "document.change",
            "id": 2,
            "content": {"kind": "base", "version": 1, "value": {"text": "b" * 40_000}},
        }
    ]


def entry(id: int) -> list[dict[str, Any]]:
    return [{"type": "entry", "value": {"id": id, "conversationId": ROOT, "kind": "m", "data": id}}]


def _marked(txn: Any, seq: int, plan: Any, *rest: Any) -> bool:
    """A prepared batch holding the marked change (``Projector.apply``'s arguments)."""

    return MARK in repr(plan.writes)


def _marked_frame(records: list[tuple[int, bytes]]) -> bool:
    return any(MARK.encode() in data for _, data in records)


POINTS = ["work", "group", "journal", "commit", "stream"]


@contextmanager
def packer_held(release: threading.Event) -> Iterator[None]:
    """The snapshot packer waits for ``release`` before it packs anything: a snapshot asked for
    by the failed commit (if any were) is packed only after the good commit took its sequence."""

    original = documents._pack

    def held(row: Any) -> bytes:
        release.wait(60)
        return original(row)

    documents._pack = held  # type: ignore[assignment]
    try:
        yield
    finally:
        documents._pack = original  # type: ignore[assignment]


@pytest.mark.parametrize("point", POINTS)
def test_a_commit_failing_after_its_checks_leaves_no_value_nobody_committed(
    tmp_path: Path, point: str
) -> None:
    path = tmp_path / "store"
    release = threading.Event()
    server = MemoryStream("EFFECTS") if point == "stream" else None

    async def open_writer() -> LmdbStorage:
        if server is not None:
            return await LmdbStorage.open(
                path,
                durability="replicated",
                nats=MemoryLink(server),
                stream="EFFECTS",
                store="effects",
            )
        return await LmdbStorage.open(path, durability="power" if point == "journal" else "process")

    async def write() -> MemoryStorage:
        memory = MemoryStorage()
        storage = await open_writer()
        try:
            for batch in ([conversation(ROOT)], [document_create(2)], base()):
                for store in (storage, memory):
                    await store.commit(batch, CTX)
            for n in range(1, DELTAS + 1):
                if n == PLACES:  # the commit due to place the snapshot fails after its checks
                    await fail_one(storage, change(n, f"{MARK} {n} " + "f" * 5_000))
                batch = change(n, f"delta {n} ")
                for store in (storage, memory):
                    await store.commit(batch, CTX)
                if n >= PLACES:  # from the good commit that took the failed one's sequence on
                    release.set()
                assert await storage.document(2, "current", CTX) == await memory.document(
                    2, "current", CTX
                ), n  # the writer's own reads, from its cache
        finally:
            await storage.close()
        return memory

    async def fail_one(storage: LmdbStorage, batch: list[dict[str, Any]]) -> None:
        head = storage.log.head()
        if point == "work":
            with failing(Projector, "apply", _marked, OSError(errno.EIO, "injected")):
                with pytest.raises(OSError, match="injected"):
                    await storage.commit(batch, CTX)
        elif point == "group":  # one group, then each batch alone: the marked one fails twice
            with failing(Projector, "apply", _marked, OSError(errno.EIO, "injected")):
                outcomes = await asyncio.gather(
                    storage.commit(entry(900), CTX),
                    storage.commit(batch, CTX),
                    return_exceptions=True,
                )
            assert not isinstance(outcomes[0], BaseException), outcomes
            assert isinstance(outcomes[1], OSError), outcomes
        elif point == "journal":
            with failing(Journal, "write", _marked_frame, OSError(errno.EIO, "injected")):
                with pytest.raises(OSError, match="injected"):
                    await storage.commit(batch, CTX)
        elif point == "commit":
            with commit_fails(storage._env), pytest.raises(lmdb.Error, match="Input/output"):
                await storage.commit(batch, CTX)
        else:
            assert server is not None
            server.drop_requests = 1  # stored nowhere, answered never
            with pytest.raises(Exception, match=r"stream|answer|publish|append"):
                await storage.commit(batch, CTX)
        if point != "group":
            assert storage.log.head() == head  # nothing of it in the log: the sequence is reused

    with packer_held(release):
        memory = asyncio.run(write())
    if point == "group":  # the two entries committed beside it are in the log too
        memory = None  # type: ignore[assignment]

    async def read_fresh(expected: MemoryStorage | None) -> None:
        reader = await LmdbStorage.open(path, readonly=True)
        try:
            head = reader.log.head()
            value = await reader.document(2, "current", CTX)
            assert value is not None and MARK not in value["value"]["text"]
            assert value["value"]["text"].count("delta ") == DELTAS
            if expected is not None:
                assert value == await expected.document(2, "current", CTX)
                for seq in range(3, head + 1):
                    assert await reader.document(2, seq, CTX) == await expected.document(
                        2, seq, CTX
                    ), seq
            else:  # every past point holds exactly the deltas committed by then
                done = 0
                for seq in range(3, head + 1):
                    past = await reader.document(2, seq, CTX)
                    assert past is not None and MARK not in past["value"]["text"], seq
                    count = past["value"]["text"].count("delta ")
                    assert count in (done, done + 1), seq
                    done = count
        finally:
            await reader.close()

    asyncio.run(read_fresh(memory))
    assert verify(path) is None


def current_only(id: int) -> list[dict[str, Any]]:
    return [
        {
            "type": "document.create",
            "record": {
                "id": id,
                "kind": "draft",
                "scope": {"kind": "conversation", "conversationId": ROOT},
                "history": "latest",
                "fork": "current",
            },
            "content": {"kind": "base", "version": 1, "value": {"text": "b" * 40_000}},
        }
    ]


@pytest.mark.parametrize("then", ["retired in the same batch", "rebased right after"])
def test_verify_is_clean_when_a_current_only_document_drops_a_snapshot_before_it_is_put(
    tmp_path: Path, then: str
) -> None:
    """A current-only long document whose batch places a snapshot, and which is retired in that
    batch or rebased right after: the log's fold writes the snapshot and drops it, the writer
    never puts it (held in the packer meanwhile), and both keep no trace of it."""

    path = tmp_path / "store"
    release = threading.Event()

    async def write() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for batch in ([conversation(ROOT)], current_only(2)):
                await storage.commit(batch, CTX)
            for n in range(1, PLACES):
                await storage.commit(change(n, f"delta {n} "), CTX)
            placing = change(PLACES, "p" * 5_000)
            if then == "retired in the same batch":
                await storage.commit([*placing, {"type": "document.retire", "id": 2}], CTX)
            else:
                await storage.commit(placing, CTX)
                await storage.commit(
                    [
                        {
                            "type": "document.change",
                            "id": 2,
                            "content": {"kind": "base", "version": 1, "value": {"text": "new"}},
                        }
                    ],
                    CTX,
                )
            release.set()
            await storage.commit(entry(900), CTX)  # lands what was packed, if anything
        finally:
            await storage.close()

    with packer_held(release):
        asyncio.run(write())
    assert verify(path) is None


def test_a_snapshot_lost_with_a_killed_writer_is_packed_again_when_a_writer_opens(
    tmp_path: Path,
) -> None:
    """The writer is killed after the commit that placed a long document's snapshot, before
    the packer put it: the next writer's open packs it again, so reads start from it."""

    path = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_WRITER, str(path)], capture_output=True, text=True
    )
    assert child.returncode == -signal.SIGKILL, child.stderr

    async def snapshots_after_reopen() -> tuple[int, int]:
        before = len(rows_of(path, DOCUMENT_SNAPSHOTS))
        storage = await LmdbStorage.open(path, durability="process")
        await storage.close()  # the close waits for the packer and puts what it packed
        return before, len(rows_of(path, DOCUMENT_SNAPSHOTS))

    assert asyncio.run(snapshots_after_reopen()) == (0, 1)
    assert verify(path) is None


_KILLED_WRITER = """
import asyncio, os, signal, sys, threading
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.projections import documents
from tests.storage.test_transaction_effects import PLACES, base, change
from tools.bench.workloads import ROOT, conversation, document_create

documents._pack = lambda row: threading.Event().wait()  # the packer never finishes

async def main(path):
    storage = await LmdbStorage.open(path, durability="process")
    for batch in ([conversation(ROOT)], [document_create(2)], base()):
        await storage.commit(batch, CTX)
    for n in range(1, PLACES + 1):
        await storage.commit(change(n, "p" * 5_000 if n == PLACES else f"delta {n} "), CTX)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main(sys.argv[1]))
"""
