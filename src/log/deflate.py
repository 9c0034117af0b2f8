"""Deflating stored bytes: the projections' rows that are read rarely (document
snapshots, the history of overwritten rows), and log records of format 2, which are still read
(log records are written as format 3: ``log.zstd``, with this module's ``PRESET``).

Raw deflate (zlib's, no header or trailer: every stored value already has its own checksum) with a
preset dictionary of the Storage contract's field names and record shapes (placeholder values,
no data) as msgpack: a batch of a few hundred bytes is mostly keys and map headers, which the
dictionary turns into back-references from its first byte. The dictionary is part of the format: ``PRESET`` must never change (a record of format 2 is
inflated with exactly these bytes); another dictionary would be another format.
"""

from __future__ import annotations

import zlib
from typing import Final

import msgspec

PRESET_KEYS: Final = (
    "type",
    "value",
    "record",
    "content",
    "source",
    "id",
    "conversation",
    "entry",
    "task",
    "submission",
    "document.create",
    "document.copy",
    "document.change",
    "document.retire",
    "conversationId",
    "taskId",
    "parent",
    "at",
    "kind",
    "version",
    "ops",
    "base",
    "delta",
    "scope",
    "session",
    "key",
    "history",
    "rewindable",
    "fork",
    "asOf",
    "current",
    "message",
    "model",
    "role",
    "user",
    "assistant",
    "toolResult",
    "toolCall",
    "text",
    "thinking",
    "name",
    "arguments",
    "api",
    "provider",
    "usage",
    "input",
    "output",
    "cacheRead",
    "cacheWrite",
    "totalTokens",
    "cost",
    "stopReason",
    "stop",
    "toolUse",
    "timestamp",
    "isError",
    "details",
    "data",
    "byTaskId",
    "customType",
    "display",
    "background",
    "abortRequested",
    "startedAt",
    "state",
    "status",
    "pending",
    "running",
    "waiting",
    "sleeping",
    "completing",
    "terminal",
    "until",
    "checkpoint",
    "memos",
    "result",
    "error",
    "requestId",
    "queued",
    "placed",
    "done",
    "unanswered",
    "createdAt",
)
"""Never change (see the module docstring)."""

PRESET_SHAPES: Final = (
    [{"type": "conversation", "value": {"id": 1, "parent": {"conversationId": 1, "at": 1}}}],
    [
        {
            "type": "submission",
            "value": {
                "id": 1,
                "conversationId": 1,
                "requestId": "",
                "type": "input",
                "status": "queued",
            },
        }
    ],
    [
        {
            "type": "document.create",
            "record": {
                "id": 1,
                "kind": "",
                "scope": {"kind": "conversation", "conversationId": 1},
                "history": "rewindable",
                "fork": "asOf",
            },
            "content": {"kind": "base", "version": 1, "value": {}},
        }
    ],
    [
        {
            "type": "task",
            "value": {
                "id": 1,
                "conversationId": 1,
                "kind": "",
                "version": 1,
                "input": {},
                "background": False,
                "abortRequested": False,
                "startedAt": 1_760_000_000_000,
                "state": {"status": "running"},
                "memos": {},
            },
        }
    ],
    [
        {
            "type": "entry",
            "value": {
                "id": 1,
                "conversationId": 1,
                "kind": "message",
                "model": [
                    {
                        "role": "assistant",
                        "content": [{"type": "text", "text": ""}],
                        "api": "",
                        "provider": "",
                        "model": "",
                        "usage": {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0},
                        "stopReason": "stop",
                        "timestamp": 1_760_000_000_000,
                    }
                ],
            },
        }
    ],
    [{"type": "document.change", "id": 1, "content": {"kind": "delta", "version": 1, "ops": []}}],
)
"""Batches of the contract's record shapes with placeholder values (no data): a batch of the same
shape is mostly these byte runs, keys and map headers in order. Never change."""

PRESET: Final = b"".join(msgspec.msgpack.encode(key) for key in PRESET_KEYS) + b"".join(
    msgspec.msgpack.encode(shape) for shape in PRESET_SHAPES
)

MIN_SIZE: Final = 48
"""Shorter values are stored as they are: deflate cannot win enough to pay for itself."""
MIN_SAVING: Final = 8
"""A value is stored deflated only when that saves at least this many bytes."""
LEVEL: Final = 1
"""Small values (a commit's batch is ~1 KiB): the dictionary and zlib's setup dominate, level 1
costs ~20% less CPU than the default 6 for ~2% more bytes (``tools/bench/commit_path.py``)."""
BIG_LEVEL: Final = 6
"""Values of ``BIG`` bytes or more (document snapshots, long rows) keep zlib's default: there the
level decides the size."""
BIG: Final = 4096
MEM_LEVEL: Final = 4
"""zlib's hash table and buffers at memLevel 4 take ~24 KiB instead of ~150 KiB at its default 8:
on the commit path, where the caches hold the caller's data, that is most of deflate's cost; on
values of a few KiB the ratio is the same."""

_primed: dict[tuple[int, int], zlib._Compress] = {}


def _compressor(window: int, level: int) -> zlib._Compress:
    """A compressor with ``PRESET`` already loaded: each value starts from a copy of it, which
    costs less than loading the dictionary again (``Compress.copy`` is thread-safe)."""

    primed = _primed.get((window, level))
    if primed is None:
        primed = _primed[(window, level)] = zlib.compressobj(
            level, zlib.DEFLATED, -window, MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, PRESET
        )
    return primed.copy()


def deflate(data: bytes) -> bytes | None:
    """``data`` deflated, or ``None`` when that would not save ``MIN_SAVING`` bytes."""

    size = len(data)
    if size < MIN_SIZE:
        return None
    window = min(15, max(9, (size + len(PRESET)).bit_length()))  # a small window starts faster
    compressor = _compressor(window, LEVEL if size < BIG else BIG_LEVEL)
    out = compressor.compress(data) + compressor.flush()
    return out if len(out) + MIN_SAVING <= size else None


def inflate(data: bytes | memoryview, size: int) -> bytes:
    """The ``size`` bytes ``data`` deflates; ``ValueError`` if it holds anything else (never more
    than ``size`` bytes are produced, whatever ``data`` holds)."""

    if size <= 0:  # zlib reads a max_length of 0 as "no limit"
        raise ValueError(f"a deflated value of {size} bytes")
    decompressor = zlib.decompressobj(-15, PRESET)
    try:
        out = decompressor.decompress(
            data, size
        )  # the output grows as it is made: no allocation of ``size``
    except zlib.error as error:
        raise ValueError(f"undeflatable ({error})") from None
    except (OverflowError, MemoryError):
        raise ValueError(
            f"a deflated value of {size} bytes, which this process cannot hold"
        ) from None
    if (
        len(out) != size
        or not decompressor.eof
        or decompressor.unconsumed_tail
        or decompressor.unused_data
    ):
        raise ValueError(f"does not deflate to {size} bytes")
    return out


__all__ = [
    "BIG",
    "BIG_LEVEL",
    "LEVEL",
    "MEM_LEVEL",
    "MIN_SAVING",
    "MIN_SIZE",
    "PRESET",
    "PRESET_KEYS",
    "PRESET_SHAPES",
    "deflate",
    "inflate",
]
