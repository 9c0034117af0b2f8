"""A pi-durable Session on LmdbStorage: the real host path, closed and reopened."""

from __future__ import annotations

from pathlib import Path

import pytest
from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.errors import StorageRequestError as PiStorageRequestError

from storage import LmdbStorage, StorageRequestError
from storage.demo import QUESTIONS, _definitions, run_workload
from storage.audit import verify


async def test_the_demo_workload_reads_back_after_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    first = await run_workload(path)
    assert first["root_answers"] == len(QUESTIONS)
    assert first["fork_answers"] == 0, "the fork copied the notes as of its fork point"
    assert first["fork_entries"] == 1
    second = await run_workload(path)  # the same store, reopened: history accumulates
    assert second["root_answers"] == 2 * len(QUESTIONS)
    assert second["head"] > first["head"]
    assert verify(path) is None

    notes, settings, _ = _definitions()
    storage = await LmdbStorage.open(path, readonly=True)
    session = create_session(storage)
    try:
        assert (await session.snapshot(settings, CTX))["turns"] == 2 * len(QUESTIONS)
        tasks = await storage.scan_tasks({"status": "terminal"}, 100, None, CTX)
        assert len(tasks["items"]) == 2 * len(QUESTIONS)
        assert all(task["state"]["outcome"]["status"] == "completed" for task in tasks["items"])
    finally:
        await session.close(CTX)
        await storage.close()


async def test_a_session_fails_only_the_read_on_a_storage_request_error(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    session = create_session(storage)
    try:
        async def root(tx):  # type: ignore[no-untyped-def]
            return await tx.create_root_conversation()

        await session.commit(root, CTX)
        with pytest.raises(StorageRequestError) as raised:
            await session.storage.scan_entries({"conversationId": 999}, 10, None, CTX)
        assert isinstance(raised.value, PiStorageRequestError)
        assert "Unknown conversation: 999" in str(raised.value)
        assert session.failure is None, "a StorageRequestError must not fail the Session"

        async def entry(tx):  # type: ignore[no-untyped-def]
            return await tx.append_entry(1, {"kind": "message", "data": {"after": "the failed read"}})

        record = await session.commit(entry, CTX)
        assert (await storage.entry(record["id"], CTX))["entry"] == record
    finally:
        await session.close(CTX)
        await storage.close()
