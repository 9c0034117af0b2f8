"""The store directory on disk: how it is made, locked and checked before LMDB maps it.

A store is a directory (0700) holding LMDB's ``data.mdb`` and ``lock.mdb``, our ``writer.lock``
(``flock``: one writer process at a time, named when refused) and, while a ``process``-mode writer
may have commits the disk does not hold in order, ``process.unsynced`` (with the boot id, so an
open after an OS crash refuses the store). New files and renames are made durable with their
directory (fsync(2) of a file does not persist its name): ``sync_directory`` is the one way this
package does it.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import shutil
import struct
from typing import BinaryIO, Final

import lmdb

from ..errors import (
    JournalReplayPending,
    StoreDamagedError,
    StoreFormatError,
    StoreFullError,
    TruncatedStoreError,
    WriterLockedError,
)

MAX_DBS: Final = 256
"""Named databases per store: the log, the core projections (two generations during a rebuild)
and user projections."""

WRITER_LOCK: Final = "writer.lock"


STAGING: Final = "creating"


COMPACTING: Final = "compacting"
"""The staging directory of a compacting copy (``log.compact``), inside the store directory."""


UNSYNCED_FILE: Final = "process.unsynced"
"""Present while a ``process``-mode writer may have commits the disk does not hold in order."""


BOOT_ID: Final = "/proc/sys/kernel/random/boot_id"


POWER_FILE: Final = "power.unsynced"
"""Present while a journaled ``power`` writer may have commits that only its journal holds
(``log.journal``): the boot id, then the writer life's epoch (which checkpoints to trust)."""


def make_private_dir(path: str) -> bool:
    """Create the store directory; True when it did not exist."""

    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise NotADirectoryError(f"{path} exists and is not a directory") from None
        return False
    return True


def create_data_file(path: str, map_size: int) -> None:
    """Make a new data.mdb appear whole or not at all. LMDB writes a new file's two meta pages
    without syncing them, so a power cut right after leaves a file no open accepts
    (``MDB_INVALID``); here it is made in a staging directory, synced, renamed in, and the
    directory synced (fsync of a file does not make its name durable: fsync(2))."""

    staging = os.path.join(path, STAGING)
    shutil.rmtree(staging, ignore_errors=True)  # left by a cut during an earlier creation
    os.mkdir(staging, 0o700)
    env = lmdb.open(staging, map_size=map_size, max_dbs=MAX_DBS, mode=0o600, lock=False)
    try:
        env.sync(True)
    finally:
        env.close()
    os.rename(os.path.join(staging, "data.mdb"), os.path.join(path, "data.mdb"))
    sync_directory(path)
    shutil.rmtree(staging, ignore_errors=True)


ALLOCATION_STEP: Final = 256 << 10
"""The least a mapped ``data.mdb`` grows by at once (``grow_allocation``)."""
ALLOCATION_GRAIN: Final = mmap.PAGESIZE
"""Mapped sizes are multiples of this: LMDB maps whole OS pages."""
GROWTH_CAP: Final = 64 << 20
"""A mapped file doubles until its growth would pass this, then grows by this much at once,
and beyond ``ALLOCATION_SHARE`` times this by a sixteenth of its size. Each growth remaps the
file, and every page a commit then writes faults once more (on ext4, with an inode update each):
about 3 ms a growth under 64 agents, so growth comes in few, big steps. What it allocates
beyond LMDB's pages is disk the open store holds, given back at a clean close
(``trim_data_file``)."""
ALLOCATION_SHARE: Final = 16
"""Beyond ``ALLOCATION_SHARE * GROWTH_CAP`` (1 GiB) a mapped file grows by its size over this."""


def _grain(size: int) -> int:
    return -(-size // ALLOCATION_GRAIN) * ALLOCATION_GRAIN


def mapped_size(path: str) -> int:
    """The map a writer that writes pages through it (``Mode.mapped``) opens ``data.mdb`` with:
    the file as it is (what LMDB uses after a clean close, what was allocated after a crash), so
    an open neither changes the file nor needs room on the disk; the first write that needs
    more grows it (``grow_allocation``)."""

    return _grain(max(os.stat(os.path.join(path, "data.mdb")).st_size, ALLOCATION_GRAIN))


def next_allocation(size: int, growths: int = 1) -> int:
    """The mapped size after ``size`` was found full ``growths`` times in a row by one write
    (``GROWTH_CAP``), twice the step at each growth in a row: a big transaction is run again a
    few times, not once per step."""

    step = max(min(size, GROWTH_CAP), size // ALLOCATION_SHARE, ALLOCATION_STEP)
    return _grain(size + (step << min(max(growths, 1) - 1, 16)))


def grow_allocation(path: str, size: int, growths: int = 1) -> int:
    """Allocate ``data.mdb`` up to ``next_allocation(size, growths)`` and return that size; on a
    disk without room for it, halve the step down to ``ALLOCATION_STEP`` before giving up with
    ``StoreFullError`` (a commit that needs a few pages must not fail for want of a big step)."""

    step = next_allocation(size, growths) - size
    while True:
        try:
            allocate(path, size + step)
            return size + step
        except StoreFullError:
            if step <= ALLOCATION_STEP:
                raise
            step = max(ALLOCATION_STEP, _grain(step // 2))


def trim_data_file(path: str, used: int) -> None:
    """Give back what a mapped writer allocated beyond the ``used`` bytes of LMDB's pages, at a
    clean close (the data synced, the environment closed, the writer lock still held): past its
    last page LMDB holds nothing, and a reader in another process touches no page past the last
    one its snapshot names. Cut or not by a crash, the file is sound either way."""

    file = os.path.join(path, "data.mdb")
    used = _grain(used)
    try:
        if os.stat(file).st_size > used:
            os.truncate(file, used)
    except OSError:
        pass  # the next writer maps what is there


IN_PLACE_FILE_SYSTEMS: Final = frozenset({"ext2", "ext3", "ext4", "xfs", "tmpfs"})
"""File systems that overwrite an allocated block where it is: a page written through the map
there needs no new block, so ``allocate`` leaves nothing for a full disk to refuse later. A
copy-on-write one (btrfs, ZFS) writes every overwrite to a new block, which a full disk would
refuse with a SIGBUS; there, and wherever the type is not known, LMDB writes with ``pwrite``."""


def overwrites_in_place(path: str, mountinfo: str = "/proc/self/mountinfo") -> bool:
    """Whether the file system holding ``path`` is one of ``IN_PLACE_FILE_SYSTEMS`` (the mount
    whose point is the longest prefix of its real path, the last such in ``mountinfo``)."""

    real = os.path.realpath(path)
    best, kind = -1, ""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split(" - ", 1)
                head, tail = fields[0].split(), fields[1].split() if len(fields) == 2 else []
                if len(head) < 5 or not tail:
                    continue
                point = head[4].replace("\\040", " ").replace("\\011", "\t")
                point = point.replace("\\012", "\n").replace("\\134", "\\")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= best:
                    best, kind = len(point), tail[0]
    except OSError:
        return False
    return kind in IN_PLACE_FILE_SYSTEMS


def allocate(path: str, size: int) -> None:
    """Give ``data.mdb`` all the blocks of its first ``size`` bytes (``posix_fallocate``), before
    LMDB maps them writable. A writer that writes pages through the map (``MDB_WRITEMAP``)
    touches file blocks from its own memory, where a block the disk has no room for is not an
    error but a SIGBUS that kills the process; so the map never goes past what is allocated, and a
    full disk is ``StoreFullError`` here, before any transaction writes, with the store as it
    was."""

    file = os.path.join(path, "data.mdb")
    descriptor = os.open(file, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.posix_fallocate(descriptor, 0, size)
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise StoreFullError(
                error.errno,
                f"No space left to grow {file} to {size} bytes: {os.strerror(error.errno)}; "
                "nothing was written, free some space and commit again",
            ) from error
        raise
    finally:
        os.close(descriptor)


def remove_leftover_copy(path: str) -> None:
    """Remove the staging directory an interrupted compaction left (``data.mdb`` was never
    touched before its rename). Only a holder of the writer lock calls this: a running
    compaction holds it."""

    staging = os.path.join(path, COMPACTING)
    if not os.path.lexists(staging):
        return
    if os.path.isdir(staging) and not os.path.islink(staging):
        shutil.rmtree(staging)
    else:
        os.unlink(staging)
    sync_directory(path)


def boot_id() -> bytes | None:
    try:
        with open(BOOT_ID, "rb") as file:
            return file.read().strip()
    except OSError:
        return None


def refuse_after_crash(path: str) -> None:
    """Refuse a store a ``process``-mode writer had open when the machine stopped."""

    marker = os.path.join(path, UNSYNCED_FILE)
    try:
        with open(marker, "rb") as file:
            boot = file.read().strip()
    except FileNotFoundError:
        return
    current = boot_id()
    if current is not None and boot != current:
        raise StoreDamagedError(path, marker)


def mark_unsynced(path: str) -> None:
    """Write the boot id to ``process.unsynced`` and make it durable before LMDB writes a page."""

    _write_marker(path, UNSYNCED_FILE, (boot_id() or b"unknown") + b"\n")


def mark_power(path: str, epoch: int) -> None:
    """Write ``power.unsynced`` (boot id, epoch) and make it durable before LMDB writes a page
    unsynced."""

    _write_marker(path, POWER_FILE, (boot_id() or b"unknown") + b"\n" + b"%016x\n" % epoch)


def _write_marker(path: str, name: str, content: bytes) -> None:
    """A marker made durable, with its directory entry, and replaced whole: written in place, a
    writer killed between the truncation and the write left an empty marker, which the next
    open read as another boot's and refused the store as damaged by an OS crash that never
    happened (found by the crash harness, a kill during an open)."""

    replace_file(os.path.join(path, name), content, durable=True)


def replace_file(file: str, content: bytes, durable: bool) -> None:
    """Put ``content`` in ``file`` whole or not at all (a private staged copy renamed over it);
    ``durable``: synced, with its directory entry, before this returns. On failure the staged
    copy is removed and the error raised."""

    staged = f"{file}.{os.getpid()}.tmp"
    try:
        flags = (
            os.O_WRONLY
            | os.O_CREAT
            | os.O_TRUNC
            | getattr(os, "O_NOFOLLOW", 0)
            | getattr(os, "O_CLOEXEC", 0)
        )
        fd = os.open(staged, flags, 0o600)
        try:
            os.write(fd, content)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staged, file)
    except BaseException:
        try:
            os.unlink(staged)
        except OSError:
            pass
        raise
    if durable:
        sync_directory(os.path.dirname(file))


def read_power_marker(path: str) -> tuple[bytes, int | None] | None:
    """``power.unsynced``'s (boot id, epoch); the epoch is None when the file is not whole (cut
    while it was written: no checkpoint of its life was trusted yet). None when absent."""

    try:
        with open(os.path.join(path, POWER_FILE), "rb") as file:
            lines = file.read().split(b"\n")
    except FileNotFoundError:
        return None
    try:
        epoch: int | None = int(lines[1], 16)
    except (IndexError, ValueError):
        epoch = None
    return lines[0].strip(), epoch


def settle_power_marker(path: str) -> None:
    """Before a command that replaces ``data.mdb`` without a power writer's open (``compact``):
    a power writer killed on this boot left every commit it acknowledged in the page cache, so
    the file is synced and its marker is obsolete (removed first: its checkpoints hold the meta
    pages of the file being replaced, which a later recovery must never write over another
    file). One from another boot (a power cut since) needs its journal replayed by a power
    writer's open first: ``JournalReplayPending``."""

    marker = read_power_marker(path)
    if marker is None:
        return
    current = boot_id()
    if current is None or marker[0] != current:
        raise JournalReplayPending(path, "was open in a power-mode writer when the machine stopped")
    fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    clear_unsynced(path, POWER_FILE)


def clear_markers(path: str) -> None:
    """A writer that has made the whole file durable (synced it, with this boot's page cache
    holding every commit: ``refuse_after_crash`` passed) removes every marker that made
    obsolete: its own, and a ``process`` writer's killed earlier on this boot."""

    clear_unsynced(path, POWER_FILE)
    clear_unsynced(path, UNSYNCED_FILE)


def clear_unsynced(path: str, name: str = UNSYNCED_FILE) -> None:
    """After the final sync: the disk holds every commit, in order."""

    try:
        os.unlink(os.path.join(path, name))
    except FileNotFoundError:
        return
    sync_directory(path)


def sync_directory(path: str) -> None:
    """Make the directory's entries durable: fsync of a file does not persist the file's name
    (fsync(2)), so without this a power cut can drop a new data.mdb with every commit in it."""

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def take_writer_lock(path: str) -> int:
    lock_path = os.path.join(path, WRITER_LOCK)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(lock_path, flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            os.close(fd)
            raise
        holders = lock_holders(fd)
        os.close(fd)
        named = ", ".join(str(pid) for pid in holders)
        raise WriterLockedError(path, f" by process {named}" if holders else "") from None
    os.pwrite(fd, f"{os.getpid():<20}".encode(), 0)  # fixed width: no truncate, which can cost ms
    return fd


def writer_holders(path: str | os.PathLike[str]) -> list[int]:
    """The processes holding the store's writer lock now (read-only: never takes the lock, which
    would refuse a writer starting at that moment); none when no writer has the store open."""

    try:
        fd = os.open(
            os.path.join(path, WRITER_LOCK),
            os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
        )
    except OSError:
        return []
    try:
        listed = _listed_holders(fd)
        return listed if listed is not None else _named_holder(fd)
    finally:
        os.close(fd)


def lock_holders(fd: int) -> list[int]:
    """The processes holding ``flock`` on the file ``fd`` opens, as the kernel lists them.

    ``writer.lock`` holds the pid of the writer that last took it, which goes stale (a writer that
    forked, one that died before another wrote over it); the kernel's lock table does not. Where
    it cannot be read, the pid in the file is named only if that process is alive.
    """

    holders = _listed_holders(fd)
    if holders:
        return holders
    return _named_holder(fd)


def _listed_holders(fd: int) -> list[int] | None:
    """The holders the kernel's lock table lists (``None`` where it cannot be read)."""

    stat = os.fstat(fd)
    inode = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    try:
        with open("/proc/locks") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    holders = []
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == inode and fields[4].isdigit():
            holders.append(int(fields[4]))  # waiters are listed as "->", so they never match
    return sorted(set(holders))


def _named_holder(fd: int) -> list[int]:
    """The pid written in the lock file, if that process is alive."""

    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    if not text.isdigit():
        return []
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [int(text)]


def refuse_links(path: str) -> None:
    """LMDB would follow a planted link and write the store (or its lock table) elsewhere."""

    for name in ("data.mdb", "lock.mdb", WRITER_LOCK):
        file = os.path.join(path, name)
        if os.path.islink(file):
            raise StoreFormatError(
                f"{file} is a symbolic link; refusing to follow it out of the store directory"
            )


_META_OFFSET: Final = 16
"""LMDB's page header; ``MDB_meta`` follows it on each of the two meta pages (64-bit layout)."""


_META = struct.Struct("=II8x8xI44x48xQQ")
"""magic, version, (address, map size), the free DB's ``md_pad`` (the page size), (the rest of
both DB records), ``mm_last_pg``, ``mm_txnid``."""


_MAGIC: Final = 0xBEEFC0DE
_FREE_ROOT_OFFSET: Final = _META_OFFSET + 24 + 40
"""``md_root`` of the free pages' database (``FREE_DBI``), the first record after magic, version,
address and map size."""
_PAGE = struct.Struct("=Q2xHHH")  # pgno, (pad), flags, lower, upper
_NODE = struct.Struct("=HHHH")  # lo, hi, flags, key size
_BRANCH, _LEAF, _BIG_DATA = 0x01, 0x02, 0x01


def _all_free(
    handle: BinaryIO, page_size: int, file_pages: int, free_root: int, pages: range
) -> bool:
    """Whether every page of ``pages`` (past the end of the file) is on LMDB's list of free pages.

    LMDB does not write a page it allocated and freed in the same transaction (a "loose" page):
    when such pages are the highest ones, the newest meta page names a last page past the end of
    the file, and nothing reachable lives there. Found by the crash harness after a kill during a
    rebuild (a healthy 1.3 GB store 205 pages short, all free, was refused). The free list is
    read with plain file reads; any of its pages past the end means it cannot be trusted."""

    wanted = set(pages)
    stack, seen = [free_root], 0
    while stack and wanted:
        number = stack.pop()
        seen += 1
        if number >= file_pages or seen > file_pages:
            return False
        handle.seek(number * page_size)
        page = handle.read(page_size)
        _, flags, lower, _ = _PAGE.unpack_from(page, 0)
        for index in range(max(0, (lower - _PAGE.size) // 2)):
            (offset,) = struct.unpack_from("=H", page, _PAGE.size + 2 * index)
            if offset + _NODE.size > page_size:
                return False
            low, high, node_flags, key_size = _NODE.unpack_from(page, offset)
            if flags & _BRANCH:
                stack.append(low | high << 16 | node_flags << 32)
                continue
            if not flags & _LEAF:
                return False
            size, start = low | high << 16, offset + _NODE.size + key_size
            if node_flags & _BIG_DATA:
                (overflow,) = struct.unpack_from("=Q", page, start)
                if overflow >= file_pages:
                    return False
                handle.seek(overflow * page_size + _PAGE.size)
                data = handle.read(size)
            else:
                data = page[start : start + size]
            if len(data) < 8:
                return False
            (count,) = struct.unpack_from("=Q", data, 0)
            if 8 + 8 * count > len(data):
                return False
            wanted.difference_update(struct.unpack_from(f"={count}Q", data, 8))
    return not wanted


def check_not_truncated(path: str) -> None:
    """Refuse a ``data.mdb`` shorter than the last page its newest meta page names.

    LMDB maps the file and trusts it: a reader touching a page past the end dies from SIGBUS, and
    a writer would commit on top of pages that are gone. So the meta pages are read with plain
    file reads first, and the damage is named before LMDB maps anything.
    """

    file = os.path.join(path, "data.mdb")
    try:
        handle = open(file, "rb")
    except FileNotFoundError:
        return  # a new store: LMDB creates it
    with handle:
        head = handle.read(_META_OFFSET + _META.size)
        if not head:
            return  # LMDB initialises an empty file (a store whose creation never got further)
        if len(head) < _META_OFFSET + _META.size:
            size = os.fstat(handle.fileno()).st_size
            raise TruncatedStoreError(
                f"{file} is truncated: {size} bytes cannot hold LMDB's meta pages; "
                "restore the store from a copy"
            )
        magic, _, page_size, _, _ = _META.unpack_from(head, _META_OFFSET)
        if magic != _MAGIC or page_size < 512 or page_size & (page_size - 1):
            return  # not an LMDB file, or one this layout does not describe: LMDB says so itself
        metas = []
        for page in (0, 1):
            handle.seek(page * page_size)
            data = handle.read(_META_OFFSET + _META.size)
            if len(data) == _META_OFFSET + _META.size:
                magic, _, _, last_page, txnid = _META.unpack_from(data, _META_OFFSET)
                if magic == _MAGIC:
                    (free_root,) = struct.unpack_from(
                        "=Q", data, _FREE_ROOT_OFFSET
                    )  # inside _META's span
                    metas.append((txnid, last_page, free_root))
        # Only now the size: a writer elsewhere writes a commit's pages before its meta page and
        # never shrinks the file, so a size taken after the metas were read covers them.
        size = os.fstat(handle.fileno()).st_size
        if len(metas) == 2:
            _, last_page, free_root = max(metas)  # the meta LMDB will use: the newest transaction's
            if size < (last_page + 1) * page_size and _all_free(
                handle,
                page_size,
                size // page_size,
                free_root,
                range(size // page_size, last_page + 1),
            ):
                return  # the pages past the end were never written and are free: nothing lives there
    if len(metas) < 2:
        raise TruncatedStoreError(
            f"{file} is truncated: {size} bytes cannot hold LMDB's two meta pages of "
            f"{page_size} bytes; restore the store from a copy"
        )
    _, last_page, _ = max(metas)  # the meta LMDB will use: the newest transaction's
    needed = (last_page + 1) * page_size
    if size < needed:
        raise TruncatedStoreError(
            f"{file} is truncated: it holds {size} bytes, but its last page ({last_page}, "
            f"{page_size} bytes each) ends at {needed}; {needed - size} bytes are missing. "
            "Restore the store from a copy (opening it would read past the end of the file)"
        )


__all__ = [
    "ALLOCATION_GRAIN",
    "ALLOCATION_SHARE",
    "ALLOCATION_STEP",
    "BOOT_ID",
    "COMPACTING",
    "GROWTH_CAP",
    "IN_PLACE_FILE_SYSTEMS",
    "MAX_DBS",
    "POWER_FILE",
    "STAGING",
    "UNSYNCED_FILE",
    "WRITER_LOCK",
    "allocate",
    "boot_id",
    "check_not_truncated",
    "clear_markers",
    "clear_unsynced",
    "create_data_file",
    "grow_allocation",
    "lock_holders",
    "make_private_dir",
    "mapped_size",
    "mark_power",
    "mark_unsynced",
    "next_allocation",
    "overwrites_in_place",
    "read_power_marker",
    "refuse_after_crash",
    "refuse_links",
    "remove_leftover_copy",
    "replace_file",
    "settle_power_marker",
    "sync_directory",
    "take_writer_lock",
    "trim_data_file",
]
