"""A minimal agent host: a pi-durable Session on an embedded store (python examples/host.py STORE)."""

import asyncio
import sys

from pi_durable import create_session, define_doc
from pi_durable.context import BACKGROUND_CONTEXT as ctx
from pi_durable_lmdb import open_lmdb_storage

notes = define_doc(  # a document per conversation: the answers given in it
    kind="notes",
    version=1,
    scope="conversation",
    history="latest",
    fork="current",
    initial=lambda: {"answers": []},
    checkpoint_when=lambda value, ops, info: False,
)


async def main(path: str) -> None:
    storage = await open_lmdb_storage(path)  # durability="power": survives power loss
    session = create_session(storage)
    try:

        async def open_root(tx):  # the root conversation (id 1), made by the first run
            return await tx.conversation(1) or await tx.create_root_conversation()

        root = await session.commit(open_root, ctx)

        async def turn(tx):  # one commit, all or nothing: an entry and a document change
            await tx.append_entry(
                root["id"], {"kind": "message", "model": [{"role": "user", "content": "Hello"}]}
            )
            doc = await tx.doc(notes, root["id"])
            doc.answers.append("Hello to you")

        await session.commit(turn, ctx)
        value = await session.snapshot(notes, root["id"], ctx)
        print(f"conversation {root['id']}: {value['answers']}, log head {storage.log.head()}")
    finally:
        await session.close(ctx)
        await storage.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "host-store"))
