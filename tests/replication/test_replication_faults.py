"""Replication through NATS JetStream (issue #14), against real nats-server processes.

Nothing is mocked: the servers are ``tests/support/natsserver.py``'s (one node, or a 3-node R3 cluster),
writers that are SIGKILLed run in child processes (``tests/support/replication_child.py``, which prints
every acknowledged commit before it does anything else), and the stream is read back with nats-py
directly, never through the engine's own link, so what the tests see is what the server holds.

What is checked:

* machine loss: a replicated writer on R3 killed and its directory deleted mid-load; a store
  rebuilt elsewhere from the stream holds every acknowledged commit and answers every read as
  pi-durable's ``MemoryStorage`` fed the same writes, and goes on as the writer;
* cluster faults on R3: one node down (commits go on), two down (commits fail fast with a clear
  error, nothing acknowledged is lost), nodes back (commits resume), no quorum at all (opens and
  commits fail with ``NatsUnavailableError``, never a raw nats-py error); a writer whose lease
  lapsed in an outage takes it again.

Every test is bounded in time (children and waits have deadlines; ``_bounded`` wraps the async
bodies), and every process a test starts is stopped in a ``finally``.
"""

from __future__ import annotations

import asyncio
import copy
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb import LeaseLapsedError, NatsUnavailableError, NotWriterError, ReplicationError
from pi_durable_lmdb.audit import export_lines, verify
from pi_durable_lmdb.log import write_to_builtins
from pi_durable_lmdb.storage import LmdbStorage

from tests.support.compare import REFUSALS

from ..support.compare import canonical
from ..support.natsserver import NatsCluster, NatsNode, nats_cluster, nats_server  # noqa: F401 - fixtures
from ..support.polling import until_async
from ..support.replication_helpers import (
    TURN_IDS,
    Child,
    Ledger,
    _bounded,
    _connect,
    _count,
    _entry,
    check_subject,
    entry_ids,
    local_records,
    open_writer,
    read_subject,
    subject,
)
from ..support.workload import Workload, snapshot

# ── machine loss ─────────────────────────────────────────────────────────────


@pytest.mark.cluster
def test_machine_loss_every_acknowledged_commit_is_restored_from_the_stream(
    tmp_path: Path, nats_cluster: NatsCluster
) -> None:
    """A replicated writer on an R3 stream (a child: one agent committing ``Workload`` batches,
    two committing entry turns, so groups form) is SIGKILLed mid-load and its directory deleted.
    A replica opened on a new directory catches up to the stream's end: it holds every
    acknowledged commit (an unacknowledged one only if it is the batch in flight), answers every
    read as ``MemoryStorage`` fed the same batches, and verifies; ``restore`` (when present) builds
    the same log; the new directory then takes over as the writer."""

    seed = random.randrange(2**32)
    rng = random.Random(seed)
    machine_a = tmp_path / "machine-a"
    stream = "loss"

    async def provision() -> (
        None
    ):  # the R3 stream and its lease bucket, made as a writer makes them
        storage = await open_writer(
            tmp_path / "provision",
            durability="replicated",
            nats=nats_cluster.urls,
            stream=stream,
            replicas=3,
        )
        await storage.close()

    _bounded(40, provision())
    child = Child(
        tmp_path,
        str(machine_a / "store"),
        "--nats",
        nats_cluster.urls,
        "--stream",
        stream,
        "--durability",
        "replicated",
        "--replicas",
        "3",
        "--agents",
        "3",
        "--workload",
        str(seed),
    )
    try:
        child.wait_for(lambda lines: "ready" in lines, 30, "ready")
        target = rng.randint(250, 400)
        child.wait_for(
            lambda lines: _count("ack#0 ")(lines) >= target, 60, f"{target} workload commits"
        )
        time.sleep(rng.uniform(0, 0.05))
    finally:
        child.kill()
    shutil.rmtree(machine_a)  # the machine is gone, and its disk with it
    ledger = Ledger()
    ledger.add(child.lines)
    assert not ledger.failures, ledger.failures[:5]
    store = ledger.store
    assert store is not None
    in_flight = [number for number in ledger.intents if number not in ledger.settled]
    assert len(in_flight) <= 1
    work = Workload(seed)
    batches = [work.batch() for _ in range(max(ledger.intents) + 1)]

    async def restore_elsewhere() -> None:
        messages = await read_subject(nats_cluster.urls, stream, subject(stream, store))
        records = check_subject(messages, store, {})
        last = len(records)
        assert last >= max(ledger.all_acked())
        machine_b = tmp_path / "machine-b"
        replica = await LmdbStorage.open_replica(
            machine_b, nats=nats_cluster.urls, stream=stream, store=store
        )
        try:
            await replica.wait(last, timeout=30)
            head = replica.log.head()
            assert head == last
            memory = MemoryStorage()
            unacknowledged = []
            for seq in range(1, head + 1):
                commit = replica.log.get(seq)
                assert commit is not None
                writes = [write_to_builtins(write) for write in commit.writes]
                if seq in ledger.workload:
                    fed = batches[ledger.workload[seq]]
                    assert canonical(writes) == canonical(fed), (
                        f"seed {seed}: record {seq} is not the batch acknowledged"
                    )
                elif seq in ledger.acked:
                    fed = writes
                    assert (
                        tuple(w["value"]["id"] for w in writes if w["type"] == "entry")
                        == ledger.acked[seq]
                    )
                else:  # committed, killed before it could say so: only what was in flight
                    fed = writes
                    unacknowledged.append(seq)
                    turn = all(
                        w["type"] in ("entry", "conversation") and w["value"]["id"] >= TURN_IDS
                        for w in writes
                    )
                    if not turn:
                        assert in_flight and canonical(writes) == canonical(
                            batches[in_flight[0]]
                        ), f"seed {seed}: {seq}"
                assert await memory.commit(copy.deepcopy(fed), CTX) == seq
            assert len(unacknowledged) <= 3, unacknowledged  # at most one batch in flight per agent
            assert canonical(await snapshot(replica, work, head)) == canonical(
                await snapshot(memory, work, head)
            ), f"seed {seed}"
            for seq, ids in ledger.acked.items():
                for id in ids:
                    ours, theirs = await replica.entry(id, CTX), await memory.entry(id, CTX)
                    assert ours is not None and ours["commitSeq"] == seq
                    assert canonical(ours) == canonical(theirs)
            exported = list(export_lines(machine_b))
        finally:
            await replica.close()
        assert verify(machine_b) is None
        try:
            from pi_durable_lmdb.audit.restore import restore
        except ImportError:
            restore = None
        if restore is not None:
            machine_c = tmp_path / "machine-c"
            assert await restore(nats_cluster.urls, stream, store, machine_c) == head
            assert list(export_lines(machine_c)) == exported
        # The restored store goes on as the writer (the dead one's lease is fenced out).
        writer = await LmdbStorage.open(
            machine_b,
            durability="replicated",
            nats=nats_cluster.urls,
            stream=stream,
            replicas=3,
            take_over="force",
        )
        try:
            seq = await writer.commit(
                [{"type": "conversation", "value": {"id": 3 * TURN_IDS}}], CTX
            )
            assert seq == head + 1
        finally:
            await writer.close()
        records = check_subject(
            await read_subject(nats_cluster.urls, stream, subject(stream, store)),
            store,
            local_records(machine_b),
        )
        assert len(records) == head + 1

    _bounded(90, restore_elsewhere())
    print(
        f"machine loss: seed {seed}, {len(ledger.all_acked())} acknowledged, in flight {in_flight}"
    )


# ── cluster faults ──────────────────────────────────────────────────────────


@dataclass
class Attempt:
    agent: int
    started: float
    ended: float
    seq: int | None
    error: BaseException | None
    ids: tuple[int, ...]


async def _stream_leader(servers: str, stream: str) -> str:
    nc = await _connect(servers)
    try:
        info = await nc.jetstream(timeout=5).stream_info(stream)
        assert info.cluster is not None and info.cluster.leader, info
        return info.cluster.leader
    finally:
        await nc.close()


@pytest.mark.cluster
def test_cluster_faults_one_node_down_two_down_and_back(
    tmp_path: Path, nats_cluster: NatsCluster
) -> None:
    """A replicated writer on a 3-node R3 stream, four agents committing turns. The stream's
    leader is SIGKILLed: commits go on after an election (failed ones are followed by new ones,
    acknowledged ones are never retried). A second node is SIGKILLed: no commit begun after that
    is acknowledged, and they fail within 15 s each with ``NatsUnavailableError`` (or its
    ``OutcomeUnknownError``) naming the stream. Both nodes come back: commits resume. Nothing
    acknowledged is lost, the stream holds each record once, as the local log does, and a replica
    that followed all along catches up and ends with the writer's log and projections.

    ``lease_ttl=120``: the writer's lease outlives the outage; with a shorter one, commits would
    fail with ``LeaseLapsedError`` instead until the writer takes its lease again (see
    ``test_a_writer_cut_off_longer_than_its_lease_stops_then_takes_it_again``)."""

    path, replica_dir = tmp_path / "store", tmp_path / "replica"
    stream = "faults"
    attempts: list[Attempt] = []
    timings: dict[str, float] = {}

    async def body() -> None:
        storage = await open_writer(
            path,
            durability="replicated",
            nats=nats_cluster.urls,
            stream=stream,
            replicas=3,
            lease_ttl=120,
        )
        stop = asyncio.Event()

        async def agent(k: int) -> None:
            conversation, turn = None, 0
            while not stop.is_set():
                started = time.monotonic()
                ids: tuple[int, ...] = ()
                try:
                    if conversation is None:
                        conversation = await storage.mint_id()
                        ids = (await storage.mint_id(),)
                        writes = [
                            {"type": "conversation", "value": {"id": conversation}},
                            _entry(ids[0], conversation),
                        ]
                    else:
                        ids = (await storage.mint_id(),)
                        writes = [_entry(ids[0], conversation, data={"turn": turn})]
                    seq = await storage.commit(writes, CTX)
                except REFUSALS as error:  # judged below: only a ReplicationError is right
                    attempts.append(Attempt(k, started, time.monotonic(), None, error, ids))
                    conversation = None  # it may or may not exist: a failed turn is not retried
                    await asyncio.sleep(0.05)
                    continue
                attempts.append(Attempt(k, started, time.monotonic(), seq, None, ids))
                turn += 1

        def acked_since(moment: float) -> int:
            return sum(1 for a in attempts if a.seq is not None and a.started > moment)

        async def until(condition: Callable[[], bool], timeout: float, what: str) -> float:
            await until_async(
                condition,
                timeout=timeout,
                what=what,
                detail=lambda: f"last attempts: {attempts[-4:]}",
            )
            return time.monotonic()

        replica: LmdbStorage | None = None
        lost = back = 0.0

        async def phases() -> None:
            nonlocal replica, lost, back
            begin = time.monotonic()
            await until(lambda: acked_since(begin) >= 200, 30, "200 commits")
            replica = await LmdbStorage.open_replica(
                replica_dir, nats=nats_cluster.urls, stream=stream, store=storage.store_id
            )

            # One node down: the stream's leader.
            first = nats_cluster.index_of(await _stream_leader(nats_cluster.urls, stream))
            await asyncio.to_thread(nats_cluster.kill, first)
            killed = time.monotonic()
            resumed = await until(
                lambda: acked_since(killed) >= 1, 30, "a commit after the leader's loss"
            )
            await until(lambda: acked_since(killed) >= 200, 20, "200 commits with one node down")
            timings["one down: first commit after"] = resumed - killed

            # Two down: no quorum.
            second = nats_cluster.index_of(await _stream_leader(nats_cluster.urls, stream))
            assert second != first
            await asyncio.to_thread(nats_cluster.kill, second)
            lost = time.monotonic()
            failing = lambda: [a for a in attempts if a.started > lost and a.error is not None]  # noqa: E731
            first_failure = await until(
                lambda: len(failing()) >= 1, 15, "a failed commit without quorum"
            )
            await until(lambda: len({a.agent for a in failing()}) == 4, 30, "every agent failing")
            timings["two down: first failure after"] = first_failure - lost
            timings["two down: longest failed commit"] = max(a.ended - a.started for a in failing())

            # Both back.
            await asyncio.to_thread(nats_cluster.start_node, first)
            await asyncio.to_thread(nats_cluster.start_node, second)
            back = time.monotonic()
            resumed = await until(
                lambda: acked_since(back) >= 1, 45, "a commit once the nodes are back"
            )
            await until(lambda: acked_since(back) >= 100, 30, "100 commits once the nodes are back")
            timings["back: first commit after"] = resumed - back

        agents = [asyncio.create_task(agent(k)) for k in range(4)]
        try:
            try:
                await phases()
            finally:
                stop.set()
                await asyncio.gather(*agents, return_exceptions=True)
            # The last attempts may have failed after their records landed: one more commit
            # settles, so the log then holds everything the stream does.
            conversation = await storage.mint_id()
            await storage.commit([{"type": "conversation", "value": {"id": conversation}}], CTX)
            head = storage.log.head()
            local = {seq: bytes(data) for seq, data in storage.log.raw_chunk(1, None, 10**6)}
            await storage.close()
            # The replica that followed through all of it catches up.
            began = time.monotonic()
            assert replica is not None
            await replica.wait(head, timeout=30)
            timings["replica caught up after"] = time.monotonic() - began
        finally:
            await storage.close()
            if replica is not None:
                await replica.close()

        no_quorum = [a for a in attempts if lost < a.started and a.ended < back]
        assert no_quorum and all(a.seq is None for a in no_quorum), (
            "a commit was acknowledged without a quorum"
        )
        for attempt in no_quorum:
            assert isinstance(attempt.error, NatsUnavailableError), repr(attempt.error)
            assert attempt.ended - attempt.started < 15, (
                f"a commit took {attempt.ended - attempt.started:.1f} s to fail"
            )
            assert stream in str(attempt.error) or "NATS" in str(attempt.error), str(attempt.error)
        odd = [
            a.error
            for a in attempts
            if a.error is not None and not isinstance(a.error, ReplicationError)
        ]
        assert not odd, f"failures that are not ReplicationError: {odd[:3]!r}"
        assert not [a for a in attempts if isinstance(a.error, NotWriterError)], (
            "the writer was deposed"
        )
        acked = [a for a in attempts if a.seq is not None]
        assert len({a.seq for a in acked}) == len(acked), "a sequence was acknowledged twice"
        for attempt in acked:
            assert (
                attempt.seq in local
                and entry_ids(local[attempt.seq], attempt.seq)[-1:] == attempt.ids
            ), attempt
        store = storage.store_id
        assert store is not None
        records = check_subject(
            await read_subject(nats_cluster.urls, stream, subject(stream, store)), store, local
        )
        assert len(records) == head == len(local)

    _bounded(170, body())
    assert list(export_lines(replica_dir)) == list(export_lines(path))
    assert verify(replica_dir) is None
    print("timings:", {name: round(value, 2) for name, value in timings.items()})
    errors: dict[str, str] = {}
    for attempt in attempts:
        if attempt.error is not None:
            errors.setdefault(type(attempt.error).__name__, str(attempt.error)[:160])
    print(
        f"{sum(a.seq is not None for a in attempts)} acknowledged, {sum(a.error is not None for a in attempts)} failed: {errors}"
    )
    assert verify(path) is None


@pytest.mark.cluster
def test_a_cluster_without_quorum_fails_opens_and_commits_with_replication_errors(
    tmp_path: Path, nats_cluster: NatsCluster
) -> None:
    """All three nodes of an R3 cluster crash and one comes back alone: it answers JetStream
    requests with "503 JetStream system temporarily unavailable". A replicated open, a replica
    open and a commit of an open writer then fail with ``NatsUnavailableError`` (never a raw
    nats-py error) within 12 s each; once the other nodes are back, the writer's commits resume."""

    path, replica_dir = tmp_path / "store", tmp_path / "replica"
    stream = "quorum"
    urls = nats_cluster.urls
    outcomes: list[tuple[str, float, BaseException]] = []

    async def body() -> None:
        storage = await open_writer(
            path, durability="replicated", nats=urls, stream=stream, replicas=3, lease_ttl=120
        )
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            store = storage.store_id
            assert store is not None
            for node in range(3):
                await asyncio.to_thread(nats_cluster.kill, node)
            await asyncio.to_thread(nats_cluster.start_node, 0)

            async def attempt(name: str, call: Callable[[], Awaitable[Any]]) -> None:
                began = time.monotonic()
                try:
                    result = await call()
                except REFUSALS as error:
                    outcomes.append((name, time.monotonic() - began, error))
                else:
                    if isinstance(result, LmdbStorage):
                        await result.close()
                    raise AssertionError(f"{name} succeeded with one node of three")

            began = time.monotonic()
            next_id = iter(range(100, 10**6))
            while time.monotonic() - began < 12:  # long enough for the lone node to answer 503s
                await attempt("commit", lambda: storage.commit([_entry(next(next_id))], CTX))
                await attempt(
                    "open",
                    lambda: LmdbStorage.open(
                        tmp_path / "other",
                        durability="replicated",
                        nats=urls,
                        stream=stream,
                        replicas=3,
                    ),
                )
                await attempt(
                    "open_replica",
                    lambda: LmdbStorage.open_replica(
                        replica_dir, nats=urls, stream=stream, store=store
                    ),
                )
            for node in (1, 2):
                await asyncio.to_thread(nats_cluster.start_node, node)
            back = time.monotonic()
            while True:
                tried = time.monotonic()
                try:
                    seq = await storage.commit([_entry(next(next_id))], CTX)
                    break
                except REFUSALS as error:
                    outcomes.append(("commit, nodes coming back", time.monotonic() - tried, error))
                    assert time.monotonic() - back < 45, (
                        "commits did not resume once the nodes were back"
                    )
                    await asyncio.sleep(0.2)
            assert seq == storage.log.head() and seq >= 2
        finally:
            await storage.close()

    _bounded(100, body())
    raw = [
        (name, error) for name, _, error in outcomes if not isinstance(error, NatsUnavailableError)
    ]
    assert not raw, f"errors that are not NatsUnavailableError: {raw[:4]!r}"
    slow = [(name, round(seconds, 1)) for name, seconds, _ in outcomes if seconds > 12]
    assert not slow, slow
    assert {"commit", "open", "open_replica"} <= {name for name, _, _ in outcomes}


@pytest.mark.slow
def test_a_writer_cut_off_longer_than_its_lease_stops_then_takes_it_again(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """The server is down longer than a writer's lease may go unrenewed (``lease_ttl=2``: 1.5 s):
    a commit is then refused at once with ``LeaseLapsedError`` (a ``NotWriterError``) naming the
    lease, committing nothing. Once the server is back, nobody else having taken the lease, the
    writer holds it again (taken again with a new epoch, fenced on the subject, or renewed by a
    request sent before it lapsed) and commits resume in the same handle; nothing acknowledged is
    lost and the subject holds each record once."""

    path = tmp_path / "store"
    stream = "lease"

    async def body() -> None:
        storage = await open_writer(
            path, durability="replicated", nats=nats_server.url, stream=stream, lease_ttl=2
        )
        try:
            acked = [await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)]
            for id in range(100, 120):
                acked.append(await storage.commit([_entry(id)], CTX))
            epoch = storage.replication.epoch
            await asyncio.to_thread(nats_server.stop)
            await asyncio.sleep(2.0)  # past the lease's 1.5 s: the writer no longer counts on it
            began = time.monotonic()
            with pytest.raises(LeaseLapsedError, match="lease") as caught:
                await storage.commit([_entry(200)], CTX)
            assert time.monotonic() - began < 1, "the lease is checked before the network"
            assert storage.store_id in str(caught.value), str(caught.value)
            assert storage.log.head() == acked[-1]
            await asyncio.to_thread(nats_server.start)
            back = time.monotonic()
            next_id = iter(range(300, 10**6))
            while True:
                try:
                    acked.append(await storage.commit([_entry(next(next_id))], CTX))
                    break
                except NotWriterError as error:
                    assert isinstance(error, LeaseLapsedError), repr(
                        error
                    )  # never deposed for good
                except NatsUnavailableError:
                    pass
                assert time.monotonic() - back < 15, (
                    "commits did not resume once the server was back"
                )
                await asyncio.sleep(0.1)
            resumed = time.monotonic() - back
            # Taken again (a new epoch, fenced on the subject); or, when a renewal sent just
            # before the lease lapsed waited in the client for the server to come back, renewed
            # at its epoch: its revision was unchanged, so nobody took the lease meanwhile.
            regained = storage.replication.epoch > epoch
            assert storage.replication.epoch >= epoch
            for id in range(1000, 1020):
                began = time.monotonic()
                while True:
                    try:
                        acked.append(await storage.commit([_entry(id)], CTX))
                        break
                    except LeaseLapsedError:  # a renewal late on a loaded machine (1.5 s lease):
                        pass  # nothing was committed; the writer takes its lease again
                    assert time.monotonic() - began < 15, "commits did not resume after a lapse"
                    await asyncio.sleep(0.1)
            assert acked == sorted(set(acked)) and acked[-1] == storage.log.head()
            store = storage.store_id
            assert store is not None
            local = {seq: bytes(data) for seq, data in storage.log.raw_chunk(1, None, 10**6)}
        finally:
            await storage.close()
        messages = await read_subject(nats_server.url, stream, subject(stream, store))
        records = check_subject(messages, store, local)
        assert len(records) == len(local)
        fences = [message.epoch for message in messages if message.kind == "fence"]
        assert fences == sorted(set(fences)) and len(fences) >= 1 + regained, fences
        print(f"commits resumed {resumed:.2f} s after the server was back ({regained=})")

    _bounded(60, body())
