"""`durable-log stats --watch`: rates between two reads of `stats`, every few seconds."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TextIO

from ..audit.stats import stats


def fold_lag(info: dict[str, Any]) -> int:
    """Records of the log that the slowest projection has not folded yet."""
    head = int(info["headSeq"])
    folded = [info["projections"]["core"]["foldedSeq"] or 0]
    folded += [status["foldedSeq"] or 0 for status in info["projections"]["user"].values()]
    return head - min(int(seq) for seq in folded)


def rate_line(before: dict[str, Any], after: dict[str, Any], seconds: float) -> str:
    commits = (int(after["headSeq"]) - int(before["headSeq"])) / seconds if seconds > 0 else 0.0
    line = f"head {after['headSeq']}  {commits:.1f} commits/s  fold lag {fold_lag(after)}"
    replication = after.get("replication")
    if replication is not None:
        line += f"  replicated to seq {replication['seq']} (lag {int(after['headSeq']) - int(replication['seq'])})"
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
