"""The boundary between the log's replication and a stream engine: one small typed interface.

Everything that ships and guards the log (the stream writer, the shipper, the follower, the
lease) talks to the stream through ``StreamLink`` only. ``JetStreamLink`` (``jetstream.py``) is
NATS JetStream; ``MemoryLink`` (``memory.py``) keeps the same promises in memory, for tests that
need no server and must be fast and deterministic. Another engine implements this Protocol.

What every link promises:

- A store's subject is an append-only sequence of messages (``StreamMessage``); each has a stream
  sequence that only grows (shared by every subject of the stream).
- ``publish(subject, messages, expected)`` appends all of ``messages`` or none, and only if the
  subject's last message is at stream sequence ``expected`` (0: the subject is empty); else
  ``StreamMovedError``. With no answer: ``OutcomeUnknownError`` (they may or may not be there).
- ``last(subject, store)`` is the subject's last message as the stream's leader has it.
- ``read(subject, after, ...)`` yields the subject's messages after a stream sequence, in order,
  each with how many more are known to follow.
- ``fetch(subject, after, batch=...)`` returns the next messages of the subject after a stream
  sequence, at most ``batch`` of them, in order and unchecked (``RawMessage``): a catch-up's bulk
  read, checked and folded off the link's loop while the next batch is fetched. An empty list
  means the server that answered holds nothing more.
- Snapshots: a bucket of named objects beside the stream. ``snapshot_put(name, source)`` stores
  one whole or not at all (a put cut short leaves nothing listed); ``snapshot_names()`` lists the
  complete ones; ``snapshot_get(name, sink)`` writes one out, ``ReplicationError`` when it is
  missing or does not match the digest it was stored with; ``snapshot_delete(name)``.
  ``trim(subject, keep_from)`` removes the subject's messages below stream sequence ``keep_from``
  (only ever asked for by an explicit retention policy).
- The lease key-value: ``lease_get(key)`` is ``(value, revision)`` (``None``, and the revision a
  delete left or 0, when there is none); ``lease_put(key, value, revision, ttl)`` sets it only if
  its revision is ``revision`` and returns the new one, or ``None`` when it is not (someone moved
  first); the value is dropped ``ttl`` seconds after the put, by the engine's clock, not the
  holder's. ``lease_delete(key, revision)`` drops it if it is still at ``revision``.
- Other key-value buckets beside the stream, ``<stream>-<bucket>`` (signed checkpoints:
  ``audit.witness``), made on first use: ``kv_get(bucket, key)`` is ``(value, revision)`` as for
  the lease; ``kv_put(bucket, key, value, revision)`` sets it only if its revision is
  ``revision`` (0: the key has never been set) and returns the new one, or ``None`` when it is
  not (someone else put first). Values never expire.

A link owns a thread with its event loop (``LinkLoop``): the writer thread, which must not run an
event loop, calls ``run``; a caller's loop calls ``arun``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any, BinaryIO, Protocol, TypeVar

from .message import RawMessage, StreamMessage

T = TypeVar("T")


class StreamLink(Protocol):
    """What replication needs from a stream engine (see the module docstring for the promises)."""

    stream: str
    timeout: float
    last_error: str | None
    clock: Callable[[], float]
    """Monotonic seconds: what the lease's validity is counted in."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T: ...

    async def connect(self) -> None: ...

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

    async def lease_get(self, key: str) -> tuple[bytes | None, int]: ...

    async def snapshot_put(self, name: str, source: BinaryIO) -> None: ...

    async def snapshot_names(self) -> list[str]: ...

    async def snapshot_get(self, name: str, sink: BinaryIO) -> None: ...

    async def snapshot_delete(self, name: str) -> None: ...

    async def trim(self, subject: str, keep_from: int) -> None: ...

    async def lease_put(self, key: str, value: bytes, revision: int, ttl: float) -> int | None: ...

    async def lease_delete(self, key: str, revision: int) -> None: ...

    async def kv_get(self, bucket: str, key: str) -> tuple[bytes | None, int]: ...

    async def kv_put(self, bucket: str, key: str, value: bytes, revision: int) -> int | None: ...

    def close(self) -> None: ...


class LinkLoop:
    """A thread running an event loop of its own, for a link's coroutines."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False
        self.last_error: str | None = None
        self.clock: Callable[[], float] = time.monotonic

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
