"""An implementation of docs/audit.md's leaf encoding written from that page alone (``json``,
``re``, ``struct``, ``hashlib``; nothing of the package), checked against the leaves and root a
store computes, for exported lines of every kind of value a store keeps."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit.export import export_lines

from tests.support.compare import REFUSALS
from tests.support.workload import Workload

# ── the page's encoding ───────────────────────────────────────────────────────

_MARK = "\U0010ffff"


def read_line(line: str) -> dict[str, Any]:
    """One exported line; each ``\\udXXX`` escape stays one code point (the page's caveat)."""

    marked = re.sub(r"\\u([dD][89a-fA-F][0-9a-fA-F]{2})", lambda m: _MARK + m[1], line)
    return _unmark(json.loads(marked))


def _unmark(value: Any) -> Any:
    if isinstance(value, str):
        return re.sub(_MARK + "([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), value)
    if isinstance(value, list):
        return [_unmark(item) for item in value]
    if isinstance(value, dict):
        return {_unmark(key): _unmark(item) for key, item in value.items()}
    return value


def _count(fixed: int, code16: int, code32: int, n: int) -> bytes:
    """The header of an array or object of ``n`` items (no 1-byte form)."""

    if n < 16:
        return bytes([fixed | n])
    if n < 1 << 16:
        return bytes([code16]) + n.to_bytes(2, "big")
    return bytes([code32]) + n.to_bytes(4, "big")


def _ext(kind: int, data: bytes) -> bytes:
    fixed = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
    if len(data) in fixed:
        return bytes([fixed[len(data)], kind]) + data
    for code, size in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        if len(data) < 1 << (8 * size):
            return bytes([code]) + len(data).to_bytes(size, "big") + bytes([kind]) + data
    raise ValueError(len(data))


def _has_surrogate(text: str) -> bool:
    return any(0xD800 <= ord(char) <= 0xDFFF for char in text)


def pack(value: Any) -> bytes:
    if value is None:
        return b"\xc0"
    if value is False:
        return b"\xc2"
    if value is True:
        return b"\xc3"
    if isinstance(value, int):
        if 0 <= value <= 127:
            return bytes([value])
        if -32 <= value < 0:
            return bytes([value & 0xFF])
        if 0 <= value < 2**64:
            for code, size in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
                if value < 1 << (8 * size):
                    return bytes([code]) + value.to_bytes(size, "big")
        if -(2**63) <= value < 0:
            for code, size in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
                if value >= -(1 << (8 * size - 1)):
                    return bytes([code]) + value.to_bytes(size, "big", signed=True)
        return _ext(4, value.to_bytes((abs(value).bit_length() + 8) // 8, "big", signed=True))
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        if _has_surrogate(value):
            return _ext(1, value.encode("utf-8", "surrogatepass"))
        data = value.encode("utf-8")
        if len(data) < 32:
            return bytes([0xA0 | len(data)]) + data
        for code, size in ((0xD9, 1), (0xDA, 2), (0xDB, 4)):
            if len(data) < 1 << (8 * size):
                return bytes([code]) + len(data).to_bytes(size, "big") + data
    if isinstance(value, list):
        return _count(0x90, 0xDC, 0xDD, len(value)) + b"".join(pack(item) for item in value)
    if isinstance(value, dict):
        if any(_has_surrogate(key) for key in value):
            flat = [part for key, item in value.items() for part in (key, item)]
            return _ext(3, pack(flat))
        body = b"".join(pack(key) + pack(item) for key, item in value.items())
        return _count(0x80, 0xDE, 0xDF, len(value)) + body
    raise TypeError(type(value))


def leaf_hash_of_line(line: str) -> bytes:
    record = read_line(line)
    data = (
        b"\x01" + struct.pack(">Qq", record["seq"], record["committedAt"]) + pack(record["writes"])
    )
    return hashlib.sha256(b"\x00" + data).digest()


def root(hashes: list[bytes]) -> bytes:
    if not hashes:
        return hashlib.sha256(b"").digest()
    if len(hashes) == 1:
        return hashes[0]
    k = 1
    while k * 2 < len(hashes):
        k *= 2
    return hashlib.sha256(b"\x01" + root(hashes[:k]) + root(hashes[k:])).digest()


# ── against the store ─────────────────────────────────────────────────────────


ODD_VALUES: list[Any] = [
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**40,
    -(10**40),
    128,
    -33,
    -129,
    65536,
    0.5,
    1.0,
    -0.0,
    1e300,
    "x" * 31,
    "y" * 32,
    "z" * 300,
    "\ud800",
    "a\udfffb",
    {"k\ud800": 1, "plain": [1, 2]},
    list(range(16)),
    {f"key{i}": i for i in range(20)},
    "日本語",
    "\ud83d\ude00",
    None,
    True,
    False,
]


async def test_an_implementation_of_the_page_computes_the_stores_leaves_and_root(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    reference, work, done = MemoryStorage(), Workload(11), 0
    try:
        while done < 60:
            writes = work.batch()
            try:
                reference.prepare_commit(writes)
            except REFUSALS:
                continue
            await reference.commit(writes, CTX)
            await storage.commit(writes, CTX)
            done += 1
        for index, value in enumerate(ODD_VALUES):
            conversation = {
                "id": 10_000 + index,
                "meta": {"value": value},
                "list": [value, {"nested": value}],
            }
            await storage.commit(
                [{"type": "conversation", "value": conversation}], CTX, committed_at=-5 + index
            )
        head = storage.log.head()
        leaves = [bytes.fromhex(storage.log.prove(seq).leaf_hash) for seq in range(1, head + 1)]
        stored_root = storage.log.root()
    finally:
        await storage.close()
    lines = list(export_lines(path))
    assert len(lines) == head == len(leaves)
    assert any("\\ud800" in line for line in lines) and any(str(10**40) in line for line in lines)
    assert [leaf_hash_of_line(line) for line in lines] == leaves
    assert root([leaf_hash_of_line(line) for line in lines]) == stored_root
