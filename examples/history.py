"""Read a store as it was: a view as of a log sequence, a Session over that view, the log's
commits and a document's stored versions (python examples/history.py STORE)."""

import asyncio
import sys

from pi_durable import create_session, define_doc
from pi_durable.context import BACKGROUND_CONTEXT as ctx
from pi_durable_lmdb import open_lmdb_storage

notes = define_doc(
    kind="notes",
    version=1,
    scope="conversation",
    history="rewindable",
    fork="asOf",
    initial=lambda: {"answers": []},
    checkpoint_when=lambda value, ops, info: False,
)


async def main(path: str) -> None:
    storage = await open_lmdb_storage(path)
    session = create_session(storage)
    try:
        ownerless = {"ownership": {"kind": "ownerless"}}  # a conversation of its own, a new id
        root = await session.commit(lambda tx: tx.create_conversation(ownerless), ctx)
        after_turn = []  # the log's head after each turn: a point to read the store at
        for number in (1, 2, 3):

            async def turn(tx, number=number):
                message = {"role": "assistant", "content": f"answer {number}"}
                await tx.append_entry(root["id"], {"kind": "message", "model": [message]})
                (await tx.doc(notes, root["id"])).answers.append(number)

            await session.commit(turn, ctx)
            after_turn.append(storage.log.head())

        view = await storage.as_of(after_turn[0])  # every read as right after that commit
        page = await view.scan_entries({"conversationId": root["id"]}, 50, None, ctx)
        print(f"as of the first turn: {len(page['items'])} entry")

        past = create_session(view)  # a Session over the view: its reads are of that point
        try:
            print(f"its notes then: {await past.snapshot(notes, root['id'], ctx)}")
        finally:
            await past.close(ctx)

        for commit in storage.log.read(
            after_turn[1], after_turn[2]
        ):  # the log: what each commit wrote
            kinds = [type(write).__struct_config__.tag for write in commit.writes]
            print(f"a commit of {len(commit.writes)} writes: {', '.join(kinds)}")

        address = {"kind": "notes", "scope": {"kind": "conversation", "conversationId": root["id"]}}
        record = await storage.find_document(address, "current", ctx)
        versions = await storage.document_revisions(record["id"])  # oldest first
        print(f"the notes' stored versions: {[version.kind for version in versions]}")
        second = await storage.document(record["id"], versions[1].seq, ctx)  # a past value
        print(f"the notes at their second version: {second['value']}")
    finally:
        await session.close(ctx)
        await storage.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "history-store"))
