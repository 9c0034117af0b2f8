"""Asynchronous shipping: a writer's committed records follow it to the stream, in order, once each.

Used with ``durability="power"`` or ``"process"`` and a NATS stream: a commit returns after the
local commit, and the ``Shipper`` (a task on the link's loop) publishes what the stream lacks.
It never trusts a local guess of where the stream stands: on start and after every error it asks
the stream's leader for the subject's last message, checks that record is byte for byte the local
one, and ships from the next. Each publish is conditional on the subject's last message and
carries ``Nats-Msg-Id``, so across kills, server restarts and lost answers no record is stored
twice, skipped or reordered.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Final

from ..errors import ForeignMessageError, ReplicationError
from .jetstream import JetStreamLink, record_headers, subject_of
from .writelog import WriteLog

SHIP_BATCH: Final = 256
"""Records per atomic batch."""
RETRY: Final = (0.05, 2.0)
"""Back-off after an error, from the first to the longest pause (seconds)."""


class Shipper:
    """Publishes a store's committed records to its subject, behind the commits."""

    def __init__(self, link: JetStreamLink, log: WriteLog, store: str, epoch: int = 0) -> None:
        self.link, self.log, self.store, self.epoch = link, log, store, epoch
        self.subject = subject_of(link.stream, store)
        self.shipped_seq = 0
        self.expected = 0
        self.last_error: str | None = None
        self.fatal: ReplicationError | None = None
        self._task: asyncio.Future[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.run_coroutine_threadsafe(self._run(), self.link.loop)  # type: ignore[assignment]

    async def _run(self) -> None:
        pause = RETRY[0]
        while not self._stopping:
            try:
                await self._settle()
                while not self._stopping:
                    rows = self.log.raw_chunk(self.shipped_seq + 1, None, SHIP_BATCH)
                    if not rows:
                        await self.log.wait_commit(0.05)
                        continue
                    messages = [(record_headers(self.store, seq, self.epoch), bytes(data)) for seq, data in rows]
                    self.expected = await self.link.publish(self.subject, messages, self.expected)
                    self.shipped_seq = rows[-1][0]
                    self.last_error = None
                    pause = RETRY[0]
            except ForeignMessageError as error:
                self.fatal, self.last_error = error, str(error)
                return
            except ReplicationError as error:
                self.last_error = str(error)
            except Exception as error:  # the store closed under us, or a bug: say it, retry
                if self._stopping:
                    return
                self.last_error = f"{type(error).__name__}: {error}"
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY[1])

    async def _settle(self) -> None:
        last = await self.link.last(self.subject, self.store)
        if last is None:
            self.shipped_seq, self.expected = 0, 0
            return
        if last.seq > self.log.head():
            raise ForeignMessageError(
                self.link.stream, last.stream_seq,
                f"the stream holds store {self.store} up to record {last.seq}, beyond this store's head "
                f"{self.log.head()} (another writer, or a store restored from an older copy): shipping stopped",
            )
        if last.kind == "record":
            rows = self.log.raw_chunk(last.seq, last.seq, 1)
            if not rows or bytes(rows[0][1]) != last.data:
                raise ForeignMessageError(
                    self.link.stream, last.stream_seq,
                    f"record {last.seq} differs from this store's own record {last.seq} (the histories forked): shipping stopped",
                )
        self.shipped_seq, self.expected = last.seq, last.stream_seq
        # Ship under the epoch of the writer before (a replicated one fenced the subject with it):
        # a record of an older epoch after that fence is refused by every replica.
        self.epoch = max(self.epoch, last.epoch)

    def status(self) -> dict[str, Any]:
        head = self.log.head()
        lag_ms = 0.0
        if head > self.shipped_seq:
            oldest = self.log.get(self.shipped_seq + 1)
            if oldest is not None:
                lag_ms = max(0.0, time.time() * 1000 - oldest.committed_at)
        return {
            "mode": "async",
            "stream": self.link.stream,
            "subject": self.subject,
            "shippedSeq": self.shipped_seq,
            "lagRecords": max(0, head - self.shipped_seq),
            "lagMs": lag_ms,
            "lastError": self.last_error,
            "stopped": self.fatal is not None,
        }

    async def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every committed record is shipped."""

        deadline = time.monotonic() + timeout
        while self.shipped_seq < self.log.head() and self.fatal is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return self.fatal is None

    def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

