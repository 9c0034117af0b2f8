"""A replica behind its writer takes the backlog in big transactions, not one per writer group.

Messages a replica has already received count as pending beside those the server still holds
back: before that, a replica whose transactions were slower than the writer (a ``power`` replica
syncing twice per transaction) took in one small chunk per transaction and fell further behind.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from pi_durable_lmdb import LmdbStorage

from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)

RECORDS = 400


async def test_a_replica_held_up_takes_what_arrived_meanwhile_in_one_chunk(nats_server: NatsNode, tmp_path: Path) -> None:  # noqa: F811
    writer = await LmdbStorage.open(tmp_path / "w", durability="replicated", nats=nats_server.url, stream="CHUNKS")
    replica = await LmdbStorage.open_replica(tmp_path / "r", nats=nats_server.url, stream="CHUNKS", store=writer.store_id or "")
    try:
        await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await replica.wait(1, timeout=10)
        before = replica.replication.status()["transactions"]  # type: ignore[union-attr]
        with replica._committer.exclusive():  # the replica cannot take anything in meanwhile
            for id in range(2, 2 + RECORDS):  # one commit at a time: each a message of its own
                await writer.commit([{"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "m"}}], CTX)
            await asyncio.sleep(0.5)  # every message has reached the replica's connection
        await replica.wait(1 + RECORDS, timeout=20)
        taken = replica.replication.status()["transactions"] - before  # type: ignore[union-attr]
        assert taken <= 4, f"{RECORDS} records waiting took {taken} transactions"
        assert (await replica.entry(1 + RECORDS, CTX)) is not None
    finally:
        await replica.close()
        await writer.close()
