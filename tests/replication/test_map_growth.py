"""A replicated writer whose group must grow the LMDB map after its records reached the stream.

The group's transaction is published, then fails to commit for want of map space; the map grows
and the group runs again. It used to fail the callers with ``OutcomeUnknownError`` ("The stream
holds records ... that the local transaction failed to commit"): a routine map growth failed
commits whose records were on the stream. Now the run again takes the group's records in from
the stream and hands each caller the outcome it had: every commit succeeds, once, and the store
and its subject hold the same records (found by the power-loss explorer's group workload)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log.stream.jetstream import JetStreamLink, subject_of

from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)


def entry(id: int, size: int) -> dict[str, object]:
    """An entry of about ``size`` bytes of text that does not compress (entry rows and log
    records are stored compressed: a repeated letter would never grow the map)."""

    text = random.Random(id).randbytes(size // 2 + 1).hex()[:size]
    return {
        "type": "entry",
        "value": {"id": id, "conversationId": 1, "kind": "message", "text": text},
    }


async def stream_records(url: str, stream: str, store: str) -> list[bytes]:
    link = JetStreamLink(url, stream)
    try:
        await link.arun(link.connect())

        async def collect() -> list[bytes]:
            found = []
            async for message, _ in link.messages.read(
                subject_of(stream, store), 0, store=store, follow=False
            ):
                if message.kind == "record":
                    found.append(message.data)
            return found

        return await link.arun(collect())
    finally:
        link.close()


@pytest.mark.parametrize("callers", [1, 8], ids=["one-caller", "eight-callers"])
async def test_a_group_that_grows_the_map_after_publishing_commits_once(
    tmp_path: Path, nats_server: NatsNode, callers: int
) -> None:
    rng = random.Random(callers)
    storage = await LmdbStorage.open(
        tmp_path / "store",
        durability="replicated",
        nats=nats_server.url,
        stream="GROW",
        map_size=256 * 1024,
    )
    store = storage.store_id
    assert store is not None
    acked: dict[int, int] = {}
    next_id = 2
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        grown_from = storage._env.env.info()["map_size"]
        for _ in range(60 // callers):
            batch = []
            for _ in range(callers):
                batch.append((next_id, rng.choice([200, 3_000, 9_000])))
                next_id += 1

            async def one(id: int, size: int) -> None:
                acked[id] = await storage.commit([entry(id, size)], CTX)

            await asyncio.gather(*(one(id, size) for id, size in batch))
        assert storage._env.env.info()["map_size"] > grown_from, "the workload made the map grow"
        assert len(set(acked.values())) == len(acked), "two commits got one sequence"
        for id, seq in acked.items():
            lookup = await storage.entry(id, CTX)
            assert lookup is not None and lookup["commitSeq"] == seq
        head = storage.log.head()
        assert head == len(acked) + 1, f"the log holds {head} records for {len(acked) + 1} commits"
    finally:
        await storage.close()
    assert verify(str(tmp_path / "store")) is None
    on_stream = await stream_records(nats_server.url, "GROW", store)
    reader = await LmdbStorage.open(tmp_path / "store", readonly=True)
    try:
        with reader._env.read() as txn:
            local = [reader.log.record(txn, seq) for seq in range(1, reader.log.head(txn) + 1)]
    finally:
        await reader.close()
    assert on_stream == local, "the stream holds the store's records, each exactly once, in order"
