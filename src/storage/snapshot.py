"""Snapshots of a store on its stream's side, so that a restore replays only the log after one.

A snapshot is LMDB's compacting copy of the store (``backup``: one read snapshot, no free pages),
zstd-compressed, behind a header that says what it holds: the store, the stream, the stream
sequence of the last message of the store's subject it took in and the log head it left (the
records up to it are the stream's), the copy's size and its xxh3-64. It goes to the stream's
object store (``<stream>-snapshots``) under ``<store>.<stream seq>.<log seq>`` (zero-padded, so
names sort by age), which keeps it whole or not at all and checks its SHA-256 on the way back.

A restore (and a new replica) takes the newest snapshot of the store that verifies -- the bucket's
digest, then the header, then the copy's length and checksum, then the copy opened: its store id,
log head and stream position must be the ones named -- and replays only the subject's messages
after it. One that does not verify is skipped with a warning, never started from; with none left,
the whole log is replayed, as without snapshots.

Retention is explicit: ``keep`` drops all but the newest snapshots of the store, and ``trim``
then removes the subject's messages older than the oldest snapshot kept. Neither happens unless
asked: by default every snapshot and every message stays.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from typing import BinaryIO, Final

import msgspec
import xxhash
import zstandard

from ..errors import ReplicationError, SnapshotUnsoundError
from ..log import Environment, WriteLog
from ..log.compact import zero_page_gaps
from ..log.stream.link import StreamLink
from ..log.stream.message import subject_of
from ..log.stream.position import read_position
from .backup import backup

logger = logging.getLogger(__name__)

SNAPSHOT_FORMAT: Final = 1
MAGIC: Final = b"PDLSNAP\n"
_LENGTH: Final = struct.Struct(">I")
MAX_HEADER: Final = 64 * 1024
BLOCK: Final = 1 << 20
WORK_PREFIX: Final = ".snapshot-"
"""Work directories beside the store: ``.snapshot-<pid>-<random>`` (a compacted copy, the object)."""
LEVEL: Final = 3
"""zstd level: LMDB pages are mostly zeros and repeated keys; higher levels cost time for little."""


class SnapshotHeader(msgspec.Struct, forbid_unknown_fields=True):
    """What a snapshot holds; written before the compressed copy."""

    format: int
    store: str
    stream: str
    stream_seq: int
    """The last message of the store's subject the copy took in."""
    seq: int
    """The copy's log head (every record up to it is the stream's)."""
    size: int
    """Bytes of the copy (``data.mdb``)."""
    checksum: int
    """xxh3-64 of the copy."""
    created_at: int
    """Milliseconds since the epoch."""


class SnapshotName(msgspec.Struct, frozen=True, order=True):
    """A snapshot as its object's name gives it (sorts oldest first)."""

    stream_seq: int
    seq: int
    name: str


class SnapshotReport(msgspec.Struct):
    """What ``take_snapshot`` published and what its retention removed."""

    name: str
    store: str
    stream_seq: int
    seq: int
    size: int
    """Bytes of the copy."""
    stored: int
    """Bytes of the object (compressed)."""
    seconds: float
    deleted: list[str] = []
    trimmed_below: int = 0
    """The subject's messages below this stream sequence were removed (0: none)."""


_header_encoder: Final = msgspec.msgpack.Encoder()
_header_decoder: Final = msgspec.msgpack.Decoder(SnapshotHeader)


def snapshot_name(store: str, stream_seq: int, seq: int) -> str:
    return f"{store}.{stream_seq:020d}.{seq:020d}"


def snapshots_of(names: list[str], store: str) -> list[SnapshotName]:
    """The store's snapshots among an object store's ``names``, oldest first."""

    found = []
    for name in names:
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == store and parts[1].isdigit() and parts[2].isdigit():
            found.append(SnapshotName(int(parts[1]), int(parts[2]), name))
    return sorted(found)


# ── writing one ───────────────────────────────────────────────────────────────


def write_snapshot(
    path: str | os.PathLike[str], stream: str, sink: BinaryIO, work: str
) -> SnapshotHeader:
    """Write a snapshot of the store at ``path`` (live or not) to ``sink``, through a compacted
    copy made in the directory ``work``. Refuses a store whose log holds records the stream does
    not (a store shipping behind its commits that has not shipped them all yet)."""

    copy = os.path.join(work, "copy")
    backup(path, copy, compact=True)
    data = os.path.join(copy, "data.mdb")
    zero_page_gaps(data)  # a page's unused middle may hold what it held before (an erased record)
    env = Environment(copy, readonly=True)
    try:
        store, log, meta = (
            env.store_id,
            WriteLog(env),
            env.db("meta"),
        )  # databases before the transaction
        with env.read() as txn:
            head = log.head(txn)
            position = read_position(txn, meta, stream)
    finally:
        env.close()
    if store is None:
        raise ValueError(f"The store at {path} has no store id: it was never opened by a writer")
    if position.stream_seq == 0 or position.seq != head:
        raise ReplicationError(
            f"The store at {path} holds records up to {head}, and stream {stream!r} those up to "
            f"{position.seq}: a snapshot holds only records the stream has (wait for them to be shipped)"
        )
    digest = xxhash.xxh3_64()
    with open(data, "rb") as source:
        while block := source.read(BLOCK):
            digest.update(block)
    header = SnapshotHeader(
        SNAPSHOT_FORMAT,
        store,
        stream,
        position.stream_seq,
        head,
        os.path.getsize(data),
        digest.intdigest(),
        int(time.time() * 1000),
    )
    encoded = _header_encoder.encode(header)
    sink.write(MAGIC + _LENGTH.pack(len(encoded)) + encoded)
    with open(data, "rb") as source:
        zstandard.ZstdCompressor(level=LEVEL).copy_stream(
            source, sink, read_size=BLOCK, write_size=BLOCK
        )
    shutil.rmtree(copy, ignore_errors=True)
    return header


def read_snapshot(
    source: BinaryIO, directory: str, store: str, stream: str, expected: SnapshotName
) -> SnapshotHeader:
    """Verify the snapshot in ``source`` and leave its copy as ``directory``/data.mdb; anything
    that does not verify raises ``SnapshotUnsoundError`` (and leaves no ``data.mdb``)."""

    def unsound(why: str) -> SnapshotUnsoundError:
        return SnapshotUnsoundError(
            f"The snapshot {expected.name} of stream {stream} does not verify: {why}"
        )

    start = source.read(len(MAGIC) + _LENGTH.size)
    if len(start) < len(MAGIC) + _LENGTH.size or not start.startswith(MAGIC):
        raise unsound("it does not begin as a snapshot does")
    (length,) = _LENGTH.unpack(start[len(MAGIC) :])
    if length > MAX_HEADER:
        raise unsound(f"its header claims {length} bytes")
    try:
        header = _header_decoder.decode(source.read(length))
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise unsound(f"its header does not decode ({error})") from None
    if header.format != SNAPSHOT_FORMAT:
        raise unsound(f"it has format {header.format}, this program reads {SNAPSHOT_FORMAT}")
    if (header.store, header.stream, header.stream_seq, header.seq) != (
        store,
        stream,
        expected.stream_seq,
        expected.seq,
    ):
        raise unsound(
            f"it holds store {header.store} of stream {header.stream} at message {header.stream_seq}, record "
            f"{header.seq}, not what its name says"
        )
    data = os.path.join(directory, "data.mdb")
    digest, size = xxhash.xxh3_64(), 0
    try:
        with open(data, "wb") as sink:
            try:
                reader = zstandard.ZstdDecompressor().stream_reader(source, read_size=BLOCK)
                while block := reader.read(BLOCK):
                    size += len(block)
                    if size > header.size:
                        raise unsound(
                            f"it holds more than the {header.size} bytes its header names"
                        )
                    digest.update(block)
                    sink.write(block)
            except zstandard.ZstdError as error:
                raise unsound(f"its copy does not decompress ({error})") from None
            sink.flush()
            os.fsync(sink.fileno())
        if size != header.size or digest.intdigest() != header.checksum:
            raise unsound(
                f"its copy has {size} bytes and checksum {digest.intdigest():x}, not {header.size} and {header.checksum:x}"
            )
        _check_copy(directory, header, unsound)
    except BaseException:
        for name in ("data.mdb", "lock.mdb"):
            if os.path.exists(os.path.join(directory, name)):
                os.unlink(os.path.join(directory, name))
        raise
    return header


def _check_copy(
    directory: str, header: SnapshotHeader, unsound: Callable[[str], SnapshotUnsoundError]
) -> None:
    """The copy opens as the store the header names, at its log head and stream position."""

    env = Environment(directory, readonly=True)
    try:
        log, meta = WriteLog(env), env.db("meta")  # databases before the transaction
        with env.read() as txn:
            head = log.head(txn)
            position = read_position(txn, meta, header.stream)
        found = (env.store_id, head, position.stream_seq)
    except Exception as error:  # an LMDB error, a store header it cannot read
        raise unsound(
            f"its copy does not open as a store ({type(error).__name__}: {error})"
        ) from None
    finally:
        env.close()
    if found != (header.store, header.seq, header.stream_seq):
        raise unsound(f"its copy is store {found[0]} at record {found[1]}, message {found[2]}")
    if os.path.exists(os.path.join(directory, "lock.mdb")):  # the read-only open's: made afresh
        os.unlink(os.path.join(directory, "lock.mdb"))


# ── the stream's side ─────────────────────────────────────────────────────────


async def take_snapshot(
    path: str | os.PathLike[str], link: StreamLink, *, keep: int | None = None, trim: bool = False
) -> SnapshotReport:
    """Publish a snapshot of the store at ``path`` to ``link``'s stream; then, when asked,
    keep only the ``keep`` newest snapshots of the store and ``trim`` its subject below the
    oldest kept."""

    if keep is not None and (type(keep) is not int or keep < 1):
        raise ValueError(f"keep is how many snapshots to keep, 1 or more, not {keep!r}")
    if trim and keep is None:
        raise ValueError("trim removes the log before the oldest snapshot kept: give keep too")
    started = time.perf_counter()
    parent = os.path.dirname(os.path.abspath(os.fspath(path)))
    _remove_stale_work(parent)
    work = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir=parent)
    try:
        packed = os.path.join(work, "snapshot")
        with open(packed, "wb") as sink:
            header = await asyncio.to_thread(write_snapshot, path, link.stream, sink, work)
        name = snapshot_name(header.store, header.stream_seq, header.seq)
        with open(packed, "rb") as source:
            await link.arun(link.snapshots.put(name, source))
        stored = os.path.getsize(packed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = SnapshotReport(
        name, header.store, header.stream_seq, header.seq, header.size, stored, 0.0
    )
    if keep is not None:
        await _retain(link, header.store, keep, trim, report)
    report.seconds = time.perf_counter() - started
    return report


def _remove_stale_work(parent: str) -> None:
    """Remove the work directories of snapshot processes that were killed (their pid is gone)."""

    for name in os.listdir(parent):
        if name.startswith(WORK_PREFIX):
            pid = name[len(WORK_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


async def _retain(
    link: StreamLink, store: str, keep: int, trim: bool, report: SnapshotReport
) -> None:
    found = snapshots_of(await link.arun(link.snapshots.names()), store)
    kept, dropped = found[-keep:], found[:-keep]
    for old in dropped:
        await link.arun(link.snapshots.delete(old.name))
        report.deleted.append(old.name)
    if trim and kept:
        await link.arun(link.messages.trim(subject_of(link.stream, store), kept[0].stream_seq))
        report.trimmed_below = kept[0].stream_seq


async def replace_snapshots(
    path: str | os.PathLike[str], link: StreamLink, store: str
) -> list[str]:
    """After an erasure: when the stream's bucket holds snapshots of ``store``, publish a fresh
    one of the store at ``path`` and delete every older one (they hold the erased records).
    Returns the names deleted."""

    older = snapshots_of(await link.arun(link.snapshots.names()), store)
    if not older:
        return []
    report = await take_snapshot(path, link)
    deleted = []
    for old in older:
        if old.name != report.name:
            await link.arun(link.snapshots.delete(old.name))
            deleted.append(old.name)
    return deleted


def seed(
    link: StreamLink,
    store: str,
    directory: str,
    to_seq: int | None = None,
    to_time: int | None = None,
) -> SnapshotHeader | None:
    """Leave in the empty ``directory`` the copy of the newest snapshot of ``store`` that
    verifies (holding records up to ``to_seq`` at most, and none committed after Unix ms
    ``to_time``); ``None`` when there is none. Run from a thread other than the link's.
    Snapshots that do not verify are skipped, with a warning. A snapshot's name gives its head
    sequence but not its commit time: for ``to_time`` each is fetched and its head read."""

    candidates = snapshots_of(link.run(link.snapshots.names()), store)
    if to_seq is not None:
        candidates = [found for found in candidates if found.seq <= to_seq]
    for found in reversed(candidates):
        packed = os.path.join(directory, ".snapshot")
        try:
            with open(packed, "w+b") as spool:
                link.run(link.snapshots.get(found.name, spool))
                spool.seek(0)
                os.unlink(packed)  # the open file stays readable; nothing is left if this fails
                header = read_snapshot(spool, directory, store, link.stream, found)
            if to_time is None or _committed_by(directory, header.seq, to_time):
                return header
            os.unlink(os.path.join(directory, "data.mdb"))  # too late: try an older one
        except (SnapshotUnsoundError, ReplicationError) as error:
            if isinstance(error, ReplicationError) and not _unsound_object(error):
                raise
            logger.warning("skipping snapshot %s: %s", found.name, error)
        finally:
            if os.path.exists(packed):
                os.unlink(packed)
    return None


def _committed_by(directory: str, seq: int, to_time: int) -> bool:
    """Whether record ``seq`` of the store copied into ``directory`` was committed by ``to_time``."""

    env = Environment(directory, readonly=True)
    try:
        commit = WriteLog(env).get(seq) if seq else None
    finally:
        env.close()
    if os.path.exists(os.path.join(directory, "lock.mdb")):  # the read-only open's: made afresh
        os.unlink(os.path.join(directory, "lock.mdb"))
    return commit is None or commit.committed_at <= to_time


def seed_new(link: StreamLink, store: str, path: str | os.PathLike[str]) -> SnapshotHeader | None:
    """``seed`` a new store's directory (``path`` missing or empty; else nothing is done)."""

    directory = os.path.abspath(os.fspath(path))
    if os.path.exists(directory) and not (os.path.isdir(directory) and not os.listdir(directory)):
        return None
    os.makedirs(directory, exist_ok=True)
    return seed(link, store, directory)


def _unsound_object(error: ReplicationError) -> bool:
    """A bucket's refusal of one object (missing, digest mismatch), as opposed to no answer."""

    from ..errors import NatsUnavailableError

    return not isinstance(error, NatsUnavailableError)


__all__ = [
    "BLOCK",
    "LEVEL",
    "MAGIC",
    "MAX_HEADER",
    "SNAPSHOT_FORMAT",
    "WORK_PREFIX",
    "SnapshotHeader",
    "SnapshotName",
    "SnapshotReport",
    "read_snapshot",
    "replace_snapshots",
    "seed",
    "seed_new",
    "snapshot_name",
    "snapshots_of",
    "take_snapshot",
    "write_snapshot",
]
