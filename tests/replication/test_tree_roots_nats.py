"""The log tree's root travels with the records over a real nats-server: every ``ROOT_EVERY``-th
record's stream message carries the writer's root (``Pd-Tree-Root``), a replica that follows the
stream computes the same root at every size, and a record published by someone else with a root
that is not the tree's with it stops the replica before it is appended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, tlog
from pi_durable_lmdb.log import encode_batch
from pi_durable_lmdb.log.records import encode_record, record_leaf
from pi_durable_lmdb.log.stream.message import (
    H_EPOCH,
    H_ROOT,
    H_SEQ,
    ROOT_EVERY,
    record_headers,
    subject_of,
)

from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


def leaves(storage: LmdbStorage) -> list[bytes]:
    return [
        record_leaf(seq, data)
        for seq, data in storage.log.read(1, None, decode=lambda seq, data: (seq, data))
    ]


async def rooted_messages(url: str, stream: str, last: int) -> dict[int, tuple[str, str]]:
    """The stream's messages 1..last that carry a root: their record sequence -> (root, epoch)."""

    import nats

    client = await nats.connect(url)
    try:
        js = client.jetstream()
        found: dict[int, tuple[str, str]] = {}
        for stream_seq in range(1, last + 1):
            message = await js.get_msg(stream, stream_seq)
            headers = message.headers or {}
            if H_ROOT in headers:
                found[int(headers[H_SEQ])] = (headers[H_ROOT], headers[H_EPOCH])
        return found
    finally:
        await client.close()


async def publish(url: str, subject: str, body: bytes, headers: dict[str, str]) -> None:
    import nats

    client = await nats.connect(url)
    try:
        await client.jetstream().publish(subject, body, headers=headers)
    finally:
        await client.close()


async def test_a_replica_over_nats_agrees_with_the_writers_roots_and_refuses_a_forked_record(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    writer = await LmdbStorage.open(
        tmp_path / "w", durability="replicated", nats=nats_server.url, stream="ROOTS", store="s1"
    )
    replica = await LmdbStorage.open_replica(
        tmp_path / "r", nats=nats_server.url, stream="ROOTS", store="s1"
    )
    try:
        count = ROOT_EVERY + 3
        for first in range(1, count + 1, 64):  # concurrent commits, grouped by the writer
            await asyncio.gather(
                *(
                    writer.commit([{"type": "conversation", "value": {"id": n}}], CTX)
                    for n in range(first, min(first + 64, count + 1))
                )
            )
        head = writer.log.head()
        assert head == count
        writer_root = writer.log.root()
        await writer.close()
        await replica.wait(head, 30)
        assert replica.log.root() == writer_root == tlog.root_of(leaves(replica))

        rooted = await rooted_messages(nats_server.url, "ROOTS", head)
        assert {seq: root for seq, (root, _) in rooted.items()} == {
            ROOT_EVERY: replica.log.root(ROOT_EVERY).hex()
        }
        epoch = int(rooted[ROOT_EVERY][1])

        def data_of(conversation: int) -> bytes:
            return encode_record(
                encode_batch([{"type": "conversation", "value": {"id": conversation}}]).payload,
                1_767_225_600_000,
            )

        subject = subject_of("ROOTS", "s1")
        right = tlog.root_of([*leaves(replica), record_leaf(head + 1, data_of(9001))])
        await publish(
            nats_server.url, subject, data_of(9001), record_headers("s1", head + 1, epoch, right)
        )
        await replica.wait(head + 1, 30)  # a record whose root is the tree's with it: taken
        await publish(
            nats_server.url,
            subject,
            data_of(9002),
            record_headers("s1", head + 2, epoch, b"\x11" * 32),
        )
        for _ in range(200):
            if replica.replication.error is not None:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
        error = replica.replication.error  # type: ignore[union-attr]
        assert error is not None and "(the histories forked)" in str(error), error
        assert replica.log.head() == head + 1
        assert await replica.conversation(9002, CTX) is None
        assert replica.log.root() == tlog.root_of(leaves(replica))
    finally:
        await replica.close()
        await writer.close()
