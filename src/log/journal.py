"""The write-ahead journal of ``power`` durability: one device flush per commit (or group).

Why: LMDB's own durable commit flushes the device twice (``fdatasync`` of the data pages, then
the meta page through an ``O_DSYNC`` descriptor). A ``power`` writer instead runs LMDB without
syncing (``MDB_NOSYNC``) and, inside each write transaction that appends log records, right
before LMDB's commit, writes those records to this journal as one frame with one ``pwrite`` and
one ``fdatasync``: the only flush a commit waits for. Before, not after, LMDB's commit: a commit
is visible to every reader (other processes included) as soon as LMDB commits it, and nothing
may be visible that a power cut could take back. A frame whose transaction then fails to commit
is unmade (``abandon``) before the failure is reported.

Checkpoints (``log.journaled``): ``data.mdb`` is synced (``env.sync(True)``) off the commit
path, and a *checkpoint record* is made durable: a copy of LMDB's two meta pages as they were
when the checkpoint began, and the journal segment where records after it start. A read
transaction of the writer stays pinned on that state until the next checkpoint is durable:
LMDB reuses a page only once every reader is newer than the transaction that freed it, so the
checkpoint's pages stay as they were synced however much is committed after it. After a power
cut LMDB's file may hold anything newer (pages in any order, a meta page naming pages that never
arrived); recovery writes the checkpoint's meta pages back, which names a whole, synced tree,
and replays the journal's records past it through the normal append and fold. A segment is
released for reuse once a durable checkpoint needs nothing in it.

Layout: ``journal/<number>.seg`` files, sized when made (``segment_sizing``: with the store,
between ``segment_min`` and ``segment_size``) and written full of zeros then, so that appending
a frame overwrites allocated, written blocks and ``fdatasync`` has no file metadata to write
(``fallocate`` alone leaves unwritten extents, whose conversion is metadata). A segment is never
truncated: once released it is *recycled* (renamed to a new number, its header rewritten and
synced), as PostgreSQL recycles WAL segments and RocksDB ``recycle_log_file_num`` does; a
released segment smaller than the size a new one gets is deleted instead when that one is made
(nothing needs it, and it would never fit again). The next segment is made ready ahead, off the
commit path (``prepare``, called after each checkpoint on the checkpoint thread: recycled or
made, numbered, header and name synced), so the commit that fills a segment only switches to
it; one made ready and never written is the chain's empty end to recovery (no frame of its
number), and the next writer life recycles it. ``journal/checkpoint.0`` and ``.1`` hold
checkpoint records (``log.checkpoints``), written alternately (the one not holding the newest),
each whole or rejected by its checksum, so a cut while one is written leaves the other.

A segment starts with a 4 KiB header block (magic, format, its number, a random salt, a
checksum). Then frames, back to back: a header (magic, body length, record count, the segment's
number, the first record's sequence, an xxh3-64 checksum seeded with the segment's salt over
header and body) and a body (each record: u32 length + the log record's stored bytes, exactly
what the ``log`` database holds). A frame holds one write transaction's records (one caller, or
a whole group). Segment numbers only grow and are never reused, so what a recycled segment
still holds from its earlier life names another number (and salt) and is rejected; a frame cut
by the power cut fails its checksum; the chain is read from the checkpoint's segment through
consecutive numbers and must continue sequence by sequence. Reading stops at the first frame
that fails any of these: nothing after it was acknowledged (each frame is flushed before its
commit is, and frames are written one after the other).

Every call may fail (a full disk, an I/O error): a segment whose making failed gives its number
to the next attempt (a number is taken only once its segment is durable, so the chain never has a
hole), and the segment in use stays open until the next one is ready, so commits that fit it go
on. Recovery never stops early in silence: a valid frame anywhere past the point where the chain
stops (in a later segment, or after a frame that does not continue it) means a segment or frame
inside the range to replay is missing or unreadable, and is ``JournalDamagedError`` naming it.
"""

from __future__ import annotations

import errno
import os
import secrets
import struct
import threading
from dataclasses import dataclass
from typing import Final

import xxhash

from ..errors import JournalDamagedError, StoreFormatError, StoreFullError
from .checkpoints import CheckpointRecord as CheckpointRecord
from .checkpoints import Checkpoints as Checkpoints
from .counters import EngineCounters
from .storedir import sync_directory

JOURNAL_DIR: Final = "journal"
SEGMENT_FORMAT: Final = 1
HEADER_SIZE: Final = 4096
_SEGMENT_MAGIC: Final = b"PIDLJSEG"
_SEGMENT = struct.Struct(">8sIIQQQ")  # magic, format, reserved, number, salt, checksum
_FRAME_MAGIC: Final = 0x504A4652
_FRAME = struct.Struct(
    ">IIIIQQQ"
)  # magic, body length, count, reserved, segment, first seq, checksum
_LENGTH = struct.Struct(">I")
_CHECKSUM = struct.Struct(">Q")
_ZEROS: Final = bytes(1 << 20)
SEGMENT_SHARE = 64
"""A new segment is about ``data.mdb``'s size over this (``segment_sizing``)."""

_faults: set[str] = set()
"""Planted faults, for the power-loss explorer's writer process only (``tools/harness/powerloss``): never
set by the package. ``skip-journal-flush``, ``skip-pin``, ``recycle-early``: each must make the
explorer fail (with ``recycle-early`` no segment is made ready ahead: the journal moves on by
recycling inline, where the planted fault takes the segment that just filled); ``segment-gap`` (a failed segment uses up its number) must make the I/O fault
checker (``tools/harness/io_faults.py``) fail."""


def planted(fault: str) -> bool:
    """Whether the fault ``fault`` is planted in this process (``_faults``)."""

    return fault in _faults


@dataclass(frozen=True)
class JournalOptions:
    """How a ``power`` writer journals and checkpoints (``LmdbStorage.open(journal=...)``).

    A checkpoint (an ``fdatasync`` of ``data.mdb`` and of the checkpoint file, off the commit
    path) is taken after ``checkpoint_commits`` journaled commits (fewer when the pages they
    write would pin more than ``pinned_share`` of the file), ``checkpoint_bytes`` of journal, or
    ``checkpoint_seconds`` (checked at each commit), whichever comes first. Between checkpoints
    LMDB keeps the pages of the last checkpoint from reuse, so ``data.mdb`` grows by the pages
    the commits since then rewrote: the bounds keep that growth bounded, and a checkpoint comes
    long before a segment fills, so two segments take turns.
    """

    segment_size: int = 1 << 20
    """The largest a new segment is made (``segment_sizing``). Two segments take turns in steady
    state (a checkpoint comes once half a segment is written, so before one fills). Each writer
    open makes its first segment ready (zeros written and synced, or a free one recycled), so
    smaller is cheaper to open."""
    segment_min: int = 64 << 10
    """The smallest a new segment is made (never above ``segment_size``)."""
    checkpoint_commits: int = 16
    """Bounds what the pin keeps from reuse (some 14 pages per small commit) and what one
    checkpoint flushes: a big data flush delays the journal flushes queued behind it on the
    device, and so the commits waiting for them."""
    checkpoint_bytes: int = 512 << 10
    """At most this much journal between checkpoints, and at most half the segment in use."""
    checkpoint_half_segment: bool = True
    """A checkpoint once half the segment in use is written, so that two segments take turns and
    the journal stays two segments long. False leaves only the other bounds (a test's writer
    that must meet segment changes between checkpoints)."""
    checkpoint_seconds: float = 1.0
    pinned_share: float = 0.2
    """The share of ``data.mdb`` its free pages may take (at least ``pinned_pages`` pages): the
    commit bound between checkpoints adapts to it (``log.journaled``), so that the pages the pin
    keeps from reuse do not make a small store big."""
    pinned_pages: int = 128
    """Free pages always allowed (512 KiB): a store of a few hundred pages would otherwise take
    a checkpoint every commit or two, two more flushes each, for a few hundred KiB."""
    background: bool = True
    """Take checkpoints on a thread of their own while commits go on (True), or on the
    committing thread (False: simpler to reason about, slower)."""

    def __post_init__(self) -> None:
        if type(self.checkpoint_half_segment) is not bool:
            raise ValueError(
                f"checkpoint_half_segment must be a bool, not {self.checkpoint_half_segment!r}"
            )
        if type(self.segment_size) is not int or self.segment_size < 2 * HEADER_SIZE:
            raise ValueError(
                f"segment_size must be an int of at least {2 * HEADER_SIZE} bytes, not {self.segment_size!r}"
            )
        if type(self.segment_min) is not int or self.segment_min < 2 * HEADER_SIZE:
            raise ValueError(
                f"segment_min must be an int of at least {2 * HEADER_SIZE} bytes, not {self.segment_min!r}"
            )
        if type(self.checkpoint_commits) is not int or self.checkpoint_commits < 1:
            raise ValueError(
                f"checkpoint_commits must be a positive int, not {self.checkpoint_commits!r}"
            )
        if type(self.checkpoint_bytes) is not int or self.checkpoint_bytes < 1:
            raise ValueError(
                f"checkpoint_bytes must be a positive int, not {self.checkpoint_bytes!r}"
            )
        if not isinstance(self.pinned_share, (int, float)) or not 0 < self.pinned_share <= 1:
            raise ValueError(f"pinned_share must be a number in (0, 1], not {self.pinned_share!r}")
        if type(self.pinned_pages) is not int or self.pinned_pages < 1:
            raise ValueError(f"pinned_pages must be a positive int, not {self.pinned_pages!r}")
        if not isinstance(self.checkpoint_seconds, (int, float)) or not self.checkpoint_seconds > 0:
            raise ValueError(
                f"checkpoint_seconds must be a positive number, not {self.checkpoint_seconds!r}"
            )


class _Segment:
    __slots__ = ("number", "path", "salt", "size")

    def __init__(self, path: str, number: int, salt: int, size: int) -> None:
        self.path, self.number, self.salt, self.size = path, number, salt, size


def _segment_header(number: int, salt: int) -> bytes:
    head = _SEGMENT.pack(_SEGMENT_MAGIC, SEGMENT_FORMAT, 0, number, salt, 0)[:-8]
    return head + struct.pack(">Q", xxhash.xxh3_64_intdigest(head))


def _read_header(path: str) -> tuple[int, int] | None:
    """(number, salt) of a segment file, or None when its header is not a valid one."""

    try:
        with open(path, "rb") as file:
            raw = file.read(_SEGMENT.size)
    except OSError:
        return None
    if len(raw) < _SEGMENT.size:
        return None
    magic, fmt, _, number, salt, checksum = _SEGMENT.unpack(raw)
    if magic != _SEGMENT_MAGIC or xxhash.xxh3_64_intdigest(raw[:-8]) != checksum:
        return None
    if fmt != SEGMENT_FORMAT:
        raise StoreFormatError(
            f"{path} is a journal segment of format {fmt}; this version reads {SEGMENT_FORMAT}"
        )
    return number, salt


def encode_frame(number: int, salt: int, first: int, records: list[bytes]) -> bytes:
    """One frame's bytes: its header (checksum seeded with the segment's salt over header and
    body) and body. Built with one copy of the records and the checksum streamed over the two
    parts (it runs on the committing thread, once per commit)."""

    length = _LENGTH.pack
    body = b"".join([part for data in records for part in (length(len(data)), data)])
    head = _FRAME.pack(_FRAME_MAGIC, len(body), len(records), 0, number, first, 0)[:-8]
    hasher = xxhash.xxh3_64(seed=salt)
    hasher.update(head)
    hasher.update(body)
    return b"".join((head, _CHECKSUM.pack(hasher.intdigest()), body))


def read_frames(data: bytes | memoryview, number: int, salt: int) -> list[tuple[int, list[bytes]]]:
    """The valid frames of one segment's contents, in order: (first sequence, records); stops at
    the first frame that is not whole and of this segment's life."""

    frames: list[tuple[int, list[bytes]]] = []
    at = HEADER_SIZE
    view = memoryview(data)
    while at + _FRAME.size <= len(view):
        magic, length, count, _, seg, first, checksum = _FRAME.unpack_from(view, at)
        end = at + _FRAME.size + length
        if magic != _FRAME_MAGIC or seg != number or end > len(view) or count == 0:
            break
        body = view[at + _FRAME.size : end]
        if (
            xxhash.xxh3_64_intdigest(
                bytes(view[at : at + _FRAME.size - 8]) + bytes(body), seed=salt
            )
            != checksum
        ):
            break
        records = []
        pos = 0
        for _ in range(count):
            if pos + 4 > length:
                break
            (size,) = _LENGTH.unpack_from(body, pos)
            records.append(bytes(body[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if len(records) != count or pos != length:
            break
        frames.append((first, records))
        at = end
    return frames


def segment_sizing(options: JournalOptions, data_bytes: int, needed: int) -> int:
    """The size of a new segment: a power of two near 1/64 of ``data.mdb`` (``data_bytes``),
    within ``segment_min`` and ``segment_size``, and at least ``needed`` (one frame must fit).

    Why so: a segment is preallocated whole and stays on disk for reuse, so its size is paid in
    bytes by every store, while a small one costs a rotation (a recycled segment renamed and its
    header synced, two flushes: ahead, on the checkpoint thread, when one was made ready in
    time, else on the commit path) every time it fills. Tied to the store's size,
    the journal stays a small share of a small store (two segments: about 1/32 of it), and a
    store that has grown, which a host writes to at a rate, gets segments that rotate seldom."""

    top = max(
        min(options.segment_min, options.segment_size),
        min(options.segment_size, data_bytes // SEGMENT_SHARE),
    )
    size = 1 << (top.bit_length() - 1) if top > 0 else top
    return max(size, min(options.segment_min, options.segment_size), needed)


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


class Journal:
    """The journal directory of one store, open for one writer (see the module docstring).

    ``write``, ``confirm`` and ``abandon`` run on whichever thread commits (one at a time: LMDB's
    writer lock); ``release`` runs on the checkpoint's thread: ``_lock`` guards the segment
    lists between them.
    """

    def __init__(
        self, store: str, options: JournalOptions, counters: EngineCounters | None = None
    ) -> None:
        self.directory = os.path.join(store, JOURNAL_DIR)
        self.counters = counters if counters is not None else EngineCounters()
        """Where the journal counts its flushes and segments (the environment's)."""
        self._data = os.path.join(store, "data.mdb")
        self.options = options
        self._lock = threading.Lock()
        if not os.path.isdir(self.directory):
            os.mkdir(self.directory, 0o700)
            sync_directory(store)
        self.segments: dict[int, _Segment] = {}
        """Segments with a valid header and not released, by number."""
        self._free: list[_Segment] = []
        """Segments free for reuse: released by a checkpoint, or with no valid header."""
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if not name.endswith(".seg") or not os.path.isfile(path) or os.path.islink(path):
                continue
            header = _read_header(path)
            size = os.path.getsize(path)
            if header is None or header[0] in self.segments:
                self._free.append(_Segment(path, -1, 0, size))
            else:
                self.segments[header[0]] = _Segment(path, header[0], header[1], size)
        named = [
            int(name[:-4], 16)
            for name in os.listdir(self.directory)
            if name.endswith(".seg") and _is_hex(name[:-4])
        ]
        self.next_number = max([*self.segments, *named, 0]) + 1
        """The number the next segment made or recycled gets: never one seen before, in a header
        or a file name (a segment whose making was cut by a power cut has its name and no
        header)."""
        self.current: _Segment | None = None
        self._offset = 0
        self._fd: int | None = None
        self._staged: int | None = (
            None  # offset of a frame written for a transaction not yet committed
        )
        self.written = 0
        """Bytes of frames written since this journal opened (a checkpoint trigger)."""
        self._making = threading.Lock()
        """Held while a segment is made or moved on to (``prepare`` on the checkpoint thread,
        ``_next_segment`` on the committing one): one number taken at a time."""
        self._ready: tuple[_Segment, int] | None = None
        """The segment made ready ahead (``prepare``) and its open descriptor: not yet in
        ``segments`` (nothing may release it), the chain's next number."""
        self.checkpoints = Checkpoints(self.directory)

    # ── reading (recovery) ─────────────────────────────────────────────────

    def records(self, from_segment: int, after: int) -> list[tuple[int, bytes]]:
        """The records with sequences above ``after`` (the restored checkpoint's head), from the
        chain that starts in segment ``from_segment``: consecutive segment numbers, frames in
        order, each continuing the one before it. The first must be ``after + 1``; a chain that
        skips past it is damage, named."""

        chain: list[tuple[int, bytes]] = []
        last: int | None = None
        number = from_segment
        while number in self.segments:
            frames = self._frames(number)
            for at, (first, records) in enumerate(frames):
                if last is not None and first != last + 1:
                    raise JournalDamagedError(
                        os.path.dirname(self.directory),
                        f"segment {number:016x}.seg holds a frame starting at sequence {first} "
                        f"after sequence {last}; {len(frames) - at} frames from there cannot be replayed",
                    )
                chain.extend((first + index, record) for index, record in enumerate(records))
                last = first + len(records) - 1
            number += 1
        self._refuse_stranded(number, after if last is None else max(last, after))
        wanted = [(seq, data) for seq, data in chain if seq > after]
        if wanted and wanted[0][0] != after + 1:
            raise StoreFormatError(
                f"The journal in {self.directory} continues at sequence {wanted[0][0]}, but the "
                f"checkpoint it was written after ends at {after}: the journal is damaged"
            )
        return wanted

    def _frames(self, number: int) -> list[tuple[int, list[bytes]]]:
        segment = self.segments[number]
        try:
            with open(segment.path, "rb") as file:
                data = file.read()
        except OSError as error:
            raise JournalDamagedError(
                os.path.dirname(self.directory),
                f"segment {segment.path} cannot be read ({error.strerror or error})",
            ) from error
        return read_frames(data, segment.number, segment.salt)

    def _refuse_stranded(self, missing: int, last: int) -> None:
        """The chain stopped at segment ``missing`` (absent, or its header unreadable) after
        sequence ``last``: no later segment may hold a frame past it, or what lies between is
        lost (damage, named), not the journal's end. A file of that number whose header is not
        valid but whose first frame names it was written after its header was durable: its
        header is damaged, not cut while it was made."""

        path = os.path.join(self.directory, f"{missing:016x}.seg")
        try:
            with open(path, "rb") as file:
                file.seek(HEADER_SIZE)
                head = file.read(_FRAME.size)
        except OSError:
            head = b""
        if len(head) == _FRAME.size:
            magic, _, count, _, seg, first, _ = _FRAME.unpack(head)
            if magic == _FRAME_MAGIC and seg == missing and count and first > last:
                raise JournalDamagedError(
                    os.path.dirname(self.directory),
                    f"segment {missing:016x}.seg has a damaged header but holds frames (from sequence "
                    f"{first}); the records after {last} cannot be replayed",
                )
        for number in sorted(n for n in self.segments if n > missing):
            later = [first for first, _ in self._frames(number) if first > last]
            if later:
                named = (
                    f"{missing:016x}.seg"
                    if number == missing + 1
                    else f"{missing:016x}.seg to {number - 1:016x}.seg"
                )
                raise JournalDamagedError(
                    os.path.dirname(self.directory),
                    f"segment {named} is missing or its header unreadable, but segment {number:016x}.seg "
                    f"holds records from sequence {later[0]} on; the records after {last} before it are lost",
                )

    # ── writing ────────────────────────────────────────────────────────────

    def write(self, records: list[tuple[int, bytes]]) -> None:
        """Append one transaction's records as one frame and flush it (the commit's one device
        flush). A frame staged by an earlier attempt of the same transaction is written over."""

        if not records:
            return
        if (
            self._staged is not None
        ):  # an earlier attempt's frame, whose unmaking failed: written over
            self._offset = self._staged
        first = records[0][0]
        segment = self.current
        needed = _FRAME.size + sum(4 + len(data) for _, data in records)
        if segment is None or self._offset + needed > segment.size:
            if self._staged is not None:
                # Not written over, so unmade first (or this fails): it may be whole on disk, and
                # a frame of the same sequence in the next segment would follow it.
                self.abandon()
            segment = self._next_segment(HEADER_SIZE + needed)
        self._staged = None
        frame = encode_frame(segment.number, segment.salt, first, [data for _, data in records])
        assert self._fd is not None
        os.pwrite(self._fd, frame, self._offset)
        self._staged = self._offset  # from here a failure unmakes it (``abandon``)
        if "skip-journal-flush" not in _faults:
            os.fdatasync(self._fd)
            self.counters.journal_flushes += 1
        self._offset += len(frame)
        self.written += len(frame)

    def confirm(self) -> None:
        """The transaction of the staged frame committed."""

        self._staged = None

    def abandon(self) -> None:
        """The transaction of the staged frame did not commit: unmake the frame, durably, before
        the failure is reported (zeroing its header is enough: the chain stops there)."""

        if self._staged is None or self._fd is None:
            return
        os.pwrite(self._fd, bytes(_FRAME.size), self._staged)
        os.fdatasync(self._fd)
        self.counters.journal_flushes += 1
        self._offset, self._staged = self._staged, None

    def _next_segment(self, needed: int) -> _Segment:
        """Move on to a new segment: the one ``prepare`` made ready (grown first if ``needed``
        does not fit it), else one made now (``_make``). Its header and name are durable before
        any frame goes into it. On failure the segment in use stays current and open, and the
        number stays free for the next attempt (a failure never leaves a hole in the chain): no
        frame was written under it."""

        with self._making:
            ready, self._ready = self._ready, None
            if ready is not None:
                segment, fd = ready
                try:
                    self._grow(segment, fd, needed)
                except BaseException:
                    self._ready = ready  # still whole and next in the chain: the next attempt's
                    raise
            else:
                segment, fd = self._make(needed)
            with self._lock:
                self.segments[segment.number] = segment
            if self._fd is not None:
                os.close(self._fd)
            self._fd, self.current, self._offset = fd, segment, HEADER_SIZE
            self.counters.segment_switches += 1
            return segment

    def prepare(self) -> bool:
        """Off the commit path (a checkpoint, after it released segments): make the segment the
        journal moves on to next ready now, numbered, sized, its header and name durable, so
        that moving on (``_next_segment``) is a switch of descriptors instead of a file made,
        two ``fsync`` calls and a rename on the commit that fills the segment in use. Made from
        a released segment when one is free; a new file only once the segment in use is half
        written (a small store keeps one segment until it needs a second). Whether one was made.

        Crash safety: a ready segment is the chain's next number with a valid header and no
        frame of its life (a recycled file's old frames name another number and salt), so
        recovery reads it as the chain's empty end, and the next writer life recycles it."""

        if self.current is None or "recycle-early" in _faults:
            return False  # planted: moving on recycles inline, where the fault bites
        with self._making:
            current = self.current
            if self._ready is not None or current is None:
                return False
            with self._lock:
                free = bool(self._free)
            if not free and self._offset - HEADER_SIZE < (current.size - HEADER_SIZE) // 2:
                return False
            self._ready = self._make(HEADER_SIZE)
            self.counters.segments_ahead += 1
            return True

    @property
    def ready(self) -> int | None:
        """The number of the segment made ready ahead (``prepare``), if one is."""

        ready = self._ready
        return None if ready is None else ready[0].number

    def _drop_ready(self) -> None:
        """The segment made ready goes back to the free list (a new writer life, a close)."""

        with self._making:
            ready, self._ready = self._ready, None
        if ready is None:
            return
        segment, fd = ready
        os.close(fd)
        with self._lock:
            self._free.append(segment)

    def _grow(self, segment: _Segment, fd: int, needed: int) -> None:
        """A ready segment smaller than a frame to go into it (a big commit): zeros written up to
        the size a new one would get now, and synced, before the frame goes in. Its header is
        durable already, and its number stays the chain's next."""

        if segment.size >= needed:
            return
        try:
            data_bytes = os.path.getsize(self._data)
        except OSError:
            data_bytes = 0
        size = segment_sizing(self.options, data_bytes, needed)
        try:
            at = segment.size
            while at < size:
                at += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), size - at)], at)
            os.fsync(fd)
        except OSError as error:
            raise _full(error, self.directory, size) from error
        self.counters.segment_flushes += 1
        segment.size = size

    def _make(self, needed: int) -> tuple[_Segment, int]:
        """A segment numbered ``next_number``, held under ``_making``: a released one renamed and
        given a new header, or a new file of zeros, durable (header, size and name); with its
        open descriptor. On failure the number stays free and nothing of the attempt is in the
        way of the next (``_failed_segment``)."""

        try:
            data_bytes = os.path.getsize(self._data)
        except OSError:
            data_bytes = 0
        size = segment_sizing(self.options, data_bytes, needed)
        number = self.next_number
        salt = secrets.randbits(64)
        path = os.path.join(self.directory, f"{number:016x}.seg")
        with self._lock:
            reuse = next(
                (s for s in self._free if s.path == path and s.size >= size), None
            )  # a failed attempt's file
            reuse = reuse or next(
                (s for s in self._free if s.size >= size and s.path != path), None
            )
            if (
                "recycle-early" in _faults
                and self.current is not None
                and self.current.size >= size
            ):
                reuse = self.segments.pop(
                    self.current.number
                )  # planted: the segment just filled, unchecked
                self._free.append(reuse)
            self._free = [
                s for s in self._free if s is not reuse and s.path != path
            ]  # replaced by this attempt
            # Too small for the journal now (or for any segment: cut at a clean close, ``trim``).
            outgrown = [
                s for s in self._free if s.size < (HEADER_SIZE * 2 if reuse is not None else size)
            ]
            self._free = [s for s in self._free if s not in outgrown]
        for free in outgrown:
            try:
                os.unlink(free.path)
            except OSError:
                pass
        fd: int | None = None
        renamed = False
        try:
            if reuse is not None:
                if reuse.path != path:
                    os.rename(reuse.path, path)
                renamed = True
                fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
                size = reuse.size
            else:
                # No O_EXCL: a file of this name can only be an earlier failed attempt's (the
                # number is above every segment's), and it is written over whole.
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
                at = 0
                while at < size:
                    at += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), size - at)], at)
            os.pwrite(fd, _segment_header(number, salt), 0)
            os.fsync(fd)
            sync_directory(self.directory)
            self.counters.segment_flushes += 2
        except BaseException as error:
            self._failed_segment(fd, path, reuse, renamed, size)
            if "segment-gap" in _faults:
                self.next_number += 1  # planted: the number is used up, a hole recovery meets
            if isinstance(error, OSError):
                raise _full(error, self.directory, size) from error
            raise
        self.next_number = number + 1
        return _Segment(path, number, salt, size), fd

    def _failed_segment(
        self, fd: int | None, path: str, reuse: _Segment | None, renamed: bool, size: int
    ) -> None:
        """Leave nothing of a failed attempt in the way of the next: a recycled file goes back to
        the free list (under its new name, if the rename happened), a new file is removed (or,
        if even that fails, kept free under its name, which the next attempt takes)."""

        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
        with self._lock:
            if reuse is not None:
                self._free.insert(0, _Segment(path, -1, 0, reuse.size) if renamed else reuse)
                return
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError:
            with self._lock:
                self._free.insert(
                    0, _Segment(path, -1, 0, os.path.getsize(path) if os.path.exists(path) else 0)
                )

    @property
    def current_number(self) -> int:
        """The segment the next frame goes to (or a new one's number, if none is open yet): a
        checkpoint names it, as where recovery starts reading."""

        return self.current.number if self.current is not None else self.next_number

    def begin(self) -> int:
        """A new writer life, once no recovery can need any segment (the store is synced and
        holds no marker): every segment is free, and the first of this life is made ready now
        (recycled, or made and filled with zeros), not on the first commit. Its number."""

        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.current = None
        self._staged = None
        self._drop_ready()
        self.release(self.next_number)
        return self._next_segment(HEADER_SIZE).number

    def roll(self) -> int:
        """Move on to a new segment now (an erasure's, whose rewritten records are in no frame):
        the checkpoint taken next names it, so the chain recovery reads after that checkpoint
        starts with the frames written after the rewrite. Its number."""

        return self._next_segment(HEADER_SIZE).number

    def release(self, below: int) -> None:
        """A checkpoint is durable that needs no segment numbered below ``below``: they may be
        recycled."""

        with self._lock:
            for number in [n for n in self.segments if n < below]:
                if self.current is not None and number == self.current.number:
                    continue
                self._free.append(self.segments.pop(number))

    def close(self) -> None:
        """Close every descriptor (the segment in use, the one made ready, the checkpoint
        slots); a ready segment goes back to the free list."""

        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._drop_ready()
        self.checkpoints.close()

    def trim(self) -> None:
        """After a clean close (``data.mdb`` synced, the marker gone, so no recovery reads a
        segment): cut every segment but the one in use to zero bytes. A closed store keeps one
        segment, which the next writer life recycles (``begin``), instead of every segment it
        wrote, as SQLite keeps no ``-wal`` file past its last close; the names stay, so segment
        numbers keep growing, and that life deletes the empty files when it makes or recycles its
        first segment (``_next_segment``: too small to reuse). Best effort: the close is already
        done, and a segment left whole (an error, a power cut before the truncation reached the
        disk) is only the bytes it was before."""

        keep = self.current.path if self.current is not None else None
        self.close()
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            if name.endswith(".seg") and path != keep:
                try:
                    os.truncate(path, 0)
                except OSError:
                    pass


def _full(error: OSError, directory: str, size: int) -> OSError:
    """A journal segment that could not be made: ``StoreFullError`` when the disk is full (the
    commit waiting for it fails with nothing written), the error itself otherwise."""

    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(
            errno.ENOSPC,
            f"No space left for a journal segment of {size} bytes in {directory}: nothing was "
            "written, free some space and commit (or open) again",
        )
    return error


__all__ = [
    "HEADER_SIZE",
    "JOURNAL_DIR",
    "SEGMENT_FORMAT",
    "SEGMENT_SHARE",
    "Journal",
    "JournalOptions",
    "encode_frame",
    "planted",
    "read_frames",
    "segment_sizing",
]
