"""What the engine counts as it commits, for a host's metrics (``pi_durable_lmdb.metrics``).

Counting must cost nothing a commit would notice: plain integers and fixed-bucket histograms
(a ``bisect`` and two additions per observation, no lock, no allocation), kept in memory by the
open handle and read by a Prometheus collector only when it is scraped. Each histogram is
written by one thread (the writer thread, or the callers' loop), so no increment is lost.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Final

SECONDS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Bucket bounds for durations, from 100 µs (a commit in ``process`` mode) to 10 s (a stalled stream)."""
SIZES: Final = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
"""Bucket bounds for the batches of one transaction (a group holds at most 64)."""


class Histogram:
    """Observations counted per bucket (``counts[i]``: at most ``bounds[i]``; the last: above all)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus exposes a histogram, ``+Inf`` last."""

        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return out


class EngineCounters:
    """One open store's counters since it opened."""

    def __init__(self) -> None:
        self.commit_seconds = Histogram(SECONDS)
        """From a caller's ``commit`` to its acknowledgement (the callers' loop)."""
        self.commit_failures = 0
        """Commits that raised (refused by the checks, by the stream, or failed)."""
        self.group_batches = Histogram(SIZES)
        """Batches per write transaction (the writer thread)."""
        self.flush_seconds = Histogram(SECONDS)
        """LMDB's commit of a write transaction, its sync included (the writer thread)."""


__all__ = [
    "SECONDS",
    "SIZES",
    "EngineCounters",
    "Histogram",
]
