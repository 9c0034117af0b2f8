"""Giving a store's free pages back to the disk: LMDB's compacting copy swapped in place.

LMDB never shrinks ``data.mdb``: pages freed by a rebuild (the old projections) or by rewritten and
deleted rows stay in the file, reused only by later commits. ``compact`` writes LMDB's
compacting copy (every live page, renumbered, no free ones) beside the store, syncs it, and renames
it over ``data.mdb``. While it runs it holds the store's writer lock (no writer) and LMDB's own
exclusive lock on ``lock.mdb`` (no reader in any other process: one mapping the old file would
go on reading it after the swap), so it refuses a store in use, naming who holds it.

Safe to interrupt: until the rename, ``data.mdb`` is untouched and the copy lives in the staging
directory ``compacting/``, which the next ``compact`` or the next writer's open removes; the rename
is atomic, and the directory is synced after it. The copy is checked (it opens, its log holds the
same records up to the same head) before it replaces anything.

After a killed writer: a ``process`` writer's marker from this boot is removed once the synced
copy is in place (from an earlier boot the store is refused, ``StoreDamagedError``); a ``power``
writer's from this boot is settled before the copy (``settle_power_marker``: the file synced,
the marker removed, so no recovery can write the old file's meta pages over the new one), and
from an earlier boot the journal must be replayed first (``JournalReplayPending``; the
``durable-log compact`` command replays it by opening a power writer).
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import Final

import lmdb
import msgspec

from ..errors import StoreFormatError, StoreInUseError
from . import shared
from .storedir import (
    COMPACTING,
    MAX_DBS,
    check_not_truncated,
    clear_unsynced,
    refuse_after_crash,
    refuse_links,
    remove_leftover_copy,
    settle_power_marker,
    sync_directory,
    take_writer_lock,
)

_LOG_DB: Final = b"log"
_FLOCK = struct.Struct("hhqqi4x")
"""``struct flock`` on Linux x86-64/arm64: type, whence, start, len, pid."""


class CompactReport(msgspec.Struct, frozen=True):
    """File sizes before and after, and the log the copy was checked to hold."""

    before: int
    after: int
    records: int
    head: int


def compact(path: str | os.PathLike[str], zero_gaps: bool = False) -> CompactReport:
    """Replace the store's ``data.mdb`` with its compacting copy, in place and atomically.

    ``zero_gaps`` (an erasure's scrub): before the copy is checked, the unused middle of each of
    its branch and leaf pages (between the node pointers and the nodes) is written with zeros.
    LMDB copies a page whole, and that middle may hold what a page or a buffer LMDB reused held
    before: the bytes of a deleted or rewritten record."""

    path = os.path.abspath(os.fspath(path))
    data = os.path.join(path, "data.mdb")
    if not os.path.isfile(data):
        raise FileNotFoundError(f"No store at {path} (no data.mdb)")
    if os.path.realpath(path) in shared.open_envs:
        raise StoreInUseError(path, " in this process; close its handles first")
    refuse_links(path)
    lock_fd = take_writer_lock(path)
    try:
        refuse_after_crash(path)
        settle_power_marker(path)
        check_not_truncated(path)
        readers_fd = _lock_out_readers(path)
        try:
            remove_leftover_copy(path)
            staging = os.path.join(path, COMPACTING)
            try:
                os.mkdir(staging, 0o700)
                before = os.path.getsize(data)
                records, head = _copy(path, staging)
                copied = os.path.join(staging, "data.mdb")
                if zero_gaps:
                    zero_page_gaps(copied)
                _check_copy(staging, records, head)
                os.chmod(copied, os.stat(data).st_mode & 0o777)
                _fsync(copied)
                sync_directory(staging)
                os.rename(copied, data)
                sync_directory(path)
                clear_unsynced(path)  # the file in place now is whole on disk
                report = CompactReport(before, os.path.getsize(data), records, head)
            finally:  # done, a failed check or Ctrl-C: the store as it was or compacted, no copy
                _remove_copy(path)
            return report
        finally:
            os.close(readers_fd)
    finally:
        os.close(lock_fd)


def _remove_copy(path: str) -> None:
    """``remove_leftover_copy``, finished even when a Ctrl-C lands during it (the interrupt is
    raised again once the copy is gone): an interrupted command leaves nothing beside the store."""

    interrupted: KeyboardInterrupt | None = None
    while True:
        try:
            remove_leftover_copy(path)
        except KeyboardInterrupt as error:
            interrupted = error
            continue
        break
    if interrupted is not None:
        raise interrupted


def _lock_out_readers(path: str) -> int:
    """Take LMDB's exclusive lock (a write lock on byte 0 of ``lock.mdb``, which every process
    with the environment open holds shared); the open file, to close once the swap is done.
    A reader opening meanwhile waits for it in LMDB, then maps the new file."""

    fd = os.open(
        os.path.join(path, "lock.mdb"), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600
    )
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise StoreInUseError(
            path, f" by process {holder}" if holder else " by another process"
        ) from None
    return fd


def _lock_holder(fd: int) -> int | None:
    """One process holding a lock on byte 0 of ``fd``'s file (``F_GETLK``), if it says."""

    try:
        answer = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    except OSError:
        return None
    kind, _, _, _, pid = _FLOCK.unpack(answer)
    return pid if kind != fcntl.F_UNLCK and pid > 0 else None


def _copy(path: str, staging: str) -> tuple[int, int]:
    """LMDB's compacting copy into ``staging``, from one read snapshot; the log's record count
    and head in that snapshot. The source is opened without LMDB's lock file: this process holds
    its exclusive lock, which LMDB's own open and close of it would release."""

    env = lmdb.open(path, readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    try:
        records, head = _log_extent(env)
        env.copy(staging, compact=True)
        return records, head
    finally:
        env.close()


_PAGE_HEADER = struct.Struct("<QHHHH")
"""An LMDB page's header: page number, pad, flags, lower, upper (``mp_pages`` of an overflow
page's first page overlays lower and upper)."""
_P_BRANCH, _P_LEAF, _P_OVERFLOW, _P_LEAF2 = 0x01, 0x02, 0x04, 0x20


def zero_page_gaps(file: str) -> None:
    """Zeros over the unused middle ``[lower, upper)`` of every branch and leaf page of the
    LMDB file ``file`` (not a LEAF2 page, whose fixed-size keys start at its header; overflow
    pages are skipped whole)."""

    env = lmdb.open(file, readonly=True, lock=False, max_dbs=MAX_DBS, subdir=False)
    try:
        size = env.stat()["psize"]
    finally:
        env.close()
    fd = os.open(file, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        pages = os.fstat(fd).st_size // size
        number = 2  # pages 0 and 1 are the meta pages
        while number < pages:
            header = os.pread(fd, _PAGE_HEADER.size, number * size)
            _, _, flags, lower, upper = _PAGE_HEADER.unpack(header)
            if flags & _P_OVERFLOW:
                number += max(1, lower | upper << 16)  # mp_pages: the run's length
                continue
            if (
                flags & (_P_BRANCH | _P_LEAF)
                and not flags & _P_LEAF2
                and _PAGE_HEADER.size <= lower < upper <= size
            ):
                os.pwrite(fd, bytes(upper - lower), number * size + lower)
            number += 1
    finally:
        os.close(fd)


def _check_copy(staging: str, records: int, head: int) -> None:
    env = lmdb.open(staging, readonly=True, lock=False, max_dbs=MAX_DBS, subdir=True)
    try:
        found = _log_extent(env)
    finally:
        env.close()
    if found != (records, head):
        raise StoreFormatError(
            f"The compacting copy in {staging} holds {found[0]} log records up to {found[1]}, not "
            f"{records} up to {head}; the store was left as it was"
        )


def _log_extent(env: lmdb.Environment) -> tuple[int, int]:
    with env.begin() as txn:
        if txn.get(_LOG_DB) is None:
            return 0, 0
        db = env.open_db(_LOG_DB, txn=txn, create=False)
        records = txn.stat(db)["entries"]
        cursor = txn.cursor(db)
        head = int.from_bytes(cursor.key(), "big") if cursor.last() else 0
        return records, head


def _fsync(file: str) -> None:
    fd = os.open(file, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "CompactReport",
    "compact",
    "zero_page_gaps",
]
