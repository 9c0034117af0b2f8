"""Failover (issue #15): one writer at a time across machines, with a lease, fencing and promotion.

Real processes and real servers: a 3-node JetStream cluster (``tests/support/natsserver.py``), the stream
and the lease bucket at R3, writers in child processes (``tests/support/failover_child.py``) that are
SIGKILLed, SIGSTOPped and SIGCONTed while they commit; every process is stopped at the end. Checked:

* ``test_sigkilled_writer_is_replaced_within_its_ttl``: a writer under load (4 agents) is
  SIGKILLed (lease_ttl=2); a second directory opened with ``take_over=True`` accepts commits within
  TTL + 3 s of the kill (the figure is printed, about 2 s); every commit the dead writer
  acknowledged is on the new writer at its sequence; the lease shows in ``status()``; the dead
  writer's directory reopened as a replicated writer without ``take_over`` refuses
  (``NotWriterError``), opened as a replica it refuses commits and converges to the new writer's
  head and ``durable-log export``.
* ``test_paused_writer_is_fenced_out``: a writer under load is SIGSTOPped for 4 s, another takes
  over (``take_over=True``) and commits, then SIGCONT: its later commits fail with
  ``NotWriterError``; every commit it acknowledged is in the stream (before the new fence), none
  that failed with ``NotWriterError`` is, every record is the old writer's (acknowledged, or of
  unknown outcome) or the new one's, and the subject is one linear history.
* ``test_writer_paused_between_lease_check_and_publish``: the same, with the pause in the window
  between the writer's last lease check and its publish (a hook in the child makes the writer
  thread linger there 0.5 s; the parent SIGSTOPs it then).
* ``test_force_take_over_deposes_the_old_writer``: in one process, ``take_over="force"`` while the
  old writer lives; its next commits (one record alone, or a group) must fail with
  ``NotWriterError`` and never land, and the new writer keeps writing.
* ``test_take_over_epoch_is_above_every_epoch_on_the_subject``: a writer that waited for the lease
  while two others took the store over and left must fence above their epochs.
* ``test_mint_ids_after_failover``: every id the new writer mints is above every id the killed
  writer handed out and above the id blocks it reserved on the stream.
* ``test_session_continues_after_failover``: a pi-durable ``Harness`` task left sleeping, and one
  left inside a running phase, on a SIGKILLed writer are finished by a Harness on the new writer,
  each phase once.
* ``test_randomized_failover`` (last, ~55 s): three candidate writer processes on three
  directories of one store, each looping open(take_over=True) / mint and commit / reopen on
  ``NotWriterError``, under random SIGKILL (restarted), SIGSTOP/SIGCONT, and NATS node kills and
  restarts for ``PD_FAILOVER_CHAOS_SECONDS`` (45). Then: one linear history on the subject, every
  acknowledged commit exactly once at its sequence, no id minted twice nor used by two commits,
  every directory opened as a replica converges to one ``durable-log export``, and reads equal
  ``MemoryStorage`` fed the stream's commits in order. ``PD_FAILOVER_SEED`` replays the schedule
  of events (not their timing); ``PD_FAILOVER_DUMP`` keeps the post-mortem (each candidate's
  output, the subject) in a directory of your choosing.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from pi_durable_lmdb import LmdbStorage, NotWriterError
from pi_durable_lmdb.log.records import decode_record_builtins

from ..support.compare import canonical
from ..support.natsserver import NatsCluster, nats_cluster  # noqa: F401  (the fixture)

pytestmark = pytest.mark.cluster  # every test here runs a 3-node nats-server cluster

HERE = Path(__file__).resolve().parent
CHILD = str(HERE.parent / "support" / "failover_child.py")
PYTHON = sys.executable
DURABLE_LOG = str(Path(sys.executable).parent / "durable-log")
STREAM = "PD"
TTL = 2


# ── child processes ─────────────────────────────────────────────────────────


class Child:
    """A child process whose stdout lines are collected (with their arrival time) by a thread."""

    def __init__(self, args: list[str], log_dir: Path, name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.args = args
        self.stderr_path = log_dir / f"{name}.{time.monotonic_ns()}.stderr"
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.stopped = False
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [PYTHON, CHILD, *args], stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            with self._lock:
                self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip("\n")))

    def snapshot(self) -> list[str]:
        with self._lock:
            return [line for _, line in self.lines]

    def words(self, first: str) -> list[list[str]]:
        return [line.split(" ", 2) for line in self.snapshot() if line.split(" ", 1)[0] == first]

    def count(self, first: str) -> int:
        return len(self.words(first))

    async def wait_for(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.proc.poll() is not None and not predicate():
                self._reader.join(2)
                if predicate():
                    return
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: no {what} after {timeout} s:\n{self.tail()}")
            await asyncio.sleep(0.02)

    async def wait_line(self, first: str, timeout: float, count: int = 1) -> list[str]:
        await self.wait_for(lambda: self.count(first) >= count, timeout, f"{count} {first!r} line(s)")
        return self.words(first)[count - 1]

    def signal(self, sig: signal.Signals) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass
        self.stopped = sig == signal.SIGSTOP or (self.stopped and sig != signal.SIGCONT)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(10)
        self._reader.join(5)

    def finish(self) -> None:
        """Whatever state it is in: gone, its output read to the end."""

        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.kill()
        self._reader.join(5)

    def tail(self, lines: int = 30) -> str:
        out = "\n".join(self.snapshot()[-lines:])
        try:
            err = "\n".join(self.stderr_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            err = ""
        return f"--- stdout (tail)\n{out}\n--- stderr (tail)\n{err}"


@pytest.fixture
def children(tmp_path: Path) -> Any:
    """Start children with ``spawn(role, dir, *args)``; every one is killed at the end."""

    started: list[Child] = []
    log_dir = tmp_path / "logs"
    log_dir.mkdir()

    class Spawner:
        def __call__(self, role: str, directory: Path, *args: str, name: str = "child", env: dict[str, str] | None = None) -> Child:
            child = Child([role, str(directory), *args], log_dir, name, env)
            started.append(child)
            return child

    yield Spawner()
    for child in started:
        child.finish()


def writer_args(cluster: NatsCluster, store: str, *extra: str) -> list[str]:
    return ["--nats", cluster.urls, "--stream", STREAM, "--store", store, "--ttl", str(TTL), *extra]


def acked(child: Child) -> dict[int, int]:
    """Conversation id -> sequence of every commit the child acknowledged."""

    return {int(words[1]): int(words[2]) for words in child.words("ack")}


def failed(child: Child, kind: str | None = None) -> dict[int, str]:
    return {int(words[1]): words[2] for words in child.words("fail") if kind is None or words[2] == kind}


def intents(child: Child) -> dict[int, list[dict[str, Any]]]:
    return {int(words[1]): json.loads(words[2]) for words in child.words("intent")}


async def open_writer(cluster: NatsCluster, path: Path, store: str, take_over: Any = True) -> LmdbStorage:
    return await LmdbStorage.open(
        path, durability="replicated", nats=cluster.urls, stream=STREAM, replicas=3, store=store,
        take_over=take_over, lease_ttl=TTL,
    )


async def open_replica(cluster: NatsCluster, path: Path, store: str) -> LmdbStorage:
    return await LmdbStorage.open_replica(path, nats=cluster.urls, stream=STREAM, store=store)


def conversation(id: int, **metadata: Any) -> dict[str, Any]:
    return {"type": "conversation", "value": {"id": id, "createdAt": 1, "metadata": metadata}}


# ── the stream, read raw ────────────────────────────────────────────────────


async def read_subject(cluster: NatsCluster, store: str, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Every message of the store's subject in stream order, straight from JetStream (nats-py,
    not the engine's link): stream sequence, kind, epoch, log sequence, and for a record its
    conversation id (the first write's) and writes."""

    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy

    subject = f"{STREAM}.{store}.log"
    nc = await nats.connect(servers=cluster.url_list, connect_timeout=2, max_reconnect_attempts=20)
    try:
        js = nc.jetstream(timeout=5)
        deadline = time.monotonic() + timeout
        while True:  # the stream may still be electing a leader after a node restart
            try:
                last = await js.get_last_msg(STREAM, subject)
                break
            except nats.js.errors.NotFoundError:
                return []
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        messages: list[dict[str, Any]] = []
        sub = await js.subscribe(
            subject, stream=STREAM, ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, filter_subject=subject),
        )
        try:
            while not messages or messages[-1]["stream_seq"] < last.seq:
                msg = await sub.next_msg(timeout=max(0.5, deadline - time.monotonic()))
                headers = msg.headers or {}
                item: dict[str, Any] = {
                    "stream_seq": msg.metadata.sequence.stream,
                    "kind": headers.get("Pd-Kind"),
                    "epoch": int(headers.get("Pd-Epoch", "-1")),
                    "seq": int(headers.get("Pd-Seq", "-1")),
                    "store": headers.get("Pd-Store"),
                    "at": msg.metadata.timestamp.timestamp() if msg.metadata.timestamp else None,
                }
                if item["kind"] == "record":
                    item["writes"] = decode_record_builtins(item["seq"], msg.data)["writes"]
                    item["cid"] = item["writes"][0]["value"]["id"]
                else:
                    item["control"] = msgspec.msgpack.decode(msg.data)
                messages.append(item)
        finally:
            await sub.unsubscribe()
        return messages
    finally:
        await nc.close()


def check_linear(messages: list[dict[str, Any]], store: str, *, growing_fences: bool = True) -> list[dict[str, Any]]:
    """The subject is one history: records 1..N each once and in order; a fence before any
    record; every record of the epoch of the last fence before it and of no lower epoch than any
    fence before it (no record of a fenced-out writer after its fence); with ``growing_fences``,
    fences of strictly growing epochs (each lease's epoch is above every epoch the subject has
    seen, ``log.stream.lease``). Returns the records."""

    records = [message for message in messages if message["kind"] == "record"]
    assert all(message["store"] == store for message in messages)
    assert [record["seq"] for record in records] == list(range(1, len(records) + 1)), (
        "the subject's records are not 1..N in order: "
        + str([(m["stream_seq"], m["kind"], m["epoch"], m["seq"]) for m in messages][:200])
    )
    fence_epoch, highest = None, 0
    for message in messages:
        if message["kind"] == "fence":
            if growing_fences:
                assert message["epoch"] > highest, (
                    f"the fence at stream seq {message['stream_seq']} is of epoch {message['epoch']}, "
                    f"yet the subject already had a fence of epoch {highest}: {message}"
                )
            fence_epoch, highest = message["epoch"], max(highest, message["epoch"])
        elif message["kind"] == "record":
            assert fence_epoch is not None, f"record before any fence: {message}"
            assert message["epoch"] >= highest, (
                f"record {message['seq']} (stream seq {message['stream_seq']}) is of epoch {message['epoch']}, "
                f"after the fence of epoch {highest} (a writer that took a lease below the subject's epoch: see "
                "test_take_over_epoch_is_above_every_epoch_on_the_subject)"
            )
            assert message["epoch"] == fence_epoch, (
                f"record {message['seq']} (stream seq {message['stream_seq']}) is of epoch {message['epoch']}, "
                f"though the last fence before it is of epoch {fence_epoch}"
            )
        else:
            assert message["kind"] == "ids", message
    return records


def stale_fences(messages: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(stream seq, epoch, highest epoch before) of every fence not above the fences before it."""

    out, highest = [], 0
    for message in messages:
        if message["kind"] == "fence":
            if message["epoch"] <= highest:
                out.append((message["stream_seq"], message["epoch"], highest))
            highest = max(highest, message["epoch"])
    return out


def export(path: Path) -> str:
    done = subprocess.run([DURABLE_LOG, "export", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def converge(cluster: NatsCluster, path: Path, store: str, head: int, timeout: float = 20.0) -> str:
    """Open ``path`` as a replica, wait until it holds ``head``, close it; its export."""

    replica = await open_replica(cluster, path, store)
    try:
        await replica.wait(head, timeout=timeout)
        assert replica.log.head() == head
    finally:
        await replica.close()
    return export(path)


# ── SIGKILL: promotion within the TTL ───────────────────────────────────────


async def test_sigkilled_writer_is_replaced_within_its_ttl(tmp_path: Path, nats_cluster: NatsCluster, children: Any) -> None:
    store = secrets.token_hex(8)
    old = children("writer", tmp_path / "a", *writer_args(nats_cluster, store, "--agents", "4", "--take-over", "no"), name="a")
    await old.wait_line("opened", 20)
    await old.wait_for(lambda: old.count("ack") >= 120, 30, "120 acks")
    killed_at = time.monotonic()
    old.kill()
    before = acked(old)
    assert len(before) >= 120

    new = await open_writer(nats_cluster, tmp_path / "b", store, take_over=True)
    try:
        opened_after = time.monotonic() - killed_at
        seq = await new.commit([conversation(await new.mint_id(), by="b")], CTX)
        promoted_after = time.monotonic() - killed_at
        print(f"\nfailover after SIGKILL (lease_ttl={TTL}): open returned after {opened_after:.2f} s, "
              f"first commit acknowledged after {promoted_after:.2f} s")
        assert promoted_after < TTL + 3, f"promotion took {promoted_after:.2f} s"
        status = new.replication.status()
        assert status["lease"]["epoch"] == new.replication.epoch and status["lease"]["ttl"] == TTL
        assert status["lease"]["holder"].endswith(str(tmp_path / "b"))
        assert 0 < status["lease"]["expiresIn"] <= TTL

        # every acknowledged commit is on the new writer, at its sequence
        assert seq > max(before.values())
        for cid, acked_seq in before.items():
            record = await new.conversation(cid, CTX)
            assert record is not None, f"acknowledged commit {acked_seq} (conversation {cid}) is lost"
            entries = (await new.scan_entries({"conversationId": cid, "order": "ascending"}, 10, None, CTX))["items"]
            lookup = await new.entry(entries[0]["id"], CTX)
            assert lookup is not None and lookup["commitSeq"] == acked_seq

        # the old directory: refused as a writer without take_over, follows as a replica
        with pytest.raises(NotWriterError):
            await open_writer(nats_cluster, tmp_path / "a", store, take_over=False)
        for n in range(20):
            await new.commit([conversation(await new.mint_id(), n=n)], CTX)
        head = new.log.head()
        replica = await open_replica(nats_cluster, tmp_path / "a", store)
        try:
            await replica.wait(head, timeout=20)
            with pytest.raises(NotWriterError):
                await replica.commit([conversation(10**12)], CTX)
            for cid in before:
                assert await replica.conversation(cid, CTX) == await new.conversation(cid, CTX)
        finally:
            await replica.close()
    finally:
        await new.close()
    assert export(tmp_path / "a") == export(tmp_path / "b")
    records = check_linear(await read_subject(nats_cluster, store), store)
    assert len(records) == head


# ── SIGSTOP: a paused writer is fenced out ──────────────────────────────────


async def paused_writer_round(tmp_path: Path, cluster: NatsCluster, children: Any, *extra: str, stall: bool = False) -> None:
    store = secrets.token_hex(8)
    old = children("writer", tmp_path / "a", *writer_args(cluster, store, "--take-over", "no", "--after-deposed", "3", *extra), name="a")
    await old.wait_line("opened", 20)
    await old.wait_for(lambda: old.count("ack") >= 40, 30, "40 acks")
    if stall:
        await old.wait_line("stalled", 30)
    old.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    old_epoch = int(old.words("opened")[0][1])

    new = await open_writer(cluster, tmp_path / "b", store, take_over=True)
    try:
        took = time.monotonic() - stopped_at
        assert took < TTL + 3, f"take-over took {took:.2f} s"
        assert new.replication.epoch > old_epoch
        mine = {}
        for n in range(10):
            cid = await new.mint_id()
            mine[cid] = await new.commit([conversation(cid, by="b")], CTX)
        await asyncio.sleep(max(0.0, 4.0 - (time.monotonic() - stopped_at)))
        old.signal(signal.SIGCONT)
        await old.wait_line("done", 30)
        assert old.proc.wait(10) == 0, old.tail()
        for n in range(5):
            cid = await new.mint_id()
            mine[cid] = await new.commit([conversation(cid, by="b")], CTX)
        head = new.log.head()
    finally:
        await new.close()

    ok, refused, other = acked(old), failed(old, "NotWriterError"), failed(old)
    late = [cid for cid in intents(old) if cid >= 9 * 10**12]
    assert late and all(cid in refused for cid in late), f"commits after deposition were not refused:\n{old.tail()}"
    assert refused, "the old writer's commits never failed"
    messages = await read_subject(cluster, store)
    records = check_linear(messages, store)
    in_stream = Counter(record["cid"] for record in records)
    assert len(records) == head
    fence = next(m for m in messages if m["kind"] == "fence" and m["epoch"] == new.replication.epoch)
    for cid, seq in ok.items():
        assert in_stream[cid] == 1, f"commit {seq} (conversation {cid}) acknowledged by the paused writer is not in the stream"
        record = next(r for r in records if r["cid"] == cid)
        assert record["seq"] == seq and record["stream_seq"] < fence["stream_seq"]
    for cid in refused:
        assert cid not in in_stream, f"conversation {cid}: refused with NotWriterError, yet in the stream"
    for cid, seq in mine.items():
        assert in_stream[cid] == 1 and next(r for r in records if r["cid"] == cid)["seq"] == seq
    unknown = {cid: kind for cid, kind in other.items() if kind != "NotWriterError"}
    for record in records:  # nothing else: each is the old writer's (acked, or of unknown outcome) or the new one's
        assert record["cid"] in ok or record["cid"] in mine or record["cid"] in unknown, f"record {record['seq']} is nobody's: {record}"
    print(f"\npaused writer: {len(ok)} acked, {len(refused)} refused (NotWriterError), other failures {unknown}")
    assert export(tmp_path / "b") == await converge(cluster, tmp_path / "a", store, head)


async def test_paused_writer_is_fenced_out(tmp_path: Path, nats_cluster: NatsCluster, children: Any) -> None:
    await paused_writer_round(tmp_path, nats_cluster, children, "--agents", "4")


async def test_writer_paused_between_lease_check_and_publish(tmp_path: Path, nats_cluster: NatsCluster, children: Any) -> None:
    # a single agent: the stalled publish is one record alone (a plain conditional publish)
    await paused_writer_round(tmp_path, nats_cluster, children, "--agents", "1", "--stall-after-check", "60", stall=True)


# ── take_over="force": the fence deposes a live writer ──────────────────────


@pytest.mark.parametrize("group", [False, True], ids=["one-record", "group"])
async def test_force_take_over_deposes_the_old_writer(tmp_path: Path, nats_cluster: NatsCluster, group: bool) -> None:
    store = secrets.token_hex(8)
    # a long TTL: the old writer learns of the take-over from the stream, not from a renewal
    old = await LmdbStorage.open(
        tmp_path / "a", durability="replicated", nats=nats_cluster.urls, stream=STREAM, replicas=3, store=store, lease_ttl=30
    )
    new = None
    try:
        await old.commit([conversation(100, by="a")], CTX)
        new = await LmdbStorage.open(
            tmp_path / "b", durability="replicated", nats=nats_cluster.urls, stream=STREAM, replicas=3, store=store,
            take_over="force", lease_ttl=30,
        )
        theirs = {}
        cids = [200, 201, 202]
        if group:
            seqs = await asyncio.gather(*(new.commit([conversation(cid, by="b")], CTX) for cid in cids))
        else:
            seqs = [await new.commit([conversation(cid, by="b")], CTX) for cid in cids]
        theirs.update(zip(cids, seqs))

        outcomes: dict[int, str] = {}

        async def attempt(cid: int) -> None:
            try:
                outcomes[cid] = f"acknowledged as {await old.commit([conversation(cid, by='a')], CTX)}"
            except Exception as error:
                outcomes[cid] = type(error).__name__

        if group:
            await asyncio.gather(*(attempt(cid) for cid in (300, 301, 302)))
        else:
            await attempt(300)
        await attempt(400)  # and the next one
        more = 500
        try:
            theirs[more] = await new.commit([conversation(more, by="b")], CTX)
        except Exception as error:
            raise AssertionError(
                f"the new writer (epoch {new.replication.epoch}) was deposed after the old one's attempts {outcomes}: {error}"
            ) from None
        messages = await read_subject(nats_cluster, store)
        in_stream = {m["cid"]: m for m in messages if m["kind"] == "record"}
        check_linear(messages, store)
        for cid, outcome in outcomes.items():
            assert cid in in_stream or not outcome.startswith("acknowledged"), (
                f"the old writer's commit {outcome} (conversation {cid}) is not in the stream: its attempts {outcomes}"
            )
        for cid, seq in theirs.items():
            assert cid in in_stream and in_stream[cid]["seq"] == seq, f"the new writer's commit {seq} is not in the stream"
        assert outcomes == {cid: "NotWriterError" for cid in outcomes}, f"the old writer's commits after the fence: {outcomes}"
        await old.wait(new.log.head(), timeout=10)
        for cid in outcomes:
            assert await old.conversation(cid, CTX) is None
        assert await old.conversation(more, CTX) is not None
    finally:
        await old.close()
        if new is not None:
            await new.close()


# ── the epoch of a take-over that waited ────────────────────────────────────


async def test_take_over_epoch_is_above_every_epoch_on_the_subject(tmp_path: Path, nats_cluster: NatsCluster) -> None:
    """A writer that waits for a lease must, once it takes it, fence with an epoch above every
    epoch the subject carries by then, not only above those it saw when it began to wait: here
    two writers take the store over (``force``) and go while it waits, each fencing the subject
    with a higher epoch."""

    store = secrets.token_hex(8)
    opened: list[LmdbStorage] = []
    try:
        first = await open_writer(nats_cluster, tmp_path / "first", store, take_over=False)
        opened.append(first)
        await first.commit([conversation(1)], CTX)
        waiting = asyncio.ensure_future(open_writer(nats_cluster, tmp_path / "waiting", store, take_over=True))
        await asyncio.sleep(0.5)  # it has read the subject (epoch 1) and polls the lease
        assert not waiting.done()
        for number in range(2):
            other = await open_writer(nats_cluster, tmp_path / f"other{number}", store, take_over="force")
            opened.append(other)
            await other.commit([conversation(10 + number)], CTX)
        assert not waiting.done()
        for storage in opened:
            await storage.close()  # the last one releases the lease: ``waiting`` takes it
        late = await asyncio.wait_for(waiting, 15)
        opened.append(late)
        highest = max(  # of the others' fences
            m["epoch"] for m in await read_subject(nats_cluster, store)
            if m["kind"] == "fence" and not m["control"]["holder"].endswith(str(tmp_path / "waiting"))
        )
        try:
            seq = await late.commit([conversation(20)], CTX)
        except NotWriterError:
            seq = None
        messages = await read_subject(nats_cluster, store)
        summary = [(m["kind"], m["epoch"], m["seq"]) for m in messages]
        assert late.replication.epoch > highest, (
            f"the writer that waited took epoch {late.replication.epoch}; the subject had a fence of epoch "
            f"{highest} (its commit: {seq}); the subject: {summary}"
        )
        check_linear(messages, store)
        replica = await open_replica(nats_cluster, tmp_path / "replica", store)
        try:
            await replica.wait(max(m["seq"] for m in messages if m["kind"] == "record"), timeout=10)
        finally:
            await replica.close()
    finally:
        for storage in opened:
            await storage.close()


# ── mint_id across writers ──────────────────────────────────────────────────


async def test_mint_ids_after_failover(tmp_path: Path, nats_cluster: NatsCluster, children: Any) -> None:
    store = secrets.token_hex(8)
    old = children("mint", tmp_path / "a", *writer_args(nats_cluster, store, "--take-over", "no", "--count", "5000"), name="a")
    await old.wait_line("ready", 60)
    old.kill()
    handed_out = [int(value) for line in old.snapshot() if line.startswith("minted ") for value in line.split()[1:]]
    assert len(handed_out) == len(set(handed_out)) == 5000
    messages = await read_subject(nats_cluster, store)

    new = await open_writer(nats_cluster, tmp_path / "b", store, take_over=True)
    try:
        fresh = [await new.mint_id() for _ in range(200)]
        assert len(set(fresh)) == 200
        assert min(fresh) > max(handed_out), f"the new writer minted {min(fresh)}, the old one had handed out up to {max(handed_out)}"
        await new.commit([conversation(fresh[0])], CTX)
    finally:
        await new.close()
    # the id blocks the old writer reserved are on the stream, and the new writer started above them
    blocks = [m["control"]["upto"] for m in messages if m["kind"] == "ids"]
    assert blocks and max(blocks) > max(handed_out)
    assert min(fresh) >= max(blocks)


# ── a Session continues on the new writer ───────────────────────────────────


async def test_session_continues_after_failover(tmp_path: Path, nats_cluster: NatsCluster, children: Any) -> None:
    from pi_durable import Harness

    from ..support.failover_child import HANG_ENV, Step, Trail, harness_options

    assert not os.environ.get(HANG_ENV)
    store = secrets.token_hex(8)
    old = children("session", tmp_path / "a", *writer_args(nats_cluster, store, "--take-over", "no"), name="session")
    ready = await old.wait_line("ready", 60)
    sleeper, worker, head = (int(part) for part in (ready[1] + " " + ready[2]).split())
    root = int(old.words("root")[0][1])
    assert old.count("hanging") == 1
    old.kill()

    clock = [1_700_000_000_000 + 120_000]  # past the sleeper's wake-up time
    storage = await open_writer(nats_cluster, tmp_path / "b", store, take_over=True)
    assert storage.log.head() >= head
    harness = await Harness.open(storage, harness_options(clock), CTX)
    try:
        left = await harness.get_task(sleeper, CTX)
        assert left is not None and left["state"]["status"] == "sleeping"
        cut = await harness.get_task(worker, CTX)
        assert cut is not None and cut["state"]["status"] == "pending" and cut["state"]["checkpoint"] == {"phase": "work"}
        assert cut.get("restarts") == 1
        harness.resume()
        for task in (sleeper, worker):
            settled = await asyncio.wait_for(harness.wait_for_task(task, CTX), 30)
            assert settled["state"] == {"status": "terminal", "outcome": {"status": "completed", "result": {"last": "finish"}}}
        lines = (await harness.snapshot(Trail, root, CTX))["lines"]
        assert [line for line in lines if line.startswith(f"{sleeper}:")] == [f"{sleeper}:{p}" for p in ("start", "wake", "finish")]
        assert [line for line in lines if line.startswith(f"{worker}:")] == [f"{worker}:{p}" for p in ("start", "work", "finish")]
        entries = (await harness.storage.scan_entries({"conversationId": root, "order": "ascending"}, 1000, None, CTX))["items"]
        steps = [(entry["data"]["task"], entry["data"]["phase"]) for entry in entries if entry["kind"] == Step.kind]
        assert [phase for task, phase in steps if task == sleeper] == ["start", "wake", "finish"]
        assert [phase for task, phase in steps if task == worker] == ["start", "work", "finish"]
    finally:
        await harness.close(CTX)
    # the dead writer's directory follows the stream to the same history
    records = check_linear(await read_subject(nats_cluster, store), store)
    assert export(tmp_path / "b") == await converge(nats_cluster, tmp_path / "a", store, len(records))


# ── randomized: candidates, signals, node crashes ───────────────────────────

CHAOS_SECONDS = float(os.environ.get("PD_FAILOVER_CHAOS_SECONDS", "45"))


async def snapshot_reads(store: Any, ids: list[int], conversations: list[int]) -> dict[str, Any]:
    """The reads the candidates' writes can be seen by, over the ids they used."""

    async def call(method: str, *args: Any) -> Any:
        try:
            return ("ok", await getattr(store, method)(*args))
        except Exception as error:
            return ("error", type(error).__name__, str(error))

    async def pages(method: str, query: dict[str, Any], limit: int) -> list[Any]:
        out, cursor = [], None
        for _ in range(10_000):
            page = await call(method, query, limit, cursor, CTX)
            out.append(page)
            if page[0] != "ok" or "next" not in page[1]:
                return out
            cursor = json.loads(json.dumps(page[1]["next"]))
        raise AssertionError(f"{method} never ended")

    state: dict[str, Any] = {}
    for id in ids:
        state[f"conversation {id}"] = await call("conversation", id, CTX)
        state[f"entry {id}"] = await call("entry", id, CTX)
        state[f"task {id}"] = await call("task", id, CTX)
    for order in ("ascending", "descending"):
        state[f"conversations {order}"] = await pages("scan_conversations", {"order": order}, 7)
        state[f"tasks {order}"] = await pages("scan_tasks", {"order": order}, 5)
    for status in ("pending", "running", "sleeping", "terminal"):
        state[f"tasks {status}"] = await pages("scan_tasks", {"status": status}, 4)
        state[f"background tasks {status}"] = await pages("scan_tasks", {"status": status, "background": True}, 3)
    for cid in conversations:
        for order in ("ascending", "descending"):
            state[f"entries {cid} {order}"] = await pages("scan_entries", {"conversationId": cid, "order": order}, 2)
        state[f"head {cid}"] = await call("find_latest_head_marker", cid, None, CTX)
    return state


async def test_randomized_failover(tmp_path: Path, nats_cluster: NatsCluster, children: Any) -> None:
    from pi_durable.storage.memory import MemoryStorage

    seed = int(os.environ.get("PD_FAILOVER_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"\nrandomized failover: seed {seed} (PD_FAILOVER_SEED), {CHAOS_SECONDS:.0f} s")
    store = secrets.token_hex(8)
    dirs = [tmp_path / f"c{slot}" for slot in range(3)]
    everyone: list[Child] = []

    def start(slot: int) -> Child:
        child = children(
            "writer", dirs[slot], *writer_args(nats_cluster, store, "--agents", "2", "--loop", "--name", f"c{slot}"),
            name=f"c{slot}",
        )
        everyone.append(child)
        return child

    current = [start(slot) for slot in range(3)]
    paused: dict[int, float] = {}
    node_down: int | None = None
    node_back_at = 0.0
    events: Counter[str] = Counter()

    def holder() -> int | None:
        """The slot that opened last (most likely the lease holder)."""
        best, when = None, -1.0
        for slot, child in enumerate(current):
            with child._lock:
                opened = [at for at, line in child.lines if line.startswith("opened")]
            if opened and opened[-1] > when and child.proc.poll() is None:
                best, when = slot, opened[-1]
        return best

    await asyncio.sleep(1.0)
    ends = time.monotonic() + CHAOS_SECONDS
    while time.monotonic() < ends:
        await asyncio.sleep(rng.uniform(0.2, 1.2))
        now = time.monotonic()
        for slot, until in list(paused.items()):
            if now >= until:
                current[slot].signal(signal.SIGCONT)
                del paused[slot]
                events["SIGCONT"] += 1
        if node_down is not None and now >= node_back_at:
            nats_cluster.start_node(node_down)
            node_down = None
            events["node restart"] += 1
        target = holder() if rng.random() < 0.7 else rng.randrange(3)
        if target is None:
            continue
        choice = rng.random()
        if choice < 0.25:
            paused.pop(target, None)
            current[target].kill()
            current[target] = start(target)
            events["SIGKILL"] += 1
        elif choice < 0.55 and target not in paused:
            current[target].signal(signal.SIGSTOP)
            paused[target] = now + rng.uniform(0.5, 4.0)
            events["SIGSTOP"] += 1
        elif choice < 0.7 and node_down is None:
            node_down = rng.randrange(3)
            nats_cluster.kill(node_down)
            node_back_at = now + rng.uniform(1.0, 4.0)
            events["node kill"] += 1
    for slot in list(paused):
        current[slot].signal(signal.SIGCONT)
    if node_down is not None:
        nats_cluster.start_node(node_down)
    nats_cluster.wait_ready(30)
    acks_before = sum(child.count("ack") for child in everyone)
    deadline = time.monotonic() + 30
    working = True
    while sum(child.count("ack") for child in everyone) < acks_before + 20:  # a writer works again
        if time.monotonic() > deadline:
            working = False
            break
        await asyncio.sleep(0.1)
    for child in everyone:
        child.finish()

    messages = await read_subject(nats_cluster, store)
    # for a post-mortem: what each candidate said, and the subject
    dump = Path(os.environ.get("PD_FAILOVER_DUMP") or tmp_path) / f"failover-{seed}-{int(time.time())}"
    dump.mkdir(parents=True)
    for number, child in enumerate(everyone):
        (dump / f"{number:02d}-{child.name}-{child.proc.pid}.out").write_text("\n".join(f"{at:.3f} {line}" for at, line in child.lines))
    (dump / "subject.jsonl").write_text("\n".join(json.dumps({k: v for k, v in m.items() if k != "writes"}) for m in messages))
    print(f"randomized failover: seed {seed}, post-mortem in {dump}")
    assert working, f"no writer after the chaos (seed {seed}):\n" + "\n".join(c.tail(8) for c in current)

    # one linear history (fences of an epoch not above the last: reported, and tested by
    # test_take_over_epoch_is_above_every_epoch_on_the_subject)
    records = check_linear(messages, store, growing_fences=False)
    stale = stale_fences(messages)
    head = len(records)
    fences = [m for m in messages if m["kind"] == "fence"]

    # what the candidates said
    said: dict[int, tuple[Child, list[dict[str, Any]]]] = {}
    acknowledged: dict[int, tuple[Child, int]] = {}
    refused: dict[int, Child] = {}
    minted: Counter[int] = Counter()
    for child in everyone:
        for cid, writes in intents(child).items():
            assert cid not in said, f"conversation id {cid} used by two commits ({said[cid][0].name}, {child.name})"
            said[cid] = (child, writes)
        for cid, seq in acked(child).items():
            acknowledged[cid] = (child, seq)
        for cid in failed(child, "NotWriterError"):
            refused[cid] = child
        minted.update(int(words[1]) for words in child.words("mint"))
    twice = [id for id, count in minted.items() if count > 1]
    assert not twice, f"ids minted twice: {twice[:20]}"

    by_cid = Counter(record["cid"] for record in records)
    assert all(count == 1 for count in by_cid.values()), [cid for cid, count in by_cid.items() if count > 1]
    used: Counter[int] = Counter()
    for record in records:
        cid = record["cid"]
        assert cid in said, f"record {record['seq']} was never committed by any candidate: {record['writes']}"
        child, writes = said[cid]
        assert canonical(record["writes"], tuples_as_arrays=True) == canonical(writes, tuples_as_arrays=True)
        assert cid not in refused, f"record {record['seq']}: {child.name}'s commit refused with NotWriterError is in the stream"
        for write in record["writes"]:
            used[write["value"]["id"]] += 1
            assert minted[write["value"]["id"]] == 1, f"id {write['value']['id']} of record {record['seq']} was never minted"
    assert all(count == 1 for count in used.values()), [id for id, count in used.items() if count > 1]
    seq_of = {record["cid"]: record["seq"] for record in records}
    for cid, (child, seq) in acknowledged.items():
        assert seq_of.get(cid) == seq, (
            f"{child.name} acknowledged commit {seq} (conversation {cid}); the stream has it at {seq_of.get(cid)}"
        )
    assert len(acknowledged) >= 50, f"too few commits acknowledged ({len(acknowledged)}): {events}"
    print(
        f"randomized failover: {dict(events)}; {len(everyone)} candidate processes, {len(fences)} fences, "
        f"{head} records, {len(acknowledged)} acknowledged, {len(refused)} refused, "
        f"{sum(c.count('fail') for c in everyone) - len(refused)} other failures; "
        f"fences not above the last one (stream seq, epoch, highest before): {stale}"
    )

    # every directory, opened as a replica, converges to one export; so does a fresh one
    exports = {path.name: await converge(nats_cluster, path, store, head) for path in [*dirs, tmp_path / "fresh"]}
    assert len(set(exports.values())) == 1, {name: len(text) for name, text in exports.items()}
    assert len(exports["fresh"].splitlines()) == head

    # reads equal MemoryStorage fed the stream's commits in stream order
    reference = MemoryStorage()
    for record in records:
        assert await reference.commit(said[record["cid"]][1], CTX) == record["seq"]
    ours = await LmdbStorage.open(tmp_path / "fresh")
    try:
        ids = sorted(used)
        conversations = sorted(by_cid)
        mine_state = await snapshot_reads(ours, ids, conversations)
        reference_state = await snapshot_reads(reference, ids, conversations)
    finally:
        await ours.close()
    for key in reference_state:
        assert canonical(mine_state[key], tuples_as_arrays=True) == canonical(reference_state[key], tuples_as_arrays=True), f"{key}: {mine_state[key]!r} != {reference_state[key]!r}"
