"""A replica serves long documents as the writer does, through a real nats-server.

A replicated writer commits ``LongDocumentWork`` batches (documents many chunks long: agent
turns, every other op, bases, copies from past points, retirements, batches rejected after
touching a long document) while a replica follows; pi-durable's ``MemoryStorage`` gets the same
batches and must accept and refuse the same ones. Then every document is read at each of its
revision points, between them, before its first and ``current`` (``document``, ``find_document``,
``scan_documents``) on the writer, the replica (live, and again after it was closed and opened
from its directory) and the reference: the replica's answers equal the writer's exactly, and
the writer's equal the reference's. Bounded: ``BATCHES`` commits, waits of at most a minute.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.projections.tables import CHUNK
from pi_durable_lmdb.storage import LmdbStorage

from ..support.compare import canonical, outcome
from ..support.long_documents import LongDocumentWork, current_value
from ..support.natsserver import NatsNode, nats_server  # noqa: F401 - fixtures
from ..support.replication_helpers import _bounded

BATCHES = 300


def _reads(work: LongDocumentWork, head: int) -> list[tuple[str, tuple[Any, ...]]]:
    """Every document at each revision point, one point between two, the point before its
    first, and ``current``; its address and its scope at the same points."""

    calls: list[tuple[str, tuple[Any, ...]]] = []
    for id, document in sorted(work.documents.items()):
        points = document["points"]
        middles = {(a + b) // 2 for a, b in itertools.pairwise(points)}
        record = document["record"]
        address = {k: v for k, v in record.items() if k in ("kind", "scope", "key")}
        for at in ["current", *sorted({*points, *middles, max(points[0] - 1, 1), head})]:
            calls.append(("document", (id, at)))
            calls.append(("find_document", (address, at)))
            query = {"scope": record["scope"], "at": at}
            calls.append(("scan_documents", (query, 10_000, None)))
    return calls


async def _answers(store: Any, calls: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
    return [await outcome(getattr(store, method)(*args, CTX)) for method, args in calls]


@pytest.mark.slow
def test_a_replica_serves_long_documents_as_the_writer_does(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    seed = random.randrange(2**32)
    writer_dir, replica_dir = tmp_path / "writer", tmp_path / "replica"

    async def body() -> None:
        writer = await LmdbStorage.open(
            writer_dir, durability="replicated", nats=nats_server.url, stream="longdocs"
        )
        replica = None
        try:
            ref = MemoryStorage()
            work = LongDocumentWork(seed, ref)
            label, writes = await work.batch()
            seq = await writer.commit(writes, CTX)
            assert await ref.commit(writes, CTX) == seq
            work.committed(writes, seq)
            replica = await LmdbStorage.open_replica(
                replica_dir, nats=nats_server.url, stream="longdocs", store=writer.store_id
            )
            refused = 0
            for _ in range(BATCHES):
                label, writes = await work.batch()
                ours = await outcome(writer.commit(writes, CTX))
                theirs = await outcome(ref.commit(writes, CTX))
                assert ours[0] == theirs[0], f"seed {seed}, {label}: {ours} / {theirs}"
                if ours[0] == "ok":
                    assert ours[1] == theirs[1]
                    work.committed(writes, ours[1])
                else:
                    refused += 1
            assert refused, f"seed {seed}: no batch was refused"
            head = writer.log.head()
            sizes = [len(repr(await current_value(ref, id))) for id in work.documents]
            assert max(sizes) > 3 * CHUNK, sizes  # a document several chunks long
            await replica.wait(head, timeout=60)
            calls = _reads(work, head)
            expected = await _answers(writer, calls)
            for (method, args), mine, reference in zip(
                calls, expected, await _answers(ref, calls), strict=True
            ):
                if mine[0] != reference[0] or (
                    mine[0] == "ok" and canonical(mine[1]) != canonical(reference[1])
                ):
                    raise AssertionError(f"seed {seed}: {method}{args} differs from the reference")
            for attempt in ("live", "reopened"):
                if attempt == "reopened":
                    await replica.close()
                    replica = await LmdbStorage.open_replica(
                        replica_dir, nats=nats_server.url, stream="longdocs", store=writer.store_id
                    )
                    await replica.wait(head, timeout=60)
                answers = await _answers(replica, calls)
                for (method, args), mine, theirs in zip(calls, expected, answers, strict=True):
                    if canonical(theirs) != canonical(mine):
                        raise AssertionError(f"seed {seed}, {attempt} replica: {method}{args}")
        finally:
            if replica is not None:
                await replica.close()
            await writer.close()

    _bounded(600, body())
