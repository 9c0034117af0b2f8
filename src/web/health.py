"""``/healthz`` and ``/metrics``: read from the store's files (``stats``, the metrics collector),
and, given ``--nats URL --stream S``, from the stream that carries the store's log."""

from __future__ import annotations

import asyncio
from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..audit.stats import LeaseHolder, lease_of, stats
from ..audit.tail import open_stream
from ..metrics import PREFIX, register_path

DEFAULT_MAX_LAG: Final = 1000
"""Records a store may be behind its stream before ``/healthz`` calls it stale."""


async def stream_head(nats: str, stream: str, store: str | None) -> int | None:
    """The log sequence of the store's last record on its stream (None: the stream holds none)."""

    from ..log.stream.message import subject_of

    if store is None:
        return None
    link = await open_stream(nats, stream)
    try:
        message = await link.arun(link.messages.last(subject_of(stream, store), store))
        return None if message is None else message.seq
    finally:
        await asyncio.to_thread(link.close)


class StreamLag(msgspec.Struct, frozen=True, rename="camel"):
    """The store's last record on its stream, and how many records the store lacks."""

    head_seq: int | None
    lag_records: int


class Health(msgspec.Struct, frozen=True, rename="camel"):
    """The body of ``/healthz``: ``status`` (``ok``, ``stale``, ``unavailable``) and what backs
    it; a field left ``UNSET`` is not written."""

    status: str
    head_seq: int | UnsetType = UNSET
    store_id: str | UnsetType | None = UNSET
    warnings: list[str] | UnsetType = UNSET
    stream: StreamLag | UnsetType = UNSET
    reason: str | UnsetType = UNSET


async def health(path: str, options: dict[str, Any]) -> tuple[bool, Health]:
    """``(healthy, body)``: healthy while the store opens and reads and (with a stream) is no more
    than ``max_lag`` records behind it; the body says why not, and what else is wrong."""

    try:
        info = await asyncio.to_thread(stats, path)
    except Exception as error:  # damaged, missing, unreadable: what /healthz is for
        return False, Health(status="unavailable", reason=f"{type(error).__name__}: {error}")
    head = info.head_seq
    warnings = [
        f"projection {name} stopped at sequence {user.failed_seq}: {user.error}"
        for name, user in info.projections.user.items()
        if user.error is not None
    ]
    if info.shipping is not UNSET:
        warnings.append(f"shipping stopped: {info.shipping.reason}")
    body = Health(status="ok", head_seq=head, store_id=info.store_id, warnings=warnings or UNSET)
    if options.get("nats") is None:
        return True, body
    try:
        last = await stream_head(options["nats"], options["stream"], info.store_id)
    except Exception as error:
        reason = f"stream {options['stream']!r} cannot be read: {type(error).__name__}: {error}"
        return False, msgspec.structs.replace(body, status="unavailable", reason=reason)
    lag = 0 if last is None else max(0, last - head)
    body = msgspec.structs.replace(body, stream=StreamLag(head_seq=last, lag_records=lag))
    max_lag = DEFAULT_MAX_LAG if options.get("max_lag") is None else int(options["max_lag"])
    if lag > max_lag:
        reason = (
            f"the store is {lag} records behind stream {options['stream']!r} (more than {max_lag})"
        )
        return False, msgspec.structs.replace(body, status="stale", reason=reason)
    return True, body


def metrics_text(path: str, options: dict[str, Any] | None = None) -> bytes:
    """The store's metrics as Prometheus reads them (a fresh registry: only this store's)."""

    registry = CollectorRegistry()
    register_path(path, registry)
    if options and options.get("nats") is not None:
        registry.register(_StreamCollector(path, options["nats"], options["stream"]))
    return generate_latest(registry)


class _StreamCollector:
    """The stream's side, read at scrape time: its head for the store, the lag, the lease."""

    def __init__(self, path: str, nats: str, stream: str) -> None:
        self.path, self.nats, self.stream = path, nats, stream

    def collect(self) -> Any:
        up = GaugeMetricFamily(
            f"{PREFIX}_stream_up", "1 while the stream that carries the log answers"
        )
        try:
            info = stats(self.path)
            store = info.store_id
            last, lease = asyncio.run(self._read(store))
        except Exception:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        head = info.head_seq
        yield GaugeMetricFamily(
            f"{PREFIX}_stream_head_seq",
            "Log sequence of the store's last record on the stream",
            value=last or 0,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_replication_lag_records",
            "Records on the stream the store does not hold yet",
            value=max(0, (last or 0) - head),
        )
        if lease is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_stream_lease_epoch",
                "Epoch of the store's writer lease on the stream",
                value=lease.epoch,
            )

    async def _read(self, store: str | None) -> tuple[int | None, LeaseHolder | None]:
        return await stream_head(self.nats, self.stream, store), await lease_of(
            self.nats, self.stream, store
        )


__all__ = [
    "DEFAULT_MAX_LAG",
    "Health",
    "StreamLag",
    "health",
    "metrics_text",
    "stream_head",
]
