"""Looking at a store without changing it: ``stats``, ``show``, ``tail`` (of a store, or of a NATS
stream with no local store) and ``verify``. Every one opens the store read-only."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
from typing import Any, Final

import lmdb
import msgspec

from ..audit.export import seq_range
from ..audit.jsonlines import to_json
from ..audit.numbers import DIFFERENCES, argument
from ..audit.show import UnreadableDocument, show
from ..audit.stats import format_stats, lease_of, require_store, stats
from ..audit.tail import StreamTail, Tail, TailFilter, commit_to_builtins, open_stream, summarize
from ..audit.verify import check, record_outcome
from ..errors import LogError
from ..log.environment import check_store_id
from ..log.records import WRITE_TYPES
from . import transparency
from .common import (
    EXIT_OK,
    EXIT_USAGE,
    KIND_HELP,
    READ_ONLY,
    Progress,
    add_command,
    as_of_option,
    cell_text,
    conversation_id,
    count,
    interval,
    json_option,
    kind,
    nats_options,
    print_json,
    print_outcome,
    progress_on,
    progress_option,
    readable,
    record_id,
    run_until_signalled,
    seq_or_time,
    sequence,
    store_argument,
    time_argument,
    usage,
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_stats(commands)
    _register_show(commands)
    _register_tail(commands)
    _register_verify(commands)


# ── stats ─────────────────────────────────────────────────────────────────────


def _register_stats(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "stats",
        "head sequence, record counts, sizes, projections",
        f"Statistics of a store; {READ_ONLY}.",
        example="durable-log stats demo-store",
    )
    store_argument(sub)
    json_option(sub, "one object, the fields of the text")
    sub.add_argument(
        "--nats", metavar="URL", help="also ask NATS for the store's writer lease (with --stream)"
    )
    sub.add_argument(
        "--stream", metavar="S", help="the stream that carries the store's log (with --nats)"
    )
    sub.add_argument(
        "--watch",
        action="store_true",
        help="print rates (commits/s, fold lag, replication lag) every --every seconds",
    )
    sub.add_argument(
        "--every",
        type=interval,
        default=2.0,
        metavar="SECONDS",
        help="interval of --watch (default 2)",
    )
    sub.set_defaults(run=_stats)


def _stats(args: argparse.Namespace) -> int:
    if args.watch:
        from .watch import watch

        require_store(args.path)
        try:
            return watch(args.path, sys.stdout, args.every)
        except KeyboardInterrupt:
            return 0
    if (args.nats is None) != (args.stream is None):
        raise usage("--nats and --stream go together")
    info = stats(args.path)
    if args.nats is not None:
        info = msgspec.structs.replace(
            info, lease=asyncio.run(lease_of(args.nats, args.stream, info.store_id))
        )
    if args.json:
        print_json(msgspec.to_builtins(info))
    else:
        print(format_stats(info))
    return EXIT_OK


# ── show ──────────────────────────────────────────────────────────────────────


def _register_show(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "show",
        "print one record as the store reads it, now or at an earlier point",
        "Print one record (a document with its value) as the Storage contract reads it, a field "
        f"a line, times in ISO 8601 (--json: the record as one line of JSON); {READ_ONLY}.",
        example="durable-log show demo-store task 3",
    )
    store_argument(sub)
    sub.add_argument("kind", type=kind, metavar="KIND", help=KIND_HELP)
    sub.add_argument("id", type=record_id, metavar="ID", help="the record's id")
    as_of_option(sub)
    json_option(sub, "the record, on one line")
    sub.add_argument("--pretty", action="store_true", help="print the JSON indented for reading")
    sub.set_defaults(run=_show)


def _show(args: argparse.Namespace) -> int:
    as_of, as_of_time = seq_or_time(args.as_of)
    try:
        found, seq = asyncio.run(show(args.path, args.kind, args.id, as_of, as_of_time))
    except (
        TypeError
    ) as error:  # the contract's own refusal of an id (entry 0: "0 is not a positive ID")
        raise usage(f"{args.kind} {args.id}: {error}") from None
    if found is None:
        when = "" if seq is None else f" as of log sequence {seq}"
        print(
            f"durable-log: no {args.kind} {args.id} in {os.path.abspath(args.path)}{when}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if isinstance(found, UnreadableDocument):  # its record and why, not a traceback
        print(f"durable-log: {found.unreadable.describe()}", file=sys.stderr)
    if args.pretty:
        import json

        print(readable(json.dumps(json.loads(to_json(found)), indent=2, ensure_ascii=False)))
    elif args.json:
        print_json(found)
    else:
        print(readable(record_text(found)))
    return EXIT_OK


def record_text(record: Any) -> str:
    """A record as ``show`` prints it by default: a field a line (``state.status: terminal``),
    nested records flattened to dotted names, lists and other values as JSON, times
    (``common.TIME_FIELDS``) in ISO 8601."""

    import json

    lines: list[str] = []

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for name, inner in value.items():
                add(f"{prefix}.{name}" if prefix else str(name), inner)
        else:
            lines.append(f"{prefix}: {cell_text(prefix, value)}")

    add("", json.loads(to_json(record)))
    return "\n".join(lines)


# ── tail ──────────────────────────────────────────────────────────────────────


def _register_tail(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "tail",
        "print committed batches, one line each, of a store or of a NATS stream",
        "Print committed batches, one line each: by default the last 10 (like tail); with --from or "
        f"--since, every batch from there on. --limit N keeps the last N that match. {READ_ONLY}. "
        "With --nats URL --stream S instead of PATH, read the batches from the NATS stream itself "
        "(no local store): those of store --store ID, or of every store the stream carries, each "
        "line then naming its store (--from is then a log sequence of each store).",
        example="durable-log tail demo-store --limit 3",
    )
    sub.add_argument(
        "path", nargs="?", metavar="PATH", help="the store's directory (not with --nats)"
    )
    sub.set_defaults(reads_store=True)
    nats_options(sub, store_required=False)
    sub.add_argument(
        "--from", dest="from_seq", type=sequence, metavar="SEQ", help="start at this log sequence"
    )
    sub.add_argument(
        "--to",
        dest="to_seq",
        type=sequence,
        metavar="SEQ",
        help="stop at this log sequence (with --from: that range)",
    )
    sub.add_argument(
        "--since",
        type=time_argument,
        metavar="TIME",
        help="start at the first batch committed at or after TIME",
    )
    sub.add_argument(
        "--until",
        type=time_argument,
        metavar="TIME",
        help="stop at the last batch committed at or before TIME",
    )
    sub.add_argument(
        "--limit",
        "-n",
        type=count,
        metavar="N",
        help="only the last N matching batches of the range",
    )
    sub.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="then keep printing new batches as they are committed, until Ctrl-C",
    )
    json_option(sub, 'one object per batch, {"seq", "committedAt", "writes"}')
    sub.add_argument(
        "--conversation",
        type=conversation_id,
        metavar="ID",
        help="only the writes of this conversation (its entries, tasks, submissions and documents)",
    )
    sub.add_argument(
        "--type",
        dest="types",
        action="append",
        type=write_kind,
        metavar="KIND",
        help=f"only writes of this kind (repeatable): {KIND_HELP}, the document's all four, "
        f"or one of them: {', '.join(t for t in WRITE_TYPES if '.' in t)}",
    )
    transparency.checkpoint_options(sub)
    sub.set_defaults(run=_tail)


def write_kind(text: str) -> str:
    """``tail --type``: a kind of record in either spelling (``document``: its four kinds of
    write), or a kind of document write (``document.change``)."""

    if text.strip() in WRITE_TYPES:
        return text.strip()
    return kind(text)


def _write_types(given: str) -> tuple[str, ...]:
    if given == "document":
        return tuple(t for t in WRITE_TYPES if t.startswith("document."))
    return (given,)


DEFAULT_LAST: Final = 10
"""Batches ``tail`` prints without --from, --since or --limit (like tail)."""
STORE_WAIT_POLL: Final = 0.2
"""Seconds between looks for a store that ``tail --follow`` waits for."""
STORE_BIRTH_GRACE: Final = 10.0
"""Seconds a just-created ``data.mdb`` may stay unreadable (its writer is still making it) before
``tail --follow`` reports why it cannot be read."""


def _tail(args: argparse.Namespace) -> int:
    if args.follow and args.until is not None:
        raise usage("--until ends the range, --follow never ends: use one")
    if args.from_seq is not None and args.since is not None:
        raise usage("--from and --since both start the range: use one")
    if args.follow and args.to_seq is not None:
        raise usage("--to ends the range, --follow never ends: use one")
    if args.from_seq is not None and args.to_seq is not None and args.from_seq > args.to_seq:
        raise usage(f"--from {args.from_seq} is after --to {args.to_seq}: an empty range")
    types = (
        frozenset(t for given in args.types for t in _write_types(given)) if args.types else None
    )
    filter = TailFilter(args.conversation, types)
    args.signer = transparency.checkpoint_signer(args)
    if args.nats is not None:
        if args.path is not None:
            raise usage(
                f"tail reads a store at PATH or a NATS stream (--nats), not both (PATH {args.path!r})"
            )
        if args.stream is None:
            raise usage("--nats needs --stream: the JetStream stream that carries the logs")
        if args.store is not None:
            check_store_id(args.store)
        return int(run_until_signalled(_print_stream_tail(args, filter)))
    if args.path is None:
        raise usage("tail needs a store's PATH, or --nats URL --stream S to read a NATS stream")
    if args.stream is not None or args.store is not None:
        raise usage(
            "--stream and --store name what to read from a NATS stream: give --nats URL (and no PATH)"
        )
    if args.to_seq is not None and args.nats is not None:
        raise usage("--to is for a store's log (PATH)")
    if args.follow and not os.path.isfile(os.path.join(args.path, "data.mdb")):
        waited = run_until_signalled(_wait_for_store(args.path, filter), stopped=EXIT_OK)
        if not isinstance(waited, Tail):
            return EXIT_OK  # stopped (Ctrl-C, SIGTERM) before the store appeared
        tail = waited
    else:
        tail = Tail(args.path, filter)
    try:
        first, last = seq_range(tail.log, args.from_seq, args.to_seq, args.since, args.until)
        past_head(tail.head(), args.from_seq, args.follow)
        limit = args.limit
        if limit is None and args.from_seq is None and args.since is None and args.to_seq is None:
            limit = DEFAULT_LAST
        return int(run_until_signalled(_print_tail(tail, first, last, limit, args)))
    finally:
        tail.close()


def past_head(head: int, from_seq: int | None, follow: bool = False) -> None:
    """Say on stderr that ``--from`` starts after the log's head (nothing to print, or nothing yet)."""

    if from_seq is not None and from_seq > head:
        then = "waiting for it" if follow else "nothing to print"
        print(
            f"durable-log: --from {from_seq} is past the log's head ({head}): {then}",
            file=sys.stderr,
            flush=True,
        )


async def _wait_for_store(path: str, filter: TailFilter) -> Tail:
    """``tail -F`` for a store: wait until a host creates it (saying so once), then open it.
    A store that appeared is given a moment to become readable: its writer may be making it."""

    print(
        f"durable-log: no store at {os.path.abspath(path)} yet: waiting for one (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    loop = asyncio.get_running_loop()
    appeared: float | None = None
    while True:
        try:
            return Tail(path, filter)
        except FileNotFoundError:
            pass
        except (LogError, lmdb.Error):
            if appeared is None:
                appeared = loop.time()
            if loop.time() - appeared > STORE_BIRTH_GRACE:
                raise
        await asyncio.sleep(STORE_WAIT_POLL)


async def _print_tail(
    tail: Tail, first: int, last: int, limit: int | None, args: argparse.Namespace
) -> int:
    write, flush = sys.stdout.write, sys.stdout.flush

    def line(commit: Any, writes: list[Any]) -> str:
        if args.json:
            return to_json(commit_to_builtins(commit, writes))
        return readable(summarize(commit, writes))

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
    checkpoints = None
    if args.signer is not None:
        checkpoints = asyncio.ensure_future(
            transparency.print_checkpoints(
                tail.log, args.checkpoints, args.signer, args.json, write
            )
        )
    try:
        if args.json:
            async for text in tail.json_lines(start, follow=True):
                write(text + "\n")
                flush()
        else:
            async for commit, writes in tail.commits(start, follow=True):
                write(line(commit, writes) + "\n")
                flush()
    finally:
        if checkpoints is not None:
            checkpoints.cancel()
    return EXIT_OK


async def _print_stream_tail(args: argparse.Namespace, filter: TailFilter) -> int:
    link = await open_stream(args.nats, args.stream)
    try:
        tail = StreamTail(link, args.store, filter, json=args.json)
        return await link.arun(_stream_tail_lines(tail, args))  # the link's reads run on its loop
    finally:
        await asyncio.to_thread(link.close)


async def _stream_tail_lines(tail: StreamTail, args: argparse.Namespace) -> int:
    write, flush = sys.stdout.write, sys.stdout.flush
    limit = args.limit
    if limit is None and args.from_seq is None and args.since is None:
        limit = DEFAULT_LAST
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
        nothing = (
            f"stream {args.stream} holds nothing of store {args.store} (subject {tail.subject})"
        )
        if not args.follow:
            raise usage(nothing)
        print(
            f"durable-log: {nothing} yet: waiting for its first commit (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
    if not args.follow:
        return EXIT_OK
    flush()
    async for text in tail.lines(follow=True, **window):
        write(text + "\n")
        flush()
    return EXIT_OK


# ── verify ────────────────────────────────────────────────────────────────────


def _register_verify(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "verify",
        "check the log and re-fold it against the projections",
        "Check every log record's checksum and order, fold the whole log into scratch projections and "
        f"compare them with the live ones key by key; {READ_ONLY}. Exit 1 if anything differs.",
        example="durable-log verify demo-store",
    )
    store_argument(sub)
    sub.add_argument(
        "--max-differences",
        type=argument(DIFFERENCES),
        default=20,
        metavar="N",
        help="list at most N differences (default 20)",
    )
    progress_option(sub)
    json_option(sub, '{"path", "sound", "summary", ...} (with --trusted: its checks)')
    transparency.trusted_options(sub)
    sub.set_defaults(run=_verify)


def _verify(args: argparse.Namespace) -> int:
    if args.trusted is not None:
        return transparency.verify_against(args)
    report = check(
        args.path, progress=Progress("verify", None, progress_on(args)), limit=args.max_differences
    )
    record_outcome(args.path, report)
    counts = (report.head, report.records, report.keys, report.tables, round(report.seconds, 3))
    differences = ([str(each) for each in report.differences], report.more)
    unreadable = ([each.describe() for each in report.unreadable], report.more_unreadable)
    result = None
    if args.json:
        result = VerifyResult(
            args.path, report.sound, *counts, *differences, *unreadable, report.summary()
        )
    return print_outcome(args.path, report.sound, report.summary(), result)


class VerifyResult(msgspec.Struct):
    """What ``verify --json`` prints: the report of its text, field by field."""

    path: str
    sound: bool
    head: int
    records: int
    keys: int
    tables: int
    seconds: float
    differences: list[str]
    moreDifferences: int
    unreadable: list[str]
    moreUnreadable: int
    summary: str


__all__ = [
    "DEFAULT_LAST",
    "STORE_BIRTH_GRACE",
    "STORE_WAIT_POLL",
    "VerifyResult",
    "past_head",
    "record_text",
    "register",
    "write_kind",
]
