"""Migrating a pi-durable JSONL store: what its Storage API shows comes across."""

from __future__ import annotations

from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.env.posix import PosixExecutionEnv
from pi_durable.storage.jsonl import JsonlStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.audit.migrate import import_pi_durable
from pi_durable_lmdb.audit.pisource import open_read_only
from pi_durable_lmdb.storage import LmdbStorage


async def test_import_from_a_jsonl_store(tmp_path: Path) -> None:
    source_dir = str(tmp_path / "jsonl")
    source = await JsonlStorage.open(source_dir, PosixExecutionEnv(), CTX)
    await source.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    await source.commit(
        [
            {
                "type": "entry",
                "value": {"id": 2, "conversationId": 1, "kind": "message", "data": {"x": "\ud800"}},
            },
            {
                "type": "entry",
                "value": {"id": 3, "conversationId": 1, "kind": "message", "head": 3},
            },
        ],
        CTX,
    )
    task = {
        "id": 4,
        "conversationId": 1,
        "kind": "k",
        "version": 1,
        "input": None,
        "background": False,
        "abortRequested": False,
        "state": {"status": "pending"},
    }
    await source.commit([{"type": "task", "value": task}], CTX)
    notes = {"id": 5, "kind": "notes", "scope": {"kind": "session"}}
    await source.commit(
        [
            {
                "type": "document.create",
                "record": notes,
                "content": {"kind": "base", "version": 1, "value": {"a": 1}},
            }
        ],
        CTX,
    )
    await source.commit(
        [
            {
                "type": "document.change",
                "id": 5,
                "content": {"kind": "delta", "version": 1, "ops": [["s", ["a"], 2]]},
            }
        ],
        CTX,
    )
    await source.close(CTX)

    async with open_read_only(source_dir) as reopened:
        report = await import_pi_durable(reopened, tmp_path / "store")
    assert report.records == {"conversation": 1, "entry": 2, "task": 1, "document": 1}
    assert any("document history" in line for line in report.lacking)

    storage = await LmdbStorage.open(tmp_path / "store", readonly=True)
    try:
        assert (await storage.entry(2, CTX))["entry"]["data"] == {"x": "\ud800"}
        assert (await storage.find_latest_head_marker(1, None, CTX))["id"] == 3
        assert await storage.task(4, CTX) == task
        document = await storage.document(5, "current", CTX)
        assert (document["value"], document["version"]) == ({"a": 2}, 1)
        assert (await storage.entry(2, CTX))["commitSeq"] == (await storage.entry(3, CTX))[
            "commitSeq"
        ], "entries keep their original commit grouping"
    finally:
        await storage.close()
    assert verify(tmp_path / "store") is None
