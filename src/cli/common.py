"""What every family of ``durable-log`` commands shares: exit codes and the refusals that map to
them, argument types (sequences, counts, ISO 8601 times), the shared options, progress on stderr,
JSON output, and running until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
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
)

# ── exit codes ────────────────────────────────────────────────────────────────

EXIT_OK: Final = 0
EXIT_DAMAGE: Final = 1
"""The store is damaged: a log record or projection row fails its checksum, data.mdb is truncated,
or verify found a projection that differs from the log; or a stream carries a message that is
not a sound record of its store (tail --nats, restore, replica)."""
EXIT_USAGE: Final = 2
"""The command could not run: bad arguments, no store at the path, the writer lock held, nothing
found by show, an import source that is not an export, no NATS server answering, no such stream,
nothing of the store on it."""
EXIT_BUG: Final = 3
"""An unexpected error: a bug in durable-log or the engine. Its traceback is printed to stderr."""
EXIT_INTERRUPTED: Final = 130
"""Stopped by Ctrl-C (SIGINT) after cleaning up: 128 + SIGINT, as a shell reports a command the
signal ended."""

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

EPILOG: Final = """\
exit status:
  0  success
  1  damage found: a log record or projection row fails its checksum, data.mdb
     is truncated, or verify found projections that differ from the log; a
     stream message that is not a sound record of its store (tail --nats,
     restore, replica); a failed user projection (projections)
  2  the command could not run: bad arguments or ranges, no store at PATH, a
     store locked by another writer, nothing found by show, a malformed import,
     no NATS server answering, no such stream, nothing of the store on it
  3  an unexpected error (a bug): its traceback is printed; please report it.
     --debug (before the command) prints the traceback of any error
  130  stopped by Ctrl-C (SIGINT), after cleaning up: nothing half written
     is left and the store is as it was

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


def install_hint(extra: str) -> str:
    """How to install this package with ``extra``: from a checkout or from its wheel (it is not
    on a package index)."""

    from importlib import (
        metadata,
    )  # only when a refusal needs it: it is slow to import at every start

    try:
        version = metadata.version("pi-durable-lmdb")
    except metadata.PackageNotFoundError:
        version = "VERSION"
    return (
        f"from a checkout, pip install '/path/to/pi-durable-lmdb[{extra}]'; "
        f"from a wheel, pip install 'pi_durable_lmdb-{version}-py3-none-any.whl[{extra}]'"
    )


SERVE_MODULES: Final = ("aiohttp", "jinja2", "prometheus_client")
"""What ``serve`` needs: the ``[web]`` extra."""


def serve_missing(missing: str) -> ValueError:
    """The refusal of ``serve`` without the ``[web]`` extra (exit 2)."""

    return usage(
        f"durable-log serve needs the [web] extra ({missing} is not installed): {install_hint('web')}"
    )


def usage(message: str) -> ValueError:
    """A refusal the command names (exit 2)."""

    return ValueError(message)


# ── sub-parsers and shared options ─────────────────────────────────────────────


class Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal; the epilog (a table and examples) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def add_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help: str,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """A sub-command with the exit codes, time format and examples as its epilog."""

    return commands.add_parser(
        name, help=help, description=description or help, epilog=EPILOG, formatter_class=Formatter
    )


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


# ── argument types (every one parsed by ``numbers``) ─────────────────────────────

sequence = argument(SEQUENCE)
count = argument(COUNT)
conversation_id = argument(CONVERSATION)
record_id = argument(RECORD_ID)
interval = argument(INTERVAL)
time_argument = typed(parse_time)
point = typed(numbers.point)


# ── output ────────────────────────────────────────────────────────────────────


def print_json(value: Any) -> None:
    """One JSON document on stdout, lossless (surrogates escaped, integers of any size)."""

    print(to_json(value))


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
