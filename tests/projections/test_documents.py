"""Long documents as bases and deltas: a commit writes its delta row and a small head row, the
value lives in the writer's cache under the chain of its revisions (``projections.documents``),
and any read (another process, a past point, a copy) replays in time linear in the bytes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.errors import CorruptProjectionError
from pi_durable_lmdb.log import Environment
from pi_durable_lmdb.projections import delta as delta_module
from pi_durable_lmdb.projections import tables as tbl
from pi_durable_lmdb.projections.delta import Folding, apply_batches
from pi_durable_lmdb.projections.documents import DocumentCache

from tests.support.cli_call import call
from tools.bench.workloads import ROOT, conversation, document_create


def change(id: int, ops: list[Any]) -> dict[str, Any]:
    return {
        "type": "document.change",
        "id": id,
        "content": {"kind": "delta", "version": 1, "ops": ops},
    }


def base(id: int, text: str) -> dict[str, Any]:
    return {
        "type": "document.change",
        "id": id,
        "content": {"kind": "base", "version": 1, "value": {"title": "Notes", "text": text}},
    }


def rows_of(path: Path, table: str) -> dict[bytes, bytes]:
    env = Environment(path, readonly=True)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith("." + table)))
        with env.read() as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor(db=db)}
    finally:
        env.close()


def test_a_long_document_keeps_a_head_row_and_reads_as_memory_storage_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    big = "x" * 150_000
    batches: list[list[dict[str, Any]]] = [[conversation(ROOT)], [document_create(2)]]
    batches += [[base(2, big)]]
    batches += [
        [change(2, [["a", ["text"], f"more {n} " + "z" * 300], ["s", ["turns"], n]])]
        for n in range(90)
    ]
    batches += [[base(2, "short again")], [change(2, [["a", ["text"], "y" * 20_000]])]]
    batches += [[change(2, [["t", ["text"], 5], ["s", ["n"], [1, 2]]])]]
    batches += [[change(2, [["p", ["n"], 0, 1, [7]], ["a", ["text"], "!"]])]]

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        memory = MemoryStorage()
        try:
            for number, writes in enumerate(batches, 1):
                for store in (storage, memory):
                    await store.commit(writes, CTX)
                if number in (3, 40, 93, 94, 95, 97):
                    rows = rows_of(path, tbl.DOCUMENT_VALUES)
                    assert len(rows) == 1, number  # one row, never chunks
                    ((key, raw),) = rows.items()
                    row = tbl.decode_row(tbl.current_decoder, tbl.unseal(raw, "", key), "", key)
                    assert row.held == (number != 94) and (row.value is None) == row.held, number
                    assert await storage.document(2, "current", CTX) == await memory.document(
                        2, "current", CTX
                    )
            for seq in range(3, len(batches) + 1):
                assert await storage.document(2, seq, CTX) == await memory.document(2, seq, CTX)
        finally:
            await storage.close()
        # packed off the commit path by a thread: stored by a later fold, or at the close
        assert len(rows_of(path, tbl.DOCUMENT_SNAPSHOTS)) >= 1
        reopened = await LmdbStorage.open(path, durability="process")  # a cold cache
        try:
            assert await reopened.document(2, "current", CTX) == await memory.document(
                2, "current", CTX
            )
            await reopened.commit([{"type": "document.retire", "id": 2}], CTX)
            await memory.commit([{"type": "document.retire", "id": 2}], CTX)
            assert rows_of(path, tbl.DOCUMENT_VALUES) == {}
        finally:
            await reopened.close()

    asyncio.run(run())
    code, out, err = call(capsys, "verify", path)
    assert code == 0, out + err  # a fresh fold writes the same bytes


def test_a_delta_to_a_long_text_writes_its_revision_and_the_head_row_only(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"

    async def commit(batches: list[list[dict[str, Any]]]) -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for writes in batches:
                await storage.commit(writes, CTX)
        finally:
            await storage.close()

    asyncio.run(commit([[conversation(ROOT)], [document_create(2)], [base(2, "y" * 300_000)]]))
    values, revisions = rows_of(path, tbl.DOCUMENT_VALUES), rows_of(path, tbl.DOCUMENT_REVISIONS)
    asyncio.run(commit([[change(2, [["a", ["text"], "more text"]])]]))
    after_values = rows_of(path, tbl.DOCUMENT_VALUES)
    after_revisions = rows_of(path, tbl.DOCUMENT_REVISIONS)
    assert after_values.keys() == values.keys() and len(after_values) == 1
    assert all(len(value) < 200 for value in after_values.values())  # a head, no value
    added = {key: value for key, value in after_revisions.items() if key not in revisions}
    assert len(added) == 1 and all(len(value) < 100 for value in added.values())


def test_a_damaged_revision_of_a_long_document_is_named_not_served(tmp_path: Path) -> None:
    path = tmp_path / "store"

    async def build() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit([document_create(2)], CTX)
            await storage.commit([change(2, [["a", ["text"], "q" * 200_000]])], CTX)
        finally:
            await storage.close()

    asyncio.run(build())
    key = max(rows_of(path, tbl.DOCUMENT_REVISIONS))
    env = Environment(path)
    try:
        with env.read() as txn:
            names = [bytes(name).decode() for name, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith(".documents.revisions")))
        value = rows_of(path, tbl.DOCUMENT_REVISIONS)[key]
        env.write(lambda txn: txn.put(key, value[:-1] + bytes([value[-1] ^ 1]), db=db))
    finally:
        env.close()

    async def read() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            with pytest.raises(CorruptProjectionError) as caught:
                await storage.document(2, "current", CTX)
            assert caught.value.key == key
        finally:
            await storage.close()

    asyncio.run(read())


# ── replay costs the bytes it reads ─────────────────────────────────────────


def count_copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Characters every text append builds (``delta._append``), counted as they are made."""

    copied = [0]
    append = delta_module._append

    def counted(text: str, suffix: str) -> str:
        copied[0] += len(text) + len(suffix)
        return append(text, suffix)

    monkeypatch.setattr(delta_module, "_append", counted)
    return copied


def test_replaying_appends_mixed_with_other_ops_copies_each_character_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copied = count_copies(monkeypatch)
    line = "a line of a transcript, " * 20
    batches = [[["a", ["text"], line], ["s", ["turns"], n]] for n in range(2_000)]
    batches += [[["a", ["log", 0], line], ["p", ["items"], 0, 0, [n]]] for n in range(500)]
    start = {"text": "", "turns": 0, "log": [""], "items": []}
    value = apply_batches(start, batches)
    replayed = copied[0]
    reference: Any = {"text": "", "turns": 0, "log": [""], "items": []}
    for ops in batches:
        reference = delta_module.apply_ops(reference, ops)
    assert value == reference and start["text"] == ""
    total = len(value["text"]) + len(value["log"][0])
    assert replayed <= 2 * total + 4 * len(line)
    assert copied[0] - replayed > 100 * total  # one batch at a time: what replay used to cost


def test_a_folding_joins_pending_appends_before_an_op_that_can_see_them() -> None:
    folding = Folding({"a": {"text": "x"}, "b": "y"})
    folding.apply([["a", ["a", "text"], "1"], ["a", ["a", "text"], "2"], ["a", ["b"], "z"]])
    folding.apply([["s", ["a", "n"], 1]])  # beside the pending text: nothing joined
    assert folding.pending == {("a", "text"): ["2"], ("b",): []}
    folding.apply([["t", ["a", "text"], 1]])  # on it: joined first
    folding.apply([["d", ["a"]]])
    assert folding.joined() == {"b": "yz"}
    folding.apply([["r", {"c": "w"}], ["a", ["c"], "v"], ["a", ["c"], "u"]])
    assert folding.joined() == {"c": "wvu"}


def test_a_past_read_and_a_copy_of_a_long_document_copy_linear_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copied = count_copies(monkeypatch)
    line = "x" * 400

    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        try:
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit([document_create(2)], CTX)
            for n in range(600):
                await storage.commit([change(2, [["a", ["text"], line], ["s", ["turns"], n]])], CTX)
            length = len((await storage.document(2, "current", CTX))["value"]["text"])
            copied[0] = 0
            past = await storage.document(2, 590, CTX)
            assert past["value"]["turns"] == 587 and copied[0] <= 3 * length
            await storage.commit([conversation(5)], CTX)
            copy = dict(document_create(3), type="document.copy")
            copy.pop("content")
            copy["record"] = dict(
                copy["record"], scope={"kind": "conversation", "conversationId": 5}
            )
            copy["source"] = {"id": 2, "at": 580}
            await storage.commit([copy], CTX)
            assert copied[0] <= 6 * length
            copied_value = (await storage.document(3, "current", CTX))["value"]
            assert copied_value["turns"] == 577
        finally:
            await storage.close()

    asyncio.run(run())


# ── the cache ───────────────────────────────────────────────────────────────


def test_the_cache_serves_only_the_chain_it_holds_and_keeps_its_bounds() -> None:
    cache = DocumentCache()
    cache.put(1, "a", Folding({"text": "x"}), 10)
    assert cache.read(1, "b") is None
    served = cache.read(1, "a")
    assert served == {"text": "x"}
    served["text"] = "mutated"  # a reader's copy: the cache is untouched
    assert cache.advance(1, "a", "b", [["a", ["text"], "y"]], 11) is True
    assert cache.read(1, "a") is None and cache.read(1, "b") == {"text": "xy"}
    assert cache.advance(1, "a", "c", [["a", ["text"], "z"]], 12) is False  # not that chain
    assert cache.advance(1, "b", "c", [["a", ["nope"], "z"]], 12) is None  # failed: dropped
    assert cache.read(1, "b") is None and cache.read(1, "c") is None
    for id in range(DocumentCache.ENTRIES + 3):
        cache.put(id, "k", Folding({"n": id}), 1)
    assert cache.read(0, "k") is None and cache.read(3, "k") == {"n": 3}
    cache.put(100, "k", Folding({}), DocumentCache.BYTES - 5)
    cache.put(101, "k", Folding({}), 10)
    assert cache.read(100, "k") is None and cache.read(101, "k") == {}


def test_a_transaction_that_does_not_commit_leaves_no_value_to_serve(tmp_path: Path) -> None:
    """A group's transaction run again (the map grew) reuses its sequences: an entry the first
    run advanced must not be served for what the second run commits."""

    path = tmp_path / "store"

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit([document_create(2)], CTX)
            await storage.commit([change(2, [["a", ["text"], "q" * 20_000]])], CTX)
            model = storage._model
            projector = storage._projector
            from pi_durable_lmdb.log.records import decode_batch, encode_batch

            def abort(txn: Any) -> None:
                writes = decode_batch(
                    encode_batch([change(2, [["a", ["text"], "ABORTED"]])]).payload
                )
                outcome = projector.admit(txn, writes, lambda: 4)
                assert not isinstance(outcome, Exception)
                raise RuntimeError("abort")

            with pytest.raises(RuntimeError):
                model.env.write(abort)
            await storage.commit([change(2, [["a", ["text"], "kept"]])], CTX)
            value = (await storage.document(2, "current", CTX))["value"]
            assert value["text"].endswith("qkept") and "ABORTED" not in value["text"]
        finally:
            await storage.close()

    asyncio.run(run())


READER = """
import asyncio, sys
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

async def main():
    storage = await LmdbStorage.open(sys.argv[1], durability="process", readonly=True)
    try:
        seen = 0
        while seen < 60:
            doc = await storage.document(2, "current", CTX)
            if doc is None:
                continue
            text = doc["value"]["text"]
            n = doc["value"].get("turns", -1)
            assert text == "s" * 9000 + "".join(f"<{i}>" for i in range(n + 1)), n
            seen += 1
            await asyncio.sleep(0.01)
    finally:
        await storage.close()
    print("ok")

asyncio.run(main())
"""


def test_a_reader_in_another_process_sees_only_committed_values(tmp_path: Path) -> None:
    path = tmp_path / "store"

    async def setup() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit([document_create(2)], CTX)
            await storage.commit([base(2, "s" * 9000)], CTX)
            await storage.commit([change(2, [["a", ["text"], "<0>"], ["s", ["turns"], 0]])], CTX)
        finally:
            await storage.close()

    asyncio.run(setup())
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path)], stdout=subprocess.PIPE, text=True
    )

    async def write() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            n = 1
            while reader.poll() is None and n < 3000:
                ops = [["a", ["text"], f"<{n}>"], ["s", ["turns"], n]]
                await storage.commit([change(2, ops)], CTX)
                n += 1
        finally:
            await storage.close()

    asyncio.run(write())
    out, _ = reader.communicate(timeout=120)
    assert reader.returncode == 0 and out.strip() == "ok"


# ── snapshots off the commit's path ─────────────────────────────────────────


def head_of(path: Path, id: int) -> Any:
    raw = rows_of(path, tbl.DOCUMENT_VALUES)[tbl.u64(id)]
    return tbl.decode_row(tbl.current_decoder, tbl.unseal(raw, "", b""), "", b"")


def test_a_long_documents_snapshot_is_put_after_its_commit_and_packed_again_if_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    placed: list[int] = []

    async def grow(turns: int, stop_at_snapshot: bool) -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for _ in range(turns):
                seq = await storage.commit([change(2, [["a", ["text"], "z" * 400]])], CTX)
                if stop_at_snapshot and head_of(path, 2).snapshot == seq:
                    placed.append(seq)
                    # the commit that placed it did not write it: the next transaction puts it
                    assert tbl.u64_pair(2, seq) not in rows_of(path, tbl.DOCUMENT_SNAPSHOTS)
                    return
        finally:
            await storage.close()

    async def setup() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit([document_create(2)], CTX)
            await storage.commit([base(2, "y" * 20_000)], CTX)
        finally:
            await storage.close()

    asyncio.run(setup())
    asyncio.run(grow(200, True))
    key = tbl.u64_pair(2, placed[0])
    kept = rows_of(path, tbl.DOCUMENT_SNAPSHOTS)[key]  # put at close
    assert call(capsys, "verify", path)[0] == 0
    env = Environment(path)  # as if the process had died before putting it
    try:
        with env.read() as txn:
            names = [bytes(name).decode() for name, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith(".documents.snapshots")))
        env.write(lambda txn: txn.delete(key, db=db))
    finally:
        env.close()
    assert call(capsys, "verify", path)[0] == 0  # named by the head row: pending, not different
    asyncio.run(grow(1, False))  # the document's next commit packs it again
    assert rows_of(path, tbl.DOCUMENT_SNAPSHOTS)[key] == kept
    assert call(capsys, "verify", path)[0] == 0


def test_a_long_document_reads_the_same_after_rebuild_backup_compact_and_export_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    turns = [
        [change(2, [["a", ["text"], f"<{n}>" + "w" * 700], ["s", ["n"], n]])] for n in range(90)
    ]
    batches = [[conversation(ROOT)], [document_create(2)], [base(2, "v" * 9000)], *turns]

    async def build() -> list[Any]:
        storage = await LmdbStorage.open(path, durability="process")
        memory = MemoryStorage()
        try:
            for writes in batches:
                for store in (storage, memory):
                    await store.commit(writes, CTX)
            return [await memory.document(2, at, CTX) for at in ("current", *range(3, 94))]
        finally:
            await storage.close()

    async def reads(at_path: Path, rebuild: bool = False) -> list[Any]:
        storage = await LmdbStorage.open(at_path, durability="process")
        try:
            if rebuild:
                await storage.rebuild()
            return [await storage.document(2, at, CTX) for at in ("current", *range(3, 94))]
        finally:
            await storage.close()

    expected = asyncio.run(build())
    assert len(rows_of(path, tbl.DOCUMENT_SNAPSHOTS)) >= 1
    assert asyncio.run(reads(path, rebuild=True)) == expected
    assert call(capsys, "verify", path)[0] == 0
    copy = tmp_path / "copy"
    assert call(capsys, "backup", path, copy)[0] == 0
    assert call(capsys, "compact", copy)[0] == 0
    assert asyncio.run(reads(copy)) == expected
    dump = tmp_path / "dump.jsonl"
    code, out, err = call(capsys, "export", path)
    assert code == 0, err
    dump.write_text(out)
    imported = tmp_path / "imported"
    assert call(capsys, "import", dump, imported)[0] == 0
    assert asyncio.run(reads(imported)) == expected
    assert call(capsys, "verify", imported)[0] == 0


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (100, 200),
        (100, 3 * tbl.CHUNK),
        (tbl.CHUNK, tbl.CHUNK + 1),
        (3 * tbl.CHUNK, 100),
        (3 * tbl.CHUNK, 2 * tbl.CHUNK + 5),
    ],
)
def test_a_value_put_over_the_one_its_transaction_read_leaves_the_rows_of_a_plain_put(
    tmp_path: Path, before: int, after: int
) -> None:
    """``put_value`` given the value its transaction read (which spares it reading the row
    again) leaves the rows it leaves when it reads them itself: a short row, chunks added,
    chunks dropped."""

    stores: list[dict[bytes, bytes]] = []
    for given in (False, True):
        env = Environment(tmp_path / f"given-{given}", durability="process")
        try:
            db = env.db("values")
            env.write(lambda txn: tbl.put_value(txn, db, 7, b"a" * before))

            def over(txn: Any) -> None:
                stored = tbl.get_value(txn, db, 7, tbl.unseal)
                assert stored == b"a" * before
                tbl.put_value(txn, db, 7, b"b" * after, stored if given else None)

            env.write(over)
            with env.read() as txn:
                assert tbl.get_value(txn, db, 7, tbl.unseal) == b"b" * after
                stores.append({bytes(key): bytes(value) for key, value in txn.cursor(db=db)})
        finally:
            env.close()
    assert stores[0] == stores[1]
    assert len(stores[1]) == (1 if after <= tbl.CHUNK else 1 + -(-after // tbl.CHUNK))


def test_a_delta_commit_reads_no_key_twice(tmp_path: Path) -> None:
    """A delta to a short document and to a long one reads each key once: the document's row
    read by the checks is the one its new row is put over."""

    from tools.bench import commit_path

    async def run() -> list[list[tuple[Any, ...]]]:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        commits: list[list[tuple[Any, ...]]] = []
        try:
            await storage.commit([conversation(ROOT)], CTX)
            await storage.commit([document_create(2)], CTX)
            names = commit_path._Names()
            delta = [change(2, [["a", ["text"], "more text"]])]
            with commit_path._recording(commits, names):
                await storage.commit(delta, CTX)
                await storage.commit(delta, CTX)
            await storage.commit([base(2, "y" * 3 * tbl.CHUNK)], CTX)
            with commit_path._recording(commits, names):
                await storage.commit(delta, CTX)
                await storage.commit(delta, CTX)
        finally:
            await storage.close()
        return commits

    commits = asyncio.run(run())
    assert len(commits) == 4
    for ops in commits:
        reads = [(index, args[0]) for op, index, args, _ in ops if op == "get"]
        assert reads and len(reads) == len(set(reads)), ops
