"""Replication through NATS JetStream (issue #14), against real nats-server processes.

Nothing is mocked: the servers are ``tests/support/natsserver.py``'s (one node, or a 3-node R3 cluster),
writers that are SIGKILLed run in child processes (``tests/support/replication_child.py``, which prints
every acknowledged commit before it does anything else), and the stream is read back with nats-py
directly, never through the engine's own link, so what the tests see is what the server holds.

What is checked:

* replicas: follow a writer under load and end identical (verify, export), catch up after being
  closed for thousands of commits, resume exactly after being SIGKILLed, refuse commits, and stop
  at a forged message naming it, applying nothing of it.

Every test is bounded in time (children and waits have deadlines; ``_bounded`` wraps the async
bodies), and every process a test starts is stopped in a ``finally``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import ForeignMessageError, NotWriterError, ReplicationError
from pi_durable_lmdb.audit import check, export_lines, verify
from pi_durable_lmdb.log import encode_batch
from pi_durable_lmdb.log.records import LogRecord, encode_record
from pi_durable_lmdb.log.stream.jetstream import Fence, encode_control
from pi_durable_lmdb.storage import LmdbStorage

from tests.support.compare import REFUSALS

from ..support.compare import canonical
from ..support.natsserver import NatsNode, nats_server  # noqa: F401 - fixtures
from ..support.replication_helpers import (
    Child,
    _bounded,
    _cli,
    _entry,
    local_records,
    publish_raw,
    subject,
)
from ..support.workload import Workload, snapshot

# ── replicas ─────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_replica_follows_a_writer_under_load_and_ends_identical(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """A replica follows a replicated writer while eight agents commit entries and one commits
    ``Workload`` batches (documents, tasks, forks, rejections): it serves read-your-writes once
    ``wait(seq)`` returns, refuses commits and ``mint_id`` with ``NotWriterError``, and ends with
    every read equal to the writer's, ``durable-log verify`` passing and ``durable-log export``
    byte-identical to the writer's."""

    writer_dir, replica_dir = tmp_path / "writer", tmp_path / "replica"
    seed = random.randrange(2**32)
    work = Workload(seed)
    stream = "follow"

    async def body() -> None:
        writer = await LmdbStorage.open(
            writer_dir, durability="replicated", nats=nats_server.url, stream=stream
        )
        replica = None
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 10**6}}], CTX)
            replica = await LmdbStorage.open_replica(
                replica_dir, nats=nats_server.url, stream=stream, store=writer.store_id
            )
            assert replica.store_id == writer.store_id

            async def entries(k: int) -> None:
                for i in range(250):
                    id = 10**6 + 1 + k * 1000 + i
                    seq = await writer.commit([_entry(id, 10**6, data={"k": k, "i": i})], CTX)
                    if i % 50 == 49:  # read-your-writes on the replica
                        await replica.wait(seq, timeout=10)
                        read = await replica.entry(id, CTX)
                        assert read is not None and read["commitSeq"] == seq

            async def documents() -> None:
                minted = [await writer.mint_id()]  # an id reservation goes to the stream too
                for _ in range(300):
                    try:
                        await writer.commit(work.batch(), CTX)
                    except ReplicationError:
                        raise
                    except REFUSALS:
                        pass  # the checks refused it, as MemoryStorage would
                    if len(minted) < 20:
                        minted.append(await writer.mint_id())
                assert minted == sorted(set(minted))

            await asyncio.gather(documents(), *(entries(k) for k in range(8)))
            with pytest.raises(NotWriterError, match="replica"):
                await replica.commit([_entry(5 * 10**6, 10**6)], CTX)
            with pytest.raises(NotWriterError):
                await replica.mint_id()
            head = writer.log.head()
            assert head > 2000
            await replica.wait(head, timeout=20)
            status = replica.replication.status()
            assert status.applied_seq == head and not status.stopped, status
            assert canonical(await snapshot(replica, work, head)) == canonical(
                await snapshot(writer, work, head)
            ), f"seed {seed}"
        finally:
            if replica is not None:
                await replica.close()
            await writer.close()

    _bounded(90, body())
    assert check(replica_dir).sound
    verified = _cli("verify", str(replica_dir))
    assert verified.returncode == 0, verified.stderr
    ours, theirs = _cli("export", str(replica_dir)), _cli("export", str(writer_dir))
    assert ours.returncode == theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert ours.stdout == theirs.stdout and ours.stdout.count(b"\n") > 2000


def test_replica_closed_for_thousands_of_commits_catches_up(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """A replica of a shipping (``process``) writer is closed while the writer commits 3,000
    more batches; reopened, it catches up, and ends with the writer's log and projections."""

    writer_dir, replica_dir = tmp_path / "writer", tmp_path / "replica"
    stream = "offline"
    timings: dict[str, float] = {}

    async def body() -> None:
        writer = await LmdbStorage.open(
            writer_dir, durability="process", nats=nats_server.url, stream=stream
        )
        drain = lambda: writer._link.arun(writer.replication.drain(20))  # noqa: E731
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for id in range(100, 200):
                await writer.commit([_entry(id)], CTX)
            assert await drain()
            replica = await LmdbStorage.open_replica(
                replica_dir, nats=nats_server.url, stream=stream, store=writer.store_id
            )
            try:
                await replica.wait(101, timeout=10)
            finally:
                await replica.close()
            for start in range(1000, 4000, 50):
                await asyncio.gather(
                    *(
                        writer.commit([_entry(id, data={"n": id})], CTX)
                        for id in range(start, start + 50)
                    )
                )
            assert await drain(), writer.replication.status()
            head = writer.log.head()
            assert head == 3101
            status = writer.replication.status()
            assert (
                status.shipped_seq == head and status.lag_records == 0 and status.last_error is None
            ), status
            began = time.monotonic()
            replica = await LmdbStorage.open_replica(
                replica_dir, nats=nats_server.url, stream=stream, store=writer.store_id
            )
            try:
                await replica.wait(head, timeout=30)
                timings["catch-up of 3000 records"] = time.monotonic() - began
                for id in (100, 199, 1000, 2345, 3999):
                    ours, theirs = await replica.entry(id, CTX), await writer.entry(id, CTX)
                    assert ours is not None and canonical(ours) == canonical(theirs)
            finally:
                await replica.close()
        finally:
            await writer.close()

    _bounded(90, body())
    print("timings:", {name: round(value, 2) for name, value in timings.items()})
    assert list(export_lines(replica_dir)) == list(export_lines(writer_dir))
    assert verify(replica_dir) is None


@pytest.mark.slow
def test_a_replica_killed_at_random_moments_resumes_where_it_stood(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """A shipping writer puts 20,000 records on the stream; a replica (a child process) catching
    up is SIGKILLed at random moments six times, then left to finish. After each kill its log is
    a prefix of the writer's, byte for byte, never shorter than after the kill before, and its
    projections verify; at the end it holds everything and exports what the writer exports."""

    seed = random.randrange(2**32)
    rng = random.Random(seed)
    writer_dir, replica_dir = tmp_path / "writer", tmp_path / "replica"
    stream = "resume"

    async def write() -> tuple[str, int]:
        writer = await LmdbStorage.open(
            writer_dir, durability="process", nats=nats_server.url, stream=stream
        )
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for start in range(100, 20_099, 200):
                await asyncio.gather(
                    *(
                        writer.commit([_entry(id, data={"n": id})], CTX)
                        for id in range(start, min(start + 200, 20_099))
                    )
                )
            assert await writer._link.arun(writer.replication.drain(30)), (
                writer.replication.status()
            )
            assert writer.store_id is not None
            return writer.store_id, writer.log.head()
        finally:
            await writer.close()

    store, head = _bounded(60, write())
    assert head == 20_000
    written = local_records(writer_dir)
    args = [
        str(replica_dir),
        "--nats",
        nats_server.url,
        "--stream",
        stream,
        "--replica-of",
        store,
        "--until",
        str(head),
    ]
    heads = [0]
    for round in range(6):
        child = Child(tmp_path, *args)
        try:
            child.wait_for(lambda lines: "ready" in lines, 20, "ready")
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            child.kill()
        local = local_records(replica_dir)
        heads.append(max(local, default=0))
        assert heads[-1] >= heads[-2], f"seed {seed}: the replica went back: {heads}"
        assert sorted(local) == list(range(1, heads[-1] + 1)) and all(
            local[seq] == written[seq] for seq in local
        ), f"seed {seed}"
        if round % 2:
            assert verify(replica_dir) is None, f"seed {seed}: after a kill at {heads[-1]}"
    child = Child(tmp_path, *args)
    try:
        child.wait_for(lambda lines: "closed" in lines, 60, "the replica catching up")
        assert child.finish(10) == 0, child.tail()
    finally:
        child.kill()
    print(f"seed {seed}: replica heads at the kills: {heads[1:]}")
    assert list(export_lines(replica_dir)) == list(export_lines(writer_dir))
    assert verify(replica_dir) is None


def _bad_checksum(data: bytes) -> bytes:
    record = msgspec.msgpack.decode(data, type=LogRecord)
    return msgspec.msgpack.encode(
        LogRecord(
            record.format, record.committed_at, record.checksum ^ 1, record.payload, record.size
        )
    )


def _record_of(writes: list[dict[str, Any]]) -> bytes:
    return encode_record(encode_batch(writes)[0], int(time.time() * 1000))


FORGERIES: dict[str, Callable[[str, int, bytes, int], tuple[dict[str, str], bytes, str]]] = {
    # name: (store, head, the last record's bytes, writer epoch) -> (headers, body, reason in the error)
    "bad checksum": lambda store, head, last, epoch: (
        _forged_headers(store, head + 1, epoch),
        _bad_checksum(last),
        f"record {head + 1}: checksum mismatch",
    ),
    "skipped sequence": lambda store, head, last, epoch: (
        _forged_headers(store, head + 2, epoch),
        _record_of([_entry(777)]),
        f"record {head + 2} does not follow this store's head {head}",
    ),
    "invalid commit": lambda store, head, last, epoch: (
        _forged_headers(store, head + 1, epoch),
        _record_of([_entry(1)]),
        f"record {head + 1} is not a valid commit here",
    ),
    "fenced epoch": lambda store, head, last, epoch: (
        _forged_headers(store, head + 1, epoch - 1),
        _record_of([_entry(777)]),
        f"after epoch {epoch} fenced it",
    ),
    "another store": lambda store, head, last, epoch: (
        _forged_headers("f0f0f0f0f0f0f0f0", head + 1, epoch),
        _record_of([_entry(777)]),
        "belongs to store 'f0f0f0f0f0f0f0f0'",
    ),
    "superscript digit as sequence": lambda store, head, last, epoch: (
        {
            **_forged_headers(store, head + 1, epoch),
            "Pd-Seq": "\u00b2",
            "Nats-Msg-Id": f"{store}:\u00b2",
        },
        _record_of([_entry(777)]),
        "is not a log sequence",
    ),
    "fence body as an id reservation": lambda store, head, last, epoch: (
        {
            **_forged_headers(store, head, epoch),
            "Pd-Kind": "ids",
            "Nats-Msg-Id": f"{store}:ids:{epoch}:f0f0",
        },
        encode_control(Fence(epoch, "forger")),
        "its body is a Fence, not what a 'ids' message carries",
    ),
    "message id of another record": lambda store, head, last, epoch: (
        {**_forged_headers(store, head + 1, epoch), "Nats-Msg-Id": f"{store}:{head + 1}x"},
        _record_of([_entry(777)]),
        "does not name record",
    ),
}


def _forged_headers(store: str, seq: int, epoch: int) -> dict[str, str]:
    """Headers exactly like a writer's (a record's ``Nats-Msg-Id`` must be new to the stream, or
    JetStream drops the message as a duplicate: a forger cannot rewrite a recent record)."""

    return {
        "Nats-Msg-Id": f"{store}:{seq}",
        "Pd-Format": "1",
        "Pd-Store": store,
        "Pd-Kind": "record",
        "Pd-Seq": str(seq),
        "Pd-Epoch": str(epoch),
    }


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_forged_message_stops_the_replica_and_applies_nothing(
    tmp_path: Path, nats_server: NatsNode, forgery: str
) -> None:
    """A message published on a store's subject by someone else, with valid-looking headers
    (``Pd-Format``, ``Pd-Store``, a matching ``Nats-Msg-Id``) but a body or sequence that is not
    the store's next record, stops a replica that follows live and one that catches up from
    nothing: ``ForeignMessageError`` naming the stream sequence and the reason; the replica's head
    stays at the last good record, its reads are unaffected, it verifies, and reopened it stops at
    the same message again (never skipping it)."""

    stream = "forge"
    live_dir, fresh_dir = tmp_path / "live", tmp_path / "fresh"

    async def body() -> None:
        writer = await LmdbStorage.open(
            tmp_path / "writer", durability="replicated", nats=nats_server.url, stream=stream
        )
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for id in range(100, 129):
                await writer.commit([_entry(id)], CTX)
            store, epoch = writer.store_id, writer.replication.epoch
            assert store is not None and epoch >= 1
            head = writer.log.head()
            last = writer.log.raw_chunk(head, head)[0][1]
        finally:
            await writer.close()
        live = await LmdbStorage.open_replica(
            live_dir, nats=nats_server.url, stream=stream, store=store
        )
        try:
            await live.wait(head, timeout=10)
            headers, data, reason = FORGERIES[forgery](store, head, bytes(last), epoch)
            stream_seq = await publish_raw(nats_server.url, subject(stream, store), headers, data)
            replicas = [
                live,
                await LmdbStorage.open_replica(
                    fresh_dir, nats=nats_server.url, stream=stream, store=store
                ),
            ]
            try:
                for replica in replicas:
                    with pytest.raises(ForeignMessageError) as caught:
                        await replica.wait(head + 2, timeout=10)
                    assert caught.value.stream_seq == stream_seq
                    assert f"Message {stream_seq} of stream {stream}" in str(caught.value), str(
                        caught.value
                    )
                    assert reason in str(caught.value), str(caught.value)
                    assert replica.log.head() == head
                    assert replica.replication.status().stopped
                    read = await replica.entry(128, CTX)
                    assert read is not None and read["commitSeq"] == head
                    assert (await replica.scan_entries({"conversationId": 1}, 100, None, CTX))[
                        "items"
                    ][0]["id"] == 128
            finally:
                await replicas[1].close()
        finally:
            await live.close()
        for path in (live_dir, fresh_dir):
            assert verify(path) is None
            assert local_records(path)[head] == bytes(last)
        again = await LmdbStorage.open_replica(
            live_dir, nats=nats_server.url, stream=stream, store=store
        )
        try:
            with pytest.raises(ForeignMessageError) as caught:
                await again.wait(head + 1, timeout=10)
            assert caught.value.stream_seq == stream_seq and again.log.head() == head
        finally:
            await again.close()

    _bounded(60, body())
