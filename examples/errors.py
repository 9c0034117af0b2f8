"""The errors a host meets, each caught where it is raised (python examples/errors.py STORE)."""

import asyncio
import sys

from pi_durable import SessionFailed, StorageRequestError, create_session, define_doc
from pi_durable.context import BACKGROUND_CONTEXT as ctx
from pi_durable_lmdb import StoreClosedError, WriterLockedError, open_lmdb_storage

plan = define_doc(  # history="latest": the store keeps only its current value
    kind="plan",
    version=1,
    scope="conversation",
    history="latest",
    fork="current",
    initial=lambda: {"steps": []},
    checkpoint_when=lambda value, ops, info: False,
)


def caught(what: str, error: Exception) -> None:
    print(f"{what}: {type(error).__name__}")


async def main(path: str) -> None:
    storage = await open_lmdb_storage(path)
    session = create_session(storage)
    try:
        try:  # one writer at a time, in this process or another
            await open_lmdb_storage(path)
        except WriterLockedError as error:
            caught("a second writer", error)
        reader = await open_lmdb_storage(path, readonly=True)  # readers: any number, any time
        await reader.close()

        async def start(tx):
            root = await tx.create_conversation({"ownership": {"kind": "ownerless"}})
            (await tx.doc(plan, root["id"])).steps.append("look")
            return root

        root = await session.commit(start, ctx)
        try:  # a transaction that raises commits nothing; the Session goes on
            await session.commit(lambda tx: tx.append_entry(999_999_999, {"kind": "note"}), ctx)
        except ValueError as error:
            caught("an entry in no conversation", error)
        try:  # the past of a "latest" document is not kept
            await session.snapshot_as_of(plan, root["id"], 1, ctx)
        except TypeError as error:
            caught("snapshot_as_of of a latest document", error)
        record = await storage.find_document(
            {"kind": "plan", "scope": {"kind": "conversation", "conversationId": root["id"]}},
            "current",
            ctx,
        )
        try:
            await storage.document(record["id"], storage.log.head() - 1, ctx)
        except StorageRequestError as error:
            caught("its value at an earlier sequence", error)
        try:  # malformed writes are refused whole: the log is as it was
            await storage.commit([{"type": "entry", "value": {"id": 1}}], ctx)
        except ValueError as error:
            caught("a malformed write", error)

        past = create_session(await storage.as_of(storage.log.head()))
        try:  # a view is read-only; the Session over it fails at its first commit
            await past.commit(lambda tx: tx.append_entry(root["id"], {"kind": "note"}), ctx)
        except PermissionError as error:
            caught("a commit through a view", error)
        try:
            await past.snapshot(plan, root["id"], ctx)
        except SessionFailed as error:
            caught("that Session afterwards", error)
        await past.close(ctx)
    finally:
        await session.close(ctx)
        await storage.close()
    try:
        await storage.conversation(root["id"], ctx)
    except StoreClosedError as error:
        caught("a read after close", error)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "errors-store"))
