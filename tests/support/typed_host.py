"""A typed pi-durable host on an LMDB store: ``tests/cli/test_packaging.py`` runs ``mypy --strict``
on it (so CI does) and runs it, so the one-line swap from SQLite stays type-correct."""

from __future__ import annotations

import asyncio
import sys

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT
from pi_durable.session.transaction import Transaction
from pi_durable.types import EntryId, EntryLookup, Seq, Storage
from pi_durable_lmdb import LmdbStorage, open_lmdb_storage


async def main(path: str) -> tuple[Seq, EntryLookup | None]:
    """One turn through a Session, then a typed read straight from the store."""

    storage: LmdbStorage = await open_lmdb_storage(path, durability="process")
    contract: Storage = storage  # LmdbStorage is a pi-durable Storage, statically too
    session = create_session(contract)

    async def first_turn(tx: Transaction) -> EntryId:
        root = await tx.create_root_conversation()
        entry = await tx.append_entry(root["id"], {"kind": "user", "data": {"text": "hello"}})
        return entry["id"]

    try:
        entry_id: EntryId = await session.commit(first_turn, BACKGROUND_CONTEXT)
        lookup = await storage.entry(entry_id, BACKGROUND_CONTEXT)
        seq = await storage.commit([], BACKGROUND_CONTEXT)
        return seq, lookup
    finally:
        await session.close(BACKGROUND_CONTEXT)
        await storage.close(BACKGROUND_CONTEXT)


if __name__ == "__main__":
    print(asyncio.run(main(sys.argv[1])))
