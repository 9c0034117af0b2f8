"""Fork a conversation through a Session, and read a document as it stood at an entry
(python examples/fork.py STORE)."""

import asyncio
import sys

from pi_durable import create_session, define_doc
from pi_durable.context import BACKGROUND_CONTEXT as ctx
from pi_durable_lmdb import open_lmdb_storage

notes = define_doc(  # rewindable: the store keeps its past values, for snapshot_as_of
    kind="notes",
    version=1,
    scope="conversation",
    history="rewindable",
    fork="asOf",  # a fork gets a copy of the notes as they stood at the fork's entry
    initial=lambda: {"answers": []},
    checkpoint_when=lambda value, ops, info: False,
)
QUESTIONS = ("What is stored?", "How is it rebuilt?", "How fast is a commit?")


async def main(path: str) -> None:
    storage = await open_lmdb_storage(path)
    session = create_session(storage)
    try:
        ownerless = {"ownership": {"kind": "ownerless"}}  # or {"kind": "task", "taskId": ...}
        root = await session.commit(lambda tx: tx.create_conversation(ownerless), ctx)
        asked = []
        for question in QUESTIONS:  # a commit per turn: the question and its answer in the notes

            async def turn(tx, question=question):
                message = {"role": "user", "content": question}
                entry = await tx.append_entry(root["id"], {"kind": "message", "model": [message]})
                (await tx.doc(notes, root["id"])).answers.append(f"answer to {question}")
                return entry

            asked.append(await session.commit(turn, ctx))

        async def branch(tx):  # a new conversation that continues from the second question
            return await tx.fork_conversation(root["id"], asked[1]["id"], ownerless)

        fork = await session.commit(branch, ctx)
        assert fork["parent"] == {"conversationId": root["id"], "at": asked[1]["id"]}

        async def seen(tx):  # a transaction that only reads commits nothing
            page = await tx.scan_entries({"conversationId": fork["id"], "order": "ascending"}, 50)
            return [entry["model"][0]["content"] for entry in page["items"]]

        print(f"the fork sees: {await session.commit(seen, ctx)}")
        fork_notes = await session.snapshot(notes, fork["id"], ctx)
        root_notes = await session.snapshot(notes, root["id"], ctx)
        print(
            f"its notes hold {len(fork_notes['answers'])} answers, the root's {len(root_notes['answers'])}"
        )
        first = await session.snapshot_as_of(notes, root["id"], asked[0]["id"], ctx)
        print(f"the root's notes at its first question: {first['answers']}")
    finally:
        await session.close(ctx)
        await storage.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "fork-store"))
