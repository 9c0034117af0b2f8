"""Erasing a conversation (``storage.erase``, ``durable-log erase``): afterwards every read of
every other conversation, now and as of earlier points, is what pi-durable's ``MemoryStorage``
answers when it folds the log without the erased writes; the erased one reads as never written;
forks are refused unless erased too; no file of the store holds the erased bytes; the log's
proofs still hold and an export with tombstones imports to the same store."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import secrets
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.errors import StorageRequestError
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log import Environment, WriteLog, codec
from pi_durable_lmdb.log.compact import compact
from pi_durable_lmdb.log.records import decode_record_builtins, encode_tombstone, record_leaf
from pi_durable_lmdb.storage import lmdb_storage
from pi_durable_lmdb.storage.erase import scrub
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from tests.support.cli_call import call
from tests.support.compare import REFUSALS, canonical
from tests.support.erasure import memory_of, without
from tests.support.workload import Workload, message, snapshot


async def _fill(
    path: Path, seed: int, count: int = 70
) -> tuple[LmdbStorage, Workload, dict[int, Any]]:
    work = Workload(seed)
    storage = await LmdbStorage.open(path, durability="process")
    accepted: dict[int, list[dict[str, Any]]] = {}
    for _ in range(count):
        writes = work.batch()
        try:
            seq = await storage.commit(copy.deepcopy(writes), CTX)
        except REFUSALS:
            continue
        accepted[seq] = writes
    return storage, work, accepted


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_every_other_read_equals_memory_storage_without_the_erased_writes(
    tmp_path: Path, seed: int
) -> None:
    async def run() -> None:
        storage, work, accepted = await _fill(tmp_path / "store", seed)
        report = None
        for conversation in [*work.conversations[1:], 1]:
            try:
                report = await storage.erase_conversation(
                    conversation, reason="art. 17 request", by="dpo", with_forks=True
                )
            except StorageRequestError:  # a fork the workload drew in a refused batch
                continue
            except ValueError as error:  # a kept document copies an erased one: refused whole
                assert "is a copy of document" in str(error)
                continue
            break
        assert report is not None, f"seed {seed}: no conversation could be erased"
        erased = set(report.conversations)
        kept, refused = without(accepted, erased)
        assert refused == []
        head = storage.log.head()
        assert head == report.seq == max(accepted) + 1
        # The log holds exactly the kept writes; the tombstones keep every sequence.
        for seq in range(1, head):
            line = decode_record_builtins(seq, storage.log.raw_chunk(seq, seq)[0][1])
            assert line["writes"] == kept.get(seq, []), f"seed {seed}: record {seq}"
            assert ("erased" in line) == (seq in report.records)
        assert report.writes == sum(len(w) for w in accepted.values()) - sum(
            len(w) for w in kept.values()
        )
        memory = await memory_of(kept, head)
        assert canonical(await snapshot(storage, work, head)) == canonical(
            await snapshot(memory, work, head)
        ), f"seed {seed}: now"
        for point in sorted({1, head // 3, head // 2, head - 1}):
            view = await storage.as_of(point)
            assert canonical(await snapshot(view, work, point)) == canonical(
                await snapshot(await memory_of(kept, point), work, point)
            ), f"seed {seed}: as of {point}"
        for conversation in erased:
            assert await storage.conversation(conversation, CTX) is None
        await storage.close()
        # A fresh open (projections read from disk) answers the same.
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        assert canonical(await snapshot(storage, work, head)) == canonical(
            await snapshot(memory, work, head)
        ), f"seed {seed}: reopened"
        await storage.close()

    asyncio.run(run())
    assert verify(tmp_path / "store") is None


async def _conversations(path: Path, durability: str, marker: str) -> dict[str, int]:
    """Conversations A (with ``marker`` in an entry, a document's revisions and a task's input,
    some in batches shared with B) and B, and a fork-free third, C."""

    storage = await LmdbStorage.open(path, durability=durability)  # type: ignore[arg-type]
    names = ("a", "b", "c", "doc", "task", "long", "submission")
    ids = {name: await storage.mint_id() for name in names}
    a, b, c = ids["a"], ids["b"], ids["c"]
    await storage.commit([{"type": "conversation", "value": {"id": id}} for id in (a, b, c)], CTX)
    for turn in range(40):
        writes = [
            message(await storage.mint_id(), b, f"b says {turn} " + secrets.token_hex(8)),
            message(await storage.mint_id(), a, f"a says {turn}: {marker}"),
        ]
        if turn == 3:
            writes.append(
                {
                    "type": "document.create",
                    "record": {
                        "id": ids["doc"],
                        "kind": "notes",
                        "scope": {"kind": "conversation", "conversationId": a},
                        "history": "rewindable",
                        "fork": "current",
                    },
                    "content": {"kind": "base", "version": 1, "value": {"text": marker}},
                }
            )
            writes.append(
                {
                    "type": "task",
                    "value": {
                        "id": ids["task"],
                        "conversationId": a,
                        "kind": "research",
                        "version": 1,
                        "input": {"query": marker},
                        "state": {"status": "pending"},
                        "background": False,
                        "abortRequested": False,
                    },
                }
            )
        if turn == 5:  # a document past many chunks, with snapshots of its long history
            writes.append(
                {
                    "type": "document.create",
                    "record": {
                        "id": ids["long"],
                        "kind": "transcript",
                        "scope": {"kind": "task", "taskId": ids["task"]},
                        "history": "rewindable",
                        "fork": "current",
                    },
                    "content": {"kind": "base", "version": 1, "value": {"text": ""}},
                }
            )
            writes.append(
                {
                    "type": "submission",
                    "value": {
                        "id": ids["submission"],
                        "conversationId": a,
                        "type": "input",
                        "requestId": marker,
                        "status": "unanswered",
                        "reason": marker,
                    },
                }
            )
        if turn > 5:
            text = f" {turn} {marker} " + secrets.token_hex(2000)
            writes.append(
                {
                    "type": "document.change",
                    "id": ids["long"],
                    "content": {"kind": "delta", "version": 1, "ops": [["a", ["text"], text]]},
                }
            )
        if turn > 3 and turn % 5 == 0:
            writes.append(
                {
                    "type": "document.change",
                    "id": ids["doc"],
                    "content": {
                        "kind": "delta",
                        "version": 1,
                        "ops": [["s", ["text"], f"{marker} {turn}"]],
                    },
                }
            )
        await storage.commit(writes, CTX)
        await storage.commit([message(await storage.mint_id(), c, f"c {turn}")], CTX)
    await storage.close()
    return ids


def _dirty_gaps(data: Path) -> list[int]:
    """The branch and leaf pages of an LMDB file whose unused middle is not all zeros."""

    raw, size, dirty = data.read_bytes(), 4096, []
    number = 2
    while number < len(raw) // size:
        page = raw[number * size : (number + 1) * size]
        flags, lower, upper = struct.unpack_from("<HHH", page, 10)
        if flags & 0x04:  # an overflow run: its length overlays lower and upper
            number += lower | upper << 16
            continue
        if flags & 0x03 and not flags & 0x20 and any(page[lower:upper]):
            dirty.append(number)
        number += 1
    return dirty


def _files_holding(path: Path, needle: bytes) -> list[str]:
    found = []
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as file:
                if needle in file.read():
                    found.append(os.path.join(root, name))
    return found


async def _reads_of(path: Path, conversation: int) -> Any:
    storage = await LmdbStorage.open(path, durability="process", readonly=True)
    try:
        pages = []
        cursor = None
        while True:
            page = await storage.scan_entries(
                {"conversationId": conversation, "order": "ascending"}, 50, cursor, CTX
            )
            pages.append(page)
            cursor = page.get("next")
            if cursor is None:
                return pages
    finally:
        await storage.close()


async def _erase_and_scrub(path: Path, durability: str, conversation: int) -> None:
    """The Python path ``docs/forgetting.md`` gives: erase, close, ``scrub``."""

    storage = await LmdbStorage.open(path, durability=durability)  # type: ignore[arg-type]
    await storage.erase_conversation(conversation, reason="erasure request 7")
    await storage.close()
    scrub(path)


@pytest.mark.parametrize("via", ["cli", "python"])
@pytest.mark.parametrize("compacted_first", [False, True])
@pytest.mark.parametrize("durability", ["process", "power"])
def test_no_file_of_the_store_holds_erased_bytes(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    durability: str,
    compacted_first: bool,
    via: str,
) -> None:
    path = tmp_path / "store"
    marker = "m" + secrets.token_hex(24)
    ids = asyncio.run(_conversations(path, durability, marker))
    assert call(capsys, "search", path, marker)[0] == 0  # the word index holds it too
    if compacted_first:
        compact(path)
    assert _files_holding(path, marker.encode()), "the marker must be on disk before"
    before_b = asyncio.run(_reads_of(path, ids["b"]))
    before_c = asyncio.run(_reads_of(path, ids["c"]))

    if via == "cli":
        code, out, err = call(
            capsys, "erase", path, "--conversation", ids["a"], "--reason", "erasure request 7"
        )
        assert code == 0, err
        assert "erased conversation" in out
    else:
        asyncio.run(_erase_and_scrub(path, durability, ids["a"]))

    assert _files_holding(path, marker.encode()) == []
    assert not (path / "search.index").exists()
    assert _dirty_gaps(path / "data.mdb") == []
    for segment in (path / "journal").glob("*.seg"):  # recycled segments too: zeros past the header
        assert not any(segment.read_bytes()[4096:]), segment

    async def decoded() -> None:
        storage = await LmdbStorage.open(path, durability="process", readonly=True)
        try:
            for line in storage.log.read(decode=decode_record_builtins):
                assert marker not in repr(line)
            assert await storage.conversation(ids["a"], CTX) is None
            assert await storage.task(ids["task"], CTX) is None
            for id in ("doc", "long"):
                assert await storage.document(ids[id], "current", CTX) is None
            assert await storage.submission(ids["submission"], CTX) is None
        finally:
            await storage.close()

    asyncio.run(decoded())
    assert asyncio.run(_reads_of(path, ids["b"])) == before_b
    assert asyncio.run(_reads_of(path, ids["c"])) == before_c
    # A writer opens it again as ever (power: a fresh journal life), and search finds nothing.
    asyncio.run(_reopen(path, durability))
    code, out, err = call(capsys, "search", path, marker)
    assert code in (0, 1), err
    assert "entries (0)" in out and "documents (0)" in out and "tasks (0)" in out
    assert _files_holding(path, marker.encode()) == []


async def _reopen(path: Path, durability: str) -> None:
    storage = await LmdbStorage.open(path, durability=durability)  # type: ignore[arg-type]
    await storage.close()


def test_forks_are_refused_and_named_unless_erased_too(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        a, fork, other = [await storage.mint_id() for _ in range(3)]
        entry = await storage.mint_id()
        await storage.commit(
            [{"type": "conversation", "value": {"id": a}}, message(entry, a, "hi")], CTX
        )
        await storage.commit(
            [
                {
                    "type": "conversation",
                    "value": {"id": fork, "parent": {"conversationId": a, "at": entry}},
                },
                {"type": "conversation", "value": {"id": other}},
            ],
            CTX,
        )
        head = storage.log.head()
        with pytest.raises(ValueError, match=f"forks or owned conversations: {fork} \\(of {a}\\)"):
            await storage.erase_conversation(a, reason="asked")
        assert storage.log.head() == head  # refused whole: nothing written
        with pytest.raises(REFUSALS, match="Unknown conversation"):
            await storage.erase_conversation(999_999, reason="asked")
        with pytest.raises(ValueError, match="needs a reason"):
            await storage.erase_conversation(a, reason=" ")
        report = await storage.erase_conversation(a, reason="asked", with_forks=True)
        assert report.conversations == sorted([a, fork])
        assert report.records == [1, 2]
        for gone in (a, fork):
            assert await storage.conversation(gone, CTX) is None
        assert await storage.conversation(other, CTX) == {"id": other}
        await storage.close()

    asyncio.run(run())


@pytest.mark.parametrize("durability", ["process", "power"])
async def test_ids_an_erasure_took_out_of_the_store_are_never_minted_again(
    tmp_path: Path, durability: str
) -> None:
    """An erased conversation's ids leave the store, but ids are never handed out twice: the
    floor the minter starts from after a reopen counts them (``MemoryStorage`` never reuses an
    id either)."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability=durability)
    await storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
    await storage.commit(
        [
            {"type": "conversation", "value": {"id": 7}},
            message(8, 7, "the highest ids, erased below"),
            {"type": "conversation", "value": {"id": 9, "parent": {"conversationId": 7, "at": 8}}},
        ],
        CTX,
    )
    report = await storage.erase_conversation(7, reason="asked", with_forks=True)
    assert report.conversations == [7, 9]
    await storage.close()  # nothing minted yet: no block of ids was reserved before
    for _ in range(2):  # reopened twice: the floor is durable, not only in memory
        storage = await LmdbStorage.open(path, durability=durability)
        try:
            assert await storage.conversation(9, CTX) is None
            minted = await storage.mint_id()
            assert minted > 9, f"mint_id after the erasure and a reopen returned {minted}"
        finally:
            await storage.close()


_READ_AFTER = """
import asyncio, json, sys
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

async def main():
    storage = await LmdbStorage.open(sys.argv[1], durability=sys.argv[2])
    try:
        seen = {"head": storage.log.head(), "minted": await storage.mint_id()}
        for id in (7, 9):
            seen[str(id)] = await storage.conversation(id, CTX) is not None
        page = await storage.scan_entries({"conversationId": 7}, 10, None, CTX)
        seen["entries"] = [entry["id"] for entry in page["items"]]
        print(json.dumps(seen))
    finally:
        await storage.close()

asyncio.run(main())
"""


@pytest.mark.parametrize("durability", ["process", "power"])
async def test_an_erasure_failing_after_its_checks_leaves_the_store_as_it_was(
    tmp_path: Path, durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The erasure's transaction (its rewrite, its id reservation) fails once its work is done:
    nothing is erased, and a fresh process reads the store and mints as before it."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability=durability)
    await storage.commit(
        [
            {"type": "conversation", "value": {"id": 7}},
            message(8, 7, "kept: the erasure fails"),
            {"type": "conversation", "value": {"id": 9, "parent": {"conversationId": 7, "at": 8}}},
        ],
        CTX,
    )
    head = storage.log.head()
    real_rewrite = lmdb_storage.rewrite

    def failing(*args: Any, **kwargs: Any) -> Any:
        real_rewrite(*args, **kwargs)
        raise OSError(5, "injected after the erasure's checks and work")

    monkeypatch.setattr(lmdb_storage, "rewrite", failing)
    try:
        with pytest.raises(OSError, match="injected after"):
            await storage.erase_conversation(7, reason="asked", with_forks=True)
        assert storage.log.head() == head
        assert await storage.conversation(9, CTX) is not None
    finally:
        await storage.close()
    monkeypatch.undo()
    read = subprocess.run(
        [sys.executable, "-c", _READ_AFTER, str(path), durability],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(read.stdout)  # read by a fresh process
    assert seen == {"head": head, "minted": 10, "7": True, "9": True, "entries": [8]}
    assert verify(path) is None


def _task(id: int, conversation: int) -> dict[str, Any]:
    return {
        "type": "task",
        "value": {
            "id": id,
            "conversationId": conversation,
            "kind": "research",
            "version": 1,
            "input": {},
            "state": {"status": "pending"},
            "background": False,
            "abortRequested": False,
        },
    }


def test_what_reads_through_an_erased_conversation_goes_whatever_its_place_in_the_log(
    tmp_path: Path,
) -> None:
    """A conversation owned by a fork, committed before that fork, and a document of a task
    committed before the task's record: both belong to the erased conversation."""

    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        a, fork, owned, other, task, doc = [await storage.mint_id() for _ in range(6)]
        batches = {
            1: [
                {"type": "conversation", "value": {"id": a}},
                {"type": "conversation", "value": {"id": other}},
            ],
            2: [
                {
                    "type": "conversation",
                    "value": {"id": owned, "owner": {"conversationId": fork, "taskId": task}},
                }
            ],
            3: [
                {
                    "type": "document.create",
                    "record": {
                        "id": doc,
                        "kind": "notes",
                        "scope": {"kind": "task", "taskId": task},
                        "history": "latest",
                        "fork": "current",
                    },
                    "content": {"kind": "base", "version": 1, "value": {"text": "of the task"}},
                }
            ],
            4: [
                {
                    "type": "conversation",
                    "value": {"id": fork, "parent": {"conversationId": a, "at": 1}},
                },
                _task(task, a),
            ],
        }
        for seq, writes in batches.items():
            assert await storage.commit(copy.deepcopy(writes), CTX) == seq
        with pytest.raises(ValueError, match=f"{fork} \\(of {a}\\), {owned} \\(of {fork}\\)"):
            await storage.erase_conversation(a, reason="asked")
        report = await storage.erase_conversation(a, reason="asked", with_forks=True)
        assert report.conversations == sorted([a, fork, owned])
        assert report.records == [1, 2, 3, 4]
        kept, _ = without(batches, {a, fork, owned})
        kept[5] = []
        memory = await memory_of(kept, 5)
        for id in (a, fork, owned, other):
            assert await storage.conversation(id, CTX) == await memory.conversation(id, CTX)
        assert await storage.conversation(owned, CTX) is None
        assert await storage.document(doc, "current", CTX) is None
        assert await storage.task(task, CTX) is None
        await storage.close()

    asyncio.run(run())


def test_erase_again_finishes_the_scrub_of_an_erasure_that_stopped_before_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "store"
    marker = "m" + secrets.token_hex(24)
    ids = asyncio.run(_conversations(path, "power", marker))

    async def erase_only() -> int:  # what a run killed between its erasure and its scrub did
        storage = await LmdbStorage.open(path)
        try:
            return (await storage.erase_conversation(ids["a"], reason="asked")).seq
        finally:
            await storage.close()

    seq = asyncio.run(erase_only())
    assert _files_holding(path, marker.encode()), "the projections' old pages still hold it"
    code, out, err = call(capsys, "erase", path, "--conversation", ids["a"], "--reason", "again")
    assert code == 0, err
    assert f"was erased by erasure record {seq}; scrubbed the disk" in out
    assert _files_holding(path, marker.encode()) == []
    assert _dirty_gaps(path / "data.mdb") == []
    code, out, err = call(capsys, "erase", path, "--conversation", 999_999, "--reason", "r")
    assert code == 2 and "Unknown conversation: 999999" in err


def test_verify_names_a_tombstone_no_erasure_record_lists(tmp_path: Path) -> None:
    """A record made a tombstone by hand, outside an erasure (its writes all kept, so the
    projections agree): verify names it."""

    path = tmp_path / "store"

    async def fill() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        a = await storage.mint_id()
        await storage.commit([{"type": "conversation", "value": {"id": a}}], CTX)
        await storage.commit([message(await storage.mint_id(), a, "hello")], CTX)
        await storage.close()

    asyncio.run(fill())
    assert verify(path) is None
    env = Environment(path, durability="process")
    try:
        log = WriteLog(env)

        def forge(txn: Any) -> None:
            data = log.record(txn, 2)
            assert data is not None
            line = decode_record_builtins(2, data)
            tombstone = encode_tombstone(
                codec.encode(line["writes"]), line["committedAt"], record_leaf(2, data), 7, 1
            )
            log.replace(txn, 2, tombstone)

        env.write(forge)
    finally:
        env.close()
    found = verify(path)
    assert found is not None
    assert "record 2 is a tombstone of erasure 7, which is no erasure record listing it" in str(
        found
    )
