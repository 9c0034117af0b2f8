"""A pi-durable store to import from, read without ever being written.

pi-durable's own backends write what they open: its SQLite backend creates its tables in any file
(another application's database, an empty file) and its JSONL backend truncates a torn tail. So an
import never hands them the source. A SQLite source is checked first (a SQLite file whose schema
is pi-durable's, at a version this pi-durable reads), opened read-only (``mode=ro``; immutable
when it has no write-ahead log to read, so not even a ``-shm`` file is made beside it) and copied
with SQLite's backup API into a scratch directory; a JSONL directory is copied file by file. The
backends open the copy, which is removed at the end."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from typing import Any, Final
from urllib.parse import quote

from pi_durable.context import BACKGROUND_CONTEXT

from ..errors import NotPiDurableError

SQLITE_HEADER: Final = b"SQLite format 3\x00"
JSONL_MAIN: Final = "main.jsonl"


def check_sqlite_source(path: str) -> None:
    """Refuse a file that is not a pi-durable SQLite store, reading it only: a SQLite header, then
    pi-durable's tables and a schema version it knows."""

    from pi_durable.storage.sqlite import CURRENT_SQLITE_SCHEMA_VERSION
    from pi_durable.storage.sqlite.schema import TABLE_NAMES

    with open(path, "rb") as data:
        header = data.read(100)
    if len(header) < 100 or not header.startswith(SQLITE_HEADER):
        what = "an empty file" if not header else "not a SQLite database"
        raise NotPiDurableError(
            f"{path} is not a pi-durable store: {what} (nothing was read or changed)"
        )
    with closing(_connect_read_only(path)) as source:
        try:
            tables = {
                row[0]
                for row in source.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            missing = sorted(set(TABLE_NAMES.values()) - tables)
            if missing:
                raise NotPiDurableError(
                    f"{path} is a SQLite database but not a pi-durable store: it has no table {', '.join(missing)} "
                    "(nothing was read or changed)"
                )
            row = source.execute(
                f"SELECT version FROM {TABLE_NAMES['durableSchema']} WHERE singleton = 1"
            ).fetchone()
        except sqlite3.Error as error:
            raise NotPiDurableError(
                f"{path} cannot be read as a pi-durable SQLite store ({error})"
            ) from None
    version = row[0] if row is not None else None
    if type(version) is not int or not 1 <= version <= CURRENT_SQLITE_SCHEMA_VERSION:
        raise NotPiDurableError(
            f"{path} holds pi-durable schema version {version!r}; this pi-durable reads versions 1 to "
            f"{CURRENT_SQLITE_SCHEMA_VERSION}"
        )


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A connection that cannot write ``path``: immutable unless a write-ahead log holds commits
    not yet in the file (then read-only, reading the log through the files already beside it)."""

    wal = path + "-wal"
    pending = os.path.isfile(wal) and os.path.getsize(wal) > 0
    uri = f"file:{quote(os.path.abspath(path))}?mode=ro" + ("" if pending else "&immutable=1")
    return sqlite3.connect(uri, uri=True, isolation_level=None)


def _snapshot_sqlite(path: str, copy: str) -> None:
    with closing(_connect_read_only(path)) as source, closing(sqlite3.connect(copy)) as target:
        try:
            source.backup(target)
        except sqlite3.Error as error:
            raise NotPiDurableError(
                f"{path} cannot be read as a pi-durable SQLite store ({error})"
            ) from None


def check_source(path: str) -> str:
    """``"jsonl"`` or ``"sqlite"``: the kind of pi-durable store at ``path``, checked by reading
    only; anything else is refused (``FileNotFoundError``, ``NotPiDurableError``)."""

    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, JSONL_MAIN)):
            raise FileNotFoundError(f"No pi-durable JSONL store in {path} (no {JSONL_MAIN})")
        return "jsonl"
    if not os.path.exists(path):
        raise FileNotFoundError(f"No pi-durable store at {path}")
    if not os.path.isfile(path):
        raise NotPiDurableError(
            f"{path} is not a pi-durable store (neither a SQLite file nor a JSONL directory)"
        )
    check_sqlite_source(path)
    return "sqlite"


@asynccontextmanager
async def open_read_only(path: str, scratch: str | None = None) -> AsyncIterator[Any]:
    """The pi-durable ``Storage`` of the store at ``path`` (a SQLite file or a JSONL directory),
    opened on a copy made in a scratch directory under ``scratch`` (default: the system's) and
    removed afterwards: the source itself is only ever read."""

    kind = check_source(path)
    with tempfile.TemporaryDirectory(prefix=".durable-log-import-source-", dir=scratch) as copy_dir:
        if kind == "jsonl":
            from pi_durable.env.posix import PosixExecutionEnv
            from pi_durable.storage.jsonl import JsonlStorage

            copy = os.path.join(copy_dir, "jsonl")
            shutil.copytree(path, copy, symlinks=True)
            try:
                source: Any = await JsonlStorage.open(copy, PosixExecutionEnv(), BACKGROUND_CONTEXT)
            except Exception as error:  # whatever pi-durable's reader says of a file it cannot read
                raise NotPiDurableError(
                    f"{path} cannot be read as a pi-durable JSONL store ({type(error).__name__}: {error})"
                ) from None
        else:
            from pi_durable.storage.sqlite.posix import open_posix_sqlite_storage

            copy = os.path.join(copy_dir, "source.sqlite")
            _snapshot_sqlite(path, copy)
            source = await open_posix_sqlite_storage(copy)
        try:
            yield source
        finally:
            await source.close(BACKGROUND_CONTEXT)


__all__ = [
    "JSONL_MAIN",
    "SQLITE_HEADER",
    "check_source",
    "check_sqlite_source",
    "open_read_only",
]
