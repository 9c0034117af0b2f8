"""Replicas: a local store kept level with its store's subject on a NATS stream.

A replica's log holds the writer's records byte for byte (their checksums checked on receipt),
folded by the same projector, so every read, ``as_of``, ``verify``, ``tail`` and user projection
works on it as on the writer. Records are taken in a chunk per LMDB transaction, together with
the stream position they reach, so a replica killed at any moment resumes exactly where its
store stands. A message that is not the next record of this store (a forged, corrupt or foreign
one) stops the replica with an error naming its stream sequence; nothing of it is applied.
An erasure reaches a replica as the writer's erasure record and its tombstones (``log.stream.
erasure``): its log is rewritten to the writer's bytes and its projections folded again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, NamedTuple, Protocol, TypeVar

import lmdb

from ..errors import ForeignMessageError, ReplicationError
from ..log import WriteLog
from ..log.stream.applier import StreamApplier
from ..log.stream.erasure import TombstoneLookup
from ..log.stream.link import StreamLink
from ..log.stream.message import RawMessage, StreamMessage, parse_message, subject_of
from ..log.stream.position import StreamPosition
from ..log.stream.status import ReplicaStatus
from ..projections import Projector

APPLY_CHUNK: Final = 1024
"""Messages taken in per LMDB transaction at most while following."""
BULK_BATCH: Final = 4096
"""Messages per batched read (and per LMDB transaction) while catching up from far behind."""
RETRY: Final = (0.05, 2.0)

T = TypeVar("T")


class ReplicaHost(Protocol):
    """What a follower needs of the store it takes a stream into (``LmdbStorage`` is one)."""

    @property
    def log(self) -> WriteLog:
        """The store's log: its head, the records, the wake-ups of its waiters."""

    @property
    def path(self) -> str:
        """The store's directory, for messages."""

    def check_open(self) -> None:
        """Raise ``StoreClosedError`` once the store is closed."""

    def stream_position(
        self, stream: str, txn: lmdb.Transaction[bytes] | None = None
    ) -> StreamPosition:
        """How far the store took in ``stream``; in ``txn`` when given."""

    def stream_applier(self, stream: str, store: str) -> StreamApplier:
        """An applier of ``store``'s messages on ``stream`` to the store's log and position."""

    def take_in(self, work: Callable[[lmdb.Transaction[bytes], Projector], T]) -> T:
        """Run ``work`` in one write transaction with no commit beside it (on a worker thread)."""

    def taken_in(self, max_id: int) -> None:
        """After ``take_in`` committed: its ids are never minted, readers see its records."""


class _End(NamedTuple):
    """Where a catch-up stops: after record ``to_seq``, or before the first record committed
    after Unix ms ``to_time`` (a restore to a point in time); neither: the stream's end."""

    to_seq: int | None
    to_time: int | None

    def beyond(self, message: StreamMessage) -> bool:
        """Whether ``message`` is a record past this end."""

        if message.kind != "record":
            return False
        if self.to_seq is not None and message.seq > self.to_seq:
            return True
        commit = message.commit
        return (
            self.to_time is not None and commit is not None and commit.committed_at > self.to_time
        )


class Follower:
    """Takes a store's messages from the stream into a local store (a task on the link's loop)."""

    def __init__(self, link: StreamLink, storage: ReplicaHost, store: str) -> None:
        self.link, self.storage, self.store = link, storage, store
        self.subject = subject_of(link.stream, store)
        self.applier = storage.stream_applier(link.stream, store)
        self.applier.tombstones = TombstoneLookup(link, self.subject, store)
        self.error: ForeignMessageError | None = None
        self.last_error: str | None = None
        self.stream_seq = 0
        self.pending = 0
        self.heard = False
        """Whether the stream has told how far it reaches (until then ``pending`` is not known:
        a replica just started is not level, however few records it has)."""
        self.transactions = 0
        """LMDB transactions that took messages in (a replica behind takes big chunks)."""
        self._task: Any = None
        self._stopping = False

    # ── running ─────────────────────────────────────────────────────────────

    def start(self) -> None:
        self._task = asyncio.run_coroutine_threadsafe(self._follow(), self.link.loop)

    async def _follow(self) -> None:
        pause = RETRY[0]
        while not self._stopping and self.error is None:
            try:
                await self.catch_up(follow=True)
            except ForeignMessageError:
                return
            except ReplicationError as error:
                self.last_error = str(error)
            except Exception as error:
                if self._stopping:
                    return
                self.last_error = f"{type(error).__name__}: {error}"
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY[1])

    async def catch_up(
        self,
        *,
        follow: bool = False,
        to_seq: int | None = None,
        progress: Callable[[int, int], None] | None = None,
        to_time: int | None = None,
    ) -> int:
        """Take in the subject's messages beyond this store's position (on the link's loop):
        until the stream's end (``follow=False``), record ``to_seq``, the last record committed
        at or before Unix ms ``to_time``, or forever; returns the log head reached."""

        position = self._position()
        self.stream_seq = position.stream_seq
        if to_seq is not None and position.seq >= to_seq:
            return int(position.seq)
        stop = _End(to_seq, to_time)
        if await self._bulk(stop, progress):
            return self.storage.log.head()
        position = self._position()
        chunk: list[StreamMessage] = []
        try:
            async for message, pending in self.link.messages.read(
                self.subject, position.stream_seq, store=self.store, follow=follow
            ):
                self.pending = pending
                if stop.beyond(message):
                    break
                chunk.append(message)
                if (
                    pending == 0
                    or len(chunk) >= APPLY_CHUNK
                    or (to_seq is not None and message.seq >= to_seq)
                ):
                    await self._apply(chunk)
                    chunk = []
                    if progress is not None:
                        progress(self.storage.log.head(), self.storage.log.head() + pending)
                    if to_seq is not None and self.storage.log.head() >= to_seq:
                        break
                self.last_error = None
        except ForeignMessageError as error:
            await self._apply(chunk)  # what came before the refused message is sound
            self._stop(error)
            raise
        await self._apply(chunk)
        return self.storage.log.head()

    async def _bulk(self, stop: _End, progress: Callable[[int, int], None] | None) -> bool:
        """Take in what the stream holds now beyond this store's position, in batches: the next
        batch is fetched on the link's loop while a worker thread checks and folds this one in
        one transaction. Returns whether ``stop`` was reached; the caller reads on
        from the position reached (whatever a batch answered short left, and what comes later)."""

        after = self._position().stream_seq
        try:
            last = await self.link.messages.last(self.subject, None)
        except ForeignMessageError as error:  # the last message is unsound: refused when reached
            end = error.stream_seq
        else:
            end = 0 if last is None else last.stream_seq
        self.pending, self.heard = max(0, end - after), True  # messages: refined as they come
        if end <= after:
            return False
        fetching: asyncio.Future[list[RawMessage]] | None = asyncio.ensure_future(
            self.link.messages.fetch(self.subject, after, batch=BULK_BATCH)
        )
        try:
            while fetching is not None:
                raws = await fetching
                fetching = None
                if not raws:
                    return False
                after = raws[-1].stream_seq
                if after < end:
                    fetching = asyncio.ensure_future(
                        self.link.messages.fetch(self.subject, after, batch=BULK_BATCH)
                    )
                reached = await self._take_raw(raws, stop)
                head, self.pending = self.storage.log.head(), raws[-1].pending
                if progress is not None:
                    progress(head, head + self.pending)
                if reached:
                    return True
                self.last_error = None
            return False
        finally:
            if fetching is not None:
                fetching.cancel()

    async def _take_raw(self, raws: list[RawMessage], end: _End) -> bool:
        """Check and fold ``raws`` in one transaction on a worker thread, each message checked
        just before it is folded (so no batch of decoded records is ever held: far less for the
        garbage collector to walk); stops before a record beyond ``end`` and returns whether it
        was reached. A refused message: what came before it is taken in, then it stops the
        follower and raises."""

        stream, store, beyond = self.link.stream, self.store, [False]

        def checked(upto: int) -> Iterator[StreamMessage]:
            for raw in raws:
                if raw.stream_seq >= upto:
                    return
                message = parse_message(stream, raw.stream_seq, raw.headers, raw.data, store)
                if end.beyond(message):
                    beyond[0] = True
                    return
                yield message

        try:  # a fresh iterator for each run of the transaction (a map growth runs it again)
            position = await asyncio.to_thread(
                self._write, lambda: checked(raws[-1].stream_seq + 1)
            )
        except ForeignMessageError as error:
            foreign = error.stream_seq
            if raws[0].stream_seq < foreign:
                await asyncio.to_thread(self._write, lambda: checked(foreign))
                self._applied()
            self._stop(error)
            raise
        self.stream_seq = position.stream_seq
        self._applied()
        return beyond[0] or (end.to_seq is not None and position.seq >= end.to_seq)

    async def _apply(self, chunk: list[StreamMessage]) -> None:
        if not chunk:
            return
        try:
            position = await asyncio.to_thread(self._write, chunk)
        except ForeignMessageError as error:
            sound = [message for message in chunk if message.stream_seq < error.stream_seq]
            if sound:
                await asyncio.to_thread(self._write, sound)
                self._applied()
            self._stop(error)
            raise
        self.stream_seq = position.stream_seq
        self._applied()

    def _write(self, chunk: list[StreamMessage] | Callable[[], Iterable[StreamMessage]]) -> Any:
        """One transaction taking ``chunk`` in (a list, or what makes an iterator of it: the
        transaction may run again from the start), on a worker thread (never the link's loop,
        which a commit of a writer being deposed may be waiting on), with no group beside it."""

        self.transactions += 1
        make = chunk if callable(chunk) else (lambda: chunk)
        return self.storage.take_in(
            lambda txn, projector: self.applier.apply(txn, projector, make(), self._position(txn))
        )

    def _applied(self) -> None:
        self.storage.taken_in(self.applier.max_id)

    def _position(self, txn: Any = None) -> Any:
        return self.storage.stream_position(self.link.stream, txn)

    def _stop(self, error: ForeignMessageError) -> None:
        self.error, self.last_error = error, str(error)
        self.storage.log.wake()

    # ── for callers ─────────────────────────────────────────────────────────

    async def wait(self, seq: int, timeout: float | None = None) -> None:
        """Until this store holds record ``seq`` (read-your-writes across machines)."""

        deadline = None if timeout is None else time.monotonic() + timeout
        log = self.storage.log
        while log.head() < seq:
            if self.error is not None:
                raise self.error
            self.storage.check_open()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"The replica at {self.storage.path} holds records up to {log.head()}, not {seq}, "
                    f"after {timeout} s (last error: {self.last_error})"
                )
            await log.wait_commit(0.05)

    def status(self) -> ReplicaStatus:
        head = self.storage.log.head()
        last = self.storage.log.get(head) if head else None
        lag_ms = 0.0
        if self.pending and last is not None:
            lag_ms = max(0.0, time.time() * 1000 - last.committed_at)
        return ReplicaStatus(
            stream=self.link.stream,
            subject=self.subject,
            applied_seq=head,
            stream_seq=self.stream_seq,
            lag_records=self.pending,
            lag_ms=lag_ms,
            last_error=self.last_error or self.link.last_error,
            stopped=self.error is not None,
            transactions=self.transactions,
        )

    def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()


__all__ = [
    "APPLY_CHUNK",
    "BULK_BATCH",
    "RETRY",
    "Follower",
    "ReplicaHost",
]
