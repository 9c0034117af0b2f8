"""durable-log: look at, check, copy, move and demonstrate a pi-durable-lmdb store."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import sys
import traceback
from collections.abc import Coroutine, Sequence
from importlib import metadata
from typing import Any, Final, TypeVar

import lmdb

from ..log import CorruptRecordError, LogError
from ..log.environment import check_store_id
from ..log.errors import TruncatedStoreError
from ..errors import ForeignMessageError, ProjectionFailed, ProjectionsBehind
from ..log.records import FORMAT_VERSION, WRITE_TYPES
from ..projections.errors import CorruptProjectionError, StorageRequestError
from ..projections.tables import SCHEMA_VERSION

from . import audit
from .jsonlines import to_json

EXIT_OK: Final = 0
EXIT_DAMAGE: Final = 1
"""The store is damaged: a log record or projection row fails its checksum, data.mdb is truncated,
or verify found a projection that differs from the log; or a stream carries a message that is
not a sound record of its store (tail --nats, restore, replica)."""
EXIT_USAGE: Final = 2
"""The command could not run: bad arguments, no store at the path, the writer lock held, nothing
found by show, an import source that is not an export, no NATS server answering, no such stream,
nothing of the store on it."""

EPILOG: Final = """\
exit status:
  0  success
  1  damage found: a log record or projection row fails its checksum, data.mdb
     is truncated, or verify found projections that differ from the log; a
     stream message that is not a sound record of its store (tail --nats,
     restore, replica)
  2  the command could not run: bad arguments or ranges, no store at PATH, a
     store locked by another writer, nothing found by show, a malformed import,
     no NATS server answering, no such stream, nothing of the store on it
  3  an unexpected error (a bug): its traceback is printed; please report it.
     --debug (before the command) prints the traceback of any error

times (--since, --until, --as-of) are ISO 8601, e.g. 2026-12-02T18:30:00Z or
2026-12-02; without a zone they are UTC, as every time durable-log prints is.
Progress goes to stderr when it is a terminal, or with --progress. --nats
takes a NATS URL or a comma-separated list of them (nats://host:4222,host2:4222).

examples:
  durable-log tail STORE --follow --json --type entry    # live, while a host writes
  durable-log tail STORE --conversation 1 --limit 5      # its last 5 batches
  durable-log show STORE task 9 --as-of 120
  durable-log export STORE --since 2026-12-01 > log.jsonl
  durable-log import log.jsonl NEW_STORE
  durable-log backup STORE STORE-copy --compact
  durable-log tail --nats nats://127.0.0.1:4222 --stream LOGS --follow
  durable-log restore --nats nats://127.0.0.1:4222 --stream LOGS --store ID NEW
  durable-log replica REPLICA --nats nats://127.0.0.1:4222 --stream LOGS --store ID
"""

READ_ONLY: Final = "read-only: never blocks the writer and never creates a store"


EXIT_BUG: Final = 3
"""An unexpected error: a bug in durable-log or the engine. Its traceback is printed to stderr."""

KNOWN_REFUSALS: Final = (
    LogError,  # no store, a locked or damaged one, NATS unreachable, no stream, not the writer ...
    OSError,  # a path that cannot be read or written
    ValueError,  # a refused argument, range or import line (the engine's refusals of bad input)
    StorageRequestError,
    ProjectionFailed,
    ProjectionsBehind,
    lmdb.Error,
)
"""What the command could not do for a reason it names (exit 2). Anything else is a bug (exit 3)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (
        CorruptRecordError,
        CorruptProjectionError,
        TruncatedStoreError,
        ForeignMessageError,
        lmdb.CorruptedError,
        lmdb.PageNotFoundError,
    ) as error:
        print(f"durable-log: damage: {error}", file=sys.stderr)
        _debug(args)
        return EXIT_DAMAGE
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (``| head``): not an error
        return EXIT_OK
    except KNOWN_REFUSALS as error:
        print(f"durable-log: {_message(error)}", file=sys.stderr)
        _debug(args)
        return EXIT_USAGE
    except Exception:
        print(
            "durable-log: unexpected error (a bug in durable-log: please report it with this traceback):",
            file=sys.stderr,
        )
        traceback.print_exc(file=sys.stderr)
        return EXIT_BUG


def _debug(args: argparse.Namespace) -> None:
    """``--debug``: the traceback of a known refusal too, for a report."""

    if getattr(args, "debug", False):
        traceback.print_exc(file=sys.stderr)


def _message(error: BaseException) -> str:
    return str(error) or type(error).__name__


# ── arguments ─────────────────────────────────────────────────────────────────


def _sequence(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"a log sequence is 1 or more, not {value}")
    return value


def _count(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a count is 0 or more, not {value}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _time(text: str) -> int:
    try:
        return audit.parse_time(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _point(text: str) -> tuple[str, int]:
    """``--as-of``: a sequence (digits) or a time."""

    if text.strip().isdigit():
        return "seq", int(text)
    return "time", _time(text)


def _version() -> str:
    try:
        version = metadata.version("pi-durable-lmdb")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"durable-log {version} (log format {FORMAT_VERSION}, projection schema {SCHEMA_VERSION})"


class _Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal; the epilog (a table and examples) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="durable-log", description=__doc__, epilog=EPILOG, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true", help="print the traceback of any error, not only of an unexpected one")
    commands = parser.add_subparsers(required=True, metavar="COMMAND", title="commands")

    def command(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help, description=description or help, epilog=EPILOG, formatter_class=_Formatter
        )

    def store(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("path", metavar="PATH", help="the store's directory")

    def nats_options(sub: argparse.ArgumentParser, store_required: bool = True) -> None:
        required = store_required  # restore and replica need all three; tail only --nats and --stream
        sub.add_argument("--nats", required=required, metavar="URL", help="a NATS server URL, or several, comma-separated")
        sub.add_argument("--stream", required=required, metavar="S", help="the JetStream stream that carries the logs")
        sub.add_argument(
            "--store",
            required=required,
            metavar="ID",
            help="the store's id (stats shows it); its subject is S.ID.log"
            + ("" if required else " (default: every store of the stream)"),
        )

    def progress(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal")

    demo = command("demo", "run a small agent host on a store, then show what it wrote")
    demo.add_argument("path", nargs="?", metavar="PATH", help="the store's directory (default: ./demo-store)")
    demo.set_defaults(run=lambda args: _demo(args.path))

    stats = command("stats", "head sequence, record counts, sizes, projections", f"Statistics of a store; {READ_ONLY}.")
    store(stats)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.add_argument("--nats", metavar="URL", help="also ask NATS for the store's writer lease (with --stream)")
    stats.add_argument("--stream", metavar="S", help="the stream that carries the store's log (with --nats)")
    stats.add_argument("--watch", action="store_true", help="print rates (commits/s, fold lag, replication lag) every --every seconds")
    stats.add_argument("--every", type=float, default=2.0, metavar="SECONDS", help="interval of --watch (default 2)")
    stats.set_defaults(run=_stats)

    promote = command(
        "promote",
        "make a replica (or any copy) of a store the writer of its stream",
        "Take over store PATH's stream as its writer: wait for the old writer's lease to expire "
        "(--force: fence the old writer out at once), take the lease with a higher epoch, put a "
        "fence on the store's subject (no earlier writer's append can land after it) and take in "
        "everything the stream holds. Then the lease is released, so the host that opens PATH "
        "next with durability='replicated' writes at once. Exit 2 if another writer keeps its lease.",
    )
    store(promote)
    promote.add_argument("--nats", required=True, metavar="URL", help="a NATS server URL, or several, comma-separated")
    promote.add_argument("--stream", required=True, metavar="S", help="the JetStream stream that carries the log")
    promote.add_argument("--force", action="store_true", help="fence the old writer out now, without waiting for its lease")
    promote.add_argument("--lease-ttl", type=int, default=None, metavar="SECONDS", help="the lease's time to live")
    promote.set_defaults(run=_promote)

    tail = command(
        "tail",
        "print committed batches, one line each, of a store or of a NATS stream",
        "Print committed batches, one line each: by default the last 10 (like tail); with --from or "
        f"--since, every batch from there on. --limit N keeps the last N that match. {READ_ONLY}. "
        "With --nats URL --stream S instead of PATH, read the batches from the NATS stream itself "
        "(no local store): those of store --store ID, or of every store the stream carries, each "
        "line then naming its store (--from is then a log sequence of each store).",
    )
    tail.add_argument("path", nargs="?", metavar="PATH", help="the store's directory (not with --nats)")
    nats_options(tail, store_required=False)
    tail.add_argument("--from", dest="from_seq", type=_sequence, metavar="SEQ", help="start at this log sequence")
    tail.add_argument("--since", type=_time, metavar="TIME", help="start at the first batch committed at or after TIME")
    tail.add_argument("--until", type=_time, metavar="TIME", help="stop at the last batch committed at or before TIME")
    tail.add_argument("--limit", "-n", type=_count, metavar="N", help="only the last N matching batches of the range")
    tail.add_argument("--follow", "-f", action="store_true", help="then keep printing new batches as they are committed, until Ctrl-C")
    tail.add_argument("--json", action="store_true", help='one JSON object per batch: {"seq", "committedAt", "writes"}')
    tail.add_argument("--conversation", type=_sequence, metavar="ID", help="only the writes of this conversation (its entries, tasks, submissions and documents)")
    tail.add_argument(
        "--type",
        dest="types",
        action="append",
        choices=WRITE_TYPES,
        metavar="KIND",
        help=f"only writes of this kind (repeatable): {', '.join(WRITE_TYPES)}",
    )
    tail.set_defaults(run=_tail)

    show = command(
        "show",
        "print one record as the store reads it, now or at an earlier point",
        f"Print one record as JSON (a document with its value), as the Storage contract reads it; {READ_ONLY}.",
    )
    store(show)
    show.add_argument("kind", choices=audit.SHOW_KINDS, metavar="KIND", help=f"one of: {', '.join(audit.SHOW_KINDS)}")
    show.add_argument("id", type=_integer, metavar="ID", help="the record's id")
    show.add_argument("--as-of", type=_point, metavar="SEQ|TIME", help="as the store was right after this log sequence, or at this time")
    show.set_defaults(run=_show)

    verify = command(
        "verify",
        "check the log and re-fold it against the projections",
        "Check every log record's checksum and order, fold the whole log into scratch projections and "
        f"compare them with the live ones key by key; {READ_ONLY}. Exit 1 if anything differs.",
    )
    store(verify)
    verify.add_argument("--max-differences", type=_count, default=20, metavar="N", help="list at most N differences (default 20)")
    progress(verify)
    verify.set_defaults(run=_verify)

    export = command(
        "export",
        "the log as JSON Lines",
        'The log as JSON Lines, {"seq", "committedAt", "writes"} per line, lossless: `durable-log import` '
        f"rebuilds the same store from it; {READ_ONLY}.".replace("`", ""),
    )
    store(export)
    export.add_argument("--from", dest="from_seq", type=_sequence, metavar="SEQ", help="first log sequence (default 1)")
    export.add_argument("--to", dest="to_seq", type=_sequence, metavar="SEQ", help="last log sequence (default: the head)")
    export.add_argument("--since", type=_time, metavar="TIME", help="from the first batch committed at or after TIME")
    export.add_argument("--until", type=_time, metavar="TIME", help="to the last batch committed at or before TIME")
    progress(export)
    export.set_defaults(run=_export)

    importer = command(
        "import",
        "build a new store from an export, or from a pi-durable SQLite/JSONL store",
        "Build a new store from an export (every batch replayed through the normal commit path) or, "
        "with --from-pi-durable, from a pi-durable SQLite file or JSONL directory. The store is built "
        "in a temporary directory, synced once and renamed to NEWPATH at the end: a failed import "
        "leaves nothing behind.",
    )
    importer.add_argument("source", metavar="SOURCE", help="an export (a .jsonl file, or - for stdin), or with --from-pi-durable a SQLite file or JSONL directory")
    importer.add_argument("path", metavar="NEWPATH", help="the new store's directory (must not exist, or be empty)")
    importer.add_argument("--from-pi-durable", action="store_true", help="SOURCE is a pi-durable SQLite file or JSONL directory")
    importer.add_argument(
        "--renumber",
        action="store_true",
        help="import an export whose sequences do not run 1, 2, 3, ... (a partial export, or one that skips or "
        "repeats a batch: refused without this), numbering its batches in line order; the report lists what changed",
    )
    progress(importer)
    importer.set_defaults(run=_import)

    rebuild = command(
        "rebuild",
        "fold the whole log into fresh projections beside the live ones, then swap",
        "Fold the whole log into fresh core projections beside the live ones, then swap them in "
        "(a killed rebuild resumes). Takes the writer lock; never creates a store.",
    )
    store(rebuild)
    rebuild.add_argument(
        "--projection",
        default="core",
        metavar="NAME",
        help="core (default), or a user projection's name (see stats): its rows are dropped and its "
        "program folds the log again on its next open",
    )
    progress(rebuild)
    rebuild.set_defaults(run=_rebuild)

    backup = command(
        "backup",
        "a consistent copy of a store, even while a writer commits",
        "Copy a store, even while a writer commits, with LMDB's own copy from one read snapshot, into "
        "the new directory DEST (made beside it and renamed into place when complete). LMDB files "
        f"never shrink: --compact leaves out free pages, so the copy is as small as the data; {READ_ONLY}.",
    )
    store(backup)
    backup.add_argument("dest", metavar="DEST", help="the copy's directory (must not exist)")
    backup.add_argument("--compact", action="store_true", help="leave out free pages (slower; the copy is as small as the data)")
    backup.set_defaults(run=_backup)

    restore = command(
        "restore",
        "build a store from its NATS stream alone, to the end or to a point in time",
        "Build a new store from the records of store ID that the NATS stream S holds (disaster "
        "recovery), all of them or up to log sequence --to. The new store has the store's id and "
        "stream position, so it can go on as a replica or, its writer lost, as the writer. It is "
        "built in a temporary directory beside NEWPATH, synced once and renamed to NEWPATH at the "
        "end: a failed restore leaves nothing behind.",
    )
    nats_options(restore)
    restore.add_argument("path", metavar="NEWPATH", help="the new store's directory (must not exist, or be empty)")
    restore.add_argument("--to", dest="to_seq", type=_sequence, metavar="SEQ", help="stop at this log sequence (default: the stream's last record)")
    progress(restore)
    restore.set_defaults(run=_restore)

    replica = command(
        "replica",
        "keep a replica of a store level with its NATS stream, until Ctrl-C",
        "Open (or create) at PATH a replica of store ID, take in what the NATS stream S holds of it "
        "and keep taking each new record until Ctrl-C or SIGTERM (exit 0), printing where it stands "
        "to stderr every --interval seconds. Exit 1 if a message of the stream is refused (not a "
        "sound record of the store): the replica keeps what came before it.",
    )
    replica.add_argument("path", metavar="PATH", help="the replica's directory (made when missing)")
    nats_options(replica)
    replica.add_argument("--interval", type=_seconds, default=10.0, metavar="SECONDS", help="print the status every SECONDS (default 10)")
    replica.set_defaults(run=_replica)

    return parser


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"an interval is more than 0 and less than a day of seconds, not {text}")
    return value


def _progress_on(args: argparse.Namespace) -> bool:
    return bool(args.progress) or sys.stderr.isatty()


def _usage(message: str) -> ValueError:
    return ValueError(message)


# ── commands ──────────────────────────────────────────────────────────────────


def _demo(path: str | None) -> int:
    from . import demo

    return demo.main(path)


def _stats(args: argparse.Namespace) -> int:
    if args.watch:
        from ..web.watch import watch

        audit.require_store(args.path)
        try:
            return watch(args.path, sys.stdout, args.every)
        except KeyboardInterrupt:
            return 0
    if (args.nats is None) != (args.stream is None):
        raise _usage("--nats and --stream go together")
    info = audit.stats(args.path)
    if args.nats is not None:
        info["lease"] = asyncio.run(audit.lease_of(args.nats, args.stream, info.get("storeId")))
    print(to_json(info) if args.json else audit.format_stats(info))
    return EXIT_OK


def _promote(args: argparse.Namespace) -> int:
    from ..log.environment import Environment
    from ..log.stream.lease import DEFAULT_LEASE_TTL

    audit.require_store(args.path)
    env = Environment(args.path, readonly=True)
    store = env.store_id
    env.close()
    if store is None:
        raise _usage(f"{args.path} has no store id yet (open it once with a writer of this version)")

    async def run() -> int:
        from .lmdb_storage import LmdbStorage

        storage = await LmdbStorage.open(
            args.path,
            durability="replicated",
            nats=args.nats,
            stream=args.stream,
            store=store,
            take_over="force" if args.force else True,
            lease_ttl=args.lease_ttl or DEFAULT_LEASE_TTL,
        )
        try:
            writer = storage.replication
            epoch = getattr(writer, "epoch", None)
            print(f"promoted {args.path}: store {store}, writer epoch {epoch}, head sequence {storage.log.head()}")
        finally:
            await storage.close()
        return EXIT_OK

    return asyncio.run(run())


def _tail(args: argparse.Namespace) -> int:
    if args.follow and args.until is not None:
        raise _usage("--until ends the range, --follow never ends: use one")
    if args.from_seq is not None and args.since is not None:
        raise _usage("--from and --since both start the range: use one")
    types = frozenset(args.types) if args.types else None
    if args.nats is not None:
        if args.path is not None:
            raise _usage(f"tail reads a store at PATH or a NATS stream (--nats), not both (PATH {args.path!r})")
        if args.stream is None:
            raise _usage("--nats needs --stream: the JetStream stream that carries the logs")
        if args.store is not None:
            check_store_id(args.store)
        return int(_run_until_signalled(_print_stream_tail(args, audit.TailFilter(args.conversation, types))))
    if args.path is None:
        raise _usage("tail needs a store's PATH, or --nats URL --stream S to read a NATS stream")
    if args.stream is not None or args.store is not None:
        raise _usage("--stream and --store name what to read from a NATS stream: give --nats URL (and no PATH)")
    filter = audit.TailFilter(args.conversation, types)
    if args.follow and not os.path.isfile(os.path.join(args.path, "data.mdb")):
        waited = _run_until_signalled(_wait_for_store(args.path, filter), stopped=EXIT_OK)
        if not isinstance(waited, audit.Tail):
            return EXIT_OK  # stopped (Ctrl-C, SIGTERM) before the store appeared
        tail = waited
    else:
        tail = audit.Tail(args.path, filter)
    try:
        first, last = audit.seq_range(tail.log, args.from_seq, None, args.since, args.until)
        limit = args.limit
        if limit is None and args.from_seq is None and args.since is None:
            limit = 10  # like tail: the last 10
        return int(_run_until_signalled(_print_tail(tail, first, last, limit, args)))
    finally:
        tail.close()


STORE_WAIT_POLL: Final = 0.2
"""Seconds between looks for a store that ``tail --follow`` waits for."""
STORE_BIRTH_GRACE: Final = 10.0
"""Seconds a just-created ``data.mdb`` may stay unreadable (its writer is still making it) before
``tail --follow`` reports why it cannot be read."""


async def _wait_for_store(path: str, filter: audit.TailFilter) -> audit.Tail:
    """``tail -F`` for a store: wait until a host creates it (saying so once), then open it.
    A store that appeared is given a moment to become readable: its writer may be making it."""

    print(f"durable-log: no store at {os.path.abspath(path)} yet: waiting for one (Ctrl-C stops)", file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    appeared: float | None = None
    while True:
        try:
            return audit.Tail(path, filter)
        except FileNotFoundError:
            pass
        except (LogError, lmdb.Error):
            if appeared is None:
                appeared = loop.time()
            if loop.time() - appeared > STORE_BIRTH_GRACE:
                raise
        await asyncio.sleep(STORE_WAIT_POLL)


async def _print_tail(tail: audit.Tail, first: int, last: int, limit: int | None, args: argparse.Namespace) -> int:
    write, flush = sys.stdout.write, sys.stdout.flush

    def line(commit: Any, writes: list[Any]) -> str:
        if args.json:
            return to_json(audit.commit_to_builtins(commit, writes))
        # readable text: lone surrogates shown as \udXXX escapes, never an encoding error
        return audit.summarize(commit, writes).encode("utf-8", "backslashreplace").decode("utf-8")

    if limit is not None:
        for commit, writes in tail.last(limit, first, last):
            write(line(commit, writes) + "\n")
    elif args.json:
        async for text in tail.json_lines(first, last=last):
            write(text + "\n")
    else:
        async for commit, writes in tail.commits(first, last=last):
            write(line(commit, writes) + "\n")
    if not args.follow:
        return EXIT_OK
    flush()
    start = max(first, last + 1)
    if args.json:
        async for text in tail.json_lines(start, follow=True):
            write(text + "\n")
            flush()
    else:
        async for commit, writes in tail.commits(start, follow=True):
            write(line(commit, writes) + "\n")
            flush()
    return EXIT_OK


async def _print_stream_tail(args: argparse.Namespace, filter: audit.TailFilter) -> int:
    link = await audit.open_stream(args.nats, args.stream)
    try:
        tail = audit.StreamTail(link, args.store, filter, json=args.json)
        return await link.arun(_stream_tail_lines(tail, args))  # the link's reads run on its loop
    finally:
        await asyncio.to_thread(link.close)


async def _stream_tail_lines(tail: audit.StreamTail, args: argparse.Namespace) -> int:
    write, flush = sys.stdout.write, sys.stdout.flush
    limit = args.limit
    if limit is None and args.from_seq is None and args.since is None:
        limit = 10  # like tail: the last 10
    window = {"first": args.from_seq or 1, "since": args.since, "until": args.until}
    if limit is not None:  # a stream reads forwards only: keep the last N on the way
        kept: collections.deque[str] = collections.deque(maxlen=limit)
        async for text in tail.lines(**window):
            kept.append(text)
        for text in kept:
            write(text + "\n")
    else:
        async for text in tail.lines(**window):
            write(text + "\n")
    if args.store is not None and tail.position == 0:  # not one message on the store's subject
        nothing = f"stream {args.stream} holds nothing of store {args.store} (subject {tail.subject})"
        if not args.follow:
            raise _usage(nothing)
        print(f"durable-log: {nothing} yet: waiting for its first commit (Ctrl-C stops)", file=sys.stderr, flush=True)
    if not args.follow:
        return EXIT_OK
    flush()
    async for text in tail.lines(follow=True, **window):
        write(text + "\n")
        flush()
    return EXIT_OK


_T = TypeVar("_T")


def _run_until_signalled(work: Coroutine[Any, Any, _T], stopped: _T | int = EXIT_OK) -> _T | int:
    """Run ``work``; Ctrl-C and SIGTERM end it cleanly, answering ``stopped`` (status 0)."""

    async def runner() -> _T | int:
        task = asyncio.ensure_future(work)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            return stopped

    return asyncio.run(runner())


def _restore(args: argparse.Namespace) -> int:
    from . import restore

    check_store_id(args.store)
    report = audit.Progress("restore", None, _progress_on(args))

    def progress(done: int, total: int) -> None:
        report.total = total
        report(done)

    head = asyncio.run(restore.restore(args.nats, args.stream, args.store, args.path, args.to_seq, progress))
    report.finish(head)
    print(f"{args.path}: restored store {args.store} from stream {args.stream}: {audit.plural(head, 'log record')}, up to sequence {head}")
    return EXIT_OK


def _replica(args: argparse.Namespace) -> int:
    check_store_id(args.store)
    return int(_run_until_signalled(_keep_replica(args)))


async def _keep_replica(args: argparse.Namespace) -> int:
    from .lmdb_storage import LmdbStorage
    from .replica import Follower

    replica = await LmdbStorage.open_replica(args.path, nats=args.nats, stream=args.stream, store=args.store)
    follower = replica.replication
    assert isinstance(follower, Follower)

    def say(text: str) -> None:
        print(f"durable-log: replica {args.path}: {text}", file=sys.stderr, flush=True)

    def status() -> str:
        now = follower.status()
        text = (
            f"applied sequence {now['appliedSeq']} (stream message {now['streamSeq']}), "
            f"lag {audit.plural(now['lagRecords'], 'record')}, {now['lagMs'] / 1000:.1f} s"
        )
        return text + (f"; last error: {now['lastError']}" if now["lastError"] else "")

    try:
        say(f"store {args.store}, following subject {follower.subject}; Ctrl-C or SIGTERM stops")
        shown = -1.0
        loop = asyncio.get_running_loop()
        while True:
            if follower.error is not None:
                say(f"stopped at applied sequence {replica.log.head()}")
                print(f"durable-log: damage: {follower.error}", file=sys.stderr, flush=True)
                return EXIT_DAMAGE
            if loop.time() - shown >= args.interval:
                say(status())
                shown = loop.time()
            await asyncio.sleep(min(0.1, args.interval))
    except asyncio.CancelledError:
        say(f"stopping: {status()}")
        raise
    finally:
        await replica.close()


def _show(args: argparse.Namespace) -> int:
    as_of = as_of_time = None
    if args.as_of is not None:
        kind, value = args.as_of
        as_of, as_of_time = (value, None) if kind == "seq" else (None, value)
    try:
        found, seq = asyncio.run(audit.show(args.path, args.kind, args.id, as_of, as_of_time))
    except TypeError as error:  # the contract's own refusal of an id (entry 0: "0 is not a positive ID")
        raise _usage(f"{args.kind} {args.id}: {error}") from None
    if found is None:
        when = "" if seq is None else f" as of log sequence {seq}"
        print(f"durable-log: no {args.kind} {args.id} in {os.path.abspath(args.path)}{when}", file=sys.stderr)
        return EXIT_USAGE
    print(to_json(found))
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    report = audit.check(args.path, progress=_progress_on(args), limit=max(1, args.max_differences))
    if report.sound:
        print(f"{args.path}: {report.summary()}")
        return EXIT_OK
    print(f"{args.path}: {report.summary()}", file=sys.stderr)
    return EXIT_DAMAGE


def _export(args: argparse.Namespace) -> int:
    if args.from_seq is not None and args.to_seq is not None and args.from_seq > args.to_seq:
        raise _usage(f"--from {args.from_seq} is after --to {args.to_seq}: an empty range")
    if args.since is not None and args.until is not None and args.since > args.until:
        raise _usage("--since is after --until: an empty range")
    report = audit.Progress("export", None, _progress_on(args), unit="commits")
    done = 0
    for line in audit.export_lines(args.path, args.from_seq or 1, args.to_seq, since=args.since, until=args.until):
        sys.stdout.write(line + "\n")
        done += 1
        report(done)
    report.finish(done)
    return EXIT_OK


def _import(args: argparse.Namespace) -> int:
    from . import migrate

    if args.from_pi_durable and args.renumber:
        raise _usage("--renumber is for an export; --from-pi-durable numbers what it reads itself")
    if not args.from_pi_durable and os.path.isdir(args.source):
        raise _usage(
            f"{args.source} is a directory, not an export: read a pi-durable JSONL directory with "
            "`durable-log import --from-pi-durable SOURCE NEWPATH`"
        )

    async def run() -> migrate.ImportReport:
        if args.from_pi_durable:
            report = audit.Progress("import", None, _progress_on(args), unit="commits")
            source = await migrate.open_pi_durable_store(args.source)
            try:
                return await migrate.import_pi_durable(source, args.path, report)
            finally:
                await source.close(None)
        if args.source == "-":
            report = audit.Progress("import", None, _progress_on(args), unit="commits")
            return await migrate.import_export(sys.stdin.buffer, args.path, report, renumber=args.renumber)
        report = audit.Progress("import", _count_lines(args.source), _progress_on(args), unit="commits")
        with open(args.source, "rb") as lines:  # bytes: each line is decoded strictly, named if not UTF-8
            return await migrate.import_export(lines, args.path, report, renumber=args.renumber)

    print(asyncio.run(run()))
    return EXIT_OK


def _count_lines(path: str) -> int | None:
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as data:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: data.read(1 << 20), b""))


def _rebuild(args: argparse.Namespace) -> int:
    from .lmdb_storage import LmdbStorage

    audit.require_store(args.path)
    if args.projection != "core":
        known = audit.stored_projections(args.path)
        if args.projection not in known:
            names = ", ".join(["core", *sorted(known)])
            raise _usage(f"The store has no projection {args.projection!r}; it has: {names}")

    async def run() -> None:
        storage = await LmdbStorage.open(args.path)
        try:
            if args.projection == "core":
                head = storage.log.head()
                await storage.rebuild(audit.Progress("rebuild", head, _progress_on(args)))
                print(f"{args.path}: rebuilt the core projections from {audit.plural(head, 'log record')}")
            else:
                storage.projections.reset_stored(args.projection)
                print(f"{args.path}: dropped projection {args.projection!r}; its program refolds it on its next open")
        finally:
            await storage.close()

    asyncio.run(run())
    return EXIT_OK


def _backup(args: argparse.Namespace) -> int:
    size = audit.backup(args.path, args.dest, compact=args.compact)
    how = "compacted copy" if args.compact else "copy"
    print(f"{args.path}: a consistent {how} is in {args.dest} ({audit.format_bytes(size)})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
