"""Replication through NATS JetStream (issue #14), against real nats-server processes.

Nothing is mocked: the servers are ``tests/natsserver.py``'s (one node, or a 3-node R3 cluster),
writers that are SIGKILLed run in child processes (``tests/replication_child.py``, which prints
every acknowledged commit before it does anything else), and the stream is read back with nats-py
directly, never through the engine's own link, so what the tests see is what the server holds.

What is checked:

* exactly once: across ~10 writer kills and two server restarts, in async shipping and in
  replicated mode, the store's subject holds each record once, in order, byte for byte the local
  log's records, and every acknowledged commit; the stream alone rebuilds the store;
* machine loss: a replicated writer on R3 killed and its directory deleted mid-load; a store
  rebuilt elsewhere from the stream holds every acknowledged commit and answers every read as
  pi-durable's ``MemoryStorage`` fed the same writes, and goes on as the writer;
* cluster faults on R3: one node down (commits go on), two down (commits fail fast with a clear
  error, nothing acknowledged is lost), nodes back (commits resume), no quorum at all (opens and
  commits fail with ``NatsUnavailableError``, never a raw nats-py error); a writer whose lease
  lapsed in an outage takes it again;
* replicas: follow a writer under load and end identical (verify, export), catch up after being
  closed for thousands of commits, resume exactly after being SIGKILLed, refuse commits, and stop
  at a forged message naming it, applying nothing of it;
* one store, one subject across modes (replicated, shipping, replicated again);
* wrong setups fail with clear errors.

Two tests began as ``xfail(strict=True)`` and were fixed: a store written before it had a stream
ships that history; a record too big for the stream fails alone with a clear error.

Every test is bounded in time (children and waits have deadlines; ``_bounded`` wraps the async
bodies), and every process a test starts is stopped in a ``finally``.
"""

from __future__ import annotations

import asyncio
import copy
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage

from pi_durable_lmdb import (
    ForeignMessageError,
    LeaseLapsedError,
    NatsUnavailableError,
    NotWriterError,
    ReplicationError,
    StreamMissingError,
    WrongStoreError,
)
from pi_durable_lmdb.log import Environment, WriteLog, decode_record, encode_batch, write_to_builtins
from pi_durable_lmdb.log.stream.jetstream import Fence, encode_control
from pi_durable_lmdb.log.records import LogRecord, encode_record
from pi_durable_lmdb.storage import LmdbStorage
from pi_durable_lmdb.storage.audit import check, export_lines, verify

from .compare import canonical
from .natsserver import NatsCluster, NatsNode, free_port, nats_cluster, nats_server  # noqa: F401 - fixtures
from .workload import Workload, snapshot

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).with_name("replication_child.py")
DURABLE_LOG = Path(sys.executable).with_name("durable-log")
TURN_IDS = 10**9
"""Ids the child's turn agents use beside a workload (``replication_child.py``)."""


# ── helpers: bounded async bodies, child writers ──────────────────────────────


def _bounded(seconds: float, body: Coroutine[Any, Any, T]) -> T:
    """Run ``body`` on a fresh loop; a hang fails the test after ``seconds`` instead of hanging it."""

    return asyncio.run(asyncio.wait_for(body, seconds))


class Child:
    """One ``replication_child.py`` writer; its stdout lines are collected by a thread."""

    def __init__(self, log_dir: Path, *args: str) -> None:
        self.stderr_path = log_dir / f"child-{time.monotonic_ns()}.stderr"
        self._stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            text=True,
            bufsize=1,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, done: Callable[[list[str]], bool], timeout: float, what: str) -> list[str]:
        """Until ``done(lines)``; fails if the child exits first or ``timeout`` passes."""

        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if done(self.lines):
                    return list(self.lines)
                if self._eof:
                    raise AssertionError(f"the writer exited ({self.proc.wait(5)}) before {what}:\n{self.tail()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} after {timeout} s:\n{self.tail()}")
                self._cond.wait(left)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(10)
        self._stderr.close()

    def finish(self, timeout: float) -> int:
        """Wait for the child to exit by itself (killed after ``timeout``)."""

        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the writer did not finish in {timeout} s:\n{self.tail()}") from None
        finally:
            self.kill()

    def tail(self) -> str:
        with self._cond:
            lines = self.lines[-15:]
        self._stderr.flush()
        return "\n".join(lines) + "\n-- stderr --\n" + self.stderr_path.read_text(errors="replace")[-3000:]


def _count(prefix: str) -> Callable[[list[str]], int]:
    return lambda lines: sum(1 for line in lines if line.startswith(prefix))


@dataclass
class Ledger:
    """What children said: acknowledged commits (seq -> entry ids, or seq -> workload batch)."""

    acked: dict[int, tuple[int, ...]] = field(default_factory=dict)
    workload: dict[int, int] = field(default_factory=dict)
    intents: list[int] = field(default_factory=list)
    settled: set[int] = field(default_factory=set)
    """Workload batches whose outcome the child heard (acknowledged or rejected)."""
    failures: list[str] = field(default_factory=list)
    store: str | None = None

    def add(self, lines: list[str]) -> None:
        for line in lines:
            word, _, rest = line.partition(" ")
            if word == "opened":
                store = rest.split()[0]
                assert self.store in (None, store), f"the store's id changed from {self.store} to {store}"
                self.store = store
            elif word.startswith("ack#"):
                parts = rest.split()
                seq = int(parts[0])
                assert seq not in self.acked and seq not in self.workload, (
                    f"sequence {seq} was acknowledged twice (an acknowledged commit was lost): {line}"
                )
                if parts[1:2] == ["w"]:
                    self.workload[seq] = int(parts[2])
                    self.settled.add(int(parts[2]))
                else:
                    self.acked[seq] = tuple(int(id) for id in parts[1:])
            elif word.startswith("intent#"):
                self.intents.append(int(rest))
            elif word.startswith("reject#"):
                self.settled.add(int(rest.split()[0]))
            elif word.startswith("fail#") or word in ("deposed", "error"):
                self.failures.append(line)

    def all_acked(self) -> set[int]:
        return set(self.acked) | set(self.workload)


# ── helpers: the stream as nats-py sees it, the local log ───────────────────


@dataclass(frozen=True)
class Message:
    stream_seq: int
    headers: dict[str, str]
    data: bytes

    @property
    def kind(self) -> str:
        return self.headers.get("Pd-Kind", "")

    @property
    def seq(self) -> int:
        return int(self.headers.get("Pd-Seq", "-1"))

    @property
    def epoch(self) -> int:
        return int(self.headers.get("Pd-Epoch", "-1"))


async def _connect(servers: str) -> Any:
    import nats

    return await nats.connect(servers=servers.split(","), connect_timeout=2, max_reconnect_attempts=10, reconnect_time_wait=0.2)


async def read_subject(servers: str, stream: str, subject: str, timeout: float = 30.0) -> list[Message]:
    """Every message of ``subject``, in stream order, through an ordered consumer of our own."""

    import nats.js.errors
    from nats.js.api import DeliverPolicy

    deadline = time.monotonic() + timeout
    nc = await _connect(servers)
    try:
        js = nc.jetstream(timeout=5)
        info = await js.stream_info(stream, subjects_filter=subject)
        count = (info.state.subjects or {}).get(subject, 0)
        out: list[Message] = []
        if count:
            sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
            try:
                while len(out) < count:
                    msg = await sub.next_msg(timeout=max(0.1, deadline - time.monotonic()))
                    out.append(Message(msg.metadata.sequence.stream, dict(msg.headers or {}), bytes(msg.data)))
            finally:
                await sub.unsubscribe()
        try:
            last = await js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            last = None
        assert (last.seq if last else None) == (out[-1].stream_seq if out else None), "the subject moved while read"
        return out
    finally:
        await nc.close()


async def publish_raw(servers: str, subject: str, headers: dict[str, str], body: bytes) -> int:
    """Publish one message with nats-py (a forger's tool); returns its stream sequence."""

    nc = await _connect(servers)
    try:
        ack = await nc.jetstream(timeout=5).publish(subject, body, headers=headers)
        return int(ack.seq)
    finally:
        await nc.close()


async def last_on_subject(servers: str, stream: str, subject: str) -> int:
    """The log head the subject's last message stands for (its ``Pd-Seq``; 0: no message)."""

    import nats.js.errors

    nc = await _connect(servers)
    try:
        last = await nc.jetstream(timeout=5).get_last_msg(stream, subject)
        return int((last.headers or {}).get("Pd-Seq", "0"))
    except nats.js.errors.NotFoundError:
        return 0
    finally:
        await nc.close()


def local_head(path: Path) -> int:
    env = Environment(str(path), readonly=True)
    try:
        return WriteLog(env).head()
    finally:
        env.close()


def local_records(path: Path) -> dict[int, bytes]:
    """Every record of the store's log, as stored (the writer is gone)."""

    env = Environment(str(path), readonly=True)
    try:
        log = WriteLog(env)
        out: dict[int, bytes] = {}
        first = 1
        while rows := log.raw_chunk(first, None, 4096):
            out.update((seq, bytes(data)) for seq, data in rows)
            first = rows[-1][0] + 1
        return out
    finally:
        env.close()


def check_subject(messages: list[Message], store: str, local: dict[int, bytes]) -> list[Message]:
    """The subject holds only this store's messages, its records exactly once each, in order from
    1, each byte for byte the local record of that sequence (where the local log has it), epochs
    never going back. Returns the record messages."""

    for message in messages:
        assert message.headers.get("Pd-Format") == "1", f"message {message.stream_seq}: {message.headers}"
        assert message.headers.get("Pd-Store") == store, f"message {message.stream_seq}: {message.headers}"
        assert message.kind in ("record", "fence", "ids"), f"message {message.stream_seq}: {message.headers}"
    epochs = [message.epoch for message in messages]
    assert epochs == sorted(epochs), f"writer epochs go back along the subject: {epochs[:50]}"
    records = [message for message in messages if message.kind == "record"]
    seqs = [message.seq for message in records]
    if seqs != list(range(1, len(seqs) + 1)):
        index = next(i for i, seq in enumerate(seqs) if seq != i + 1)
        raise AssertionError(
            f"the subject's records are not 1..{len(seqs)} once each, in order: at stream sequence "
            f"{records[index].stream_seq} comes record {seqs[index]}, not {index + 1} (around: {seqs[max(0, index - 3):index + 4]})"
        )
    for message in records:
        assert message.headers.get("Nats-Msg-Id") == f"{store}:{message.seq}", message.headers
        if message.seq in local:
            assert message.data == local[message.seq], f"record {message.seq} in the stream differs from the local log's"
    return records


def entry_ids(data: bytes, seq: int) -> tuple[int, ...]:
    writes = [write_to_builtins(write) for write in decode_record(seq, data).writes]
    return tuple(write["value"]["id"] for write in writes if write["type"] == "entry")


def subject(stream: str, store: str) -> str:
    return f"{stream}.{store}.log"


def _entry(id: int, conversation: int = 1, **extra: Any) -> dict[str, Any]:
    return {"type": "entry", "value": {"id": id, "conversationId": conversation, "kind": "message", **extra}}


async def open_writer(path: Path, **options: Any) -> LmdbStorage:
    """``LmdbStorage.open(path, **options)``, tried again for up to 30 s while a cluster that just
    started cannot place a new stream's or lease bucket's replicas yet ("no suitable peers for
    placement", a 400 the engine rightly passes on) or leaves a first request unanswered."""

    deadline = time.monotonic() + 30
    while True:
        try:
            return await LmdbStorage.open(path, **options)
        except ReplicationError as error:
            transient = isinstance(error, NatsUnavailableError) or "no suitable peers" in str(error)
            if not transient or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(DURABLE_LOG), *args], capture_output=True, timeout=60, cwd=ROOT)


# ── exactly once, across writer kills and server restarts ─────────────────────


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["process", "replicated"])
def test_exactly_once_across_writer_kills_and_server_restarts(tmp_path: Path, nats_server: NatsNode, durability: str) -> None:
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
    args = [str(path), "--nats", nats_server.url, "--stream", stream, "--durability", durability, "--agents", "4"]
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
        kills.append((local_head(path), asyncio.run(last_on_subject(nats_server.url, stream, subject(stream, ledger.store)))))
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
        odd = [line for line in ledger.failures if not line.split()[1].endswith(("NatsUnavailableError", "OutcomeUnknownError", "ReplicationError"))]
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
        assert seq in local and entry_ids(local[seq], seq) == ids, f"seed {seed}: acknowledged {seq} ({ids}) is not in the log"
    if durability == "replicated":
        # Each commit was acknowledged only after the stream held it: all of them are there, and
        # the writer that closed cleanly took in whatever an earlier one left in the stream only.
        assert len(records) == head, f"seed {seed}: the stream holds {len(records)} records, the log {head}"
        for seq, ids in ledger.acked.items():
            assert entry_ids(records[seq - 1].data, seq) == ids
        fences = [message.epoch for message in asyncio.run(read_subject(nats_server.url, stream, subj)) if message.kind == "fence"]
        assert len(fences) >= 11 and fences == sorted(set(fences)), f"a fence per writer, growing epochs: {fences}"
    else:
        assert len(records) <= head

    # A shipping writer drains what is left; a replicated writer settles (and has nothing to add).
    async def reopen() -> dict[str, Any]:
        storage = await LmdbStorage.open(path, durability=durability, nats=nats_server.url, stream=stream)
        try:
            if durability != "replicated":
                assert await storage._link.arun(storage.replication.drain(15)), storage.replication.status()
            return storage.replication.status()
        finally:
            await storage.close()

    status = _bounded(30, reopen())
    assert status["shippedSeq"] == head and status["lagRecords"] == 0, status
    local = local_records(path)
    assert max(local) == head
    records = check_subject(asyncio.run(read_subject(nats_server.url, stream, subj)), store, local)
    assert len(records) == head, f"seed {seed}: the stream holds {len(records)} records, the log {head}"
    for seq, ids in ledger.acked.items():
        assert entry_ids(records[seq - 1].data, seq) == ids
    assert verify(path) is None

    # The stream alone rebuilds the store (fences, settled groups, id reservations and all), and
    # a writer on the rebuilt store mints above every id handed out before.
    rebuilt_dir = tmp_path / "rebuilt"

    async def rebuild_from_stream() -> int:
        replica = await LmdbStorage.open_replica(rebuilt_dir, nats=nats_server.url, stream=stream, store=store)
        try:
            await replica.wait(head, timeout=30)
        finally:
            await replica.close()
        assert list(export_lines(rebuilt_dir)) == list(export_lines(path))
        writer = await LmdbStorage.open(rebuilt_dir, durability="replicated", nats=nats_server.url, stream=stream)
        try:
            return await writer.mint_id()
        finally:
            await writer.close()

    messages = asyncio.run(read_subject(nats_server.url, stream, subj))
    reserved = max((msgspec.msgpack.decode(m.data)["upto"] for m in messages if m.kind == "ids"), default=0)
    if durability == "replicated":
        assert reserved > 0, "no id reservation went to the stream"
    minted = _bounded(40, rebuild_from_stream())
    assert minted > max(id for ids in ledger.acked.values() for id in ids) and minted >= reserved, (minted, reserved)
    assert verify(rebuilt_dir) is None
    elapsed = time.monotonic() - started
    print(
        f"{durability}: seed {seed}, {len(ledger.acked)} acknowledged, {len(ledger.failures)} failed, "
        f"head {head}, {elapsed:.1f} s; at each kill (local head, stream head): {kills}"
    )
    assert elapsed < 120, f"took {elapsed:.0f} s"


# ── machine loss ─────────────────────────────────────────────────────────────


@pytest.mark.cluster
def test_machine_loss_every_acknowledged_commit_is_restored_from_the_stream(tmp_path: Path, nats_cluster: NatsCluster) -> None:
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

    async def provision() -> None:  # the R3 stream and its lease bucket, made as a writer makes them
        storage = await open_writer(tmp_path / "provision", durability="replicated", nats=nats_cluster.urls, stream=stream, replicas=3)
        await storage.close()

    _bounded(40, provision())
    child = Child(
        tmp_path, str(machine_a / "store"), "--nats", nats_cluster.urls, "--stream", stream,
        "--durability", "replicated", "--replicas", "3", "--agents", "3", "--workload", str(seed),
    )
    try:
        child.wait_for(lambda lines: "ready" in lines, 30, "ready")
        target = rng.randint(250, 400)
        child.wait_for(lambda lines: _count("ack#0 ")(lines) >= target, 60, f"{target} workload commits")
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
        replica = await LmdbStorage.open_replica(machine_b, nats=nats_cluster.urls, stream=stream, store=store)
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
                    assert canonical(writes) == canonical(fed), f"seed {seed}: record {seq} is not the batch acknowledged"
                elif seq in ledger.acked:
                    fed = writes
                    assert tuple(w["value"]["id"] for w in writes if w["type"] == "entry") == ledger.acked[seq]
                else:  # committed, killed before it could say so: only what was in flight
                    fed = writes
                    unacknowledged.append(seq)
                    turn = all(w["type"] in ("entry", "conversation") and w["value"]["id"] >= TURN_IDS for w in writes)
                    if not turn:
                        assert in_flight and canonical(writes) == canonical(batches[in_flight[0]]), f"seed {seed}: {seq}"
                assert await memory.commit(copy.deepcopy(fed), CTX) == seq
            assert len(unacknowledged) <= 3, unacknowledged  # at most one batch in flight per agent
            assert canonical(await snapshot(replica, work, head)) == canonical(await snapshot(memory, work, head)), f"seed {seed}"
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
            from pi_durable_lmdb.storage.restore import restore
        except ImportError:
            restore = None
        if restore is not None:
            machine_c = tmp_path / "machine-c"
            assert await restore(nats_cluster.urls, stream, store, machine_c) == head
            assert list(export_lines(machine_c)) == exported
        # The restored store goes on as the writer (the dead one's lease is fenced out).
        writer = await LmdbStorage.open(
            machine_b, durability="replicated", nats=nats_cluster.urls, stream=stream, replicas=3, take_over="force"
        )
        try:
            seq = await writer.commit([{"type": "conversation", "value": {"id": 3 * TURN_IDS}}], CTX)
            assert seq == head + 1
        finally:
            await writer.close()
        records = check_subject(await read_subject(nats_cluster.urls, stream, subject(stream, store)), store, local_records(machine_b))
        assert len(records) == head + 1

    _bounded(90, restore_elsewhere())
    print(f"machine loss: seed {seed}, {len(ledger.all_acked())} acknowledged, in flight {in_flight}")


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
def test_cluster_faults_one_node_down_two_down_and_back(tmp_path: Path, nats_cluster: NatsCluster) -> None:
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
            path, durability="replicated", nats=nats_cluster.urls, stream=stream, replicas=3, lease_ttl=120
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
                        writes = [{"type": "conversation", "value": {"id": conversation}}, _entry(ids[0], conversation)]
                    else:
                        ids = (await storage.mint_id(),)
                        writes = [_entry(ids[0], conversation, data={"turn": turn})]
                    seq = await storage.commit(writes, CTX)
                except Exception as error:  # judged below: only a ReplicationError is right
                    attempts.append(Attempt(k, started, time.monotonic(), None, error, ids))
                    conversation = None  # it may or may not exist: a failed turn is not retried
                    await asyncio.sleep(0.05)
                    continue
                attempts.append(Attempt(k, started, time.monotonic(), seq, None, ids))
                turn += 1

        def acked_since(moment: float) -> int:
            return sum(1 for a in attempts if a.seq is not None and a.started > moment)

        async def until(condition: Callable[[], bool], timeout: float, what: str) -> float:
            deadline = time.monotonic() + timeout
            while not condition():
                assert time.monotonic() < deadline, f"{what}: not within {timeout} s; last attempts: {attempts[-4:]}"
                await asyncio.sleep(0.02)
            return time.monotonic()

        replica: LmdbStorage | None = None
        lost = back = 0.0

        async def phases() -> None:
            nonlocal replica, lost, back
            begin = time.monotonic()
            await until(lambda: acked_since(begin) >= 200, 30, "200 commits")
            replica = await LmdbStorage.open_replica(replica_dir, nats=nats_cluster.urls, stream=stream, store=storage.store_id)

            # One node down: the stream's leader.
            first = nats_cluster.index_of(await _stream_leader(nats_cluster.urls, stream))
            await asyncio.to_thread(nats_cluster.kill, first)
            killed = time.monotonic()
            resumed = await until(lambda: acked_since(killed) >= 1, 30, "a commit after the leader's loss")
            await until(lambda: acked_since(killed) >= 200, 20, "200 commits with one node down")
            timings["one down: first commit after"] = resumed - killed

            # Two down: no quorum.
            second = nats_cluster.index_of(await _stream_leader(nats_cluster.urls, stream))
            assert second != first
            await asyncio.to_thread(nats_cluster.kill, second)
            lost = time.monotonic()
            failing = lambda: [a for a in attempts if a.started > lost and a.error is not None]  # noqa: E731
            first_failure = await until(lambda: len(failing()) >= 1, 15, "a failed commit without quorum")
            await until(lambda: len({a.agent for a in failing()}) == 4, 30, "every agent failing")
            timings["two down: first failure after"] = first_failure - lost
            timings["two down: longest failed commit"] = max(a.ended - a.started for a in failing())

            # Both back.
            await asyncio.to_thread(nats_cluster.start_node, first)
            await asyncio.to_thread(nats_cluster.start_node, second)
            back = time.monotonic()
            resumed = await until(lambda: acked_since(back) >= 1, 45, "a commit once the nodes are back")
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
        assert no_quorum and all(a.seq is None for a in no_quorum), "a commit was acknowledged without a quorum"
        for attempt in no_quorum:
            assert isinstance(attempt.error, NatsUnavailableError), repr(attempt.error)
            assert attempt.ended - attempt.started < 15, f"a commit took {attempt.ended - attempt.started:.1f} s to fail"
            assert stream in str(attempt.error) or "NATS" in str(attempt.error), str(attempt.error)
        odd = [a.error for a in attempts if a.error is not None and not isinstance(a.error, ReplicationError)]
        assert not odd, f"failures that are not ReplicationError: {odd[:3]!r}"
        assert not [a for a in attempts if isinstance(a.error, NotWriterError)], "the writer was deposed"
        acked = [a for a in attempts if a.seq is not None]
        assert len({a.seq for a in acked}) == len(acked), "a sequence was acknowledged twice"
        for attempt in acked:
            assert attempt.seq in local and entry_ids(local[attempt.seq], attempt.seq)[-1:] == attempt.ids, attempt
        store = storage.store_id
        assert store is not None
        records = check_subject(await read_subject(nats_cluster.urls, stream, subject(stream, store)), store, local)
        assert len(records) == head == len(local)

    _bounded(170, body())
    assert list(export_lines(replica_dir)) == list(export_lines(path))
    assert verify(replica_dir) is None
    print("timings:", {name: round(value, 2) for name, value in timings.items()})
    errors: dict[str, str] = {}
    for attempt in attempts:
        if attempt.error is not None:
            errors.setdefault(type(attempt.error).__name__, str(attempt.error)[:160])
    print(f"{sum(a.seq is not None for a in attempts)} acknowledged, {sum(a.error is not None for a in attempts)} failed: {errors}")
    assert verify(path) is None


@pytest.mark.cluster
def test_a_cluster_without_quorum_fails_opens_and_commits_with_replication_errors(tmp_path: Path, nats_cluster: NatsCluster) -> None:
    """All three nodes of an R3 cluster crash and one comes back alone: it answers JetStream
    requests with "503 JetStream system temporarily unavailable". A replicated open, a replica
    open and a commit of an open writer then fail with ``NatsUnavailableError`` (never a raw
    nats-py error) within 12 s each; once the other nodes are back, the writer's commits resume."""

    path, replica_dir = tmp_path / "store", tmp_path / "replica"
    stream = "quorum"
    urls = nats_cluster.urls
    outcomes: list[tuple[str, float, BaseException]] = []

    async def body() -> None:
        storage = await open_writer(path, durability="replicated", nats=urls, stream=stream, replicas=3, lease_ttl=120)
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
                except Exception as error:
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
                    "open", lambda: LmdbStorage.open(tmp_path / "other", durability="replicated", nats=urls, stream=stream, replicas=3)
                )
                await attempt("open_replica", lambda: LmdbStorage.open_replica(replica_dir, nats=urls, stream=stream, store=store))
            for node in (1, 2):
                await asyncio.to_thread(nats_cluster.start_node, node)
            back = time.monotonic()
            while True:
                tried = time.monotonic()
                try:
                    seq = await storage.commit([_entry(next(next_id))], CTX)
                    break
                except Exception as error:
                    outcomes.append(("commit, nodes coming back", time.monotonic() - tried, error))
                    assert time.monotonic() - back < 45, "commits did not resume once the nodes were back"
                    await asyncio.sleep(0.2)
            assert seq == storage.log.head() and seq >= 2
        finally:
            await storage.close()

    _bounded(100, body())
    raw = [(name, error) for name, _, error in outcomes if not isinstance(error, NatsUnavailableError)]
    assert not raw, f"errors that are not NatsUnavailableError: {raw[:4]!r}"
    slow = [(name, round(seconds, 1)) for name, seconds, _ in outcomes if seconds > 12]
    assert not slow, slow
    assert {"commit", "open", "open_replica"} <= {name for name, _, _ in outcomes}


@pytest.mark.slow
def test_a_writer_cut_off_longer_than_its_lease_stops_then_takes_it_again(tmp_path: Path, nats_server: NatsNode) -> None:
    """The server is down longer than a writer's lease may go unrenewed (``lease_ttl=2``: 1.5 s):
    a commit is then refused at once with ``LeaseLapsedError`` (a ``NotWriterError``) naming the
    lease, committing nothing. Once the server is back, nobody else having taken the lease, the
    writer takes it again (a new epoch, fenced on the subject) and commits resume in the same
    handle; nothing acknowledged is lost and the subject holds each record once."""

    path = tmp_path / "store"
    stream = "lease"

    async def body() -> None:
        storage = await open_writer(path, durability="replicated", nats=nats_server.url, stream=stream, lease_ttl=2)
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
                    assert isinstance(error, LeaseLapsedError), repr(error)  # never deposed for good
                except NatsUnavailableError:
                    pass
                assert time.monotonic() - back < 15, "commits did not resume once the server was back"
                await asyncio.sleep(0.1)
            resumed = time.monotonic() - back
            assert storage.replication.epoch > epoch
            for id in range(1000, 1020):
                acked.append(await storage.commit([_entry(id)], CTX))
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
        assert fences == sorted(set(fences)) and len(fences) >= 2, fences
        print(f"commits resumed {resumed:.2f} s after the server was back")

    _bounded(60, body())


# ── replicas ─────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_replica_follows_a_writer_under_load_and_ends_identical(tmp_path: Path, nats_server: NatsNode) -> None:
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
        writer = await LmdbStorage.open(writer_dir, durability="replicated", nats=nats_server.url, stream=stream)
        replica = None
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 10**6}}], CTX)
            replica = await LmdbStorage.open_replica(replica_dir, nats=nats_server.url, stream=stream, store=writer.store_id)
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
                    except Exception:
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
            assert status["appliedSeq"] == head and not status["stopped"], status
            assert canonical(await snapshot(replica, work, head)) == canonical(await snapshot(writer, work, head)), f"seed {seed}"
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


def test_replica_closed_for_thousands_of_commits_catches_up(tmp_path: Path, nats_server: NatsNode) -> None:
    """A replica of a shipping (``process``) writer is closed while the writer commits 3,000
    more batches; reopened, it catches up, and ends with the writer's log and projections."""

    writer_dir, replica_dir = tmp_path / "writer", tmp_path / "replica"
    stream = "offline"
    timings: dict[str, float] = {}

    async def body() -> None:
        writer = await LmdbStorage.open(writer_dir, durability="process", nats=nats_server.url, stream=stream)
        drain = lambda: writer._link.arun(writer.replication.drain(20))  # noqa: E731
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for id in range(100, 200):
                await writer.commit([_entry(id)], CTX)
            assert await drain()
            replica = await LmdbStorage.open_replica(replica_dir, nats=nats_server.url, stream=stream, store=writer.store_id)
            try:
                await replica.wait(101, timeout=10)
            finally:
                await replica.close()
            for start in range(1000, 4000, 50):
                await asyncio.gather(*(writer.commit([_entry(id, data={"n": id})], CTX) for id in range(start, start + 50)))
            assert await drain(), writer.replication.status()
            head = writer.log.head()
            assert head == 3101
            status = writer.replication.status()
            assert status["shippedSeq"] == head and status["lagRecords"] == 0 and status["lastError"] is None, status
            began = time.monotonic()
            replica = await LmdbStorage.open_replica(replica_dir, nats=nats_server.url, stream=stream, store=writer.store_id)
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
                assert await storage._link.arun(storage.replication.drain(10)), storage.replication.status()
            finally:
                await storage.close()
            await replica.wait(101, timeout=10)
            storage = await LmdbStorage.open(path, durability="replicated", nats=url, stream=stream)
            try:
                assert await storage.commit([_entry(200)], CTX) == 102
            finally:
                await storage.close()
            await replica.wait(102, timeout=10)
            assert not replica.replication.status()["stopped"]
        finally:
            await replica.close()
        records = check_subject(await read_subject(url, stream, subject(stream, store)), store, local_records(path))
        assert len(records) == 102

    _bounded(60, body())
    assert list(export_lines(replica_dir)) == list(export_lines(path))
    assert verify(replica_dir) is None




@pytest.mark.parametrize(
    "durability", ["replicated", "process"]
)
def test_a_store_written_before_it_had_a_stream_ships_its_history(tmp_path: Path, nats_server: NatsNode, durability: str) -> None:
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
                assert await storage._link.arun(storage.replication.drain(10)), storage.replication.status()
        finally:
            await storage.close()
        records = check_subject(await read_subject(url, stream, subject(stream, store)), store, local_records(path))
        assert len(records) == 301
        replica = await LmdbStorage.open_replica(replica_dir, nats=url, stream=stream, store=store)
        try:
            await replica.wait(301, timeout=10)
        finally:
            await replica.close()

    _bounded(60, body())
    assert list(export_lines(replica_dir)) == list(export_lines(path))


def test_a_commit_too_big_for_the_stream_fails_alone_with_a_clear_error(tmp_path: Path, nats_server: NatsNode) -> None:
    """A replicated commit whose record exceeds the server's ``max_payload`` cannot be acknowledged:
    it fails with a ``ReplicationError`` naming the limit, commits nothing, and the commits of its
    group beside it go through."""

    async def body() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="replicated", nats=nats_server.url, stream="big")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            outcomes = await asyncio.gather(
                *(storage.commit([_entry(100 + n, data={"text": "x" * (2_000_000 if n == 3 else 10)})], CTX) for n in range(6)),
                return_exceptions=True,
            )
            big = outcomes.pop(3)
            assert sorted(outcomes) == list(range(2, 7)), outcomes  # type: ignore[type-var]
            assert isinstance(big, ReplicationError) and "payload" in str(big), repr(big)
            assert await storage.entry(103, CTX) is None
        finally:
            await storage.close()

    _bounded(30, body())


@pytest.mark.slow
def test_a_replica_killed_at_random_moments_resumes_where_it_stood(tmp_path: Path, nats_server: NatsNode) -> None:
    """A shipping writer puts 20,000 records on the stream; a replica (a child process) catching
    up is SIGKILLed at random moments six times, then left to finish. After each kill its log is
    a prefix of the writer's, byte for byte, never shorter than after the kill before, and its
    projections verify; at the end it holds everything and exports what the writer exports."""

    seed = random.randrange(2**32)
    rng = random.Random(seed)
    writer_dir, replica_dir = tmp_path / "writer", tmp_path / "replica"
    stream = "resume"

    async def write() -> tuple[str, int]:
        writer = await LmdbStorage.open(writer_dir, durability="process", nats=nats_server.url, stream=stream)
        try:
            await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for start in range(100, 20_099, 200):
                await asyncio.gather(*(writer.commit([_entry(id, data={"n": id})], CTX) for id in range(start, min(start + 200, 20_099))))
            assert await writer._link.arun(writer.replication.drain(30)), writer.replication.status()
            assert writer.store_id is not None
            return writer.store_id, writer.log.head()
        finally:
            await writer.close()

    store, head = _bounded(60, write())
    assert head == 20_000
    written = local_records(writer_dir)
    args = [str(replica_dir), "--nats", nats_server.url, "--stream", stream, "--replica-of", store, "--until", str(head)]
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
        assert sorted(local) == list(range(1, heads[-1] + 1)) and all(local[seq] == written[seq] for seq in local), f"seed {seed}"
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
    return msgspec.msgpack.encode(LogRecord(record.format, record.committed_at, record.checksum ^ 1, record.payload, record.size))


def _record_of(writes: list[dict[str, Any]]) -> bytes:
    return encode_record(encode_batch(writes)[0], int(time.time() * 1000))


FORGERIES: dict[str, Callable[[str, int, bytes, int], tuple[dict[str, str], bytes, str]]] = {
    # name: (store, head, the last record's bytes, writer epoch) -> (headers, body, reason in the error)
    "bad checksum": lambda store, head, last, epoch: (
        _forged_headers(store, head + 1, epoch), _bad_checksum(last), f"record {head + 1}: checksum mismatch"
    ),
    "skipped sequence": lambda store, head, last, epoch: (
        _forged_headers(store, head + 2, epoch), _record_of([_entry(777)]), f"record {head + 2} does not follow this store's head {head}"
    ),
    "invalid commit": lambda store, head, last, epoch: (
        _forged_headers(store, head + 1, epoch), _record_of([_entry(1)]), f"record {head + 1} is not a valid commit here"
    ),
    "fenced epoch": lambda store, head, last, epoch: (
        _forged_headers(store, head + 1, epoch - 1), _record_of([_entry(777)]), f"after epoch {epoch} fenced it"
    ),
    "another store": lambda store, head, last, epoch: (
        _forged_headers("f0f0f0f0f0f0f0f0", head + 1, epoch), _record_of([_entry(777)]), "belongs to store 'f0f0f0f0f0f0f0f0'"
    ),
    "superscript digit as sequence": lambda store, head, last, epoch: (
        {**_forged_headers(store, head + 1, epoch), "Pd-Seq": "\u00b2", "Nats-Msg-Id": f"{store}:\u00b2"},
        _record_of([_entry(777)]),
        "is not a log sequence",
    ),
    "fence body as an id reservation": lambda store, head, last, epoch: (
        {**_forged_headers(store, head, epoch), "Pd-Kind": "ids", "Nats-Msg-Id": f"{store}:ids:{epoch}:f0f0"},
        encode_control(Fence(epoch, "forger")),
        "its body is a Fence, not what a 'ids' message carries",
    ),
    "message id of another record": lambda store, head, last, epoch: (
        {**_forged_headers(store, head + 1, epoch), "Nats-Msg-Id": f"{store}:{head + 1}x"}, _record_of([_entry(777)]), "does not name record"
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
def test_forged_message_stops_the_replica_and_applies_nothing(tmp_path: Path, nats_server: NatsNode, forgery: str) -> None:
    """A message published on a store's subject by someone else, with valid-looking headers
    (``Pd-Format``, ``Pd-Store``, a matching ``Nats-Msg-Id``) but a body or sequence that is not
    the store's next record, stops a replica that follows live and one that catches up from
    nothing: ``ForeignMessageError`` naming the stream sequence and the reason; the replica's head
    stays at the last good record, its reads are unaffected, it verifies, and reopened it stops at
    the same message again (never skipping it)."""

    stream = "forge"
    live_dir, fresh_dir = tmp_path / "live", tmp_path / "fresh"

    async def body() -> None:
        writer = await LmdbStorage.open(tmp_path / "writer", durability="replicated", nats=nats_server.url, stream=stream)
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
        live = await LmdbStorage.open_replica(live_dir, nats=nats_server.url, stream=stream, store=store)
        try:
            await live.wait(head, timeout=10)
            headers, data, reason = FORGERIES[forgery](store, head, bytes(last), epoch)
            stream_seq = await publish_raw(nats_server.url, subject(stream, store), headers, data)
            replicas = [live, await LmdbStorage.open_replica(fresh_dir, nats=nats_server.url, stream=stream, store=store)]
            try:
                for replica in replicas:
                    with pytest.raises(ForeignMessageError) as caught:
                        await replica.wait(head + 2, timeout=10)
                    assert caught.value.stream_seq == stream_seq
                    assert f"Message {stream_seq} of stream {stream}" in str(caught.value), str(caught.value)
                    assert reason in str(caught.value), str(caught.value)
                    assert replica.log.head() == head
                    assert replica.replication.status()["stopped"]
                    read = await replica.entry(128, CTX)
                    assert read is not None and read["commitSeq"] == head
                    assert (await replica.scan_entries({"conversationId": 1}, 100, None, CTX))["items"][0]["id"] == 128
            finally:
                await replicas[1].close()
        finally:
            await live.close()
        for path in (live_dir, fresh_dir):
            assert verify(path) is None
            assert local_records(path)[head] == bytes(last)
        again = await LmdbStorage.open_replica(live_dir, nats=nats_server.url, stream=stream, store=store)
        try:
            with pytest.raises(ForeignMessageError) as caught:
                await again.wait(head + 1, timeout=10)
            assert caught.value.stream_seq == stream_seq and again.log.head() == head
        finally:
            await again.close()

    _bounded(60, body())


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
            "replicated": lambda: LmdbStorage.open(tmp_path / "a", durability="replicated", nats=url, stream="s"),
            "shipping": lambda: LmdbStorage.open(tmp_path / "b", durability="process", nats=url, stream="s"),
            "replica": lambda: LmdbStorage.open_replica(tmp_path / "c", nats=url, stream="s", store="0123456789abcdef"),
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


def test_wrong_stream_store_or_replicas_get_clear_errors(tmp_path: Path, nats_server: NatsNode) -> None:
    """``open_replica`` of a stream that does not exist, or does not carry store subjects:
    ``StreamMissingError`` naming it. A directory opened with another store's id:
    ``WrongStoreError``, as writer and as replica. ``replicas=3`` on a single server: a
    ``ReplicationError`` giving NATS's reason. Each leaves the directory usable."""

    url = nats_server.url

    async def body() -> None:
        with pytest.raises(StreamMissingError, match="'nope'"):
            await LmdbStorage.open_replica(tmp_path / "r", nats=url, stream="nope", store="0123456789abcdef")
        nc = await _connect(url)
        try:
            await nc.jetstream(timeout=5).add_stream(name="other", subjects=["elsewhere.>"])
        finally:
            await nc.close()
        with pytest.raises(StreamMissingError, match="other"):
            await LmdbStorage.open_replica(tmp_path / "r", nats=url, stream="other", store="0123456789abcdef")
        with pytest.raises(StreamMissingError, match="other"):
            await LmdbStorage.open(tmp_path / "w", durability="replicated", nats=url, stream="other")

        storage = await LmdbStorage.open(tmp_path / "store", durability="replicated", nats=url, stream="ok")
        store = storage.store_id
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.close()
        assert store is not None
        for opener in (
            lambda: LmdbStorage.open(tmp_path / "store", store="fedcba9876543210"),
            lambda: LmdbStorage.open(tmp_path / "store", durability="replicated", nats=url, stream="ok", store="fedcba9876543210"),
            lambda: LmdbStorage.open_replica(tmp_path / "store", nats=url, stream="ok", store="fedcba9876543210"),
        ):
            with pytest.raises(WrongStoreError) as caught:
                await opener()
            assert store in str(caught.value) and "fedcba9876543210" in str(caught.value), str(caught.value)
        again = await LmdbStorage.open(tmp_path / "store", durability="replicated", nats=url, stream="ok", store=store)
        assert again.log.head() == 1
        await again.close()

        began = time.monotonic()
        with pytest.raises(ReplicationError) as caught:
            await LmdbStorage.open(tmp_path / "r3", durability="replicated", nats=url, stream="three", replicas=3)
        assert time.monotonic() - began < 8
        message = str(caught.value)
        assert "3 replicas" in message and "'three'" in message, message
        assert "replicas" in message.split(":", 1)[1].lower() or "cluster" in message.lower(), message
        storage = await LmdbStorage.open(tmp_path / "r3", durability="replicated", nats=url, stream="three")
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.close()
        assert not _nats_threads(), _nats_threads()

    _bounded(60, body())
