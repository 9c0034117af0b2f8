"""The overview's pictures, drawn on the server as SVG (no script, no library, nothing fetched):
commits over time as bars and the log's growth as a line.

A log of at most ``SAMPLES`` records is read whole and counted exactly; a longer one is sampled at
``SAMPLES`` evenly spaced sequences (one short read each) and the commits in a bar are what the
growth line says between its edges, exact at the samples and interpolated between them.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, Final

SAMPLES: Final = 240
BARS: Final = 48
WIDTH: Final = 560
HEIGHT: Final = 170
LEFT: Final = 56
BOTTOM: Final = 22
TOP: Final = 10


@dataclass
class Bar:
    x: float
    y: float
    width: float
    height: float
    title: str


@dataclass
class Chart:
    """What the template draws: bars, a growth line, and the labels of both axes."""

    empty: bool
    exact: bool = True
    bars: list[Bar] = field(default_factory=list)
    line: str = ""
    start: str = ""
    end: str = ""
    most: int = 0
    head: int = 0
    first: int = 0
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    base: int = HEIGHT - BOTTOM


def _label(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def samples(log: Any, until: int | None = None) -> tuple[list[tuple[int, int]], bool]:
    """``[(seq, committed at ms)]`` oldest first (up to sequence ``until``, None: the head),
    and whether every record is in it."""

    first, head = log.first(), log.head()
    if until is not None:
        head = min(head, until)
    if not first or head < first:
        return [], True
    if head - first + 1 <= SAMPLES:
        return [(commit.seq, commit.committed_at) for commit in log.read(first, head)], True
    step = (head - first) / (SAMPLES - 1)
    found = []
    for seq in sorted({first + round(index * step) for index in range(SAMPLES)}):
        commit = log.get(seq)
        if commit is not None:
            found.append((seq, commit.committed_at))
    return found, False


def draw(log: Any, until: int | None = None) -> Chart:
    """The log's pictures, up to sequence ``until`` (None: the head)."""

    points, exact = samples(log, until)
    if not points:
        return Chart(empty=True)
    first_seq = points[0][0] - 1
    times = [ms for _, ms in points]
    for index in range(1, len(times)):  # a clock that stepped back: keep the line monotonic
        times[index] = max(times[index], times[index - 1])
    start, end = times[0], max(times[-1], times[0] + 1)
    seqs = [seq for seq, _ in points]

    def committed_by(ms: float) -> float:
        """Records committed at or before ``ms``."""

        index = bisect.bisect_right(times, ms)
        if index == 0:
            return 0.0
        if exact or index == len(times):
            return float(seqs[index - 1] - first_seq)
        low_t, high_t = times[index - 1], times[index]
        low_s, high_s = seqs[index - 1], seqs[index]
        share = 0.0 if high_t == low_t else (ms - low_t) / (high_t - low_t)
        return (low_s - first_seq) + share * (high_s - low_s)

    span = end - start
    edges = [start - 1 + span * index / BARS for index in range(BARS + 1)]
    edges[-1] = end
    counts = [
        max(0.0, committed_by(edges[index + 1]) - committed_by(edges[index]))
        for index in range(BARS)
    ]
    most = max(1, round(max(counts)))
    plot_w, plot_h = WIDTH - LEFT - 8, HEIGHT - BOTTOM - TOP
    bar_w = plot_w / BARS
    bars = []
    for index, count in enumerate(counts):
        height = plot_h * count / most
        title = f"{round(count):,} commits{'' if exact else ' (about)'} from {_label(int(edges[index]) + 1)} to {_label(int(edges[index + 1]))}"
        bars.append(
            Bar(
                LEFT + index * bar_w + 0.5,
                TOP + plot_h - height,
                max(bar_w - 1, 0.5),
                height,
                title,
            )
        )
    total = seqs[-1] - first_seq
    line = " ".join(
        f"{LEFT + plot_w * (ms - start) / span:.1f},{TOP + plot_h - plot_h * (seq - first_seq) / max(total, 1):.1f}"
        for seq, ms in zip(seqs, times)
    )
    return Chart(
        False, exact, bars, line, _label(start), _label(end), most, seqs[-1], first_seq + 1
    )


__all__ = [
    "BARS",
    "BOTTOM",
    "HEIGHT",
    "LEFT",
    "SAMPLES",
    "TOP",
    "WIDTH",
    "Bar",
    "Chart",
    "draw",
    "samples",
]
