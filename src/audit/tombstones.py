"""Importing what an erasure left in an export: a tombstone's line (``"erased"`` beside the writes
it kept) and an erasure record's (``"erasure"``), appended as the exporting store held them, their
leaf hashes included, so the imported store has the same Merkle tree."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Final

import lmdb
import msgspec

from ..log.records import Erasure, Write, encode_batch, encode_erasure, encode_tombstone
from ..projections import Projector
from ..storage.lmdb_storage import LmdbStorage
from .jsonlines import from_json


def erased_parts(number: int, line: str) -> tuple[str, Any] | None:
    """``("erased", its object)`` of a tombstone's line, ``("erasure", its object)`` of an
    erasure record's, ``None`` for a batch's."""

    if '"erased"' not in line and '"erasure"' not in line:
        return None
    value = from_json(line)
    found = [(name, value[name]) for name in ("erased", "erasure") if name in value]
    if len(found) > 1:
        raise ValueError(f"Line {number} of the export is both a tombstone and an erasure")
    return found[0] if found else None


async def take_in_erased(
    storage: LmdbStorage, seq: int, committed_at: int, writes: list[Any], erased: tuple[str, Any]
) -> int:
    """Append an exported tombstone or erasure record at ``seq``, as the exporting store held
    it (its leaf hash included), and fold its writes."""

    kind, value = erased
    try:
        if kind == "erasure":
            if writes:
                raise ValueError("an erasure record holds no writes")
            record, _ = encode_erasure(msgspec.convert(value, Erasure), committed_at)
            batch: list[Write] = []
        else:
            fields = msgspec.convert(value, _ErasedLine)
            leaf = bytes.fromhex(fields.leaf) if _HEX64.fullmatch(fields.leaf) else b""
            encoded = encode_batch(writes)
            record = encode_tombstone(
                encoded.payload, committed_at, leaf, fields.erasure, fields.writes
            )
            batch = encoded.writes
    except msgspec.ValidationError as error:
        raise ValueError(f"'{kind}': {error}") from None
    log, env = storage.log, storage.log.env

    def work(txn: lmdb.Transaction[bytes], projector: Projector) -> tuple[int, int]:
        outcome = projector.admit(txn, batch, lambda: log.append_record(txn, seq, record))
        if isinstance(outcome, Exception):
            raise ValueError(str(outcome))
        if env.journal is not None:
            env.journal.stage(seq, record)
        return outcome

    new_seq, max_id = await asyncio.to_thread(storage.take_in, work)
    storage.taken_in(max_id)
    return new_seq


class _ErasedLine(msgspec.Struct, forbid_unknown_fields=True):
    leaf: str
    erasure: int
    writes: int


_HEX64: Final = re.compile(r"[0-9a-f]{64}")


__all__ = ["erased_parts", "take_in_erased"]
