"""``/healthz`` and ``/metrics``: read from the store's files (``stats``, the metrics collector),
and, given ``--nats URL --stream S``, from the stream that carries the store's log."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..metrics import PREFIX, register_path
from ..audit.stats import lease_of, stats
from ..audit.tail import open_stream

DEFAULT_MAX_LAG: Final = 1000
"""Records a store may be behind its stream before ``/healthz`` calls it stale."""


async def stream_head(nats: str, stream: str, store: str | None) -> int | None:
    """The log sequence of the store's last record on its stream (None: the stream holds none)."""

    from ..log.stream.message import subject_of

    if store is None:
        return None
    link = await open_stream(nats, stream)
    try:
        message = await link.arun(link.last(subject_of(stream, store), store))
        return None if message is None else message.seq
    finally:
        await asyncio.to_thread(link.close)


async def health(path: str, options: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """``(healthy, body)``: healthy while the store opens and reads and (with a stream) is no more
    than ``max_lag`` records behind it; the body says why not, and what else is wrong."""

    try:
        info = await asyncio.to_thread(stats, path)
    except Exception as error:  # damaged, missing, unreadable: what /healthz is for
        return False, {"status": "unavailable", "reason": f"{type(error).__name__}: {error}"}
    head = int(info["headSeq"])
    body: dict[str, Any] = {"status": "ok", "headSeq": head, "storeId": info["storeId"]}
    warnings = [
        f"projection {name} stopped at sequence {user['failedSeq']}: {user['error']}"
        for name, user in info["projections"]["user"].items()
        if user["error"] is not None
    ]
    if "shipping" in info:
        warnings.append(f"shipping stopped: {info['shipping']['reason']}")
    if warnings:
        body["warnings"] = warnings
    if options.get("nats") is None:
        return True, body
    try:
        last = await stream_head(options["nats"], options["stream"], info["storeId"])
    except Exception as error:
        body.update(status="unavailable", reason=f"stream {options['stream']!r} cannot be read: {type(error).__name__}: {error}")
        return False, body
    lag = 0 if last is None else max(0, last - head)
    body["stream"] = {"headSeq": last, "lagRecords": lag}
    max_lag = DEFAULT_MAX_LAG if options.get("max_lag") is None else int(options["max_lag"])
    if lag > max_lag:
        body.update(status="stale", reason=f"the store is {lag} records behind stream {options['stream']!r} (more than {max_lag})")
        return False, body
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
        up = GaugeMetricFamily(f"{PREFIX}_stream_up", "1 while the stream that carries the log answers")
        try:
            info = stats(self.path)
            store = info["storeId"]
            last, lease = asyncio.run(self._read(store))
        except Exception:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        head = int(info["headSeq"])
        yield GaugeMetricFamily(f"{PREFIX}_stream_head_seq", "Log sequence of the store's last record on the stream", value=last or 0)
        yield GaugeMetricFamily(
            f"{PREFIX}_replication_lag_records", "Records on the stream the store does not hold yet", value=max(0, (last or 0) - head)
        )
        if lease is not None:
            yield GaugeMetricFamily(f"{PREFIX}_stream_lease_epoch", "Epoch of the store's writer lease on the stream", value=lease["epoch"])

    async def _read(self, store: str | None) -> tuple[int | None, dict[str, Any] | None]:
        return await stream_head(self.nats, self.stream, store), await lease_of(self.nats, self.stream, store)
