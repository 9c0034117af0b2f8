"""The exit statuses of ``durable-log`` and the help text that documents them: all the
top-level parser needs, so that ``--version`` and ``--help`` load nothing of the engine (the
shared options and argument types, in ``common``, load it)."""

from __future__ import annotations

import argparse
from typing import Final

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


SEE_EXIT_STATUS: Final = """\
exit status: 0 done, 1 damage found, 2 could not run, 3 a bug, 130 Ctrl-C;
what each means, and the time formats: durable-log --help, or docs/operations.md
(Exit status and inputs)"""
"""What each command's ``--help`` ends with, instead of repeating the whole of ``EPILOG``."""


class Formatter(argparse.HelpFormatter):
    """Descriptions wrapped to the terminal; the epilog (a table and examples) kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


__all__ = [
    "EPILOG",
    "EXIT_BUG",
    "EXIT_DAMAGE",
    "EXIT_OK",
    "EXIT_USAGE",
    "SEE_EXIT_STATUS",
    "Formatter",
]
