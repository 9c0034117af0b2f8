"""Replication through NATS JetStream (issue #14), against real nats-server processes.

Nothing is mocked: the servers are ``tests/support/natsserver.py``'s (one node, or a 3-node R3 cluster),
writers that are SIGKILLed run in child processes (``tests/support/replication_child.py``, which prints
every acknowledged commit before it does anything else), and the stream is read back with nats-py
directly, never through the engine's own link, so what the tests see is what the server holds.

What is checked:

* exactly once: across ~10 writer kills and two server restarts, in async shipping and in
  replicated mode, the store's subject holds each record once, in order, byte for byte the local
  log's records, and every acknowledged commit; the stream alone rebuilds the store;
* one store, one subject across modes (replicated, shipping, replicated again);
* wrong setups fail with clear errors.

Two tests began as ``xfail(strict=True)`` and were fixed: a store written before it had a stream
ships that history; a record too big for the stream fails alone with a clear error.

The other parts: ``test_replication_faults.py`` (machine loss, cluster faults, a lapsed lease),
``test_replication_replicas.py``.

Every test is bounded in time (children and waits have deadlines; ``_bounded`` wraps the async
bodies), and every process a test starts is stopped in a ``finally``.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import (
    NatsUnavailableError,
    ReplicationError,
    StreamMissingError,
    WrongStoreError,
)
from pi_durable_lmdb.audit import export_lines, verify
from pi_durable_lmdb.storage import LmdbStorage

from ..support.natsserver import NatsNode, free_port, nats_server  # noqa: F401 - fixtures
from ..support.replication_helpers import (
    Child,
    Ledger,
    _bounded,
    _connect,
    _entry,
    check_subject,
    entry_ids,
    last_on_subject,
    local_head,
    local_records,
    read_subject,
    subject,
)

# ── exactly once, across writer kills and server restarts ─────────────────────


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["process", "replicated"])
def test_exactly_once_across_writer_kills_and_server_restarts(
    tmp_path: Path, nats_server: NatsNode, durability: str
) -> None:
    """A child writer (4 agents, conversation + entry turns, ids from ``mint_id``) is SIGKILLed at
    a random moment 10 times and restarted; the NATS server is restarted under it twice (once
    gracefully, once SIGKILLed); a last writer closes cleanly past 3,000 commits. The store's
    subject then holds records 1..N once each, in order, byte for byte the local log's: in
    replicated mode before anything else opens the store (so every acknowledged commit was in the
    stream already), in shipping mode once a writer drained what was left behind. Every
    acknowledged sequence holds the entries it was acknowledged for, locally and in the stream."""

    started = time.monotonic()
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    path = tmp_path / "store"
    stream = f"once-{durability}"
    args = [
        str(path),
        "--nats",
        nats_server.url,
        "--stream",
        stream,
        "--durability",
        durability,
        "--agents",
        "4",
    ]
    if durability != "replicated":
        args += ["--pause", "0.01"]  # a few hundred commits per round, as in replicated mode
    restarts = {3: True, 7: False}  # round -> graceful
    ledger = Ledger()
    kills: list[tuple[int, int]] = []  # (local head, the head the stream's last message stands for)
    for round in range(10):
        child = Child(tmp_path, *args)
        try:
            child.wait_for(lambda lines: "ready" in lines, 30, "ready")
            if round in restarts:
                time.sleep(rng.uniform(0.05, 0.4))
                nats_server.restart(graceful=restarts[round])
            time.sleep(rng.uniform(0.05, 0.9))
        finally:
            child.kill()
        ledger.add(child.lines)
        assert ledger.store is not None
        kills.append(
            (
                local_head(path),
                asyncio.run(
                    last_on_subject(nats_server.url, stream, subject(stream, ledger.store))
                ),
            )
        )
        if durability == "replicated":  # published before committed locally: never behind
            assert kills[-1][1] >= kills[-1][0], kills
        else:  # shipped behind the commits: never ahead
            assert kills[-1][1] <= kills[-1][0], kills
    assert ledger.store is not None
    more = max(200, 3000 - len(ledger.acked))
    child = Child(tmp_path, *args, "--count", str(more))
    try:
        child.wait_for(lambda lines: "closed" in lines, 60, "a clean close")
        assert child.finish(10) == 0, child.tail()
    finally:
        child.kill()
    ledger.add(child.lines)
    assert len(ledger.acked) >= 3000, f"seed {seed}: only {len(ledger.acked)} commits acknowledged"
    if durability == "replicated":  # a publish refused or unanswered fails its commit, nothing else
        odd = [
            line
            for line in ledger.failures
            if not line.split()[1].endswith(
                ("NatsUnavailableError", "OutcomeUnknownError", "ReplicationError")
            )
        ]
        assert not odd, odd[:5]
    else:
        assert not ledger.failures, ledger.failures[:5]  # shipping never fails a commit
    store = ledger.store
    subj = subject(stream, store)

    # Before anything else opens the store: what the kills and restarts left.
    local = local_records(path)
    head = max(local, default=0)
    records = check_subject(asyncio.run(read_subject(nats_server.url, stream, subj)), store, local)
    assert sorted(local) == list(range(1, head + 1))
    for seq, ids in ledger.acked.items():
        assert seq in local and entry_ids(local[seq], seq) == ids, (
            f"seed {seed}: acknowledged {seq} ({ids}) is not in the log"
        )
    if durability == "replicated":
        # Each commit was acknowledged only after the stream held it: all of them are there, and
        # the writer that closed cleanly took in whatever an earlier one left in the stream only.
        assert len(records) == head, (
            f"seed {seed}: the stream holds {len(records)} records, the log {head}"
        )
        for seq, ids in ledger.acked.items():
            assert entry_ids(records[seq - 1].data, seq) == ids
        fences = [
            message.epoch
            for message in asyncio.run(read_subject(nats_server.url, stream, subj))
            if message.kind == "fence"
        ]
        assert len(fences) >= 11 and fences == sorted(set(fences)), (
            f"a fence per writer, growing epochs: {fences}"
        )
    else:
        assert len(records) <= head

    # A shipping writer drains what is left; a replicated writer settles (and has nothing to add).
    async def reopen() -> Any:
        storage = await LmdbStorage.open(
            path, durability=durability, nats=nats_server.url, stream=stream
        )
        try:
            if durability != "replicated":
                assert await storage._link.arun(storage.replication.drain(15)), (
                    storage.replication.status()
                )
            return storage.replication.status()
        finally:
            await storage.close()

    status = _bounded(30, reopen())
    assert status.shipped_seq == head and status.lag_records == 0, status
    local = local_records(path)
    assert max(local) == head
    records = check_subject(asyncio.run(read_subject(nats_server.url, stream, subj)), store, local)
    assert len(records) == head, (
        f"seed {seed}: the stream holds {len(records)} records, the log {head}"
    )
    for seq, ids in ledger.acked.items():
        assert entry_ids(records[seq - 1].data, seq) == ids
    assert verify(path) is None

    # The stream alone rebuilds the store (fences, settled groups, id reservations and all), and
    # a writer on the rebuilt store mints above every id handed out before.
    rebuilt_dir = tmp_path / "rebuilt"

    async def rebuild_from_stream() -> int:
        replica = await LmdbStorage.open_replica(
            rebuilt_dir, nats=nats_server.url, stream=stream, store=store
        )
        try:
            await replica.wait(head, timeout=30)
        finally:
            await replica.close()
        assert list(export_lines(rebuilt_dir)) == list(export_lines(path))
        writer = await LmdbStorage.open(
            rebuilt_dir, durability="replicated", nats=nats_server.url, stream=stream
        )
        try:
            return await writer.mint_id()
        finally:
            await writer.close()

    messages = asyncio.run(read_subject(nats_server.url, stream, subj))
    reserved = max(
        (msgspec.msgpack.decode(m.data)["upto"] for m in messages if m.kind == "ids"), default=0
    )
    if durability == "replicated":
        assert reserved > 0, "no id reservation went to the stream"
    minted = _bounded(40, rebuild_from_stream())
    assert minted > max(id for ids in ledger.acked.values() for id in ids) and minted >= reserved, (
        minted,
        reserved,
    )
    assert verify(rebuilt_dir) is None
    elapsed = time.monotonic() - started
    print(
        f"{durability}: seed {seed}, {len(ledger.acked)} acknowledged, {len(ledger.failures)} failed, "
        f"head {head}, {elapsed:.1f} s; at each kill (local head, stream head): {kills}"
    )
    assert elapsed < 120, f"took {elapsed:.0f} s"


# ── one store, one history, whatever the mode ─────────────────────────────────


def test_a_store_keeps_one_history_across_modes(tmp_path: Path, nats_server: NatsNode) -> None:
    """One store, one subject, whatever the mode of each open: a replicated writer, a shipping
    (``process``) writer, a replicated writer again. A replica follows all of it without refusing
    a message (the shipped records carry the epoch of the writer before them, never one a fence
    ruled out), the subject holds records 1..N once each, and the replica ends with the writer's
    log."""

    path, replica_dir = tmp_path / "store", tmp_path / "replica"
    stream = "modes"
    url = nats_server.url

    async def body() -> None:
        storage = await LmdbStorage.open(path, durability="replicated", nats=url, stream=stream)
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for id in range(100, 150):
                await storage.commit([_entry(id)], CTX)
            store = storage.store_id
            assert store is not None
        finally:
            await storage.close()
        replica = await LmdbStorage.open_replica(replica_dir, nats=url, stream=stream, store=store)
        try:
            await replica.wait(51, timeout=10)
            storage = await LmdbStorage.open(path, durability="process", nats=url, stream=stream)
            try:
                for id in range(150, 200):
                    await storage.commit([_entry(id)], CTX)
                assert await storage._link.arun(storage.replication.drain(10)), (
                    storage.replication.status()
                )
            finally:
                await storage.close()
            await replica.wait(101, timeout=10)
            storage = await LmdbStorage.open(path, durability="replicated", nats=url, stream=stream)
            try:
                assert await storage.commit([_entry(200)], CTX) == 102
            finally:
                await storage.close()
            await replica.wait(102, timeout=10)
            assert not replica.replication.status().stopped
        finally:
            await replica.close()
        records = check_subject(
            await read_subject(url, stream, subject(stream, store)), store, local_records(path)
        )
        assert len(records) == 102

    _bounded(60, body())
    assert list(export_lines(replica_dir)) == list(export_lines(path))
    assert verify(replica_dir) is None


@pytest.mark.parametrize("durability", ["replicated", "process"])
def test_a_store_written_before_it_had_a_stream_ships_its_history(
    tmp_path: Path, nats_server: NatsNode, durability: str
) -> None:
    """300 commits made with no stream at all; then the store is opened linked to one: its
    writer (replicated, or shipping) puts that history on the subject before its own new records,
    so a replica (and a restore) holds the whole log."""

    path, replica_dir = tmp_path / "store", tmp_path / "replica"
    stream = "late"
    url = nats_server.url

    async def body() -> None:
        storage = await LmdbStorage.open(path, durability="power")
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for id in range(100, 399):
            await storage.commit([_entry(id)], CTX)
        store = storage.store_id
        assert store is not None
        await storage.close()
        storage = await LmdbStorage.open(path, durability=durability, nats=url, stream=stream)
        try:
            assert await storage.commit([_entry(400)], CTX) == 301
            if durability != "replicated":
                assert await storage._link.arun(storage.replication.drain(10)), (
                    storage.replication.status()
                )
        finally:
            await storage.close()
        records = check_subject(
            await read_subject(url, stream, subject(stream, store)), store, local_records(path)
        )
        assert len(records) == 301
        replica = await LmdbStorage.open_replica(replica_dir, nats=url, stream=stream, store=store)
        try:
            await replica.wait(301, timeout=10)
        finally:
            await replica.close()

    _bounded(60, body())
    assert list(export_lines(replica_dir)) == list(export_lines(path))


def test_a_commit_too_big_for_the_stream_fails_alone_with_a_clear_error(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """A replicated commit whose record exceeds the server's ``max_payload`` cannot be acknowledged:
    it fails with a ``ReplicationError`` naming the limit, commits nothing, and the commits of its
    group beside it go through."""

    async def body() -> None:
        storage = await LmdbStorage.open(
            tmp_path / "store", durability="replicated", nats=nats_server.url, stream="big"
        )
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            outcomes = await asyncio.gather(
                *(
                    storage.commit(
                        [_entry(100 + n, data={"text": "x" * (2_000_000 if n == 3 else 10)})], CTX
                    )
                    for n in range(6)
                ),
                return_exceptions=True,
            )
            big = outcomes.pop(3)
            assert sorted(outcomes) == list(range(2, 7)), outcomes  # type: ignore[type-var]
            assert isinstance(big, ReplicationError) and "payload" in str(big), repr(big)
            assert await storage.entry(103, CTX) is None
        finally:
            await storage.close()

    _bounded(30, body())


# ── wrong setups ────────────────────────────────────────────────────────────


def _nats_threads() -> list[str]:
    return [thread.name for thread in threading.enumerate() if thread.name.startswith("nats ")]


@pytest.mark.slow
def test_unreachable_server_fails_fast_and_leaves_the_store_usable(tmp_path: Path) -> None:
    """Nobody listens on the port: a replicated open, a shipping open and a replica open each fail
    with ``NatsUnavailableError`` naming the server within a few seconds, the directory is not
    left locked, and no link thread is left running."""

    url = f"nats://127.0.0.1:{free_port()}"

    async def body() -> None:
        opens: dict[str, Callable[[], Awaitable[LmdbStorage]]] = {
            "replicated": lambda: LmdbStorage.open(
                tmp_path / "a", durability="replicated", nats=url, stream="s"
            ),
            "shipping": lambda: LmdbStorage.open(
                tmp_path / "b", durability="process", nats=url, stream="s"
            ),
            "replica": lambda: LmdbStorage.open_replica(
                tmp_path / "c", nats=url, stream="s", store="0123456789abcdef"
            ),
        }

        async def fails(name: str, opener: Callable[[], Awaitable[LmdbStorage]]) -> None:
            began = time.monotonic()
            with pytest.raises(NatsUnavailableError) as caught:
                await opener()
            elapsed = time.monotonic() - began
            assert elapsed < 8, f"{name}: {elapsed:.1f} s to fail"
            assert "127.0.0.1" in str(caught.value), str(caught.value)

        await asyncio.gather(*(fails(name, opener) for name, opener in opens.items()))
        for directory in ("a", "b", "c"):
            storage = await LmdbStorage.open(tmp_path / directory)  # not locked by the failed open
            await storage.close()
        assert not _nats_threads(), _nats_threads()

    _bounded(40, body())


def test_wrong_stream_store_or_replicas_get_clear_errors(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """``open_replica`` of a stream that does not exist, or does not carry store subjects:
    ``StreamMissingError`` naming it. A directory opened with another store's id:
    ``WrongStoreError``, as writer and as replica. ``replicas=3`` on a single server: a
    ``ReplicationError`` giving NATS's reason. Each leaves the directory usable."""

    url = nats_server.url

    async def body() -> None:
        with pytest.raises(StreamMissingError, match="'nope'"):
            await LmdbStorage.open_replica(
                tmp_path / "r", nats=url, stream="nope", store="0123456789abcdef"
            )
        nc = await _connect(url)
        try:
            await nc.jetstream(timeout=5).add_stream(name="other", subjects=["elsewhere.>"])
        finally:
            await nc.close()
        with pytest.raises(StreamMissingError, match="other"):
            await LmdbStorage.open_replica(
                tmp_path / "r", nats=url, stream="other", store="0123456789abcdef"
            )
        with pytest.raises(StreamMissingError, match="other"):
            await LmdbStorage.open(
                tmp_path / "w", durability="replicated", nats=url, stream="other"
            )

        storage = await LmdbStorage.open(
            tmp_path / "store", durability="replicated", nats=url, stream="ok"
        )
        store = storage.store_id
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.close()
        assert store is not None
        for opener in (
            lambda: LmdbStorage.open(tmp_path / "store", store="fedcba9876543210"),
            lambda: LmdbStorage.open(
                tmp_path / "store",
                durability="replicated",
                nats=url,
                stream="ok",
                store="fedcba9876543210",
            ),
            lambda: LmdbStorage.open_replica(
                tmp_path / "store", nats=url, stream="ok", store="fedcba9876543210"
            ),
        ):
            with pytest.raises(WrongStoreError) as caught:
                await opener()
            assert store in str(caught.value) and "fedcba9876543210" in str(caught.value), str(
                caught.value
            )
        again = await LmdbStorage.open(
            tmp_path / "store", durability="replicated", nats=url, stream="ok", store=store
        )
        assert again.log.head() == 1
        await again.close()

        began = time.monotonic()
        with pytest.raises(ReplicationError) as caught:
            await LmdbStorage.open(
                tmp_path / "r3", durability="replicated", nats=url, stream="three", replicas=3
            )
        assert time.monotonic() - began < 8
        message = str(caught.value)
        assert "3 replicas" in message and "'three'" in message, message
        assert "replicas" in message.split(":", 1)[1].lower() or "cluster" in message.lower(), (
            message
        )
        storage = await LmdbStorage.open(
            tmp_path / "r3", durability="replicated", nats=url, stream="three"
        )
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.close()
        assert not _nats_threads(), _nats_threads()

    _bounded(60, body())
