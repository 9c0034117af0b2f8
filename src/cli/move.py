"""Moving a store's data: ``export`` (the log as JSON Lines), ``import`` (a new store from an
export or a pi-durable store), ``backup`` (a consistent copy) and ``restore`` (a store from its
NATS stream alone). Nothing here writes into an existing store: new stores are built beside their
target and renamed into place."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterable, Iterator

from ..audit.export import export_lines
from ..audit.words import format_bytes, plural
from ..log.environment import check_store_id
from ..storage.backup import backup
from .common import (
    EXIT_OK,
    READ_ONLY,
    Progress,
    add_command,
    nats_options,
    progress_on,
    progress_option,
    restore_point,
    seq_or_time,
    sequence,
    store_argument,
    time_argument,
    usage,
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_export(commands)
    _register_import(commands)
    _register_backup(commands)
    _register_restore(commands)


# ── export ────────────────────────────────────────────────────────────────────


def _register_export(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "export",
        "the log as JSON Lines",
        'The log as JSON Lines, {"seq", "committedAt", "writes"} per line, lossless: durable-log import '
        f"rebuilds the same store from it; {READ_ONLY}.",
        example="durable-log export demo-store > log.jsonl",
    )
    store_argument(sub)
    sub.add_argument(
        "--from",
        dest="from_seq",
        type=sequence,
        metavar="SEQ",
        help="first log sequence (default 1)",
    )
    sub.add_argument(
        "--to",
        dest="to_seq",
        type=sequence,
        metavar="SEQ",
        help="last log sequence (default: the head)",
    )
    sub.add_argument(
        "--seq",
        type=sequence,
        metavar="SEQ",
        help="only record SEQ: the one line verify-proof --record reads (--from SEQ --to SEQ)",
    )
    sub.add_argument(
        "--since",
        type=time_argument,
        metavar="TIME",
        help="from the first batch committed at or after TIME",
    )
    sub.add_argument(
        "--until",
        type=time_argument,
        metavar="TIME",
        help="to the last batch committed at or before TIME",
    )
    sub.add_argument(
        "--root",
        action="store_true",
        help='end with a line {"treeSize", "rootHash"}: the Merkle root of the records exported, which import checks (from sequence 1)',
    )
    progress_option(sub)
    sub.set_defaults(run=_export)


def _export(args: argparse.Namespace) -> int:
    if args.seq is not None:
        if args.from_seq is not None or args.to_seq is not None or args.root:
            raise usage("--seq is the range of one record: not with --from, --to or --root")
        args.from_seq = args.to_seq = args.seq
    if args.from_seq is not None and args.to_seq is not None and args.from_seq > args.to_seq:
        raise usage(f"--from {args.from_seq} is after --to {args.to_seq}: an empty range")
    if args.since is not None and args.until is not None and args.since > args.until:
        raise usage("--since is after --until: an empty range")
    if args.from_seq is not None:
        from ..audit.tail import Tail
        from .inspect import past_head

        tail = Tail(args.path)
        try:
            past_head(tail.head(), args.from_seq)
        finally:
            tail.close()
    report = Progress("export", None, progress_on(args), unit="commits")
    done = 0
    for line in export_lines(
        args.path,
        args.from_seq or 1,
        args.to_seq,
        since=args.since,
        until=args.until,
        root=args.root,
    ):
        sys.stdout.write(line + "\n")
        done += 1
        report(done)
    report.finish(done)
    return EXIT_OK


# ── import ────────────────────────────────────────────────────────────────────


def _register_import(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "import",
        "build a new store from an export, or from a pi-durable SQLite/JSONL store",
        "Build a new store from an export (every batch replayed through the normal commit path) or, "
        "with --from-pi-durable, from a pi-durable SQLite file or JSONL directory. The store is built "
        "in a temporary directory, synced once and renamed to NEWPATH at the end: a failed import "
        "leaves nothing behind.",
        example="durable-log import log.jsonl restored-store",
    )
    sub.add_argument(
        "source",
        metavar="SOURCE",
        help="an export (a .jsonl file, or - for stdin), or with --from-pi-durable a SQLite file or JSONL directory",
    )
    sub.add_argument(
        "path", metavar="NEWPATH", help="the new store's directory (must not exist, or be empty)"
    )
    sub.add_argument(
        "--from-pi-durable",
        action="store_true",
        help="SOURCE is a pi-durable SQLite file or JSONL directory",
    )
    sub.add_argument(
        "--renumber",
        action="store_true",
        help="import an export whose sequences do not run 1, 2, 3, ... (a partial export, or one that skips or "
        "repeats a batch: refused without this), numbering its batches in line order; the report lists what changed",
    )
    progress_option(sub)
    sub.set_defaults(run=_import)


def _import(args: argparse.Namespace) -> int:
    from ..audit import migrate, pisource

    if args.from_pi_durable and args.renumber:
        raise usage("--renumber is for an export; --from-pi-durable numbers what it reads itself")
    if not args.from_pi_durable and os.path.isdir(args.source):
        raise usage(
            f"{args.source} is a directory, not an export: read a pi-durable JSONL directory with "
            "`durable-log import --from-pi-durable SOURCE NEWPATH`"
        )

    async def run() -> migrate.ImportReport:
        if args.from_pi_durable:
            report = Progress("import", None, progress_on(args), unit="commits")
            scratch = os.path.dirname(
                os.path.abspath(args.path)
            )  # the copy of the source: beside the new store
            async with pisource.open_read_only(
                args.source, scratch if os.path.isdir(scratch) else None
            ) as source:
                return await migrate.import_pi_durable(source, args.path, report)
        if args.source == "-":
            report = Progress("import", None, progress_on(args), unit="commits")
            return await migrate.import_export(
                _not_empty(sys.stdin.buffer, "stdin"), args.path, report, renumber=args.renumber
            )
        report = Progress("import", _count_lines(args.source), progress_on(args), unit="commits")
        with open(
            args.source, "rb"
        ) as lines:  # bytes: each line is decoded strictly, named if not UTF-8
            return await migrate.import_export(
                _not_empty(lines, args.source), args.path, report, renumber=args.renumber
            )

    try:
        print(asyncio.run(run()))
    except ValueError as error:  # a line of the export refused ("Line 3 of the export ..."):
        said = str(error)  # named with its file too
        if args.from_pi_durable or not said.startswith("Line "):
            raise
        raise usage(f"{'stdin' if args.source == '-' else args.source}: {said}") from None
    return EXIT_OK


def _not_empty(lines: Iterable[bytes], name: str) -> Iterator[bytes]:
    """The lines of an export, refused at their end when none held anything (an empty file):
    inside the import, so that the store begun for it is removed."""

    seen = False
    for line in lines:
        seen = seen or bool(line.strip())
        yield line
    if not seen:
        raise usage(f"{name} is empty: an export holds a line per batch, and it holds none")


def _count_lines(path: str) -> int | None:
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as data:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: data.read(1 << 20), b""))


# ── backup ────────────────────────────────────────────────────────────────────


def _register_backup(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "backup",
        "a consistent copy of a store, even while a writer commits",
        "Copy a store, even while a writer commits, with LMDB's own copy from one read snapshot, into "
        "the new directory DEST (made beside it and renamed into place when complete). LMDB files "
        f"never shrink: --compact leaves out free pages, so the copy is as small as the data; {READ_ONLY}.",
        example="durable-log backup demo-store demo-store.bak --compact",
    )
    store_argument(sub)
    sub.add_argument("dest", metavar="DEST", help="the copy's directory (must not exist)")
    sub.add_argument(
        "--compact",
        action="store_true",
        help="leave out free pages (slower; the copy is as small as the data)",
    )
    sub.set_defaults(run=_backup)


def _backup(args: argparse.Namespace) -> int:
    size = backup(args.path, args.dest, compact=args.compact)
    how = "compacted copy" if args.compact else "copy"
    print(f"{args.path}: a consistent {how} is in {args.dest} ({format_bytes(size)})")
    return EXIT_OK


# ── restore ───────────────────────────────────────────────────────────────────


def _register_restore(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "restore",
        "build a store from its NATS stream alone, to the end or to a point in time",
        "Build a new store from the records of store ID that the NATS stream S holds (disaster "
        "recovery), all of them or up to --to: a log sequence, or a time (ISO 8601, the last record "
        "committed at or before it). The new store has the store's id and "
        "stream position, so it can go on as a replica or, its writer lost, as the writer. It is "
        "built in a temporary directory beside NEWPATH, synced once and renamed to NEWPATH at the "
        "end: a failed restore leaves nothing behind.",
        example="durable-log restore --nats nats://127.0.0.1:4222 --stream LOGS --store ID restored-store",
    )
    nats_options(sub)
    sub.add_argument(
        "path", metavar="NEWPATH", help="the new store's directory (must not exist, or be empty)"
    )
    sub.add_argument(
        "--to",
        dest="to_point",
        type=restore_point,
        metavar="SEQ|TIME",
        help="stop at this log sequence, or at the last record committed at or before this "
        "ISO 8601 time (default: the stream's last record)",
    )
    progress_option(sub)
    sub.set_defaults(run=_restore)


def _restore(args: argparse.Namespace) -> int:
    from ..audit import restore

    check_store_id(args.store)
    report = Progress("restore", None, progress_on(args))

    def progress(done: int, total: int) -> None:
        report.total = total
        report(done)

    to_seq, to_time = seq_or_time(args.to_point)
    head = asyncio.run(
        restore.restore(
            args.nats, args.stream, args.store, args.path, to_seq, progress, to_time=to_time
        )
    )
    report.finish(head)
    print(
        f"{args.path}: restored store {args.store} from stream {args.stream}: {plural(head, 'log record')}, up to sequence {head}"
    )
    return EXIT_OK


__all__ = [
    "register",
]
