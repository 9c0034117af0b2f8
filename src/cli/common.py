"""What every family of ``durable-log`` commands shares: the refusals that map to the exit codes
(``status`` defines those), argument types (sequences, counts, ISO 8601 times), the shared options, progress on stderr,
JSON output, and running until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import errno
import signal
import sys
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, Final, TypeVar

import lmdb
from pi_durable.errors import StorageRequestError

from ..audit import numbers
from ..audit.jsonlines import to_json
from ..audit.numbers import (
    CONVERSATION,
    COUNT,
    INTERVAL,
    RECORD_ID,
    SEQUENCE,
    argument,
    parse_time,
    typed,
)
from ..errors import (
    CorruptProjectionError,
    CorruptRecordError,
    ForeignMessageError,
    LogError,
    ProjectionFailed,
    ProjectionsBehind,
    TruncatedStoreError,
    install_hint,
)
from .status import EPILOG as EPILOG
from .status import EXIT_BUG as EXIT_BUG
from .status import EXIT_DAMAGE as EXIT_DAMAGE
from .status import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from .status import EXIT_OK as EXIT_OK
from .status import EXIT_USAGE as EXIT_USAGE
from .status import SEE_EXIT_STATUS
from .status import Formatter as Formatter

# ── refusals and their exit codes ─────────────────────────────────────────────

DAMAGE: Final = (
    CorruptRecordError,
    CorruptProjectionError,
    TruncatedStoreError,
    ForeignMessageError,
    lmdb.CorruptedError,
    lmdb.PageNotFoundError,
)
"""Errors that mean the store (or the stream) is damaged (exit 1)."""

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

READ_ONLY: Final = "read-only: never blocks the writer and never creates a store"


SERVE_MODULES: Final = ("aiohttp", "jinja2", "prometheus_client")
"""What ``serve`` needs: the ``[web]`` extra."""


def serve_missing(missing: str) -> ValueError:
    """The refusal of ``serve`` without the ``[web]`` extra (exit 2)."""

    return usage(f"serve needs the [web] extra ({missing} is not installed): {install_hint('web')}")


def refusal(error: BaseException) -> str:
    """The one line of a known refusal, in the user's terms: a file the system refused is named
    with what is wrong with it, never with Python's ``[Errno N]`` text."""

    if isinstance(error, OSError) and not isinstance(error, LogError) and error.errno in _OS_WORDS:
        name = error.filename if error.filename is not None else "a file"
        return f"{name}: {_OS_WORDS[error.errno]}"
    text = str(error) or type(error).__name__
    return text[len(PREFIX) :] if text.startswith(PREFIX) else text


PREFIX: Final = "durable-log: "
"""What the command's every message starts with: a refusal's own text never repeats it."""

_OS_WORDS: Final = {
    errno.ENOENT: "no such file or directory",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EISDIR: "is a directory, not a file",
    errno.ENOTDIR: "a part of the path is not a directory",
    errno.EEXIST: "already exists",
    errno.ENOSPC: "no space left on the device",
    errno.EROFS: "on a read-only file system",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ELOOP: "too many symbolic links",
}


def usage(message: str) -> ValueError:
    """A refusal the command names (exit 2)."""

    return ValueError(message)


# ── sub-parsers and shared options ─────────────────────────────────────────────


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str | None = None,
    *,
    example: str,
) -> argparse.ArgumentParser:
    """A sub-command whose ``--help`` is its own: what it does, its options, ``example`` (a
    command line that runs as printed) and a pointer to the exit statuses every command shares,
    which ``durable-log --help`` and docs/operations.md spell out once."""

    return commands.add_parser(
        name,
        help=help,
        description=description or help,
        epilog=f"example:\n  {example}\n\n{SEE_EXIT_STATUS}",
        formatter_class=Formatter,
    )


def json_option(sub: argparse.ArgumentParser, shape: str) -> None:
    """``--json``: what a command that reads prints instead of its text, ``shape`` saying what
    (docs/operations.md, "What --json prints", lists every command's)."""

    sub.add_argument("--json", action="store_true", help=f"print JSON instead of text: {shape}")


# ── kinds of record ───────────────────────────────────────────────────────────

KINDS: Final = {
    "conversation": "conversations",
    "entry": "entries",
    "task": "tasks",
    "submission": "submissions",
    "document": "documents",
}
"""The kinds of record, singular -> plural: every command takes either spelling of a kind."""
KIND_HELP: Final = "conversation, entry, task, submission or document (or the plural)"


def kind(text: str) -> str:
    """An argparse ``type=``: a kind of record in either spelling, as its singular."""

    word = text.strip().lower()
    for singular, plural in KINDS.items():
        if word in (singular, plural):
            return singular
    raise argparse.ArgumentTypeError(f"{text!r} is not a kind of record: {KIND_HELP}")


def plural_kind(text: str) -> str:
    """An argparse ``type=``: a kind of record in either spelling, as its plural."""

    return KINDS[kind(text)]


def store_argument(sub: argparse.ArgumentParser) -> None:
    """``PATH``, a store the command reads: a store this user may not read is refused first,
    as a permission problem (``audit.access``)."""

    sub.add_argument("path", metavar="PATH", help="the store's directory")
    sub.set_defaults(reads_store=True)


def nats_options(sub: argparse.ArgumentParser, store_required: bool = True) -> None:
    """``--nats``, ``--stream``, ``--store``: all required (restore, replica) or not (tail)."""

    required = store_required
    sub.add_argument(
        "--nats",
        required=required,
        metavar="URL",
        help="a NATS server URL, or several, comma-separated",
    )
    sub.add_argument(
        "--stream",
        required=required,
        metavar="S",
        help="the JetStream stream that carries the logs",
    )
    sub.add_argument(
        "--store",
        required=required,
        metavar="ID",
        help="the store's id (stats shows it); its subject is S.ID.log"
        + ("" if required else " (default: every store of the stream)"),
    )


def progress_option(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr even when it is not a terminal",
    )


def as_of_option(sub: argparse.ArgumentParser) -> None:
    """``--as-of SEQ|TIME``: read the store as it was right after a log sequence, or at a time
    (``seq_or_time`` splits what it parsed)."""

    sub.add_argument(
        "--as-of",
        type=point,
        metavar="SEQ|TIME",
        help="as the store was right after this log sequence, or at this time (ISO 8601)",
    )


# ── argument types (every one parsed by ``numbers``) ─────────────────────────────

sequence = argument(SEQUENCE)
count = argument(COUNT)
conversation_id = argument(CONVERSATION)
record_id = argument(RECORD_ID)
interval = argument(INTERVAL)
time_argument = typed(parse_time)
point = typed(numbers.point)
restore_point = typed(numbers.end_point)


def seq_or_time(parsed: tuple[str, int] | None) -> tuple[int | None, int | None]:
    """A parsed point (``point``, ``restore_point``) as ``(sequence, None)`` or ``(None, Unix
    ms)``; ``(None, None)`` when none was given."""

    if parsed is None:
        return None, None
    kind, at = parsed
    return (at, None) if kind == "seq" else (None, at)


# ── output ────────────────────────────────────────────────────────────────────


def print_json(value: Any) -> None:
    """One JSON document on stdout, lossless (surrogates escaped, integers of any size)."""

    print(to_json(value))


def cell_text(field: str, value: Any) -> str:
    """A record's value as text: a string as it is, a time (``TIME_FIELDS``: Unix ms) in ISO
    8601 as every command prints times, anything else as JSON."""

    if isinstance(value, str):
        return value
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and field.rsplit(".", 1)[-1] in TIME_FIELDS
        and 0 <= value <= MAX_TIME
    ):
        return numbers.format_time(value)
    return to_json(value)


TIME_FIELDS: Final = frozenset({"startedAt", "endedAt", "committedAt"})
"""The records' fields that hold a time, Unix ms (a document's ``createdAt`` and ``retiredAt``
are log sequences)."""


MAX_TIME: Final = 253402300799999
"""9999-12-31T23:59:59.999Z in Unix ms: a larger ``...At`` value is printed as the number."""


def print_outcome(label: str, holds: bool, summary: str, result: Any | None) -> int:
    """The outcome of a check (``verify``, ``verify-proof``): ``result`` as JSON when asked for
    (not None), else ``label: summary`` on stdout when it holds, on stderr when not; 0 or 1."""

    if result is not None:
        print_json(result)
    elif holds:
        print(f"{label}: {summary}")
    else:
        print(f"{label}: {summary}", file=sys.stderr)
    return EXIT_OK if holds else EXIT_DAMAGE


def readable(text: str) -> str:
    """Text for a terminal: lone surrogates shown as ``\\udXXX`` escapes, never an encoding error."""

    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def progress_on(args: argparse.Namespace) -> bool:
    return bool(args.progress) or sys.stderr.isatty()


_open_line = [False]  # a progress line is on stderr without its newline yet


def end_progress_line() -> None:
    """End a progress line left open (before a message of another kind)."""

    if _open_line[0]:
        _open_line[0] = False
        print(file=sys.stderr, flush=True)


class Progress:
    """Progress of a long command on stderr, at most a few times a second: done/total, rate and
    an ETA, or just done and rate when the total is unknown. Silent unless ``enabled``."""

    def __init__(self, label: str, total: int | None, enabled: bool, unit: str = "records") -> None:
        self.label, self.total, self.enabled, self.unit = label, total, enabled, unit
        self.started = self.last = time.monotonic()

    def __call__(self, done: int, total: int | None = None) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        total = self.total if total is None else total
        finished = total is not None and done >= total
        if now - self.last < 0.25 and not finished:
            return
        self.last = now
        rate = done / max(now - self.started, 1e-9)
        if total is None:
            text = f"{done:,} {self.unit}, {rate:,.0f} {self.unit}/s"
        else:
            eta = (total - done) / rate if rate > 0 else 0.0
            text = f"{done:,}/{total:,} {self.unit}, {rate:,.0f} {self.unit}/s, ETA {eta:.0f} s"
        _open_line[0] = not finished  # before: Ctrl-C may land as soon as it is written
        sys.stderr.write(f"\r{self.label}: {text} " + ("\n" if finished else ""))  # one write:
        sys.stderr.flush()  # Ctrl-C never lands between a line and its end

    def finish(self, done: int) -> None:
        """End the progress line (when the total was not known up front)."""

        if self.enabled and (self.total is None or done < self.total):
            self.total = done
            self.last = 0.0
            self(done, done)


# ── running ───────────────────────────────────────────────────────────────────


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` where the command is, inside ``asyncio.run``
    too (whose own handler only cancels its task at the next ``await``, so that a synchronous
    fold ran to its end): each ``finally`` and ``except BaseException`` on the way cleans up."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = None
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # ignored from the start: ``cmd &``
        try:
            previous = signal.signal(signal.SIGINT, interrupt)
        except ValueError:  # not the main thread: no signal is delivered to it anyway
            pass
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def note(text: str) -> None:
    """A line on stderr in one write: Ctrl-C never lands between the line and its end."""

    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def say_interrupted() -> None:
    """The one line a command stopped by Ctrl-C prints (on a line of its own after progress)."""

    end_progress_line()
    print("durable-log: interrupted", file=sys.stderr, flush=True)


_T = TypeVar("_T")


def run_until_signalled(work: Coroutine[Any, Any, _T], stopped: _T | int = EXIT_OK) -> _T | int:
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


__all__ = [
    "DAMAGE",
    "EPILOG",
    "EXIT_BUG",
    "EXIT_DAMAGE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "KINDS",
    "KIND_HELP",
    "KNOWN_REFUSALS",
    "PREFIX",
    "READ_ONLY",
    "SERVE_MODULES",
    "TIME_FIELDS",
    "Formatter",
    "Progress",
    "add_command",
    "cell_text",
    "conversation_id",
    "count",
    "install_hint",
    "interruptible",
    "interval",
    "json_option",
    "kind",
    "nats_options",
    "plural_kind",
    "point",
    "print_json",
    "print_outcome",
    "progress_on",
    "progress_option",
    "readable",
    "record_id",
    "refusal",
    "run_until_signalled",
    "say_interrupted",
    "sequence",
    "serve_missing",
    "store_argument",
    "time_argument",
    "usage",
]
