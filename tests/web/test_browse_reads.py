"""The two reads the web view added to ``StorageReads``: every document of every scope, and a
document's stored versions, each checked against what the log itself says."""

from __future__ import annotations

from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.cli.demo import run_workload
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage


async def test_every_document_and_each_ones_versions_are_those_the_log_wrote(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    await run_workload(str(path))
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        written: dict[int, list[int]] = {}
        for commit in storage.log.read(1, storage.log.head()):
            for write in commit.writes:
                tag = type(write).__struct_config__.tag
                if tag in ("document.create", "document.copy"):
                    written.setdefault(write.record["id"], []).append(commit.seq)
                elif tag == "document.change":
                    written.setdefault(write.id, []).append(commit.seq)
        documents = []
        after = None
        while True:
            page = await storage.scan_all_documents(
                1, after
            )  # one per page: the cursor is exercised
            documents += page["items"]
            if "next" not in page:
                break
            after = page["next"]["after"]
        assert sorted(record["id"] for record in documents) == sorted(written)
        for record in documents:
            scoped = await storage.scan_documents(
                {"scope": record["scope"], "at": "current"}, 100, None, CTX
            )
            assert record in scoped["items"]
            versions = await storage.document_revisions(record["id"])
            assert [row.seq for row in versions] == written[record["id"]]
            assert versions[0].kind == "base"
            if (
                record.get("history") == "rewindable"
            ):  # a current-only one keeps no past values to read
                last = await storage.document(record["id"], versions[-1].seq, CTX)
                assert last == await storage.document(record["id"], "current", CTX)
        view = await storage.as_of(2)
        assert (await view.scan_all_documents(10))["items"] == []  # none existed yet
    finally:
        await storage.close()
