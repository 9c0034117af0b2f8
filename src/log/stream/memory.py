"""An in-memory stream engine that keeps the promises of ``link.py``'s roles: for tests that need
no server.

``MemoryStream`` is the server (one stream, its subjects and its lease key-value), shared by
every ``MemoryLink`` to it as a NATS server is by its clients; each link has its own thread and
loop, as a JetStream link does, so writers, shippers, followers and leases run exactly as they do
against JetStream. Faults are set on the stream: ``down`` (nothing answers), ``drop_requests``
(the next publishes are lost before they are stored, with no answer), ``lose_answers`` (the next
publishes are stored but their answers lost). Time, for lease expiry, is ``clock``: pass a
``ManualClock`` to decide when leases expire instead of waiting for them.

It checks every message it gives out as JetStream's link does (``message.parse_message``), and
refuses what JetStream refuses: a conditional append not at the subject's last message, a
message id the subject already holds, a message over ``max_payload``.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from ...errors import (
    NatsUnavailableError,
    OutcomeUnknownError,
    ReplicationError,
    StreamMissingError,
    StreamMovedError,
)
from .link import LinkLoop, check_key
from .message import (
    H_MSG_ID,
    RawMessage,
    StreamMessage,
    check_size,
    check_stream_name,
    parse_message,
    too_big,
)


class ManualClock:
    """Monotonic seconds that move only when told (``advance``)."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class _Message:
    stream_seq: int
    subject: str
    headers: dict[str, str]
    data: bytes


@dataclass
class _Key:
    value: bytes | None
    revision: int
    expires: float


@dataclass
class MemoryStream:
    """One stream held in memory: the server every ``MemoryLink`` to it shares."""

    name: str
    max_payload: int = 1 << 20
    clock: Callable[[], float] = time.monotonic
    exists: bool = False
    down: bool = False
    drop_requests: int = 0
    lose_answers: int = 0
    lagging_fetches: int = 0
    """The next this many ``fetch`` answers come from a replica one append behind: without the
    messages of the last append (a replicated stream acknowledges an append once most of its
    replicas hold it)."""
    messages: list[_Message] = field(default_factory=list)
    keys: dict[str, _Key] = field(default_factory=dict)
    buckets: dict[str, dict[str, _Key]] = field(default_factory=dict)
    """Other key-value buckets (``kv_get``, ``kv_put``): bucket -> key -> value."""
    objects: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    """The snapshot bucket: name -> (content, its SHA-256 as stored)."""
    revision: int = 0
    last_seq: int = 0
    """The stream sequence of the last message ever stored (a trim does not lower it)."""
    last_append: int = 0
    """The stream sequence of the first message of the last append."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        check_stream_name(self.name)

    def subject_messages(self, subject: str, after: int = 0) -> list[_Message]:
        with self.lock:
            return [m for m in self.messages if m.subject == subject and m.stream_seq > after]

    def answer(self, stream: bool = True) -> None:
        """Raise what a server that is down, or lacks the stream (``stream``: when asked about
        it), would answer."""

        if self.down:
            raise NatsUnavailableError(f"The in-memory stream {self.name!r} is down")
        if stream and not self.exists:
            raise StreamMissingError(f"No stream {self.name!r} (in memory)")


class MemoryLink(LinkLoop):
    """A link to a ``MemoryStream``: the bundle of its stream (``messages``), key-value
    (``keys``) and snapshot (``snapshots``) roles."""

    def __init__(self, stream: MemoryStream, *, timeout: float = 1.0) -> None:
        self.server = stream
        self.stream = stream.name
        self.timeout = timeout
        self.messages = MemoryMessages(stream)
        self.keys = MemoryKeys(stream)
        self.snapshots = MemorySnapshots(stream)
        super().__init__(f"memory {stream.name}")

    async def connect(self) -> None:
        if self.server.down:
            raise NatsUnavailableError(f"The in-memory stream {self.stream!r} is down")


class MemoryMessages:
    """The stream role of a ``MemoryLink`` (``link.Stream``)."""

    def __init__(self, server: MemoryStream) -> None:
        self.server = server
        self.stream = server.name

    async def ensure_stream(self, replicas: int = 1, create: bool = True) -> None:
        if self.server.down:
            raise NatsUnavailableError(f"The in-memory stream {self.stream!r} is down")
        if not self.server.exists and not create:
            raise StreamMissingError(f"No stream {self.stream!r} (in memory)")
        self.server.exists = True

    async def last(self, subject: str, store: str | None) -> StreamMessage | None:
        self.server.answer()
        found = self.server.subject_messages(subject)
        if not found:
            return None
        last = found[-1]
        return parse_message(self.stream, last.stream_seq, last.headers, last.data, store)

    async def publish(
        self, subject: str, messages: Sequence[tuple[dict[str, str], bytes]], expected: int
    ) -> int:
        if not messages:
            return expected
        server = self.server
        server.answer()
        if server.drop_requests:
            server.drop_requests -= 1
            raise OutcomeUnknownError(
                f"The in-memory stream lost an append to {subject} (no answer)"
            )
        for _, body in messages:
            reason = too_big(len(body), server.max_payload)
            if reason is not None:
                raise ReplicationError(
                    f"The stream refused an append to {subject} as too big: {reason}"
                )
        with server.lock:
            mine = [m for m in server.messages if m.subject == subject]
            ids = {m.headers.get(H_MSG_ID) for m in mine}
            if any(headers.get(H_MSG_ID) in ids for headers, _ in messages):
                raise StreamMovedError(subject, expected, None)
            last = mine[-1].stream_seq if mine else 0
            if last != expected:
                raise StreamMovedError(subject, expected, last)
            server.last_append = server.last_seq + 1
            for headers, body in messages:
                server.last_seq += 1
                server.messages.append(
                    _Message(server.last_seq, subject, dict(headers), bytes(body))
                )
            stored = server.last_seq
        if server.lose_answers:
            server.lose_answers -= 1
            raise OutcomeUnknownError(
                f"The in-memory stream stored an append to {subject}; its answer was lost"
            )
        return stored

    async def read(
        self, subject: str, after: int, *, store: str | None, follow: bool, idle: float = 0.5
    ) -> AsyncIterator[tuple[StreamMessage, int]]:
        self.server.answer()
        while True:
            found = [] if self.server.down else self.server.subject_messages(subject, after)
            for index, message in enumerate(found):
                after = message.stream_seq
                yield (
                    parse_message(
                        self.stream, message.stream_seq, message.headers, message.data, store
                    ),
                    len(found) - index - 1,
                )
            if not follow and not self.server.down:
                return
            await asyncio.sleep(0.005)

    async def fetch(self, subject: str, after: int, *, batch: int) -> list[RawMessage]:
        server = self.server
        server.answer()
        found = server.subject_messages(subject, after)
        if server.lagging_fetches:
            server.lagging_fetches -= 1
            found = [message for message in found if message.stream_seq < server.last_append]
        return [
            RawMessage(
                message.stream_seq, dict(message.headers), message.data, len(found) - index - 1
            )
            for index, message in enumerate(found[:batch])
        ]

    def too_big(self, size: int) -> str | None:
        return too_big(size, self.server.max_payload)

    def check_size(self, size: int) -> None:
        check_size(size, self.server.max_payload)

    async def trim(self, subject: str, keep_from: int) -> None:
        self.server.answer()
        with self.server.lock:
            self.server.messages = [
                m for m in self.server.messages if m.subject != subject or m.stream_seq >= keep_from
            ]

    async def delete(self, stream_seq: int) -> None:
        self.server.answer()
        with self.server.lock:
            self.server.messages = [m for m in self.server.messages if m.stream_seq != stream_seq]


class MemoryKeys:
    """The key-value role of a ``MemoryLink`` (``link.KeyValue``), on the stream's clock."""

    def __init__(self, server: MemoryStream) -> None:
        self.server = server
        self.clock = server.clock

    async def lease_get(self, key: str) -> tuple[bytes | None, int]:
        check_key(key)
        self.server.answer()
        with self.server.lock:
            entry = self.server.keys.get(key)
            if entry is None or entry.expires <= self.clock():
                return None, 0  # an expired value is gone, as a message past its TTL is
            return entry.value, entry.revision

    async def lease_put(self, key: str, value: bytes, revision: int, ttl: float) -> int | None:
        check_key(key)
        self.server.answer()
        with self.server.lock:
            entry = self.server.keys.get(key)
            now = 0 if entry is None or entry.expires <= self.clock() else entry.revision
            if now != revision:
                return None
            self.server.revision += 1
            self.server.keys[key] = _Key(value, self.server.revision, self.clock() + ttl)
            return self.server.revision

    async def kv_get(self, bucket: str, key: str) -> tuple[bytes | None, int]:
        check_key(key)
        self.server.answer(stream=False)
        with self.server.lock:
            entry = self.server.buckets.get(bucket, {}).get(key)
            return (None, 0) if entry is None else (entry.value, entry.revision)

    async def kv_put(self, bucket: str, key: str, value: bytes, revision: int) -> int | None:
        check_key(key)
        self.server.answer(stream=False)
        with self.server.lock:
            keys = self.server.buckets.setdefault(bucket, {})
            entry = keys.get(key)
            if (0 if entry is None else entry.revision) != revision:
                return None
            self.server.revision += 1
            keys[key] = _Key(bytes(value), self.server.revision, float("inf"))
            return self.server.revision

    async def lease_delete(self, key: str, revision: int) -> None:
        self.server.answer()
        with self.server.lock:
            entry = self.server.keys.get(key)
            if entry is not None and entry.revision == revision:
                self.server.revision += 1
                self.server.keys[key] = _Key(None, self.server.revision, float("inf"))


class MemorySnapshots:
    """The snapshot role of a ``MemoryLink`` (``link.SnapshotStore``): the stream's bucket,
    which only a put needs the stream for (as JetStream's is made with the stream's replicas)."""

    def __init__(self, server: MemoryStream) -> None:
        self.server = server

    async def put(self, name: str, source: BinaryIO) -> None:
        self.server.answer()
        content = source.read()
        with self.server.lock:
            self.server.objects[name] = (content, hashlib.sha256(content).digest())

    async def names(self) -> list[str]:
        self.server.answer(stream=False)
        with self.server.lock:
            return sorted(self.server.objects)

    async def get(self, name: str, sink: BinaryIO) -> None:
        self.server.answer(stream=False)
        with self.server.lock:
            found = self.server.objects.get(name)
        if found is None:
            raise ReplicationError(f"The snapshot {name} is not in the in-memory bucket")
        if hashlib.sha256(found[0]).digest() != found[1]:
            raise ReplicationError(f"The snapshot {name} does not match its digest")
        sink.write(found[0])

    async def delete(self, name: str) -> None:
        self.server.answer(stream=False)
        with self.server.lock:
            self.server.objects.pop(name, None)


__all__ = [
    "ManualClock",
    "MemoryKeys",
    "MemoryLink",
    "MemoryMessages",
    "MemorySnapshots",
    "MemoryStream",
]
