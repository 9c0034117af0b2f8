"""What one device flush costs on this disk: the floor of a ``power`` commit.

Usage: ``python -m tools.bench.flush [--dir DIR] [--count N]``. Medians of N each, in DIR (the
system temp dir by default: use the disk the stores live on):

* overwrite 4 KiB of a preallocated, zero-filled file + ``fdatasync`` (the journal's pattern,
  ``log.journal``: one per ``power`` commit or group);
* append 4 KiB + ``fdatasync`` (a growing file: the size changes, so metadata is written too);
* 14 x 4 KiB scattered overwrites + ``fdatasync``, then 120 bytes through an ``O_DSYNC``
  descriptor (LMDB's own durable commit: two flushes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


def overwrite_flush_seconds(directory: str | None = None, count: int = 200) -> float:
    """The median time of one journal-like flush here: 4 KiB overwritten in a preallocated,
    zero-filled file, then ``fdatasync`` (the floor of one ``power`` commit)."""

    block = b"x" * 4096
    with tempfile.TemporaryDirectory(dir=directory, prefix="bench-flush-") as where:
        fd = os.open(os.path.join(where, "pre"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, bytes(4096 * count), 0)
            os.fsync(fd)
            samples = []
            for n in range(count):
                started = time.perf_counter()
                os.pwrite(fd, block, 4096 * n)
                os.fdatasync(fd)
                samples.append(time.perf_counter() - started)
        finally:
            os.close(fd)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dir", default=None)
    parser.add_argument("--count", type=int, default=300)
    args = parser.parse_args()
    block = b"x" * 4096
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-flush-") as directory:
        path = os.path.join(directory, "pre")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, bytes(4096 * (args.count + 64)), 0)
        os.fsync(fd)
        lmdb_like = []
        meta = os.open(path, os.O_WRONLY | os.O_DSYNC)
        for n in range(args.count // 3):
            started = time.perf_counter()
            for page in range(14):
                os.pwrite(fd, block, 4096 * ((n * 14 + page) % (args.count + 64)))
            os.fdatasync(fd)
            os.pwrite(meta, block[:120], 0)
            lmdb_like.append(time.perf_counter() - started)
        os.close(meta)
        os.close(fd)
        fd = os.open(
            os.path.join(directory, "append"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        append = []
        for _ in range(args.count):
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            append.append(time.perf_counter() - started)
        os.close(fd)
    overwrite = overwrite_flush_seconds(args.dir, args.count)
    print(f"overwrite 4 KiB + fdatasync (preallocated): {overwrite * 1e6:.0f} us")
    print(f"append 4 KiB + fdatasync:                   {_median_us(append):.0f} us")
    print(f"14 x 4 KiB + fdatasync + O_DSYNC 120 B:     {_median_us(lmdb_like):.0f} us")


if __name__ == "__main__":
    main()
