"""A replica behind its writer takes the backlog in big transactions, not one per writer group;
a catch-up reads on from where a lagging server's batched reads stopped.

Messages a replica has already received count as pending beside those the server still holds
back: before that, a replica whose transactions were slower than the writer (a ``power`` replica
syncing twice per transaction) took in one small chunk per transaction and fell further behind.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit import export_lines, verify
from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryMessages, MemoryStream
from pi_durable_lmdb.log.stream.message import RawMessage

from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)

RECORDS = 400


async def test_a_replica_held_up_takes_what_arrived_meanwhile_in_one_chunk(
    nats_server: NatsNode, tmp_path: Path
) -> None:
    writer = await LmdbStorage.open(
        tmp_path / "w", durability="replicated", nats=nats_server.url, stream="CHUNKS"
    )
    replica = await LmdbStorage.open_replica(
        tmp_path / "r", nats=nats_server.url, stream="CHUNKS", store=writer.store_id or ""
    )
    try:
        await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await replica.wait(1, timeout=10)
        before = replica.replication.status().transactions  # type: ignore[union-attr]
        with replica._committer.exclusive():  # the replica cannot take anything in meanwhile
            for id in range(2, 2 + RECORDS):  # one commit at a time: each a message of its own
                await writer.commit(
                    [{"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "m"}}], CTX
                )
            await asyncio.sleep(0.5)  # every message has reached the replica's connection
        await replica.wait(1 + RECORDS, timeout=20)
        taken = replica.replication.status().transactions - before  # type: ignore[union-attr]
        assert taken <= 4, f"{RECORDS} records waiting took {taken} transactions"
        assert (await replica.entry(1 + RECORDS, CTX)) is not None
    finally:
        await replica.close()
        await writer.close()


class ShortBatches(MemoryMessages):
    """A stream whose batched reads come from a server that lags the leader: each batch holds at
    most ``most`` messages, and after ``answers`` batches it holds nothing more."""

    def __init__(self, stream: MemoryStream, most: int, answers: int) -> None:
        super().__init__(stream)
        self.most, self.answers, self.asked = most, answers, 0

    async def fetch(self, subject: str, after: int, *, batch: int) -> list[RawMessage]:
        self.asked += 1
        if self.asked > self.answers:
            return []
        return (await super().fetch(subject, after, batch=batch))[: self.most]


def test_a_catch_up_reads_on_from_where_a_lagging_server_stopped(tmp_path: Path) -> None:
    """Batches answered short, then not at all (a server behind the leader): a new replica and a
    restore-like catch-up still take in every record, once, in order (the rest from the
    consumer), and end identical to the writer."""

    server = MemoryStream("SHORT")

    async def body() -> None:
        writer = await LmdbStorage.open(
            tmp_path / "w", durability="replicated", nats=MemoryLink(server), stream="SHORT"
        )
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for id in range(2, 300):
                await writer.commit(
                    [{"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "m"}}], CTX
                )
            head, store = writer.log.head(), writer.store_id or ""
        finally:
            await writer.close()
        link = MemoryLink(server)
        short = link.messages = ShortBatches(server, most=37, answers=3)
        replica = await LmdbStorage.open_replica(
            tmp_path / "r", nats=link, stream="SHORT", store=store
        )
        try:
            await replica.wait(head, timeout=20)
            assert short.asked >= 4, "the batched reads were used, then the consumer"
        finally:
            await replica.close()
        assert list(export_lines(tmp_path / "r")) == list(export_lines(tmp_path / "w"))
        assert verify(tmp_path / "r") is None

    asyncio.run(asyncio.wait_for(body(), 60))


def test_a_catch_up_whose_transaction_grows_the_map_takes_every_record(tmp_path: Path) -> None:
    """A batch taken in grows the replica's LMDB map: the transaction runs again from the start
    and takes the whole batch, not what its first run left of it (it used to skip those records
    and stop with ``ForeignMessageError``: "record N does not follow this store's head")."""

    server = MemoryStream("GROWING")

    async def body() -> None:
        writer = await LmdbStorage.open(
            tmp_path / "w", durability="replicated", nats=MemoryLink(server), stream="GROWING"
        )
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for id in range(2, 400):
                await writer.commit(
                    [
                        {
                            "type": "entry",
                            "value": {
                                "id": id,
                                "conversationId": 1,
                                "kind": "m",
                                # random: a repeated letter packs to nothing in the row
                                "text": random.Random(id).randbytes(1000).hex(),
                            },
                        }
                    ],
                    CTX,
                )
            head, store = writer.log.head(), writer.store_id or ""
        finally:
            await writer.close()
        replica = await LmdbStorage.open_replica(
            tmp_path / "r",
            nats=MemoryLink(server),
            stream="GROWING",
            store=store,
            map_size=256 * 1024,
        )
        try:
            grown_from = 256 * 1024
            await replica.wait(head, timeout=30)
            assert replica._env.env.info()["map_size"] > grown_from, (
                "the catch-up made the map grow"
            )
            assert replica.replication.status().last_error is None  # type: ignore[union-attr]
        finally:
            await replica.close()
        assert list(export_lines(tmp_path / "r")) == list(export_lines(tmp_path / "w"))

    asyncio.run(asyncio.wait_for(body(), 60))
