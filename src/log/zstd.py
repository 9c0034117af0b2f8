"""Compressing log records (format 3): zstd at level 1 with ``log.deflate.PRESET`` as a
raw-content dictionary, in a plain zstd frame that carries its content size (no checksum: the
record's CRC-32 covers the frame; no dictionary id: format 3 names the dictionary).

Why zstd rather than deflate (format 2): compressing the record is one of the largest costs on
the commit path, and on a turn's batch of about a kilobyte zstd at level 1 takes about half
deflate's time to compress and less to decompress, for a few percent more bytes
(``tools/bench/concurrent.py --raw-records`` measures what compression costs a busy store). Level
1: negative levels cost a third more bytes, levels 2 and 3 the same bytes for more time, higher
ones a few percent fewer bytes for more time than deflate took.

The dictionary is format 2's ``PRESET``, byte for byte: never change it (a record of format 3 is
decompressed with exactly these bytes). Format-2 records are still read (``log.deflate``).

Bounded reads: zstd reserves a frame's declared size before it decompresses, and a frame can
expand thousands of times (a run of one letter: over 30,000 to 1), so a record read from a stream
or a damaged file could make a reader reserve gigabytes from a few bytes. A frame of format 3 may
therefore expand at most ``MAX_EXPANSION`` times, which both sides keep: a writer stores a
``dense`` value as format 2 instead (deflate cannot exceed about 1,032 to 1, and its reader grows
its output as it goes), and ``decompress`` refuses a claim above the bound before reserving
anything.

A zstd context is not safe to share between threads: each thread keeps its own pair.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import zstandard

from .deflate import MIN_SAVING, MIN_SIZE, PRESET

LEVEL: Final = 1
"""zstd's level for log records (see the module docstring)."""
MAX_EXPANSION: Final = 256
"""How many times its size a frame of format 3 may hold (see the module docstring): a contract
batch is rarely over 10 times; a 1 MiB frame can claim at most 256 MiB."""
MAGIC: Final = b"\x28\xb5\x2f\xfd"
"""The first bytes of every frame ``compress`` makes (zstd's magic number)."""

FAST_LEVEL: Final = -1
"""zstd's level for rows read far more often than written (``compress(data, fast=True)``: entry
rows, ``projections.tables.pack_entry``). A negative level keeps literals as they are (no
Huffman stage to decode), so a frame of a kilobyte decompresses in under a microsecond instead
of about five, for about a third more bytes than ``LEVEL``. Any level's frames decompress with
the same dictionary: the level is no part of the format."""
FAST_MIN_MATCH: Final = 7
"""The shortest match ``FAST_LEVEL`` frames use. zstd picks 5 for a value of a kilobyte; each
match is a sequence to decode, and the short ones (a msgpack key and its tag) save a byte or
two each: at 7, a host's entry row (0.8 KB) decompresses in 0.4 us instead of 0.7, for 9% more
bytes (638 against 586), and most such rows still fit six to a 4 KiB page (a 10,000-turn
store's entries take 4% more pages)."""

_DICTIONARY: Final = zstandard.ZstdCompressionDict(PRESET, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
_DICTIONARY.precompute_compress(level=LEVEL)  # once, not per record
_FAST_DICTIONARY: Final = zstandard.ZstdCompressionDict(
    PRESET, dict_type=zstandard.DICT_TYPE_RAWCONTENT
)
_FAST_PARAMETERS: Final = zstandard.ZstdCompressionParameters.from_level(
    FAST_LEVEL,
    min_match=FAST_MIN_MATCH,
    write_checksum=False,
    write_content_size=True,
    write_dict_id=False,
)
_FAST_DICTIONARY.precompute_compress(compression_params=_FAST_PARAMETERS)


class _Contexts(threading.local):
    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(
            level=LEVEL,
            dict_data=_DICTIONARY,
            write_checksum=False,
            write_content_size=True,
            write_dict_id=False,
        )
        self.fast = zstandard.ZstdCompressor(
            compression_params=_FAST_PARAMETERS, dict_data=_FAST_DICTIONARY
        )
        self.decompressor = zstandard.ZstdDecompressor(dict_data=_DICTIONARY)


_contexts = _Contexts()
_claim: Final = zstandard.frame_content_size
_contexts.decompressor.decompress(
    _contexts.compressor.compress(PRESET)
)  # the dictionary's tables, built once here


def compress(data: bytes, fast: bool = False) -> bytes | None:
    """``data`` as one zstd frame (at ``FAST_LEVEL`` when ``fast``, else ``LEVEL``), or ``None``
    when that would not save ``MIN_SAVING`` bytes (values under ``MIN_SIZE`` are not tried). A
    frame that is ``dense`` must not be stored as format 3: ``decompress`` would refuse it."""

    size = len(data)
    if size < MIN_SIZE:
        return None
    out = (_contexts.fast if fast else _contexts.compressor).compress(data)
    return out if len(out) + MIN_SAVING <= size else None


def dense(frame: bytes | memoryview, size: int) -> bool:
    """A frame of ``size`` bytes once decompressed expands more than ``MAX_EXPANSION`` times."""

    return size > MAX_EXPANSION * len(frame)


def decompress(data: bytes | memoryview, size: int, whole: bool = True) -> bytes:
    """The ``size`` bytes the frame ``data`` holds; ``ValueError`` if it holds anything else. The
    frame's own content size (under the record's checksum) must be ``size`` before anything is
    decompressed, so nothing bigger than the record says is ever allocated. ``whole=False``
    does not look for bytes after the frame (they would be ignored): about 0.4 us of the 1 us a
    kilobyte row takes, for rows read far more often than records (``projections.tables``)."""

    if 0 < size <= MAX_EXPANSION * len(data):
        try:
            if zstandard.frame_content_size(data) == size:
                # The frame declares exactly ``size``: zstd reserves that and writes no more.
                # (No keyword when not ``whole``: parsing one costs a third of a small frame.)
                decompressor = _contexts.decompressor
                out = (
                    decompressor.decompress(data, allow_extra_data=False)
                    if whole
                    else decompressor.decompress(data)
                )
                if len(out) == size:
                    return out
        except (zstandard.ZstdError, MemoryError):
            pass
    raise ValueError(_refusal(data, size, whole))


def unframe(frame: bytes) -> bytes:
    """The bytes the frame ``frame`` holds, for rows read far more often than written
    (``projections.tables.pack_entry``): the frame itself declares its size, which must be
    positive and at most ``MAX_EXPANSION`` times the frame's before anything is reserved; zstd
    then writes exactly that many bytes or fails. ``ValueError`` if it holds anything else.
    Bytes after the frame are not looked for (the row is under its own checksum). A loop over
    many frames takes the same two steps inline (``frame_reader``)."""

    try:
        if 0 < _claim(frame) <= MAX_EXPANSION * len(frame):
            return _contexts.decompressor.decompress(frame)
    except (zstandard.ZstdError, MemoryError):
        pass
    raise ValueError(_unframe_refusal(frame))


Error: Final = zstandard.ZstdError
"""What ``frame_reader``'s functions raise for bytes that are no frame or do not decompress."""


def frame_reader() -> tuple[Callable[[bytes], int], Callable[[bytes], bytes]]:
    """``(claim, decompress)``: ``unframe``'s two steps for a loop over many frames on this
    thread (a page of entry rows: a call per row costs a sixth of the page). ``claim(frame)``
    is the size the frame declares (negative: none); the loop refuses a frame unless
    ``0 < claim(frame) <= MAX_EXPANSION * len(frame)``, and only then calls
    ``decompress(frame)``, which returns exactly that many bytes. Both raise ``Error`` for
    bytes that are no frame or do not decompress; ``decompress`` may raise ``MemoryError``."""

    return _claim, _contexts.decompressor.decompress


def _unframe_refusal(frame: bytes) -> str:
    """What is wrong with a frame ``unframe`` refused."""

    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as error:
        return f"not a zstd frame ({error})"
    if declared <= 0:
        return f"a zstd frame that declares {'no size' if declared < 0 else '0 bytes'}"
    return _refusal(frame, declared, False)


def _refusal(data: bytes | memoryview, size: int, whole: bool) -> str:
    """What is wrong with a frame ``decompress`` refused."""

    if size <= 0:
        return f"a compressed value of {size} bytes"
    if dense(data, size):
        return f"a frame of {len(data)} bytes that claims {size}: more than {MAX_EXPANSION} times its size"
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as error:
        return f"not a zstd frame ({error})"
    if declared != size:
        return f"a zstd frame of {declared} bytes, not {size}"
    try:
        out = _contexts.decompressor.decompress(data, allow_extra_data=not whole)
    except zstandard.ZstdError as error:
        return f"undecompressable zstd ({error})"
    except MemoryError:
        return f"a frame of {size} bytes, which this process cannot hold"
    return f"a zstd frame that holds {len(out)} bytes, not {size}"


__all__ = [
    "FAST_LEVEL",
    "FAST_MIN_MATCH",
    "LEVEL",
    "MAGIC",
    "MAX_EXPANSION",
    "Error",
    "compress",
    "decompress",
    "dense",
    "frame_reader",
    "unframe",
]
