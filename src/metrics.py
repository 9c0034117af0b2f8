"""Prometheus metrics for a store, read from its files at scrape time.

Nothing here runs on the commit path: the collector opens the store read-only (short read
transactions through `audit.stats`) only when a registry is scraped, so a writer pays nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .storage.audit import stats

PREFIX = "pi_durable_lmdb"


class StoreCollector(Collector):
    """Reads `stats(path)` on every scrape; a store that cannot be read yields `up 0`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(f"{PREFIX}_up", "1 while the store opens and reads, 0 when it does not")
        try:
            info = stats(self.path)
        except Exception:  # a damaged or missing store is what `up` reports
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from _families(info)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


def _families(info: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
    head = int(info["headSeq"])
    yield _gauge("log_head_seq", "Sequence of the newest record in the write log", head)
    yield _gauge("log_records", "Records held in the write log", int(info["records"]))
    yield _gauge("store_bytes", "Bytes of the store's data file", int(info["fileBytes"]))
    yield _gauge("log_bytes", "Bytes used by the write log", int(info["logBytes"]))
    lag = GaugeMetricFamily(
        f"{PREFIX}_projection_lag_records", "Records of the log not yet folded by a projection", labels=["projection"]
    )
    core = info["projections"]["core"]["foldedSeq"]
    lag.add_metric(["core"], head - int(core or 0))
    for name, status in info["projections"]["user"].items():
        lag.add_metric([name], head - int(status["foldedSeq"] or 0))
    yield lag
    replication = info.get("replication")
    if replication is not None:
        yield _gauge(
            "replication_stream_seq", "Stream sequence of the last record shipped or applied", replication["streamSeq"]
        )
        yield _gauge("lease_epoch", "Lease epoch recorded with the stream position", replication["epoch"])


def register_path(path: str | os.PathLike[str], registry: CollectorRegistry | None = None) -> StoreCollector:
    collector = StoreCollector(path)
    (REGISTRY if registry is None else registry).register(collector)
    return collector


def register(storage: Any, registry: CollectorRegistry | None = None) -> StoreCollector:
    """Adds the open store's collector (read from its files) to `registry`, the global one by default."""
    return register_path(storage.path, registry)
