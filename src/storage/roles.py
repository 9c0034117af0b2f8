"""A store's replication role: what its link to a NATS stream, if it has one, asks of the store.

A store plays one role at a time (``ReplicationRole``): ``Standalone`` (no stream), ``Shipping``
(a ``power``/``process`` writer whose ``Shipper`` publishes behind its commits), ``Writing`` (a
``replicated`` writer: its ``StreamWriter`` publishes each group before it commits, under the
store's lease) or ``Following`` (a replica, or a replicated writer deposed by another: its
``Follower`` takes the stream in and it refuses commits). ``LmdbStorage`` asks its role at each
step where the roles differ: before a commit, after one, when it reserves ids, when a caller
waits for a record, when the lease is lost, and at close.
"""

from __future__ import annotations

from typing import Literal, Protocol

import lmdb

from ..errors import NotWriterError
from ..log import Environment, WriteLog
from ..log.stream.lease import WriterLease
from ..log.stream.link import StreamLink
from ..log.stream.position import read_position
from ..log.stream.shipper import Shipper
from ..log.stream.writer import StreamWriter
from .ids import IdMinter
from .replica import Follower, ReplicaHost

Replication = StreamWriter | Shipper | Follower | None
"""A store's link to its stream as callers see it (``LmdbStorage.replication``)."""


class ReplicationRole(Protocol):
    """What a store asks of its replication role."""

    @property
    def replication(self) -> Replication:
        """The engine of the role (``status()`` says where it stands), ``None`` without a stream."""

    def start(self) -> None:
        """Begin the role's work on the link's loop, once the store holds the role."""

    def refuse_commits(self) -> None:
        """Raise ``NotWriterError`` when the store takes no commits (and no id reservations)."""

    def check_payload(self, payload: bytes) -> None:
        """Refuse (``ValueError``) an encoded batch the stream could not carry, before it commits."""

    def after_commit(self, ids: IdMinter) -> None:
        """After a transaction committed: raise ``ids``' floor above what the role took in."""

    def publish_ids(self, txn: lmdb.Transaction[bytes], upto: int) -> None:
        """In the transaction raising the store's id reservation to ``upto``."""

    async def wait(self, seq: int, timeout: float | None) -> None:
        """Until the store holds record ``seq``, or refuse a record it can never hold."""

    def deposed(self, error: NotWriterError, host: ReplicaHost) -> ReplicationRole | None:
        """The store's lease was lost (``error``): the role it plays from now on, if it changes."""

    def stop(self) -> None:
        """At close, before the commits in flight are waited for: stop the role's task."""

    async def release(self) -> None:
        """At close, once no commit is in flight: give back what the role holds (the lease)."""


class _RoleDefaults:
    """What every role that takes commits does (the defaults of ``Standalone``)."""

    def __init__(self, host: ReplicaHost) -> None:
        self.host = host

    def start(self) -> None:
        pass

    def refuse_commits(self) -> None:
        pass

    def check_payload(self, payload: bytes) -> None:
        pass

    def after_commit(self, ids: IdMinter) -> None:
        pass

    def publish_ids(self, txn: lmdb.Transaction[bytes], upto: int) -> None:
        pass

    async def wait(self, seq: int, timeout: float | None) -> None:
        """A writer holds every record it committed: one beyond its head was never committed."""

        head = self.host.log.head()
        if head < seq:
            raise ValueError(
                f"The store at {self.host.path} has no record {seq} (its head is {head})"
            )

    def deposed(self, error: NotWriterError, host: ReplicaHost) -> ReplicationRole | None:
        return None

    def stop(self) -> None:
        pass

    async def release(self) -> None:
        pass


class Standalone(_RoleDefaults):
    """A store with no stream (or a read-only handle)."""

    @property
    def replication(self) -> Replication:
        return None


class Shipping(_RoleDefaults):
    """A ``power`` or ``process`` writer shipping its committed records behind its commits."""

    def __init__(self, host: ReplicaHost, shipper: Shipper) -> None:
        super().__init__(host)
        self.shipper = shipper

    @property
    def replication(self) -> Replication:
        return self.shipper

    def start(self) -> None:
        self.shipper.start()

    def check_payload(self, payload: bytes) -> None:
        """Acknowledged means shippable, in every mode."""

        self.shipper.link.messages.check_size(len(payload))

    def stop(self) -> None:
        self.shipper.stop()


class Writing(_RoleDefaults):
    """A ``replicated`` writer: each group is on the stream before it commits, under the lease."""

    def __init__(self, host: ReplicaHost, writer: StreamWriter, lease: WriterLease) -> None:
        super().__init__(host)
        self.writer, self.lease = writer, lease

    @classmethod
    async def acquire(
        cls,
        host: ReplicaHost,
        link: StreamLink,
        env: Environment,
        log: WriteLog,
        meta: lmdb._Database,
        take_over: bool | Literal["force"],
        lease_ttl: int,
    ) -> Writing:
        """Take the store's lease (waiting for it to expire, or at once, as ``take_over`` says)
        at an epoch above every one the stream or this store saw; the writer fences on its
        first group."""

        store = env.store_id
        assert store is not None
        writer = StreamWriter(link, env, log, store, meta)
        lease = WriterLease(link, store, env.path, lease_ttl)
        with env.read() as txn:
            seen = read_position(txn, meta, link.stream).epoch

        async def floor() -> int:  # on the link's loop, each time the lease is about to be taken
            last = await link.messages.last(writer.subject, store)
            return max(seen, 0 if last is None else last.epoch)

        epoch = await link.arun(lease.acquire(floor, bool(take_over), take_over == "force"))
        writer.lease, writer.epoch, writer.fence_pending = lease, epoch, True
        return cls(host, writer, lease)

    @property
    def replication(self) -> Replication:
        return self.writer

    def after_commit(self, ids: IdMinter) -> None:
        """A group may have taken in another writer's records: their ids are never minted."""

        ids.raise_floor(self.writer.applier.max_id)

    def publish_ids(self, txn: lmdb.Transaction[bytes], upto: int) -> None:
        """The reservation goes on the stream too, so a writer after a failover mints above it."""

        self.writer.publish_ids(txn, upto)

    def deposed(self, error: NotWriterError, host: ReplicaHost) -> ReplicationRole | None:
        """Refuse commits (the committer keeps the writer: anything still queued fails) and
        follow the stream as a replica."""

        self.writer.failure = error
        return Following(
            host,
            Follower(self.writer.link, host, self.writer.store),
            deposed_by=error,
            lease=self.lease,
        )

    async def release(self) -> None:
        await _release(self.writer.link, self.lease)


class Following(_RoleDefaults):
    """A replica: the stream's records are taken in by a ``Follower``; commits are refused."""

    def __init__(
        self,
        host: ReplicaHost,
        follower: Follower,
        deposed_by: NotWriterError | None = None,
        lease: WriterLease | None = None,
    ) -> None:
        super().__init__(host)
        self.follower, self.deposed_by, self.lease = follower, deposed_by, lease

    @property
    def replication(self) -> Replication:
        return self.follower

    def start(self) -> None:
        self.follower.start()

    def refuse_commits(self) -> None:
        if self.deposed_by is not None:
            raise self.deposed_by
        store = self.follower.store
        raise NotWriterError(
            f"The store at {self.host.path} is a replica of store {store} on stream "
            f"{self.follower.link.stream!r}: it takes no commits (commit to its writer)",
            store,
        )

    async def wait(self, seq: int, timeout: float | None) -> None:
        await self.follower.wait(seq, timeout)

    def stop(self) -> None:
        self.follower.stop()

    async def release(self) -> None:
        if self.lease is not None:  # a deposed writer's lease: released if it still holds it
            await _release(self.follower.link, self.lease)


async def _release(link: StreamLink, lease: WriterLease) -> None:
    try:
        await link.arun(lease.release())
    except Exception:
        pass  # it expires by itself


__all__ = [
    "Following",
    "Replication",
    "ReplicationRole",
    "Shipping",
    "Standalone",
    "Writing",
]
