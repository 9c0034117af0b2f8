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
        self.direct_commits = 0
        """Batches committed on their caller's thread (the committer's direct path); the rest of
        ``group_batches``'s count went through the writer thread. A ``power`` store whose share
        here falls is paying two thread hand-offs per commit (``storage.committer``)."""
        self.journal_flushes = 0
        """Device flushes of journal frames (one per write transaction with log records, one
        more per frame unmade): the flush a ``power`` commit waits for."""
        self.checkpoints = 0
        """Checkpoints made durable (``log.journaled``): two device flushes each, off the commit
        path (``data.mdb``, then the checkpoint record)."""
        self.segment_flushes = 0
        """Device flushes of journal segments being made or grown (a segment's ``fsync`` and its
        directory's); ``segments_ahead`` of the segments were made off the commit path."""
        self.segments_ahead = 0
        """Journal segments made ready on the checkpoint thread before the commit that needs them
        (``Journal.prepare``)."""
        self.map_growths = 0
        """Times this handle grew LMDB's map (a write found it full, or a mapped writer grew it
        ahead): each waits for every transaction of the process to end, and one a write found
        full runs that write again."""
        self.segment_switches = 0
        """Times the journal moved on to its next segment, on the commit path: a switch to a
        segment made ahead, or one made then (its flushes in ``segment_flushes``)."""

    @property
    def device_flushes(self) -> int:
        """Every device flush the ``power`` engine made: frames, checkpoints, segments."""

        return self.journal_flushes + 2 * self.checkpoints + self.segment_flushes


__all__ = [
    "SECONDS",
    "SIZES",
    "EngineCounters",
    "Histogram",
]
