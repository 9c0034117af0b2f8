"""Shared by the failover tests (``tests/replication/test_failover*.py``, ``test_lease_regain.py``):
the writer child processes, and the store's subject read raw and checked for one linear history.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.records import decode_record_builtins

from .natsserver import NatsCluster
from .polling import until_async
from .replication_helpers import open_writer as open_retrying

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHILD = "tests.support.failover_child"
PYTHON = sys.executable
DURABLE_LOG = str(Path(sys.executable).parent / "durable-log")
STREAM = "PD"
TTL = 2


# ── child processes ─────────────────────────────────────────────────────────


class Child:
    """A child process whose stdout lines are collected (with their arrival time) by a thread."""

    def __init__(
        self, args: list[str], log_dir: Path, name: str, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.args = args
        self.stderr_path = log_dir / f"{name}.{time.monotonic_ns()}.stderr"
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.stopped = False
        with open(self.stderr_path, "wb") as stderr:
            self.proc = subprocess.Popen(
                [PYTHON, "-m", CHILD, *args],
                stdout=subprocess.PIPE,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=ROOT,
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
        def reached() -> bool:
            if predicate():
                return True
            if self.proc.poll() is None:
                return False
            self._reader.join(2)  # the lines it printed before exiting
            if predicate():
                return True
            raise AssertionError(
                f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.tail()}"
            )

        await until_async(
            reached, timeout=timeout, what=f"{what} from {self.name}", detail=self.tail
        )

    async def wait_line(self, first: str, timeout: float, count: int = 1) -> list[str]:
        await self.wait_for(
            lambda: self.count(first) >= count, timeout, f"{count} {first!r} line(s)"
        )
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
        def __call__(
            self,
            role: str,
            directory: Path,
            *args: str,
            name: str = "child",
            env: dict[str, str] | None = None,
        ) -> Child:
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
    return {
        int(words[1]): words[2] for words in child.words("fail") if kind is None or words[2] == kind
    }


def intents(child: Child) -> dict[int, list[dict[str, Any]]]:
    return {int(words[1]): json.loads(words[2]) for words in child.words("intent")}


async def open_writer(
    cluster: NatsCluster, path: Path, store: str, take_over: Any = True
) -> LmdbStorage:
    """A replicated writer of ``store`` on the cluster, tried again while the cluster cannot
    place a new stream's replicas yet (``replication_helpers.open_writer``)."""

    return await open_retrying(
        path,
        durability="replicated",
        nats=cluster.urls,
        stream=STREAM,
        replicas=3,
        store=store,
        take_over=take_over,
        lease_ttl=TTL,
    )


async def open_replica(cluster: NatsCluster, path: Path, store: str) -> LmdbStorage:
    return await LmdbStorage.open_replica(path, nats=cluster.urls, stream=STREAM, store=store)


def conversation(id: int, **metadata: Any) -> dict[str, Any]:
    return {"type": "conversation", "value": {"id": id, "createdAt": 1, "metadata": metadata}}


# ── the stream, read raw ────────────────────────────────────────────────────


async def read_subject(
    cluster: NatsCluster, store: str, timeout: float = 20.0
) -> list[dict[str, Any]]:
    """Every message of the store's subject in stream order, straight from JetStream (nats-py,
    not the engine's link): stream sequence, kind, epoch, log sequence, and for a record its
    conversation id (the first write's) and writes."""

    import nats
    import nats.errors
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
            except (nats.errors.Error, OSError):  # no leader yet, or no answer
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        messages: list[dict[str, Any]] = []
        sub = await js.subscribe(
            subject,
            stream=STREAM,
            ordered_consumer=True,
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


def check_linear(
    messages: list[dict[str, Any]], store: str, *, growing_fences: bool = True
) -> list[dict[str, Any]]:
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
    done = subprocess.run(
        [DURABLE_LOG, "export", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def converge(
    cluster: NatsCluster, path: Path, store: str, head: int, timeout: float = 20.0
) -> str:
    """Open ``path`` as a replica, wait until it holds ``head``, close it; its export."""

    replica = await open_replica(cluster, path, store)
    try:
        await replica.wait(head, timeout=timeout)
        assert replica.log.head() == head
    finally:
        await replica.close()
    return export(path)
