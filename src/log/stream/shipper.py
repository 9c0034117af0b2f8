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
import functools
import json
import logging
import os
import time
from typing import Final

from ...errors import ForeignMessageError, ReplicationError
from ..storedir import replace_file
from ..writelog import WriteLog
from .link import StreamLink
from .message import carried_root, record_headers, subject_of
from .status import ShipperStatus

SHIP_BATCH: Final = 256
"""Records per atomic batch."""
RETRY: Final = (0.05, 2.0)
"""Back-off after an error, from the first to the longest pause (seconds)."""
STOPPED_FILE: Final = "shipping.stopped"
"""Beside the store while its shipper has stopped for good: why (read by ``durable-log stats``
from another process); removed once records ship again."""

logger = logging.getLogger(__name__)


def stopped_reason(path: str) -> str | None:
    """Why the shipper of the store at ``path`` stopped, if it did (``STOPPED_FILE``)."""

    try:
        with open(os.path.join(path, STOPPED_FILE), encoding="utf-8") as file:
            return str(json.load(file)["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class Shipper:
    """Publishes a store's committed records to its subject, behind the commits."""

    def __init__(self, link: StreamLink, log: WriteLog, store: str, epoch: int = 0) -> None:
        self.link, self.log, self.store, self.epoch = link, log, store, epoch
        self.errors = 0
        """Shipping attempts that failed (each retried), since the store opened."""
        self.subject = subject_of(link.stream, store)
        self.shipped_seq = 0
        self.expected = 0
        self.last_error: str | None = None
        self.fatal: ReplicationError | None = None
        self._task: asyncio.Future[None] | None = None
        self._stopping = False
        self._marked = os.path.exists(os.path.join(log.env.path, STOPPED_FILE))

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
                    stuck = None
                    for index, (seq, data) in enumerate(rows):
                        reason = self.link.messages.too_big(len(data))
                        if reason is not None:  # it can never be published: waiting would not help
                            stuck, rows = (
                                _CannotShip(f"record {seq} of store {self.store}: {reason}"),
                                rows[:index],
                            )
                            break
                    if rows:
                        messages = [
                            (
                                record_headers(
                                    self.store,
                                    seq,
                                    self.epoch,
                                    carried_root(seq, functools.partial(self.log.root, seq)),
                                ),
                                bytes(data),
                            )
                            for seq, data in rows
                        ]
                        self.expected = await self.link.messages.publish(
                            self.subject, messages, self.expected
                        )
                        self.shipped_seq = rows[-1][0]
                    if stuck is not None:
                        raise stuck
                    if self.last_error is not None or self._marked:
                        self._clear_stopped()
                    self.last_error = None
                    pause = RETRY[0]
            except (ForeignMessageError, _CannotShip) as error:
                self._stop(error)
                return
            except ReplicationError as error:
                logger.warning(
                    "Shipping store %s to stream %s failed, retrying in %.2f s: %s",
                    self.store,
                    self.link.stream,
                    pause,
                    error,
                )
                self.errors += 1
                self.last_error = str(error)
            except Exception as error:  # the store closed under us, or a bug: say it, retry
                if self._stopping:
                    return
                logger.warning(
                    "Shipping store %s failed, retrying in %.2f s", self.store, pause, exc_info=True
                )
                self.errors += 1
                self.last_error = f"{type(error).__name__}: {error}"
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY[1])

    def _stop(self, error: Exception) -> None:
        """Shipping cannot go on: say so in ``status()``, at ERROR, and beside the store."""

        self.fatal = error if isinstance(error, ReplicationError) else ReplicationError(str(error))
        self.last_error = reason = f"shipping stopped: {error}"
        logger.error(
            "Shipping of store %s to stream %s stopped: %s", self.store, self.link.stream, error
        )
        path = os.path.join(self.log.env.path, STOPPED_FILE)
        try:
            record = {
                "reason": reason,
                "at": int(time.time() * 1000),
                "shippedSeq": self.shipped_seq,
            }
            replace_file(path, json.dumps(record).encode(), durable=False)
            self._marked = True
        except OSError:
            logger.exception(
                "Could not record that shipping stopped beside the store at %s", self.log.env.path
            )

    def _clear_stopped(self) -> None:
        try:
            os.unlink(os.path.join(self.log.env.path, STOPPED_FILE))
        except FileNotFoundError:
            pass
        self._marked = False

    async def _settle(self) -> None:
        last = await self.link.messages.last(self.subject, self.store)
        if last is None:
            self.shipped_seq, self.expected = 0, 0
            return
        if last.seq > self.log.head():
            raise ForeignMessageError(
                self.link.stream,
                last.stream_seq,
                f"the stream holds store {self.store} up to record {last.seq}, beyond this store's head "
                f"{self.log.head()} (another writer, or a store restored from an older copy): shipping stopped",
            )
        if last.kind == "record":
            rows = self.log.raw_chunk(last.seq, last.seq, 1)
            if not rows or bytes(rows[0][1]) != last.data:
                raise ForeignMessageError(
                    self.link.stream,
                    last.stream_seq,
                    f"record {last.seq} differs from this store's own record {last.seq} (the histories forked): shipping stopped",
                )
        self.shipped_seq, self.expected = last.seq, last.stream_seq
        # Ship under the epoch of the writer before (a replicated one fenced the subject with it):
        # a record of an older epoch after that fence is refused by every replica.
        self.epoch = max(self.epoch, last.epoch)

    def status(self) -> ShipperStatus:
        head = self.log.head()
        lag_ms = 0.0
        if head > self.shipped_seq:
            oldest = self.log.get(self.shipped_seq + 1)
            if oldest is not None:
                lag_ms = max(0.0, time.time() * 1000 - oldest.committed_at)
        return ShipperStatus(
            stream=self.link.stream,
            subject=self.subject,
            shipped_seq=self.shipped_seq,
            lag_records=max(0, head - self.shipped_seq),
            lag_ms=lag_ms,
            last_error=self.last_error,
            stopped=self.fatal is not None,
            errors=self.errors,
        )

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


class _CannotShip(Exception):
    """A record the stream can never take (over the server's ``max_payload``)."""


__all__ = [
    "RETRY",
    "SHIP_BATCH",
    "STOPPED_FILE",
    "Shipper",
    "stopped_reason",
]
