"""Prometheus metrics for a store: what its files say, and what an open handle counted.

Nothing here runs on the commit path. The file collector opens the store read-only (short read
transactions through `stats`) only when a registry is scraped; the handle's collector reads the
plain counters the engine keeps as it commits (`log.counters`: a few additions per commit) and
its replication status, also only when scraped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from msgspec import UNSET
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .audit.stats import Stats, stats
from .log.counters import Histogram
from .log.stream.status import ReplicaStatus, ReplicationStatus, ShipperStatus, WriterStatus

PREFIX = "pi_durable_lmdb"
"""The prefix of every metric's name."""


class StoreCollector(Collector):
    """Reads `stats(path)` on every scrape; a store that cannot be read yields `up 0`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            f"{PREFIX}_up", "1 while the store opens and reads, 0 when it does not"
        )
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


def _families(info: Stats) -> Iterator[GaugeMetricFamily]:
    head = info.head_seq
    yield _gauge("log_head_seq", "Sequence of the newest record in the write log", head)
    yield _gauge("log_records", "Records held in the write log", info.records)
    yield _gauge("store_bytes", "Bytes of the store's data file", info.file_bytes)
    yield _gauge("log_bytes", "Bytes used by the write log", info.log_bytes)
    tree = info.tree
    yield _gauge(
        "log_tree_size",
        "Records in the log's Merkle tree (its size, as a checkpoint names it)",
        tree.size,
    )
    yield _gauge(
        "log_tree_stored_leaves",
        "Records whose hashes the stored tree holds (the rest are hashed from the log when read)",
        tree.stored_leaves,
    )
    lag = GaugeMetricFamily(
        f"{PREFIX}_projection_lag_records",
        "Records of the log not yet folded by a projection",
        labels=["projection"],
    )
    core = info.projections.core.folded_seq
    lag.add_metric(["core"], head - (core or 0))
    building = GaugeMetricFamily(
        f"{PREFIX}_projection_build_lag_records",
        "Records of the log a user projection's version being built has not folded yet",
        labels=["projection", "version"],
    )
    for name, status in info.projections.user.items():
        lag.add_metric([name], head - (status.folded_seq or 0))
        build = status.building
        if build is not None:
            building.add_metric([name, str(build.version)], max(0, head - build.folded_seq))
    yield lag
    yield building
    replication = info.replication
    if replication is not UNSET:
        yield _gauge(
            "replication_stream_seq",
            "Stream sequence of the last record shipped or applied",
            replication.stream_seq,
        )
        yield _gauge(
            "lease_epoch", "Lease epoch recorded with the stream position", replication.epoch
        )


def register_path(
    path: str | os.PathLike[str], registry: CollectorRegistry | None = None
) -> StoreCollector:
    """Adds a `StoreCollector` of the store at `path` to `registry` (the global one by default):
    for a process that serves metrics of a store without holding it open."""
    collector = StoreCollector(path)
    (REGISTRY if registry is None else registry).register(collector)
    return collector


class HandleCollector(Collector):
    """An open handle's commit counters and replication status, read when scraped."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def collect(self) -> Iterator[Metric]:
        counters = self.storage.counters
        commits = CounterMetricFamily(
            f"{PREFIX}_commits", "Commits acknowledged by this handle since it opened"
        )
        commits.add_metric([], counters.commit_seconds.count)
        yield commits
        failures = CounterMetricFamily(
            f"{PREFIX}_commit_failures", "Commits that raised (refused or failed)"
        )
        failures.add_metric([], counters.commit_failures)
        yield failures
        for name, text, value in (
            (
                "direct_commits",
                "Commits made on their caller's thread (the rest took the writer thread)",
                counters.direct_commits,
            ),
            (
                "device_flushes",
                "Device flushes of a power writer: journal frames, checkpoints, segments",
                counters.device_flushes,
            ),
            ("checkpoints", "Checkpoints a power writer made durable", counters.checkpoints),
        ):
            family = CounterMetricFamily(f"{PREFIX}_{name}", text)
            family.add_metric([], value)
            yield family
        yield _histogram(
            "commit_seconds", "From a commit call to its acknowledgement", counters.commit_seconds
        )
        yield _histogram(
            "group_batches", "Batches per write transaction (group commit)", counters.group_batches
        )
        yield _histogram(
            "flush_seconds",
            "LMDB's commit of a write transaction, its sync included",
            counters.flush_seconds,
        )
        replication = self.storage.replication
        if replication is None:
            return
        status: ReplicationStatus = replication.status()
        if isinstance(status, ReplicaStatus):
            yield _gauge(
                "replica_applied_seq", "Log sequence this replica took in", status.applied_seq
            )
        else:
            yield _gauge(
                "replication_shipped_seq",
                "Log sequence the stream holds (shipped, or published)",
                status.shipped_seq,
            )
        yield _gauge(
            "replication_lag_records",
            "Records the stream and this store differ by",
            status.lag_records,
        )
        stopped = status.failed is not None if isinstance(status, WriterStatus) else status.stopped
        yield _gauge(
            "replication_stopped",
            "1 when shipping or following stopped for good",
            1 if stopped else 0,
        )
        errors = CounterMetricFamily(
            f"{PREFIX}_shipping_errors", "Shipping attempts that failed (each retried)"
        )
        errors.add_metric([], status.errors if isinstance(status, ShipperStatus) else 0)
        yield errors
        lease = status.lease if isinstance(status, WriterStatus) else None
        if lease is not None:
            yield _gauge(
                "lease_held",
                "1 while this process holds the store's writer lease",
                0 if lease.lost else 1,
            )
            yield _gauge("lease_holder_epoch", "Epoch of this process's lease", lease.epoch)


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(f"{PREFIX}_{name}", doc)
    family.add_metric([], histogram.cumulative(), histogram.sum)
    return family


def register(storage: Any, registry: CollectorRegistry | None = None) -> StoreCollector:
    """Adds the open store's collectors to `registry` (the global one by default): what its
    files say (`StoreCollector`) and what this handle counted (`HandleCollector`)."""

    collector = register_path(storage.path, registry)
    (REGISTRY if registry is None else registry).register(HandleCollector(storage))
    return collector


__all__ = [
    "PREFIX",
    "HandleCollector",
    "StoreCollector",
    "register",
    "register_path",
]
