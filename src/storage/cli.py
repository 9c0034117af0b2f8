"""``durable-log``: look at, check, move and demonstrate a pi-durable-lmdb store."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ..log import LogError

from . import audit


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (LogError, FileNotFoundError, RuntimeError, ValueError) as error:
        print(f"durable-log: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="durable-log", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="run a small agent host on an embedded store, then show it")
    demo.add_argument("path", nargs="?", help="store directory (default: ./demo-store)")
    demo.set_defaults(run=lambda args: _demo(args.path))

    stats = commands.add_parser("stats", help="head sequence, record counts, sizes, versions")
    stats.add_argument("path")
    stats.add_argument("--json", action="store_true", help="one JSON object")
    stats.set_defaults(run=_stats)

    tail = commands.add_parser("tail", help="print committed batches, one line each")
    tail.add_argument("path")
    tail.add_argument("--from", dest="from_seq", type=int, help="first sequence (default: the last 10 batches, like tail)")
    tail.add_argument("--follow", "-f", action="store_true", help="keep printing new commits")
    tail.add_argument("--json", action="store_true", help="one JSON object per batch")
    tail.add_argument("--conversation", type=int, help="only writes of this conversation")
    tail.add_argument("--type", dest="types", action="append", help="only writes of this type (repeatable)")
    tail.add_argument("--limit", type=int, help="stop after this many batches")
    tail.set_defaults(run=_tail)

    verify = commands.add_parser("verify", help="check the log and re-fold it against the projections")
    verify.add_argument("path")
    verify.add_argument("--progress", action="store_true", help="progress on stderr even when not a terminal")
    verify.set_defaults(run=_verify)

    export = commands.add_parser("export", help="the log as JSON Lines")
    export.add_argument("path")
    export.add_argument("--from", dest="from_seq", type=int, default=1)
    export.add_argument("--to", dest="to_seq", type=int)
    export.set_defaults(run=_export)

    rebuild = commands.add_parser(
        "rebuild", help="fold the whole log into fresh projections beside the live ones, then swap"
    )
    rebuild.add_argument("path")
    rebuild.add_argument(
        "--projection",
        default="core",
        help="core (default), or a user projection's name: its rows are dropped and its program "
        "folds the log again on its next open",
    )
    rebuild.set_defaults(run=_rebuild)

    importer = commands.add_parser(
        "import", help="build a new store from an export, or from a pi-durable SQLite/JSONL store"
    )
    importer.add_argument("source", help="an export (.jsonl, or - for stdin), a SQLite file or a JSONL directory")
    importer.add_argument("path", help="the new store's directory (must be empty)")
    importer.add_argument(
        "--from-pi-durable", action="store_true", help="the source is a pi-durable SQLite file or JSONL directory"
    )
    importer.add_argument("--durability", choices=("power", "process"), default="power")
    importer.set_defaults(run=_import)

    return parser


def _rebuild(args: argparse.Namespace) -> int:
    from .lmdb_storage import LmdbStorage

    async def run() -> None:
        storage = await LmdbStorage.open(args.path)
        try:
            if args.projection == "core":
                head = storage.log.head()
                report = audit.Progress("rebuild", head, True)
                await storage.rebuild(report)
                print(f"{args.path}: rebuilt the core projections from {head} log records")
            else:
                storage.projections.reset_stored(args.projection)
                print(f"{args.path}: dropped projection {args.projection!r}; its program rebuilds it on open")
        finally:
            await storage.close()

    asyncio.run(run())
    return 0


def _import(args: argparse.Namespace) -> int:
    from . import migrate

    async def run() -> migrate.ImportReport:
        if args.from_pi_durable:
            source = await migrate.open_pi_durable_store(args.source)
            try:
                return await migrate.import_pi_durable(source, args.path, args.durability)
            finally:
                await source.close(None)
        if args.source == "-":
            return await migrate.import_export(sys.stdin, args.path, args.durability)
        with open(args.source, encoding="utf-8") as lines:
            return await migrate.import_export(lines, args.path, args.durability)

    print(asyncio.run(run()))
    return 0


def _demo(path: str | None) -> int:
    from . import demo

    return demo.main(path)


def _stats(args: argparse.Namespace) -> int:
    info = audit.stats(args.path)
    print(json.dumps(info) if args.json else audit.format_stats(info))
    return 0


def _tail(args: argparse.Namespace) -> int:
    types = frozenset(args.types) if args.types else None
    tail = audit.Tail(args.path, audit.TailFilter(args.conversation, types))
    try:
        first = args.from_seq if args.from_seq is not None else max(1, tail.head() - 9)
        return _run_until_signalled(_print_tail(tail, first, args))
    finally:
        tail.close()


async def _print_tail(tail: audit.Tail, first: int, args: argparse.Namespace) -> int:
    write, flush = sys.stdout.write, sys.stdout.flush
    if args.json:
        async for line in tail.json_lines(first, follow=args.follow, limit=args.limit):
            write(line + "\n")
            if args.follow:
                flush()
        return 0
    async for commit, writes in tail.commits(first, follow=args.follow, limit=args.limit):
        # readable text: lone surrogates shown as \udXXX escapes, never an encoding error
        line = audit.summarize(commit, writes).encode("utf-8", "backslashreplace").decode("utf-8")
        write(line + "\n")
        if args.follow:
            flush()
    return 0


def _run_until_signalled(work: Any) -> int:
    """Run ``work``; Ctrl-C and SIGTERM end it cleanly with status 0."""

    async def runner() -> int:
        task = asyncio.ensure_future(work)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        try:
            return await task  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            return 0

    return asyncio.run(runner())


def _verify(args: argparse.Namespace) -> int:
    difference = audit.verify(args.path, progress=args.progress or sys.stderr.isatty())
    if difference is None:
        print(f"{args.path}: the log verifies and the projections match it")
        return 0
    print(f"{args.path}: first difference: {difference}", file=sys.stderr)
    return 1


def _export(args: argparse.Namespace) -> int:
    for line in audit.export_lines(args.path, args.from_seq, args.to_seq):
        sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
