"""What ``storage.replication.status()`` reports, one Struct per way a store meets its stream:
an async shipper, a replicated writer (with its lease), a replica. Plain values read from the
running handle, never stored; each field is named in camelCase by ``msgspec.to_builtins`` and
``msgspec.json.encode`` (``shippedSeq``, ``lagRecords``, ...)."""

from __future__ import annotations

from typing import Literal

import msgspec


class LeaseStatus(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """This process's writer lease: who holds it, its epoch and TTL (seconds), the seconds left
    before it lapses (0 once lost), and why it was lost."""

    holder: str
    epoch: int
    ttl: int
    expires_in: float
    lost: str | None


class _Status(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What every mode reports first: the mode, and the stream and subject the store is on."""

    mode: str
    stream: str
    subject: str


class _Shipped(_Status, frozen=True, kw_only=True):
    """A writer's side: the log sequence the stream holds and how far the store's commits are
    ahead of it (records, and milliseconds since the oldest one not shipped), the last error."""

    shipped_seq: int
    lag_records: int
    lag_ms: float
    last_error: str | None


class ShipperStatus(_Shipped, frozen=True, kw_only=True):
    """An async shipper (``durability="power"`` or ``"process"`` with a stream); ``stopped``
    once a record can never be shipped, ``errors``: shipping attempts that failed (each retried)."""

    mode: Literal["async"] = "async"
    stopped: bool
    errors: int


class WriterStatus(_Shipped, frozen=True, kw_only=True):
    """A replicated writer: every acknowledged commit is on the stream (no lag); its epoch, its
    lease (``None`` without one) and ``failed``: why it stopped writing, if it did."""

    mode: Literal["replicated"] = "replicated"
    epoch: int
    lease: LeaseStatus | None
    failed: str | None


class ReplicaStatus(_Status, frozen=True, kw_only=True):
    """A replica following the stream: the log sequence and stream message it applied, the
    records still to take in, the last error, ``stopped`` once it stopped for good, and the
    write transactions it has made."""

    mode: Literal["replica"] = "replica"
    applied_seq: int
    stream_seq: int
    lag_records: int
    lag_ms: float
    last_error: str | None
    stopped: bool
    transactions: int


ReplicationStatus = ShipperStatus | WriterStatus | ReplicaStatus
"""What ``storage.replication.status()`` returns, by the handle's mode."""


__all__ = [
    "LeaseStatus",
    "ReplicaStatus",
    "ReplicationStatus",
    "ShipperStatus",
    "WriterStatus",
]
