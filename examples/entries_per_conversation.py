"""A user projection: entries counted per conversation, folded from the log beside the core
projections (python examples/entries_per_conversation.py STORE)."""

import asyncio
import sys

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as ctx
from pi_durable_lmdb import Projection, open_lmdb_storage
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.log.records import EntryWrite
from pi_durable_lmdb.projections.user import Tables


class EntriesPerConversation(Projection):
    name = "entries_per_conversation"
    version = 1  # change it when fold changes: the new version is built beside, then swapped in
    databases = ("counts",)  # its own LMDB databases

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is EntryWrite:
                key = write.value["conversationId"].to_bytes(8, "big")
                count = int.from_bytes(tables.get("counts", key) or b"\0", "big")
                tables.put("counts", key, (count + 1).to_bytes(8, "big"))


async def main(path: str) -> None:
    storage = await open_lmdb_storage(path, projections=[EntriesPerConversation()])
    session = create_session(storage)
    try:

        async def talk(tx):  # a conversation of two entries
            conversation = await tx.create_conversation({"ownership": {"kind": "ownerless"}})
            for text in ("Hello", "How are you?"):
                message = {"role": "user", "content": text}
                await tx.append_entry(conversation["id"], {"kind": "message", "model": [message]})
            return conversation

        conversation = await session.commit(talk, ctx)
        await storage.projections.wait(storage.log.head())  # read-your-writes
        with storage.projections.read("entries_per_conversation") as tables:
            counts = dict(
                tables.items("counts")
            )  # tables.version, tables.folded_seq: what it serves
        count = int.from_bytes(counts[conversation["id"].to_bytes(8, "big")], "big")
        print(f"the new conversation: {count} entries")
    finally:
        await session.close(ctx)
        await storage.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "projection-store"))
