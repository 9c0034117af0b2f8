"""The boundary between the log's replication and a stream engine: three small typed roles.

Everything that ships and guards the log (the stream writer, the shipper, the follower, the
lease, snapshots, the witness) talks to the engine through a ``StreamLink``: a bundle of three
roles on one connection, each a Protocol of its own, so another target for one role is one new
module (as Litestream has one replica client per target):

- ``link.messages`` (``Stream``): the stream's subjects, append-only sequences of messages.
- ``link.keys`` (``KeyValue``): the writer lease's key-value and other buckets beside it.
- ``link.snapshots`` (``SnapshotStore``): a bucket of named, whole objects.

``JetStreamLink`` (``jetstream.py``, with ``buckets.py`` and ``objects.py`` for its key-value
and snapshot roles) is NATS JetStream; ``MemoryLink`` (``memory.py``) keeps the same promises in
memory, for tests that need no server and must be fast and deterministic. One contract suite per
role (``tests/replication/contract/``) runs the same tests on both.

What a ``Stream`` promises:

- A store's subject is an append-only sequence of messages (``StreamMessage``); each has a stream
  sequence that only grows (shared by every subject of the stream).
- ``publish(subject, messages, expected)`` appends all of ``messages`` or none, and only if the
  subject's last message is at stream sequence ``expected`` (0: the subject is empty); else
  ``StreamMovedError`` (also for a message id the subject already holds). A message over the
  largest the engine takes: ``ReplicationError`` naming it too big, nothing stored. With no
  answer: ``OutcomeUnknownError`` (they may or may not be there).
- ``last(subject, store)`` is the subject's last message as the stream's leader has it.
- ``read(subject, after, ...)`` yields the subject's messages after a stream sequence, in order,
  each with how many more are known to follow.
- ``fetch(subject, after, batch=...)`` returns the next messages of the subject after a stream
  sequence, at most ``batch`` of them, in order and unchecked (``RawMessage``): a catch-up's bulk
  read, checked and folded off the link's loop while the next batch is fetched. An empty list
  means the server that answered holds nothing more.
- ``delete(stream_seq)`` removes one message, its bytes overwritten where the engine keeps them
  (JetStream's secure delete); one already gone is no error. Only an erasure asks for it.
- ``trim(subject, keep_from)`` removes the subject's messages below stream sequence ``keep_from``
  (only ever asked for by an explicit retention policy); sequences are never reused.
- Without the stream (``ensure_stream`` not yet run with ``create``): ``StreamMissingError``, but
  for a publish, which JetStream cannot tell from one that nothing answers (``ReplicationError``
  either way).

What a ``KeyValue`` promises:

- Keys are letters, digits, ``-/_=`` and inner dots (``check_key``); another is refused with
  ``BadInputError`` before the engine is asked.
- The lease key-value: ``lease_get(key)`` is ``(value, revision)`` (``None``, and the revision a
  delete left or 0, when there is none); ``lease_put(key, value, revision, ttl)`` sets it only if
  its revision is ``revision`` and returns the new one, or ``None`` when it is not (someone moved
  first); the value is dropped ``ttl`` seconds after the put, by the engine's clock (``clock``),
  not the holder's. ``lease_delete(key, revision)`` drops it if it is still at ``revision``. A
  lease is only ever of a store on the stream: without the stream, ``StreamMissingError``.
- Other buckets, ``<stream>-<bucket>`` (signed checkpoints: ``audit.witness``), made on first
  use, needing no stream: ``kv_get(bucket, key)`` is ``(value, revision)`` as for the lease;
  ``kv_put(bucket, key, value, revision)`` sets it only if its revision is ``revision`` (0: the
  key has never been set) and returns the new one, or ``None`` when it is not (someone else put
  first). Values never expire.

What a ``SnapshotStore`` promises: ``put(name, source)`` stores ``source`` (from where it stands
to its end) whole or not at all (a put cut short leaves nothing listed), replacing one of that
name; ``names()`` lists the complete ones, sorted; ``get(name, sink)`` writes one out,
``ReplicationError`` when it is missing or does not match the digest it was stored with;
``delete(name)`` drops one (nothing when there is none). The store is made beside the stream by
the first put, which needs the stream (``StreamMissingError``); before it, there is nothing to
list, get or delete.

A link owns a thread with its event loop (``LinkLoop``, the runner): every role's coroutines run
on it. The writer thread, which must not run an event loop, calls ``run``; a caller's loop calls
``arun``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, BinaryIO, Final, Protocol, TypeVar

from ...errors import BadInputError
from .message import RawMessage, StreamMessage

T = TypeVar("T")
KV_KEY: Final = re.compile(r"[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*")
"""A key of a key-value bucket: letters, digits, ``-/_=`` and inner dots (NATS's rule)."""


def check_key(key: str) -> str:
    """``key`` when a ``KeyValue`` can hold it; ``BadInputError`` naming it otherwise (JetStream
    would take it for a subject of its own, or refuse it without saying why)."""

    if not isinstance(key, str) or not KV_KEY.fullmatch(key):
        raise BadInputError(
            f"A key-value key is letters, digits, '-', '/', '_', '=' and inner '.', not {key!r:.80}"
        )
    return key


class Stream(Protocol):
    """A stream's subjects (see the module docstring for the promises)."""

    async def ensure_stream(self, replicas: int = 1, create: bool = True) -> None: ...

    async def last(self, subject: str, store: str | None) -> StreamMessage | None: ...

    async def publish(
        self, subject: str, messages: Sequence[tuple[dict[str, str], bytes]], expected: int
    ) -> int: ...

    def read(
        self, subject: str, after: int, *, store: str | None, follow: bool, idle: float = 0.5
    ) -> AsyncIterator[tuple[StreamMessage, int]]: ...

    async def fetch(self, subject: str, after: int, *, batch: int) -> list[RawMessage]: ...

    def too_big(self, size: int) -> str | None: ...

    def check_size(self, size: int) -> None: ...

    async def trim(self, subject: str, keep_from: int) -> None: ...

    async def delete(self, stream_seq: int) -> None: ...


class KeyValue(Protocol):
    """The lease's key-value and the other buckets beside a stream (see the module docstring)."""

    clock: Callable[[], float]
    """Monotonic seconds: what the lease's validity is counted in."""

    async def lease_get(self, key: str) -> tuple[bytes | None, int]: ...

    async def lease_put(self, key: str, value: bytes, revision: int, ttl: float) -> int | None: ...

    async def lease_delete(self, key: str, revision: int) -> None: ...

    async def kv_get(self, bucket: str, key: str) -> tuple[bytes | None, int]: ...

    async def kv_put(self, bucket: str, key: str, value: bytes, revision: int) -> int | None: ...


class SnapshotStore(Protocol):
    """Named, whole objects: where snapshots of stores go (see the module docstring)."""

    async def put(self, name: str, source: BinaryIO) -> None: ...

    async def names(self) -> list[str]: ...

    async def get(self, name: str, sink: BinaryIO) -> None: ...

    async def delete(self, name: str) -> None: ...


class StreamLink(Protocol):
    """What replication needs from a stream engine: its three roles on one connection, and the
    runner whose loop they run on."""

    stream: str
    """The stream's name."""
    timeout: float
    last_error: str | None

    @property
    def messages(self) -> Stream: ...

    @property
    def keys(self) -> KeyValue: ...

    @property
    def snapshots(self) -> SnapshotStore: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T: ...

    async def connect(self) -> None: ...

    def close(self) -> None: ...


class LinkLoop:
    """A thread running an event loop of its own, for a link's coroutines."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False
        self.last_error: str | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the link's loop and wait for it, from any other thread."""

        if threading.current_thread() is self._thread:
            raise RuntimeError(f"{type(self).__name__}.run() called from the link's own thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on the link's loop, from a coroutine on any loop."""

        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def disconnect(self) -> None:
        """End every task left on the link's loop; a link with a connection closes it too."""

        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def close(self) -> None:
        """Disconnect and stop the link's thread (from any thread but the link's)."""

        if self._closed:
            return
        self._closed = True
        try:
            self.run(self.disconnect(), timeout=5)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()


__all__ = [
    "LinkLoop",
    "StreamLink",
]
