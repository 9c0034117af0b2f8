"""Projections rebuild themselves from the log: on a schema change, on demand, after a killed
rebuild; user projections catch up, survive version changes and fail alone."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log import Commit, CorruptRecordError, seq_key
from pi_durable_lmdb.log.records import EntryWrite
from pi_durable_lmdb.projections import rebuild as rebuild_module
from pi_durable_lmdb.projections import tables
from pi_durable_lmdb.projections.rebuild import read_header
from pi_durable_lmdb.projections.user import Projection, ProjectionFailed, Tables
from pi_durable_lmdb.storage import LmdbStorage

from examples.task_outcomes import TaskOutcomes, outcome_counts
from tests.support.compare import REFUSALS

from ..log.test_log_corruption import CORRUPTIONS
from ..support.log_helpers import open_log
from ..support.workload import Workload, snapshot

ROOT = Path(__file__).resolve().parents[2]


async def _filled(path: Path, commits: int, seed: int = 5) -> tuple[Workload, MemoryStorage]:
    storage = await LmdbStorage.open(path, durability="process")
    reference = MemoryStorage()
    work = Workload(seed)
    done = 0
    while done < commits:
        writes = work.batch()
        try:
            reference.prepare_commit(writes)
        except REFUSALS:
            continue
        await reference.commit(writes, CTX)
        await storage.commit(writes, CTX)
        done += 1
    await storage.close()
    return work, reference


async def test_schema_change_rebuilds_beside_and_reads_are_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    work, reference = await _filled(path, 80)
    expected = await snapshot(reference, work, 80)
    storage = await LmdbStorage.open(path)
    before = read_header(storage._env)
    await storage.close()

    monkeypatch.setattr(tables, "SCHEMA_VERSION", tables.SCHEMA_VERSION + 1)
    seen: list[tuple[int, int]] = []
    storage = await LmdbStorage.open(path, progress=lambda done, total: seen.append((done, total)))
    try:
        after = read_header(storage._env)
        assert after is not None and before is not None
        assert after.generation == before.generation + 1 and after.building is None
        assert after.schema_version == tables.SCHEMA_VERSION
        assert seen and seen[-1] == (80, 80)
        assert await snapshot(storage, work, 80) == expected
        old = tables.db_name(before.generation, tables.ENTRIES_BY_CONVERSATION)
        assert not storage._env.has_db(old), "the old generation is dropped at the swap"
    finally:
        await storage.close()
    assert verify(path) is None


@pytest.mark.parametrize("chunk", [1, 7, 2048])
async def test_a_rebuild_folds_to_the_bytes_the_commits_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Rebuilds fold in chunks and keep documents' values back through a chunk; ``verify``
    refolds every commit one by one, with the checks, and compares every table byte for byte."""

    path = tmp_path / "store"
    await _filled(path, 300, seed=11)
    monkeypatch.setattr(rebuild_module, "FOLD_CHUNK", chunk)
    storage = await LmdbStorage.open(path)
    await storage.rebuild()
    await storage.close()
    assert verify(path) is None


async def test_a_rebuild_copies_a_document_whose_deltas_it_has_kept_back(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path)
    scope = {"kind": "conversation", "conversationId": 1}
    notes = {"id": 2, "kind": "notes", "scope": scope, "history": "rewindable", "fork": "current"}
    copy = {**notes, "id": 3, "scope": {"kind": "conversation", "conversationId": 4}}
    base = {"kind": "base", "version": 1, "value": {"text": ""}}
    delta = {"kind": "delta", "version": 1, "ops": [["a", ["text"], "x"]]}
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    await storage.commit([{"type": "conversation", "value": {"id": 4}}], CTX)
    await storage.commit([{"type": "document.create", "record": notes, "content": base}], CTX)
    for _ in range(70):  # past a snapshot
        await storage.commit([{"type": "document.change", "id": 2, "content": delta}], CTX)
    await storage.commit(
        [{"type": "document.copy", "record": copy, "source": {"id": 2, "at": "current"}}], CTX
    )
    await storage.commit([{"type": "document.change", "id": 3, "content": delta}], CTX)
    await storage.rebuild()
    assert (await storage.document(3, "current", CTX))["value"] == {"text": "x" * 71}
    await storage.close()
    assert verify(path) is None


async def test_forced_rebuild_and_cli(tmp_path: Path) -> None:
    path = tmp_path / "store"
    work, reference = await _filled(path, 40)
    result = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "rebuild", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "rebuilt" in result.stdout
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        assert await snapshot(storage, work, 40) == await snapshot(reference, work, 40)
    finally:
        await storage.close()


KILLED_REBUILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from pi_durable_lmdb.projections import tables
    tables.SCHEMA_VERSION += 1
    from pi_durable_lmdb.storage import LmdbStorage
    def progress(done, total):
        print(done, flush=True)
    asyncio.run(LmdbStorage.open(sys.argv[1], progress=progress))
    """
)


@pytest.mark.slow
async def test_a_rebuild_killed_half_way_leaves_a_store_that_opens_and_finishes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    work, reference = await _filled(path, 3000, seed=9)
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_REBUILD, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert child.stdout is not None
    first = child.stdout.readline()  # one chunk folded into the new generation
    assert first.strip(), "the rebuild reported no progress"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    interrupted = None
    storage = await LmdbStorage.open(path, readonly=True)  # the old generation still serves
    try:
        header = read_header(storage._env)
        interrupted = header
        assert await storage.conversation(1, CTX) == {"id": 1}
    finally:
        await storage.close()
    assert interrupted is not None and interrupted.building is not None, (
        "the kill landed after the swap"
    )
    storage = await LmdbStorage.open(path)  # same schema: resumes into the same generation
    try:
        header = read_header(storage._env)
        assert header is not None and header.building is None
        assert header.generation == interrupted.building
        assert await snapshot(storage, work, 3000) == await snapshot(reference, work, 3000)
    finally:
        await storage.close()
    assert verify(path) is None


class EntryCounter(Projection):
    name = "entry_counter"
    version = 1
    databases = ("by_conversation",)

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is EntryWrite:
                key = str(write.value["conversationId"]).encode()
                count = int(tables.get("by_conversation", key) or b"0")
                tables.put("by_conversation", key, str(count + 1).encode())


def _counts(storage: Any, name: str = "entry_counter") -> dict[int, int]:
    with storage.projections.read(name) as view:
        return {int(key): int(value) for key, value in view.items("by_conversation")}


def _expected_counts(work: Workload, reference: MemoryStorage) -> dict[int, int]:
    counts: dict[int, int] = {}
    for entry in reference._state.entries.values():
        counts[entry["conversationId"]] = counts.get(entry["conversationId"], 0) + 1
    return counts


async def test_a_user_projection_catches_up_on_history_and_after_a_version_change(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    work, reference = await _filled(path, 1500)
    storage = await LmdbStorage.open(path, projections=[EntryCounter()])
    try:
        await storage.projections.wait(storage.log.head())
        assert _counts(storage) == _expected_counts(work, reference)
        seq = await storage.commit(
            [{"type": "entry", "value": {"id": 10**6, "conversationId": 1, "kind": "x"}}], CTX
        )
        await storage.projections.wait(seq)
        assert _counts(storage)[1] == _expected_counts(work, reference).get(1, 0) + 1
    finally:
        await storage.close()

    class EntryCounterV2(EntryCounter):
        version = 2

    storage = await LmdbStorage.open(path, projections=[EntryCounterV2()])
    try:
        status = storage.projections.status()["entry_counter"]
        assert status.version == 1 and status.building is not None and status.building.version == 2
        await storage.projections.wait(storage.log.head())
        assert _counts(storage)[1] == _expected_counts(work, reference).get(1, 0) + 1
        with storage.projections.read("entry_counter") as view:
            assert (view.version, view.folded_seq) == (2, storage.log.head())
    finally:
        await storage.close()


async def test_a_wait_that_returned_or_was_cancelled_leaves_no_waiter(tmp_path: Path) -> None:
    """Each turn of ``wait`` registers a waiter for the fold thread to wake: it is dropped when
    the wait returns or is cancelled, so waits that find the projection level (or a read-only
    store's polling, a turn every 50 ms) do not pile them up until the next fold."""

    storage = await LmdbStorage.open(tmp_path / "store", projections=[EntryCounter()])
    try:
        seq = await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.projections.wait(seq)
        for _ in range(100):
            await storage.projections.wait(seq)
        waiting = asyncio.ensure_future(storage.projections.wait(seq + 1))
        for _ in range(5):
            await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        left = storage.projections._waiters._futures
        assert not left, f"{len(left)} waiters left registered"
    finally:
        await storage.close()


class Exploding(Projection):
    name = "exploding"
    version = 1

    def fold(self, tables: Tables, commit: Commit) -> None:
        if commit.seq == 7:
            raise RuntimeError("boom")
        tables.put("main", commit.seq.to_bytes(8, "big"), b"")


async def test_a_failing_user_projection_stops_alone(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(
        path, projections=[Exploding(), EntryCounter(), TaskOutcomes()]
    )
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for id in range(2, 21):
            await storage.commit(
                [{"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "m"}}], CTX
            )
        head = storage.log.head()
        await storage.projections.wait(head, "entry_counter")
        assert _counts(storage) == {1: 19}
        with pytest.raises(
            ProjectionFailed, match="'exploding' stopped at log sequence 7: RuntimeError: boom"
        ):
            await storage.projections.wait(head)
        status = storage.projections.status()["exploding"]
        assert (status.folded_seq, status.failed_seq) == (6, 7)
        with storage.projections.read("exploding") as view:
            assert len(list(view.items("main"))) == 6, "the failing chunk left nothing behind"
        assert await storage.commit(
            [{"type": "entry", "value": {"id": 99, "conversationId": 1, "kind": "m"}}], CTX
        )
    finally:
        await storage.close()
    storage = await LmdbStorage.open(path, projections=[Exploding()])
    try:
        assert storage.projections.status()["exploding"].error == "RuntimeError: boom", (
            "failures persist"
        )
    finally:
        await storage.close()


async def test_task_outcomes_example(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(tmp_path / "store", projections=[TaskOutcomes()])
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for id, (kind, outcome) in enumerate(
            [("fetch", "completed"), ("fetch", "failed"), ("sum", "completed")], 2
        ):
            task = {
                "id": id,
                "conversationId": 1,
                "kind": kind,
                "version": 1,
                "input": None,
                "background": False,
                "abortRequested": False,
                "state": {"status": "running"},
            }
            await storage.commit([{"type": "task", "value": task}], CTX)
            settled = {**task, "state": {"status": "terminal", "outcome": {"status": outcome}}}
            await storage.commit([{"type": "task", "value": settled}], CTX)
            await storage.commit(
                [{"type": "task", "value": settled}], CTX
            )  # rewritten: counted once
        await storage.projections.wait(storage.log.head())
        assert outcome_counts(storage.projections) == {
            ("fetch", "completed"): 1,
            ("fetch", "failed"): 1,
            ("sum", "completed"): 1,
        }
    finally:
        await storage.close()


class Bulky(Projection):
    """Writes more per record than the commit did, so its folds are what fills the map."""

    name = "bulky"
    version = 1

    def __init__(self, size: int) -> None:
        self.size = size

    def fold(self, tables: Tables, commit: Commit) -> None:
        tables.put("main", commit.seq.to_bytes(8, "big"), b"b" * self.size)


@pytest.mark.parametrize("durability", ["power", "process"])
@pytest.mark.parametrize("size", [300, 3000, 20000])
async def test_a_user_projection_whose_fold_fills_the_map_grows_it_and_goes_on(
    tmp_path: Path, durability: str, size: int
) -> None:
    """A fold that fills the map is LMDB's MapFullError inside the projection's ``fold``: the map
    grows and the chunk folds again; it is not the projection's failure (it was recorded as one,
    stopping the projection for good: the power-loss group recording found it)."""

    storage = await LmdbStorage.open(
        tmp_path / "store", durability=durability, map_size=64 * 1024, projections=[Bulky(size)]
    )  # type: ignore[arg-type]
    try:
        for id in range(1, 41):
            await storage.commit([{"type": "conversation", "value": {"id": id}}], CTX)
        await storage.projections.wait(storage.log.head())
        with storage.projections.read("bulky") as view:
            assert len(list(view.items("main"))) == 40
    finally:
        await storage.close()


@pytest.mark.parametrize("at", [1, 4, 7])
@pytest.mark.parametrize("damage", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
async def test_waiting_for_user_projections_past_a_corrupt_record_raises_it(
    tmp_path: Path, damage: Any, at: int
) -> None:
    """A log record the projections' worker cannot read stops the worker: every ``wait`` raises
    the record's ``CorruptRecordError`` (it hung for good: the worker died with the error unread,
    and the power-loss checker's writer waited out its 10 s on stores a planted fault damaged).
    Commits go on, and the projection folds nothing past it."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    for id in range(2, 9):
        await storage.commit(
            [{"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "m"}}], CTX
        )
    await storage.close()
    env, log = open_log(path)
    with env.read() as txn:
        raw = txn.get(seq_key(at), db=log.db)
    env.write(lambda txn: txn.put(seq_key(at), damage(raw), db=log.db))
    env.close()

    storage = await LmdbStorage.open(path, durability="process", projections=[EntryCounter()])
    try:
        for seq in (storage.log.head(), at):
            with pytest.raises(CorruptRecordError) as caught:
                await asyncio.wait_for(storage.projections.wait(seq), 10)
            assert caught.value.seq == at
        seq = await storage.commit(
            [{"type": "entry", "value": {"id": 99, "conversationId": 1, "kind": "m"}}], CTX
        )
        with pytest.raises(CorruptRecordError):
            await asyncio.wait_for(storage.projections.wait(seq, "entry_counter"), 10)
        assert storage.projections.status()["entry_counter"].folded_seq < at
    finally:
        await storage.close()
