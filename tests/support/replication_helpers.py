"""Shared by the replication tests (``tests/replication/test_replication*.py``): bounded async bodies,
``replication_child.py`` writers and their ledger of acknowledged commits, the stream as nats-py reads
it, the local log, and small builders.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pi_durable_lmdb import NatsUnavailableError, ReplicationError
from pi_durable_lmdb.log import Environment, WriteLog, decode_record, write_to_builtins
from pi_durable_lmdb.storage import LmdbStorage

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
CHILD = "tests.support.replication_child"
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
            [sys.executable, "-m", CHILD, *args],
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
                    raise AssertionError(
                        f"the writer exited ({self.proc.wait(5)}) before {what}:\n{self.tail()}"
                    )
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
            raise AssertionError(
                f"the writer did not finish in {timeout} s:\n{self.tail()}"
            ) from None
        finally:
            self.kill()

    def tail(self) -> str:
        with self._cond:
            lines = self.lines[-15:]
        self._stderr.flush()
        return (
            "\n".join(lines)
            + "\n-- stderr --\n"
            + self.stderr_path.read_text(errors="replace")[-3000:]
        )


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
                assert self.store in (None, store), (
                    f"the store's id changed from {self.store} to {store}"
                )
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

    return await nats.connect(
        servers=servers.split(","),
        connect_timeout=2,
        max_reconnect_attempts=10,
        reconnect_time_wait=0.2,
    )


async def read_subject(
    servers: str, stream: str, subject: str, timeout: float = 30.0
) -> list[Message]:
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
            sub = await js.subscribe(
                subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
            )
            try:
                while len(out) < count:
                    msg = await sub.next_msg(timeout=max(0.1, deadline - time.monotonic()))
                    out.append(
                        Message(
                            msg.metadata.sequence.stream, dict(msg.headers or {}), bytes(msg.data)
                        )
                    )
            finally:
                await sub.unsubscribe()
        try:
            last = await js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            last = None
        assert (last.seq if last else None) == (out[-1].stream_seq if out else None), (
            "the subject moved while read"
        )
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
        assert message.headers.get("Pd-Format") == "1", (
            f"message {message.stream_seq}: {message.headers}"
        )
        assert message.headers.get("Pd-Store") == store, (
            f"message {message.stream_seq}: {message.headers}"
        )
        assert message.kind in ("record", "fence", "ids"), (
            f"message {message.stream_seq}: {message.headers}"
        )
    epochs = [message.epoch for message in messages]
    assert epochs == sorted(epochs), f"writer epochs go back along the subject: {epochs[:50]}"
    records = [message for message in messages if message.kind == "record"]
    seqs = [message.seq for message in records]
    if seqs != list(range(1, len(seqs) + 1)):
        index = next(i for i, seq in enumerate(seqs) if seq != i + 1)
        raise AssertionError(
            f"the subject's records are not 1..{len(seqs)} once each, in order: at stream sequence "
            f"{records[index].stream_seq} comes record {seqs[index]}, not {index + 1} (around: {seqs[max(0, index - 3) : index + 4]})"
        )
    for message in records:
        assert message.headers.get("Nats-Msg-Id") == f"{store}:{message.seq}", message.headers
        if message.seq in local:
            assert message.data == local[message.seq], (
                f"record {message.seq} in the stream differs from the local log's"
            )
    return records


def entry_ids(data: bytes, seq: int) -> tuple[int, ...]:
    writes = [write_to_builtins(write) for write in decode_record(seq, data).writes]
    return tuple(write["value"]["id"] for write in writes if write["type"] == "entry")


def subject(stream: str, store: str) -> str:
    return f"{stream}.{store}.log"


def _entry(id: int, conversation: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "type": "entry",
        "value": {"id": id, "conversationId": conversation, "kind": "message", **extra},
    }


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
