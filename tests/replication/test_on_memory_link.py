"""Replication on the in-memory stream engine: the writer, shipper, follower and lease tested
alone, fast and with no server (``log.stream.memory``; the real-cluster tests stay as they are).

Hypothesis chooses interleavings of commits, lost answers, lost requests, the stream going away
and coming back, forced take-overs by a new writer and lease expiry; after each step the subject
must be one fenced history holding every acknowledged commit once, where it was acknowledged,
and nothing that was refused. Real LMDB stores, real threads: only the stream is in memory."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.errors import NotWriterError, ReplicationError
from pi_durable_lmdb.log import decode_record
from pi_durable_lmdb.log.stream.lease import LEASE_FORMAT, Lease, WriterLease
from pi_durable_lmdb.log.stream.memory import ManualClock, MemoryLink, MemoryStream

STREAM = "MEM"
STORE = "fake"


def subject_history(server: MemoryStream, store: str = STORE) -> list[tuple[str, int, int, bytes]]:
    """(kind, epoch, seq, body) of every message of the store's subject, in stream order."""

    return [
        (m.headers["Pd-Kind"], int(m.headers["Pd-Epoch"]), int(m.headers["Pd-Seq"]), m.data)
        for m in server.messages
        if m.subject == f"{STREAM}.{store}.log"
    ]


def conversation_of(seq: int, body: bytes) -> int:
    return int(decode_record(seq, body).writes[0].value["id"])  # type: ignore[union-attr]


def check_history(server: MemoryStream) -> dict[int, int]:
    """One fenced history: records 1..N in order, each of the epoch of the last fence before it,
    fences of growing epochs. Returns {conversation id: record seq}."""

    fence, highest, seqs, where = None, 0, [], {}
    for kind, epoch, seq, body in subject_history(server):
        if kind == "fence":
            assert epoch > highest, f"fence of epoch {epoch} after one of {highest}"
            fence = highest = epoch
        elif kind == "record":
            assert fence is not None and epoch == fence, (
                f"record {seq} of epoch {epoch}, last fence {fence}"
            )
            seqs.append(seq)
            cid = conversation_of(seq, body)
            assert cid not in where, f"conversation {cid} stored twice"
            where[cid] = seq
    assert seqs == list(range(1, len(seqs) + 1)), seqs
    return where


class ReplicatedWriters(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.root = Path(tempfile.mkdtemp(prefix="memlink-"))
        self.clock = ManualClock()
        self.server = MemoryStream(STREAM, clock=self.clock)
        self.writers: list[LmdbStorage] = []
        self.ids = itertools.count(1)
        self.acked: dict[int, int] = {}
        self.refused: set[int] = set()
        self.writer = self.open_writer(force=False)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def open_writer(self, force: bool) -> LmdbStorage:
        link = MemoryLink(self.server)
        writer: LmdbStorage = self.run(
            LmdbStorage.open(
                self.root / f"w{len(self.writers)}",
                durability="replicated",
                nats=link,
                stream=STREAM,
                store=STORE,
                take_over="force" if force else False,
                lease_ttl=1,
            )
        )
        self.writers.append(writer)
        return writer

    @rule(count=st.integers(1, 4))
    def commit(self, count: int) -> None:
        async def one(cid: int) -> None:
            try:
                seq = await self.writer.commit(
                    [{"type": "conversation", "value": {"id": cid}}], CTX
                )
            except NotWriterError:
                self.refused.add(cid)
            except ReplicationError:
                pass  # unavailable, lost, lapsed: not acknowledged, may or may not be stored
            else:
                self.acked[cid] = seq

        async def all_of() -> None:
            await asyncio.gather(*(one(next(self.ids)) for _ in range(count)))

        self.run(all_of())

    @rule()
    def lose_an_answer(self) -> None:
        self.server.lose_answers += 1

    @rule()
    def lose_a_request(self) -> None:
        self.server.drop_requests += 1

    @rule()
    def stream_away_and_back(self) -> None:
        self.server.down = True
        self.commit(1)
        self.server.down = False

    @rule()
    def forced_take_over(self) -> None:
        self.server.lose_answers = self.server.drop_requests = 0
        old = self.writer
        self.writer = self.open_writer(force=True)
        cid = next(self.ids)
        try:
            self.run(old.commit([{"type": "conversation", "value": {"id": cid}}], CTX))
        except NotWriterError:
            self.refused.add(cid)
        else:
            raise AssertionError("a writer fenced out by a forced take-over acknowledged a commit")

    @rule()
    def lease_expires(self) -> None:
        """The clock passes the lease's time to live: the writer stops itself, takes its lease
        again with a new epoch (nobody else took it) and commits after fencing with it."""

        lease: WriterLease = self.writer.replication.lease  # type: ignore[union-attr]
        epoch = lease.epoch
        self.clock.advance(2)
        cid = next(self.ids)
        try:
            self.run(self.writer.commit([{"type": "conversation", "value": {"id": cid}}], CTX))
        except ReplicationError:
            pass
        deadline = self.loop.time() + 5
        while lease.epoch == epoch and self.loop.time() < deadline:
            self.run(asyncio.sleep(0.02))
        assert lease.epoch > epoch, "the lapsed lease was not taken again"

    @invariant()
    def one_fenced_history(self) -> None:
        where = check_history(self.server)
        for cid, seq in self.acked.items():
            assert where.get(cid) == seq, (
                f"conversation {cid} acknowledged at {seq}, stored at {where.get(cid)}"
            )
        assert not (self.refused & where.keys()), (
            f"refused commits stored: {self.refused & where.keys()}"
        )

    def teardown(self) -> None:
        try:
            # the last writer, settled, holds exactly the stream's records, in its order
            self.server.down = False
            self.server.lose_answers = self.server.drop_requests = 0
            cid = next(self.ids)
            try:
                seq = self.run(
                    self.writer.commit([{"type": "conversation", "value": {"id": cid}}], CTX)
                )
            except ReplicationError:
                seq = self.run(
                    self.writer.commit([{"type": "conversation", "value": {"id": cid}}], CTX)
                )
            records = [
                (s, body) for kind, _, s, body in subject_history(self.server) if kind == "record"
            ]
            assert seq == len(records)
            for s, body in records:
                assert self.writer.log.get(s) == decode_record(s, body)
            for cid_, _ in check_history(self.server).items():
                assert self.run(self.writer.conversation(cid_, CTX)) is not None
        finally:
            for writer in self.writers:
                self.run(writer.close())
            self.loop.close()
            shutil.rmtree(self.root, ignore_errors=True)


def test_replicated_writers_on_the_memory_stream() -> None:
    run_state_machine_as_test(
        ReplicatedWriters,
        settings=settings(
            max_examples=12,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# ── the shipper and the follower ──────────────────────────────────────────────


@pytest.mark.asyncio
@pytest.mark.parametrize("faults", [(), ("down",), ("lose",), ("drop",), ("down", "lose", "drop")])
async def test_shipping_and_following_through_faults(
    tmp_path: Path, faults: tuple[str, ...]
) -> None:
    """A ``process`` writer ships behind its commits through the stream's faults; a replica
    follows; both end with the writer's log, byte for byte."""

    server = MemoryStream(STREAM)
    writer = await LmdbStorage.open(
        tmp_path / "w", durability="process", nats=MemoryLink(server), stream=STREAM, store=STORE
    )
    replica = await LmdbStorage.open_replica(
        tmp_path / "r", nats=MemoryLink(server), stream=STREAM, store=STORE
    )
    try:
        for n in range(1, 41):
            if n == 10 and "down" in faults:
                server.down = True
            if n == 20:
                server.down = False
                server.lose_answers += "lose" in faults
                server.drop_requests += "drop" in faults
            assert await writer.commit([{"type": "conversation", "value": {"id": n}}], CTX) == n
        assert await writer._link.arun(writer.replication.drain(10)), writer.replication.status()  # type: ignore[union-attr]
        await replica.wait(40, 10)
        records = [
            decode_record(seq, body)
            for kind, _, seq, body in subject_history(server)
            if kind == "record"
        ]
        assert records == [writer.log.get(seq) for seq in range(1, 41)]
        assert [replica.log.get(seq) for seq in range(1, 41)] == records
        assert await replica.conversation(40, CTX) == {"id": 40}
    finally:
        await replica.close()
        await writer.close()


# ── the lease alone ──────────────────────────────────────────────────────────


async def test_lease_expiry_and_take_over_by_the_servers_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    server = MemoryStream(STREAM, clock=clock, exists=True)
    a_link, b_link = MemoryLink(server), MemoryLink(server)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        a = WriterLease(a_link, STORE, str(tmp_path / "a"), ttl=6)
        b = WriterLease(b_link, STORE, str(tmp_path / "b"), ttl=6)
        first = await a_link.arun(a.acquire(0, take_over=False))
        with pytest.raises(NotWriterError, match="open with take_over=True"):
            await b_link.arun(b.acquire(0, take_over=False))
        a.check()
        clock.advance(4.6)  # past ttl * (1 - MARGIN): A stops counting on it before it expires
        with pytest.raises(NotWriterError, match="lapsed"):
            a.check()
        with pytest.raises(NotWriterError):  # not yet expired on the server
            await b_link.arun(b.acquire(0, take_over=False))
        clock.advance(1.5)  # expired on the server
        second = await b_link.arun(
            b.acquire(first, take_over=False)
        )  # the floor: the subject's epochs
        assert second > first
        value, revision = await b_link.arun(b_link.keys.lease_get(STORE))
        assert value is not None and msgspec.json.decode(value)["epoch"] == second
        await b_link.arun(b.release())
        assert await b_link.arun(b_link.keys.lease_get(STORE)) == (None, revision + 1)
        third = await a_link.arun(a.acquire(second, take_over=False))
        assert third > second
    finally:
        a_link.close()
        b_link.close()


async def test_a_restarted_writer_takes_its_own_lease_when_it_expires_while_being_watched(
    tmp_path: Path,
) -> None:
    """The same writer restarted (its instance id, host and path; another pid) watches its old
    lease for a renewal period before reclaiming it. A lease that expires on the server during
    that watch was not renewed: its holder is dead, and the restarted writer takes it, rather
    than being refused as though another writer were renewing it."""

    clock = ManualClock()
    server = MemoryStream(STREAM, clock=clock, exists=True)
    link = MemoryLink(server)
    path = tmp_path / "store"
    path.mkdir()
    try:
        restarted = WriterLease(link, STORE, str(path), ttl=3)
        host, pid, instance, where = restarted.holder.split(":", 3)
        dead = Lease(
            LEASE_FORMAT, 4, f"{host}:{int(pid) + 1}:{instance}:{where}", 3
        )  # the killed one
        assert (
            await link.arun(link.keys.lease_put(STORE, msgspec.json.encode(dead), 0, 3.0))
            is not None
        )
        clock.advance(2.5)  # the lease expires 0.5 s into the restarted writer's watch

        async def ticking() -> None:
            while True:
                await asyncio.sleep(0.01)
                clock.advance(0.05)

        async def acquire() -> int:
            ticker = asyncio.ensure_future(ticking())
            try:
                return await restarted.acquire(0, take_over=False)
            finally:
                ticker.cancel()

        assert await link.arun(acquire()) == 5
        value, _ = await link.arun(link.keys.lease_get(STORE))
        assert value is not None and msgspec.json.decode(value)["holder"] == restarted.holder
    finally:
        link.close()
