"""The checkpoint records of the write-ahead journal (``log.journal``): what recovery needs of
the last checkpoint a journaled ``power`` writer made durable, in two preallocated slots written
alternately, so the newest whole record survives a power cut while the other is written.
"""

from __future__ import annotations

import os
import struct
from typing import Final

import msgspec
import xxhash

from ..errors import StoreFormatError
from .storedir import sync_directory

CHECKPOINT_FORMAT: Final = 1
_CHECKPOINT_NAMES: Final = ("checkpoint.0", "checkpoint.1")
_CHECKPOINT_SIZE: Final = 4096 * 4
_CHECKPOINT_HEAD = struct.Struct(">8sIQ")  # magic, body length, xxh3-64 of the body
_CHECKPOINT_MAGIC: Final = b"PIDLJCKP"


class CheckpointRecord(msgspec.Struct, frozen=True):
    """What recovery needs of one checkpoint. ``epoch``: the writer life that made it (the
    ``power.unsynced`` marker names the life whose checkpoints recovery may trust);
    ``generation`` orders a life's checkpoints; ``segment``: where records after it start;
    ``meta``: LMDB's two meta pages as they were (the first two pages of ``data.mdb``)."""

    format: int
    epoch: int
    generation: int
    segment: int
    meta: bytes


_checkpoint_encoder: Final = msgspec.msgpack.Encoder()
_checkpoint_decoder: Final = msgspec.msgpack.Decoder(CheckpointRecord)


class Checkpoints:
    """The two checkpoint slots: preallocated files written in place (one ``pwrite`` and one
    ``fdatasync`` each), alternately, so the newest whole record survives a cut while the other
    is written."""

    def __init__(self, directory: str) -> None:
        self.paths = [os.path.join(directory, name) for name in _CHECKPOINT_NAMES]
        made = False
        for path in self.paths:
            if not os.path.exists(path):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
                try:
                    os.pwrite(fd, bytes(_CHECKPOINT_SIZE), 0)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                made = True
        if made:
            sync_directory(directory)
        self.slots = [self._read(path) for path in self.paths]
        self._fds: list[int | None] = [None, None]
        """Each slot's descriptor, opened at its first ``write`` and kept (a checkpoint every
        few commits need not open and close a file each), closed by ``close`` or a failed
        write."""

    @staticmethod
    def _read(path: str) -> CheckpointRecord | None:
        try:
            with open(path, "rb") as file:
                raw = file.read(_CHECKPOINT_SIZE)
        except OSError:
            return None
        if len(raw) < _CHECKPOINT_HEAD.size:
            return None
        magic, length, checksum = _CHECKPOINT_HEAD.unpack_from(raw)
        body = raw[_CHECKPOINT_HEAD.size : _CHECKPOINT_HEAD.size + length]
        if (
            magic != _CHECKPOINT_MAGIC
            or len(body) != length
            or xxhash.xxh3_64_intdigest(body) != checksum
        ):
            return None
        try:
            record = _checkpoint_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if record.format != CHECKPOINT_FORMAT:
            raise StoreFormatError(
                f"{path} is a checkpoint of format {record.format}; this version reads {CHECKPOINT_FORMAT}"
            )
        return record

    def newest(self, epoch: int) -> CheckpointRecord | None:
        """The newest whole checkpoint of the life ``epoch``."""

        found = [record for record in self.slots if record is not None and record.epoch == epoch]
        return max(found, key=lambda record: record.generation, default=None)

    def write(self, epoch: int, segment: int, meta: bytes) -> CheckpointRecord:
        """Make a checkpoint durable, in the slot not holding the newest one."""

        valid = [
            (record.generation, index)
            for index, record in enumerate(self.slots)
            if record is not None
        ]
        newest_generation, newest_index = max(valid, default=(0, 1))
        index = 1 - newest_index
        record = CheckpointRecord(CHECKPOINT_FORMAT, epoch, newest_generation + 1, segment, meta)
        body = _checkpoint_encoder.encode(record)
        raw = (
            _CHECKPOINT_HEAD.pack(_CHECKPOINT_MAGIC, len(body), xxhash.xxh3_64_intdigest(body))
            + body
        )
        if len(raw) > _CHECKPOINT_SIZE:
            raise StoreFormatError(
                f"A checkpoint record of {len(raw)} bytes does not fit its slot of {_CHECKPOINT_SIZE}"
            )
        fd = self._fds[index]
        if fd is None:
            fd = self._fds[index] = os.open(
                self.paths[index], os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
            )
        try:
            os.pwrite(fd, raw, 0)
            os.fdatasync(fd)
        except BaseException:
            self._fds[index] = None  # the next attempt opens the file afresh
            os.close(fd)
            raise
        self.slots[index] = record
        return record

    def close(self) -> None:
        """Close the slots' descriptors (a later ``write`` opens them again)."""

        fds, self._fds = self._fds, [None, None]
        for fd in fds:
            if fd is not None:
                os.close(fd)


__all__ = [
    "CHECKPOINT_FORMAT",
    "CheckpointRecord",
    "Checkpoints",
]
