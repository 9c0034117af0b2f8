"""``snapshot``: publish a compacted, checksummed copy of a store to its stream's snapshot bucket,
so that a restore or a new replica replays only the log after it; keep and trim by policy."""

from __future__ import annotations

import argparse
import asyncio
import time

from ..audit.stats import require_store
from ..audit.words import format_bytes
from .common import EXIT_OK, add_command, count, interval, run_until_signalled, usage


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "snapshot",
        "publish a snapshot of a store to its NATS stream's snapshot bucket",
        "Publish LMDB's compacting copy of the store at PATH (a writer or a replica, live or not), "
        "zstd-compressed and checksummed, with the stream position it holds, to the object store "
        "S-snapshots beside stream S. `durable-log restore` and a new replica then start from the "
        "newest snapshot that verifies and take in only the log after it. Nothing is ever removed "
        "unless asked: --keep N drops all but the store's N newest snapshots, and --trim then removes "
        "the store's messages on S older than the oldest snapshot kept (a replica further behind, or a "
        "restore to an earlier point, then needs a snapshot).",
        example="durable-log snapshot demo-store --nats nats://127.0.0.1:4222 --stream LOGS",
    )
    sub.add_argument("path", metavar="PATH", help="the store's directory")
    sub.add_argument(
        "--nats",
        required=True,
        metavar="URL",
        help="a NATS server URL, or several, comma-separated",
    )
    sub.add_argument(
        "--stream",
        required=True,
        metavar="S",
        help="the JetStream stream that carries the store's log",
    )
    sub.add_argument(
        "--keep",
        type=count,
        metavar="N",
        help="keep only the store's N newest snapshots (default: all)",
    )
    sub.add_argument(
        "--trim",
        action="store_true",
        help="with --keep: remove the log older than the oldest snapshot kept",
    )
    sub.add_argument(
        "--every",
        type=interval,
        metavar="SECONDS",
        help="publish one every SECONDS until stopped (default: once)",
    )
    sub.set_defaults(run=_snapshot)


def _snapshot(args: argparse.Namespace) -> int:
    if args.keep is not None and args.keep < 1:
        raise usage("--keep takes 1 or more: the newest snapshot is always kept")
    if args.trim and args.keep is None:
        raise usage("--trim removes the log older than the oldest snapshot kept: give --keep N too")
    require_store(args.path)
    if args.every is None:
        return int(asyncio.run(_publish(args, once=True)))
    return int(run_until_signalled(_publish(args, once=False)))


async def _publish(args: argparse.Namespace, once: bool) -> int:
    from ..audit.tail import open_stream
    from ..storage.snapshot import take_snapshot

    link = await open_stream(args.nats, args.stream)
    try:
        while True:
            started = time.monotonic()
            report = await take_snapshot(args.path, link, keep=args.keep, trim=args.trim)
            print(
                f"{args.path}: snapshot {report.name}: store {report.store} up to record {report.seq} "
                f"(message {report.stream_seq}), {format_bytes(report.size)} as {format_bytes(report.stored)}, "
                f"in {report.seconds:.1f} s"
                + (f"; deleted {len(report.deleted)} older" if report.deleted else "")
                + (
                    f"; trimmed the log below message {report.trimmed_below}"
                    if report.trimmed_below
                    else ""
                ),
                flush=True,
            )
            if once:
                return EXIT_OK
            await asyncio.sleep(max(0.0, args.every - (time.monotonic() - started)))
    finally:
        await asyncio.to_thread(link.close)


__all__ = [
    "register",
]
