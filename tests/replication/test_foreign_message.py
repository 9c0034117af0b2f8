"""A message on a store's subject that is not a record of the store (published by someone else)
is damage on the stream, not another writer: the writer's commit fails with ``ForeignMessageError``
naming the message, and the writer is not deposed with words about ownership."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import ForeignMessageError, LmdbStorage, NotWriterError

from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)


async def publish_raw(url: str, subject: str, body: bytes, headers: dict[str, str] | None) -> None:
    import nats

    client = await nats.connect(url)
    try:
        await client.jetstream().publish(subject, body, headers=headers)
    finally:
        await client.close()


@pytest.mark.parametrize(
    "headers",
    [None, {"Pd-Store": "someone", "Pd-Seq": "2", "Pd-Epoch": "1", "Pd-Kind": "record"}],
    ids=["no-headers", "forged-headers"],
)
async def test_a_foreign_message_fails_the_commit_as_damage_not_ownership(
    tmp_path: Path, nats_server: NatsNode, headers: dict[str, str] | None
) -> None:
    storage = await LmdbStorage.open(
        tmp_path / "store", durability="replicated", nats=nats_server.url, stream="FOREIGN"
    )
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        subject = f"FOREIGN.{storage.store_id}.log"
        await asyncio.to_thread(
            asyncio.run, publish_raw(nats_server.url, subject, b"not a record", headers)
        )
        with pytest.raises(ForeignMessageError) as caught:
            await storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
        assert not isinstance(caught.value, NotWriterError)
        assert "FOREIGN" in str(caught.value) and "nothing of it was applied" in str(caught.value)
        assert "another writer" not in str(caught.value)
        assert storage.replication.lease.lost is None  # type: ignore[union-attr]
        assert await storage.conversation(2, CTX) is None
    finally:
        await storage.close()
