"""Recordings of a writer's file operations, and the states a disk could hold after a power cut.

A recording (made by ``recorder.c``) is the ordered list of what the writer asked of the files in
its store directory. Cutting the power at point ``P`` (after the first ``P`` events) leaves on disk:

* every write made durable before ``P``: by an ``fsync``/``fdatasync`` of its file (per file: a
  sync makes that file's earlier writes durable, not other files'), by ``sync``/``syncfs``, or by
  being written through an ``O_DSYNC``/``O_SYNC`` descriptor (that write only);
* directory changes (create, mkdir, rename, unlink, rmdir) once the directory holding the new
  name was fsynced (POSIX: fsync of a file does not make its directory entry durable); they reach
  the disk in the order they were made, as on any journaling file system, so a state keeps a
  prefix of the pending ones. Directories are inodes like files: renaming one moves what it
  holds, and a name inside a directory whose own name did not reach the disk is lost with it
  (the store directory itself, and directories there before the recording, are taken to exist);
* plus some of the writes issued since their file's last sync, which is what the variants choose:
  ``none``, a ``prefix`` (in issue order), a random ``subset`` (persisted in a random order; where
  two chosen writes overlap, the later one's bytes win, as a disk keeps the newest write of a
  sector), or ``torn``: each pending write cut into 4 KiB sectors (aligned on the file's offsets,
  a sector written whole or not at all) and a random subset of those pieces kept.

``sync_file_range`` is recorded but is not a durability point (it flushes no disk cache and no
metadata). ``msync`` counts as a sync of every file (LMDB uses it only with ``writemap``).
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
from dataclasses import dataclass, field
from typing import Final

CREATE, WRITE, FSYNC, FDATASYNC, MSYNC, SFR, TRUNCATE, RENAME, UNLINK, SYNC, MARK, MKDIR = range(
    1, 13
)
NAMES: Final = {
    CREATE: "create",
    WRITE: "write",
    FSYNC: "fsync",
    FDATASYNC: "fdatasync",
    MSYNC: "msync",
    SFR: "sync_file_range",
    TRUNCATE: "truncate",
    RENAME: "rename",
    UNLINK: "unlink",
    SYNC: "sync",
    MARK: "mark",
    MKDIR: "mkdir",
}
SECTOR: Final = 4096
VARIANTS: Final = ("none", "prefix", "subset", "torn")
_HEADER = struct.Struct("<IIQQII")


@dataclass(frozen=True, slots=True)
class Event:
    index: int
    kind: int
    path: str  # relative to the store directory: "" is the directory itself
    offset: int = 0
    data: bytes = b""
    synced: bool = False  # a write through an O_DSYNC/O_SYNC descriptor
    target: str = ""  # a rename's new name
    directory: bool = False  # an fsync/fdatasync of a directory

    def __str__(self) -> str:
        where = self.path or "."
        if self.kind == WRITE:
            return f"#{self.index} write {where} @{self.offset} +{len(self.data)}{' dsync' if self.synced else ''}"
        if self.kind == MARK:
            return f"#{self.index} mark {self.data.decode(errors='replace').strip()[:80]}"
        if self.kind == RENAME:
            return f"#{self.index} rename {where} -> {self.target}"
        if self.kind == TRUNCATE:
            return f"#{self.index} truncate {where} to {self.offset}"
        return f"#{self.index} {NAMES[self.kind]} {where}"


def parse(raw: bytes, store: str) -> list[Event]:
    """The events of a recording; paths made relative to ``store`` (a torn last event is dropped)."""

    store = os.path.realpath(store)
    events: list[Event] = []
    at = 0
    while at + _HEADER.size <= len(raw):
        kind, flags, offset, length, path_length, _ = _HEADER.unpack_from(raw, at)
        end = at + _HEADER.size + path_length + length
        if end > len(raw):
            break
        path_bytes = raw[at + _HEADER.size : at + _HEADER.size + path_length]
        data = raw[at + _HEADER.size + path_length : end]
        at = end
        target = ""
        if kind == RENAME:
            old, _, new = path_bytes.partition(b"\0")
            path, target = _relative(old.decode(), store), _relative(new.decode(), store)
        else:
            path = _relative(path_bytes.decode(), store)
        synced = kind == WRITE and bool(flags & 1)
        directory = kind in (FSYNC, FDATASYNC) and bool(flags & 1)
        events.append(Event(len(events), kind, path, offset, data, synced, target, directory))
    return events


def _relative(path: str, store: str) -> str:
    if not path:
        return ""
    if path == store:
        return ""
    return os.path.relpath(path, store)


def marks(events: list[Event], upto: int | None = None) -> list[tuple[int, str]]:
    """The writer's marks (index, text line) among the first ``upto`` events."""

    lines = []
    for event in events[: len(events) if upto is None else upto]:
        if event.kind == MARK:
            for line in event.data.decode().splitlines():
                lines.append((event.index, line))
    return lines


# ── crash states ───────────────────────────────────────────────────────────────

_ROOT = 0  # the store directory's inode
_Key = tuple[int, str]  # a directory entry: (directory inode, name)


@dataclass(slots=True)
class _Op:
    """A change that may or may not be on disk: a directory change, or a write/truncate of an inode."""

    event: Event
    inode: int  # the file written or truncated; for directory changes the file or directory named
    durable: bool = False
    entry: _Key | None = (
        None  # directory changes: the name made (create, mkdir, rename) or removed (unlink)
    )
    source: _Key | None = None  # a rename's old name


@dataclass(slots=True)
class _Simulation:
    """The namespace as the writer saw it: directories are inodes too, so renaming a directory
    moves what it holds, and a name is on disk only if every directory above it is."""

    entries: dict[_Key, int] = field(default_factory=dict)
    initial_entries: dict[_Key, int] = field(default_factory=dict)  # there before the recording
    initial_content: dict[int, bytes] = field(default_factory=dict)
    directories: set[int] = field(default_factory=lambda: {_ROOT})
    inode_ops: dict[int, list[_Op]] = field(default_factory=dict)
    dir_ops: list[_Op] = field(default_factory=list)
    next_inode: int = 1

    def _new(self, directory: bool = False) -> int:
        inode = self.next_inode
        self.next_inode += 1
        self.inode_ops[inode] = []
        if directory:
            self.directories.add(inode)
        return inode

    def key(self, path: str) -> _Key:
        """The entry ``path`` names; a directory above it the recording never made existed before."""

        parts = path.split("/")
        parent = _ROOT
        for part in parts[:-1]:
            inode = self.entries.get((parent, part))
            if inode is None:
                inode = self._new(directory=True)
                self.entries[(parent, part)] = self.initial_entries[(parent, part)] = inode
            parent = inode
        return parent, parts[-1]

    def lookup(self, path: str) -> int | None:
        return _ROOT if path == "" else self.entries.get(self.key(path))


def _simulate(events: list[Event], upto: int, initial: dict[str, bytes]) -> _Simulation:
    sim = _Simulation()
    for name, content in initial.items():
        inode = sim._new()
        sim.entries[sim.key(name)] = sim.initial_entries[sim.key(name)] = inode
        sim.initial_content[inode] = content
    for event in events[:upto]:
        kind = event.kind
        if kind in (CREATE, MKDIR):
            if event.path == "":
                continue  # the store directory itself: taken to exist
            key = sim.key(event.path)
            inode = sim._new(directory=kind == MKDIR)
            sim.entries[key] = inode
            sim.dir_ops.append(_Op(event, inode, entry=key))
        elif kind == RENAME:
            source = sim.key(event.path)
            inode = sim.entries.pop(source, None)
            if inode is None:  # a file there before the recording, never written: empty
                inode = sim._new()
                sim.initial_entries[source] = inode
            target = sim.key(event.target) if event.target else None
            if target is not None:
                sim.entries[target] = inode
            sim.dir_ops.append(_Op(event, inode, entry=target, source=source))
        elif kind == UNLINK:
            key = sim.key(event.path)
            sim.dir_ops.append(_Op(event, sim.entries.pop(key, -1), entry=key))
        elif kind in (WRITE, TRUNCATE):
            inode = sim.lookup(event.path)
            if inode is None or inode in sim.directories:  # opened before the recording started
                continue
            sim.inode_ops[inode].append(_Op(event, inode, durable=event.synced))
        elif kind in (FSYNC, FDATASYNC):
            inode = sim.lookup(event.path)
            if inode is None:
                continue
            if event.directory:  # the names in this directory are durable (where they point now)
                for op in sim.dir_ops:
                    held = op.entry if op.entry is not None else op.source
                    if held is not None and held[0] == inode:
                        op.durable = True
            else:
                for op in sim.inode_ops.get(inode, []):
                    op.durable = True
        elif kind in (SYNC, MSYNC):
            for ops in sim.inode_ops.values():
                for op in ops:
                    op.durable = True
            if kind == SYNC:
                for op in sim.dir_ops:
                    op.durable = True
    return sim


@dataclass(frozen=True, slots=True)
class CrashState:
    point: int
    variant: str
    seed: int
    files: dict[str, bytes]
    pending: int  # changes not yet durable at the point
    kept: int  # of which this state keeps (pieces, for torn)
    directories: tuple[str, ...] = ()  # every directory under the store directory, empty ones too

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for name in sorted(self.files):
            h.update(
                name.encode() + b"\0" + hashlib.blake2b(self.files[name], digest_size=16).digest()
            )
        for name in self.directories:
            h.update(b"dir\0" + name.encode() + b"\0")
        return h.hexdigest()

    def write(self, directory: str) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        for name in self.directories:
            os.makedirs(os.path.join(directory, name), mode=0o700, exist_ok=True)
        for name, content in self.files.items():
            os.makedirs(os.path.dirname(os.path.join(directory, name)), mode=0o700, exist_ok=True)
            with open(os.path.join(directory, name), "wb") as file:
                file.write(content)


def crash_state(
    events: list[Event],
    point: int,
    variant: str,
    seed: int,
    initial: dict[str, bytes] | None = None,
) -> CrashState:
    """The files on disk after a power cut at ``point``, keeping pending changes as ``variant`` says."""

    initial = initial or {}
    sim = _simulate(events, point, initial)
    rng = random.Random(f"{point}:{variant}:{seed}")
    pending_dir = [op for op in sim.dir_ops if not op.durable]
    pending_data = [op for ops in sim.inode_ops.values() for op in ops if not op.durable]
    pending = sorted(pending_dir + pending_data, key=lambda op: op.event.index)
    keep: set[int] = set()  # event indexes kept whole
    pieces: dict[
        int, list[tuple[int, int]]
    ] = {}  # event index -> kept (start, end) within its data
    if variant == "none":
        dir_keep = 0
    elif variant == "prefix":
        count = rng.randint(0, len(pending))
        keep = {op.event.index for op in pending[:count]}
        dir_keep = sum(1 for op in pending_dir if op.event.index in keep)
    else:
        dir_keep = rng.randint(0, len(pending_dir))
        if variant == "subset":
            keep = {op.event.index for op in pending_data if rng.random() < 0.5}
        elif variant == "torn":
            for op in pending_data:
                if op.event.kind == TRUNCATE:
                    if rng.random() < 0.5:
                        keep.add(op.event.index)
                    continue
                start, data = op.event.offset, op.event.data
                chosen = []
                at = 0
                while at < len(data):
                    end = min(len(data), (start + at) // SECTOR * SECTOR + SECTOR - start)
                    if rng.random() < 0.5:
                        chosen.append((at, end))
                    at = end
                if chosen:
                    pieces[op.event.index] = chosen
        else:
            raise ValueError(f"unknown variant {variant!r}")
    # Directories: the initial entries, then the durable changes and a prefix of the pending ones.
    entries = dict(sim.initial_entries)
    kept_dir = {op.event.index for op in pending_dir[:dir_keep]}
    for op in sim.dir_ops:
        if not (op.durable or op.event.index in kept_dir):
            continue
        if op.event.kind in (CREATE, MKDIR):
            assert op.entry is not None
            entries[op.entry] = op.inode
        elif op.event.kind == RENAME:
            assert op.source is not None
            if entries.get(op.source) == op.inode:
                del entries[op.source]
            if op.entry is not None:
                entries[op.entry] = op.inode
        elif op.event.kind == UNLINK:
            assert op.entry is not None
            entries.pop(op.entry, None)
    names, directories = _reachable(entries, sim.directories)
    contents: dict[int, bytearray] = {}
    for inode in set(names.values()):
        content = bytearray(sim.initial_content.get(inode, b""))
        for op in sim.inode_ops.get(inode, []):
            event = op.event
            if event.kind == TRUNCATE:
                if op.durable or event.index in keep:
                    del content[event.offset :]
                    content.extend(b"\0" * (event.offset - len(content)))
                continue
            if op.durable or event.index in keep:
                _put(content, event.offset, event.data)
            else:
                for begin, end in pieces.get(event.index, ()):
                    _put(content, event.offset + begin, event.data[begin:end])
        contents[inode] = content
    kept = len(kept_dir) + len(keep) + sum(len(p) for p in pieces.values())
    return CrashState(
        point,
        variant,
        seed,
        {name: bytes(contents[inode]) for name, inode in names.items()},
        len(pending),
        kept,
        tuple(sorted(directories)),
    )


def _reachable(entries: dict[_Key, int], directories: set[int]) -> tuple[dict[str, int], list[str]]:
    """The files (path -> inode) and directories reachable from the store directory: a name in a
    directory whose own name did not reach the disk is lost with it."""

    children: dict[int, list[tuple[str, int]]] = {}
    for (parent, name), inode in entries.items():
        children.setdefault(parent, []).append((name, inode))
    files: dict[str, int] = {}
    dirs: list[str] = []
    stack: list[tuple[int, str]] = [(_ROOT, "")]
    seen = {_ROOT}
    while stack:
        directory, prefix = stack.pop()
        for name, inode in children.get(directory, []):
            path = prefix + name
            if inode in directories:
                if inode not in seen:
                    seen.add(inode)
                    dirs.append(path)
                    stack.append((inode, path + "/"))
            else:
                files[path] = inode
    return files, dirs


def _put(content: bytearray, offset: int, data: bytes) -> None:
    if len(content) < offset:
        content.extend(b"\0" * (offset - len(content)))
    content[offset : offset + len(data)] = data


def crash_points(events: list[Event], rng: random.Random, randoms: int) -> list[int]:
    """Every sync boundary (right before each sync and right after it), around every directory
    change, right after every mark, and ``randoms`` points drawn at random."""

    points: set[int] = {len(events)}
    for event in events:
        if event.kind in (
            FSYNC,
            FDATASYNC,
            SYNC,
            MSYNC,
            CREATE,
            MKDIR,
            RENAME,
            UNLINK,
            TRUNCATE,
        ) or (event.kind == WRITE and event.synced):
            points.add(event.index)
            points.add(event.index + 1)
        elif event.kind == MARK:
            points.add(event.index + 1)
    for _ in range(randoms):
        points.add(rng.randint(0, len(events)))
    return sorted(points)
