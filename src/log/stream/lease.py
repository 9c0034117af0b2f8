"""The writer lease: at most one process in the world writes a store that lives on a NATS stream.

The lease is one key (the store id) of the JetStream key-value bucket ``<stream>-leases``, written
with compare-and-set on its revision and a per-message TTL: the server drops it ``ttl`` seconds
after its last renewal, so a dead or cut-off holder loses it without anyone's clock but the
server's. Each lease carries an epoch that only grows (above every epoch the store's subject has
seen); the new holder's first message on the subject is a fence of that epoch, so no earlier
writer's conditional append can land after it (``log.stream.writer``). The local
``writer.lock`` keeps guarding one machine; the lease guards the cluster.

A holder renews every ``ttl / 3`` seconds and counts its lease as lost ``ttl`` seconds after it
*sent* its last successful renewal (before the server can drop it), minus a margin: a paused or
partitioned writer stops itself before another can take over.

Who holds it: ``host:pid:instance:path``, where ``instance`` is a random id created once beside
the store (``instance.id``, synced). A writer reclaims a lease without ``take_over`` (without
waiting for it to expire) only when it is provably the same holder restarted: the same instance
id, host and path, *and* the lease is not being renewed (the holder renews every ``ttl / 3``
seconds; the claimant watches one such period). Name, path and instance id alone prove nothing:
a cloned VM or a container with a fixed host name shares all three with the live writer, which
keeps renewing, so the clone gets ``NotWriterError`` instead of fencing out a live writer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from typing import Any, Final

import msgspec

from ...errors import LeaseLapsedError, NatsUnavailableError, NotWriterError, ReplicationError
from ..storedir import replace_file
from .link import StreamLink
from .message import subject_of
from .status import LeaseStatus

logger = logging.getLogger(__name__)

LEASE_FORMAT: Final = 1
DEFAULT_LEASE_TTL: Final = 5
"""Seconds a lease lives after its last renewal unless ``lease_ttl=`` says otherwise."""
MARGIN: Final = 0.25
"""The part of the TTL a holder gives up at the end, for clock rates and scheduling."""


class Lease(msgspec.Struct, forbid_unknown_fields=True):
    """The value of a store's lease key (JSON, for humans reading the bucket)."""

    format: int
    epoch: int
    holder: str
    ttl: int


_encoder: Final = msgspec.json.Encoder()
_decoder: Final = msgspec.json.Decoder(Lease)


INSTANCE_FILE: Final = "instance.id"
"""Beside the store: the random id that tells a restarted writer of this store from another."""


def instance_id(path: str) -> str:
    """The store directory's instance id, created (and synced, with its directory) the first time."""

    file = os.path.join(path, INSTANCE_FILE)
    try:
        with open(file, encoding="ascii") as handle:
            found = handle.read().strip()
        if found:
            return found
    except FileNotFoundError:
        pass
    value = secrets.token_hex(16)
    replace_file(file, (value + "\n").encode("ascii"), durable=True)
    return value


def holder_name(path: str, instance: str = "-") -> str:
    """Who holds a lease: this machine, process, store instance and directory."""

    return f"{socket.gethostname()}:{os.getpid()}:{instance}:{path}"


def _same_instance(a: str, b: str) -> bool:
    """Two holders of one store instance on one host name and path: the same writer restarted,
    or a clone of it (``acquire`` tells them apart by whether the lease is being renewed)."""

    parts_a, parts_b = a.split(":", 3), b.split(":", 3)
    return (
        len(parts_a) == len(parts_b) == 4
        and parts_a[2] != "-"
        and (parts_a[0], parts_a[2], parts_a[3]) == (parts_b[0], parts_b[2], parts_b[3])
    )


class WriterLease:
    """One store's lease, held (or sought) by this process. Coroutines run on the link's loop."""

    def __init__(
        self, link: StreamLink, store: str, path: str, ttl: int = DEFAULT_LEASE_TTL
    ) -> None:
        if type(ttl) is not int or not 1 <= ttl <= 3600:
            raise ValueError(f"lease_ttl must be whole seconds from 1 to 3600, not {ttl!r}")
        self.link, self.store, self.ttl = link, store, ttl
        self.bucket = f"{link.stream}-leases"
        self.holder = holder_name(path, instance_id(path) if path else "-")
        self.epoch = 0
        self.revision = 0
        self.valid_until = 0.0
        """``self.link.keys.clock()`` after which this process no longer counts on its lease."""
        self.lost: NotWriterError | None = None
        self.on_lost: Any = None
        """Called (on the link's loop) with the ``NotWriterError`` once the lease is lost."""
        self._renewer: asyncio.Task[None] | None = None

    # ── taking and keeping ─────────────────────────────────────────────────

    async def current(self) -> tuple[Lease | None, int]:
        """The lease as the bucket holds it now, and the key's revision (0: no lease)."""

        value, revision = await self.link.keys.lease_get(self.store)
        if value is None:
            return None, revision
        try:
            return _decoder.decode(value), revision
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise ReplicationError(
                f"The lease of store {self.store} in bucket {self.bucket} is unreadable ({error})"
            ) from None

    async def acquire(self, least_epoch: Any, take_over: bool, force: bool = False) -> int:
        """Take the lease with an epoch above ``least_epoch`` and every earlier lease's; returns it.

        Held by another: without ``take_over``, ``NotWriterError`` at once; with it, wait until
        that lease expires (``force``: take it now; the fence then deposes the old holder)."""

        deadline: float | None = None
        conflicts = 0
        highest = 0  # the highest epoch of every lease seen while waiting
        while True:
            lease, revision = await self._answered(self.current)
            mine = lease is not None and (
                lease.holder == self.holder
                or (
                    _same_instance(lease.holder, self.holder)
                    and not force
                    and not await self._renewed(revision, lease.ttl)
                )
            )
            if lease is not None:
                highest = max(highest, lease.epoch)
            if lease is None or mine or force:
                # the floor as it is now: writers may have come and gone while this one waited
                floor: int = await least_epoch() if callable(least_epoch) else least_epoch
                epoch = max(floor, highest) + 1
                sent = self.link.keys.clock()
                try:
                    self.revision = await self._answered(
                        self._put, Lease(LEASE_FORMAT, epoch, self.holder, self.ttl), revision
                    )
                except _Conflict:
                    conflicts += 1
                    if conflicts > 50:
                        raise ReplicationError(
                            f"The lease of store {self.store} kept changing under this writer"
                        ) from None
                    continue  # someone else moved first: look again
                self.epoch, self.valid_until, self.lost = (
                    epoch,
                    sent + self.ttl * (1 - MARGIN),
                    None,
                )
                logger.info(
                    "took the lease of store %s: epoch %d, holder %s",
                    self.store,
                    epoch,
                    self.holder,
                )
                return epoch
            if not take_over:
                raise NotWriterError(
                    f"Store {self.store} is written by {lease.holder} (lease epoch {lease.epoch}, "
                    f"time to live {lease.ttl} s); open with take_over=True to take over once it expires",
                    self.store,
                    lease.epoch,
                )
            if deadline is None:
                deadline = self.link.keys.clock() + lease.ttl * 2 + 2
            elif self.link.keys.clock() > deadline:
                raise NotWriterError(
                    f"Store {self.store} is still written by {lease.holder} (epoch {lease.epoch}), which keeps "
                    "renewing its lease; stop it, or take over with force",
                    self.store,
                    lease.epoch,
                )
            await asyncio.sleep(0.05)

    async def _renewed(self, revision: int, ttl: int) -> bool:
        """Whether the lease at ``revision`` is renewed (or replaced) within one renewal period
        of its holder (``ttl / 3``) and some slack: a live holder always is, a dead one never. A
        lease that expires meanwhile was not renewed: it is gone, not rewritten."""

        deadline = self.link.keys.clock() + ttl / 3 + 0.5
        while self.link.keys.clock() < deadline:
            await asyncio.sleep(0.1)
            lease, now = await self._answered(self.current)
            if now != revision:
                return lease is not None
        return False

    async def _answered(self, request: Any, *args: Any) -> Any:
        """``await request(*args)``, asked again while NATS does not answer, for up to the link's
        timeout: a bucket just made (or a stream electing a leader) has no responder yet. A
        retried CAS is safe: if the first went through, the second conflicts and is looked at."""

        deadline = self.link.keys.clock() + self.link.timeout
        while True:
            try:
                return await request(*args)
            except NatsUnavailableError:
                if self.link.keys.clock() >= deadline:
                    raise
                await asyncio.sleep(0.1)

    async def _put(self, lease: Lease, revision: int) -> int:
        revision_now = await self.link.keys.lease_put(
            self.store, _encoder.encode(lease), revision, float(lease.ttl)
        )
        if revision_now is None:
            raise _Conflict()
        return revision_now

    def start_renewing(self) -> None:
        """From any thread: renew every ``ttl / 3`` seconds on the link's loop."""

        def start() -> None:
            self._renewer = self.link.loop.create_task(self._renew())

        self.link.loop.call_soon_threadsafe(start)

    async def _renew(self) -> None:
        """Renew until the lease is lost for good. A lease that lapsed (NATS unreachable, the
        process paused) is taken again, with a new epoch, if nobody else took it meanwhile."""

        while self.lost is None:
            await asyncio.sleep(self.ttl / 3 if self.link.keys.clock() < self.valid_until else 0.1)
            sent = self.link.keys.clock()
            try:
                if sent < self.valid_until:
                    self.revision = await self._put(
                        Lease(LEASE_FORMAT, self.epoch, self.holder, self.ttl), self.revision
                    )
                    self.valid_until = sent + self.ttl * (1 - MARGIN)
                    continue
                await self._regain()
            except _Conflict:
                await self._regain()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # unreachable, or anything else: keep trying while not lost
                self.link.last_error = (
                    f"lease of store {self.store}: {type(error).__name__}: {error}"
                )

    async def _regain(self) -> None:
        """The lease lapsed or its revision is gone: take it again unless another holds it."""

        try:
            lease, _ = await self.current()
        except ReplicationError as error:
            self.link.last_error = str(error)
            return
        if lease is not None and lease.holder != self.holder:
            self._lose(
                f"Store {self.store} was taken over by {lease.holder} (epoch {lease.epoch}); "
                f"this writer (epoch {self.epoch}) takes no more commits",
                lease.epoch,
            )
            return
        try:  # a writer that fenced the subject meanwhile (and let its lease go) deposed this one
            last = await self.link.messages.last(
                subject_of(self.link.stream, self.store), self.store
            )
        except ReplicationError as error:
            self.link.last_error = str(error)
            return
        if last is not None and last.epoch > self.epoch:
            self._lose(
                f"Store {self.store} was taken over: its stream holds writer epoch {last.epoch}; "
                f"this writer (epoch {self.epoch}) takes no more commits",
                last.epoch,
            )
            return
        previous = self.epoch
        try:
            epoch = await self.acquire(self.epoch, take_over=False)
        except NotWriterError as error:
            self.depose(error)
            return
        except ReplicationError as error:
            self.link.last_error = str(error)
            return
        logger.warning(
            "lease of store %s lapsed and was taken again: epoch %d (was %d)",
            self.store,
            epoch,
            previous,
        )

    async def _current_or_none(self) -> tuple[Lease | None, int]:
        try:
            return await self.current()
        except ReplicationError:
            return None, 0

    def _lose(self, message: str, epoch: int | None) -> None:
        self.depose(NotWriterError(message, self.store, epoch))

    def depose(self, error: NotWriterError) -> None:
        """This process no longer writes the store (the lease, or the stream, says another does)."""

        if self.lost is not None:
            return
        logger.warning(
            "no longer the writer of store %s (epoch %d): %s", self.store, self.epoch, error
        )
        self.lost = error
        self.valid_until = 0.0
        if self.on_lost is not None:
            self.link.loop.call_soon_threadsafe(self.on_lost, self.lost)

    def check(self) -> None:
        """Refuse to publish unless the lease is surely still this process's."""

        if self.lost is not None:
            raise self.lost
        if self.link.keys.clock() > self.valid_until:
            raise LeaseLapsedError(
                f"The lease of store {self.store} (epoch {self.epoch}) lapsed before it was renewed "
                "(NATS unreachable, or this process paused): nothing was committed; this writer "
                "commits again only once it holds the lease again",
                self.store,
                self.epoch,
            )

    async def release(self) -> None:
        """Give the lease up (a clean close), so the next writer need not wait for it to expire."""

        if self._renewer is not None:
            self._renewer.cancel()
            try:
                await self._renewer
            except (asyncio.CancelledError, Exception):
                pass
        if self.lost is not None or not self.revision:
            return
        try:
            await self.link.keys.lease_delete(self.store, self.revision)
        except ReplicationError:
            pass  # it expires by itself
        self.lost = NotWriterError(f"Store {self.store}'s writer closed", self.store, self.epoch)

    def status(self) -> LeaseStatus:
        return LeaseStatus(
            holder=self.holder,
            epoch=self.epoch,
            ttl=self.ttl,
            expires_in=max(0.0, self.valid_until - self.link.keys.clock())
            if self.lost is None
            else 0.0,
            lost=None if self.lost is None else str(self.lost),
        )


class _Conflict(Exception):
    """The key's revision was not the one expected."""


__all__ = [
    "DEFAULT_LEASE_TTL",
    "INSTANCE_FILE",
    "LEASE_FORMAT",
    "MARGIN",
    "Lease",
    "WriterLease",
    "holder_name",
    "instance_id",
]
