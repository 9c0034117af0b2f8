"""A replica refuses a stream record that would fork its log tree: every ``ROOT_EVERY``-th record
carries the writer's tree root (``Pd-Tree-Root``), and the follower checks its own tree with the
record against it before appending; records without the header (older writers, other records)
are taken as before. In-memory stream (``MemoryLink``): the checks are the link's, not the engine's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, tlog
from pi_durable_lmdb.log import encode_batch
from pi_durable_lmdb.log.records import encode_record, record_leaf
from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryStream
from pi_durable_lmdb.log.stream.message import (
    H_EPOCH,
    H_ROOT,
    ROOT_EVERY,
    record_headers,
    subject_of,
)


def leaves(storage: LmdbStorage) -> list[bytes]:
    return [
        record_leaf(seq, data)
        for seq, data in storage.log.read(1, None, decode=lambda seq, data: (seq, data))
    ]


@pytest.mark.parametrize(
    "durability", ["process", "replicated"]
)  # shipped after the commit, or in it
async def test_a_replica_checks_the_writers_root_and_refuses_a_record_that_forks_it(
    tmp_path: Path, durability: str
) -> None:
    server = MemoryStream("MEM")
    writer = await LmdbStorage.open(
        tmp_path / "w", durability=durability, nats=MemoryLink(server), stream="MEM", store="s1"
    )
    replica = await LmdbStorage.open_replica(
        tmp_path / "r", nats=MemoryLink(server), stream="MEM", store="s1"
    )
    link = MemoryLink(server)
    try:
        for n in range(1, ROOT_EVERY + 3):
            await writer.commit([{"type": "conversation", "value": {"id": n}}], CTX)
        if durability == "process":
            assert await writer._link.arun(writer.replication.drain(10))  # type: ignore[union-attr]
        head = writer.log.head()
        await writer.close()
        await replica.wait(head, 10)
        rooted = {
            int(m.headers["Pd-Seq"]): m.headers[H_ROOT]
            for m in server.messages
            if H_ROOT in m.headers
        }
        assert rooted == {ROOT_EVERY: replica.log.root(ROOT_EVERY).hex()}
        assert replica.log.root() == tlog.root_of(leaves(replica))

        epoch = int(server.messages[-1].headers[H_EPOCH])
        subject = subject_of("MEM", "s1")

        def data_of(conversation: int) -> bytes:
            return encode_record(
                encode_batch([{"type": "conversation", "value": {"id": conversation}}]).payload,
                1_767_225_600_000,
            )

        async def send(seq: int, conversation: int, root: bytes) -> None:
            message = (record_headers("s1", seq, epoch, root), data_of(conversation))
            await link.arun(
                link.messages.publish(subject, [message], server.messages[-1].stream_seq)
            )

        right = tlog.root_of([*leaves(replica), record_leaf(head + 1, data_of(9001))])
        await send(head + 1, 9001, right)  # a record whose root matches: taken
        await replica.wait(head + 1, 10)
        await send(
            head + 2, 9002, b"\x11" * 32
        )  # a record whose root is not the tree's with it: refused
        for _ in range(100):
            if replica.replication.error is not None:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
        error = replica.replication.error  # type: ignore[union-attr]
        assert (
            error is not None
            and "(the histories forked)" in str(error)
            and f"record {head + 2} would give" in str(error)
        )
        assert replica.log.head() == head + 1
        assert replica.log.root() == tlog.root_of(leaves(replica))
    finally:
        await asyncio.to_thread(link.close)
        await replica.close()
        await writer.close()
