"""`durable-log stats --watch`: rates between two reads of `stats`, every few seconds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TextIO

from msgspec import UNSET

from ..audit.stats import Stats, stats


def fold_lag(info: Stats) -> int:
    """Records of the log that the slowest projection has not folded yet."""
    head = info.head_seq
    folded = [info.projections.core.folded_seq or 0]
    folded += [status.folded_seq or 0 for status in info.projections.user.values()]
    return head - min(folded)


def rate_line(before: Stats, after: Stats, seconds: float) -> str:
    commits = (after.head_seq - before.head_seq) / seconds if seconds > 0 else 0.0
    line = f"head {after.head_seq}  {commits:.1f} commits/s  fold lag {fold_lag(after)}"
    replication = after.replication
    if replication is not UNSET:
        line += f"  replicated to seq {replication.seq} (lag {after.head_seq - replication.seq})"
    return line


def watch(
    path: str | os.PathLike[str],
    out: TextIO,
    interval: float = 2.0,
    rounds: int | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Prints one line of rates per interval, each led by its UTC time (forever unless `rounds`
    is given)."""
    before, then = stats(path), clock()
    done = 0
    while rounds is None or done < rounds:
        time.sleep(interval)
        after, now = stats(path), clock()
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp}  {rate_line(before, after, now - then)}", file=out, flush=True)
        before, then, done = after, now, done + 1
    return 0


__all__ = [
    "fold_lag",
    "rate_line",
    "watch",
]
