"""Trimming old history (``storage.trim``): afterwards every read now and as of every kept point is
what it was, a read as of a trimmed point raises ``HistoryTrimmed``, a rebuild and ``verify``
fold the base and the kept records into the same projections, and every root and proof of the
log's tree is what it was."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.errors import StorageRequestError
from pi_durable_lmdb import HistoryTrimmed
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.audit.export import export_lines
from pi_durable_lmdb.log.tree import TILE
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from tests.support.bases import rewrite_base
from tests.support.compare import REFUSALS, canonical
from tests.support.workload import Workload, snapshot


async def _fill(storage: LmdbStorage, work: Workload, count: int) -> None:
    for _ in range(count):
        try:
            await storage.commit(copy.deepcopy(work.batch()), CTX)
        except REFUSALS:
            continue


def _point(before: int) -> int:
    """Where a trim before ``before`` lands: down to a whole tile."""

    return (before - 1) // TILE * TILE + 1


async def _reads(storage: LmdbStorage, work: Workload, since: int) -> dict[str, Any]:
    """Every read now and as of some kept points."""

    head = storage.log.head()
    out = {"now": canonical(await snapshot(storage, work, head, since))}
    for at in sorted({since, (since + head) // 2, head - 1}):
        out[f"as of {at}"] = canonical(await snapshot(await storage.as_of(at), work, at, since))
    return out


def _proofs(storage: LmdbStorage, sizes: list[int]) -> list[Any]:
    log = storage.log
    out: list[Any] = [log.root(size) for size in sizes]
    out += [log.prove(seq, size) for size in sizes for seq in (1, size // 2 or 1, size) if size]
    out += [log.prove_consistency(old, new) for old in sizes for new in sizes if old <= new]
    return out


@pytest.mark.slow  # two workloads of a few hundred commits, read whole several times
@pytest.mark.parametrize("seed", [5, 17])
def test_reads_and_proofs_are_unchanged_and_trimmed_points_raise(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "store"

    async def run() -> None:
        work = Workload(seed)
        storage = await LmdbStorage.open(path, durability="process")
        await _fill(storage, work, 120)
        head = storage.log.head()
        point = _point(head // 2 + 7)
        sizes = sorted({1, TILE, point - 1, point, head - 3, head})
        before = await _reads(storage, work, point)
        proofs = _proofs(storage, sizes)

        report = await storage.trim(head // 2 + 7)
        assert (report.point, report.records) == (point, point - 1)
        assert storage.log.first() == point and storage.log.head() == head
        assert await _reads(storage, work, point) == before
        assert _proofs(storage, sizes) == proofs
        for at in (0, 1, point - 1):
            with pytest.raises(HistoryTrimmed, match=f"before sequence {point}.*sequence {at}"):
                await storage.as_of(at)
        raised = set()
        for id in range(1, work.next_id):
            try:
                await storage.document(id, point - 1, CTX)
            except (HistoryTrimmed, StorageRequestError) as error:  # or: keeps no history
                raised.add(type(error))
            else:
                raise AssertionError(f"document {id} read as of trimmed sequence {point - 1}")
        assert HistoryTrimmed in raised

        await storage.rebuild()  # base + kept records, folded again: the same tables
        assert await _reads(storage, work, point) == before
        assert _proofs(storage, sizes) == proofs

        await _fill(storage, work, 60)  # commits go on after the trim, and trim again
        head = storage.log.head()
        again = _point(head - 40)
        before = await _reads(storage, work, again)
        proofs = _proofs(storage, sizes + [again, head])
        assert (await storage.trim(head - 40)).point == again
        assert await _reads(storage, work, again) == before
        assert _proofs(storage, sizes + [again, head]) == proofs
        await storage.close()

        assert verify(path) is None
        storage = await LmdbStorage.open(path, durability="process")  # from disk
        assert await _reads(storage, work, again) == before
        found, total = storage.log.tree.check(storage.log, head)
        assert (found, total) == ([], 0)
        await storage.close()

    asyncio.run(run())


def test_a_trim_before_the_first_whole_tile_keeps_everything(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        await _fill(storage, Workload(3), 50)
        assert storage.log.head() > TILE + 1
        report = await storage.trim(TILE)
        assert (report.point, report.records) == (1, 0)
        assert storage.log.first() == 1
        await storage.as_of(0)  # nothing trimmed: every point reads
        report = await storage.trim(TILE + 1)
        assert (report.point, report.records) == (TILE + 1, TILE)
        assert (await storage.trim(TILE + 1)).records == 0  # again: nothing more
        await storage.close()

    asyncio.run(run())


def test_refusals(tmp_path: Path) -> None:
    path = tmp_path / "store"

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        await _fill(storage, Workload(7), 40)
        with pytest.raises(TypeError, match="before must be a log sequence"):
            await storage.trim("20")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="at least 1"):
            await storage.trim(0)
        point = (await storage.trim(TILE + 1)).point
        assert point == TILE + 1
        with pytest.raises(ValueError, match="trimmed: an erasure covers an untrimmed log"):
            await storage.erase_conversation(1, reason="a request")
        await storage.close()
        with pytest.raises(ValueError, match=f"before {point} were trimmed into its base"):
            list(export_lines(path))
        assert len(list(export_lines(path, point))) > 0
        reader = await LmdbStorage.open(path, readonly=True)
        with pytest.raises(PermissionError, match="read-only"):
            await reader.trim(point + TILE)
        with pytest.raises(HistoryTrimmed):
            await reader.as_of(point - 1)
        await reader.as_of(point)
        await reader.close()
        with pytest.raises(ValueError, match="keep_history= is for a writer"):
            await LmdbStorage.open(path, readonly=True, keep_history=100)
        with pytest.raises(ValueError, match="keeps at least"):
            await LmdbStorage.open(path, keep_history=3)

    asyncio.run(run())


def test_keep_history_keeps_a_window(tmp_path: Path) -> None:
    path = tmp_path / "store"
    keep = 2 * TILE

    async def run() -> None:
        work = Workload(11)
        storage = await LmdbStorage.open(path, durability="process", keep_history=keep)
        await _fill(storage, work, 150)
        head, first = storage.log.head(), storage.log.first()
        assert first > 1, "the window was never trimmed"
        assert keep <= head - first + 1 <= keep * 1.5 + TILE
        now = canonical(await snapshot(storage, work, head, first))
        await storage.close()
        storage = await LmdbStorage.open(path, durability="process")
        assert canonical(await snapshot(storage, work, head, first)) == now
        await _fill(storage, work, 60)  # without the option: nothing more is trimmed
        assert storage.log.first() == first
        await storage.close()
        storage = await LmdbStorage.open(path, durability="process", keep_history=keep)
        assert storage.log.first() > first  # trimmed at the open
        await storage.close()

    asyncio.run(run())
    assert verify(path) is None


def test_a_task_last_written_before_the_point_reads_as_of_it_after_a_change(
    tmp_path: Path,
) -> None:
    """A task's history keeps a reference to the record that wrote its previous value: one the
    trim dropped must not be referred to, so the previous value is kept whole."""

    def task(status: str, n: int) -> dict[str, Any]:
        value = {"id": 2, "conversationId": 1, "kind": "answer", "version": 1, "input": {"n": n}}
        return {
            "type": "task",
            "value": {
                **value,
                "background": False,
                "abortRequested": False,
                "state": {"status": status},
            },
        }

    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for n in range(2, 20):  # the task, written over and over, last before the point
            await storage.commit([task("running", n)], CTX)
        for n in range(20, 40):
            await storage.commit([{"type": "conversation", "value": {"id": 1000 + n}}], CTX)
        assert (await storage.trim(2 * TILE + 1)).point == 2 * TILE + 1
        await storage.commit([task("pending", 40)], CTX)
        view = await storage.as_of(2 * TILE + 1)
        assert (await view.task(2, CTX))["input"] == {"n": 19}
        assert (await storage.task(2, CTX))["input"] == {"n": 40}
        await storage.close()

    asyncio.run(run())
    assert verify(tmp_path / "store") is None


def test_a_trim_past_an_erasure_keeps_the_erased_conversation_erased(tmp_path: Path) -> None:
    path = tmp_path / "store"

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        await storage.commit([{"type": "conversation", "value": {"id": id}} for id in (1, 2)], CTX)
        for n in range(3, 60):
            entry = {"id": n, "conversationId": 1 + n % 2, "kind": "note", "data": f"words {n}"}
            await storage.commit([{"type": "entry", "value": entry}], CTX)
        erasure = (await storage.erase_conversation(2, reason="a request")).seq
        for n in range(60, 80):
            await storage.commit([{"type": "conversation", "value": {"id": 1000 + n}}], CTX)
        point = (await storage.trim(erasure - 10)).point
        assert point < erasure  # the erasure record is kept, some of its tombstones are not
        assert await storage.conversation(2, CTX) is None
        assert await storage.conversation(1, CTX) == {"id": 1}
        query = {"conversationId": 1, "order": "ascending"}
        page = await storage.scan_entries(query, 100, None, CTX)
        assert [item["id"] for item in page["items"]] == list(range(4, 60, 2))
        await storage.close()
        assert verify(path) is None
        storage = await LmdbStorage.open(path, durability="process")
        assert (await storage.trim(storage.log.head())).point > erasure  # and past it
        assert await storage.conversation(2, CTX) is None
        await storage.close()

    asyncio.run(run())
    assert verify(path) is None


def test_user_projections_refuse_a_trim_and_keep_history(tmp_path: Path) -> None:
    from tests.projections.test_projections import EntryCounter

    path = tmp_path / "store"

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process", projections=[EntryCounter()])
        await _fill(storage, Workload(13), 60)
        await storage.projections.wait(storage.log.head())
        with pytest.raises(ValueError, match="user projections fold from"):
            await storage.trim(TILE + 1)
        await storage.close()
        with pytest.raises(ValueError, match="open with one or the other"):
            await LmdbStorage.open(path, projections=[EntryCounter()], keep_history=TILE)
        with pytest.raises(ValueError, match="holds some: drop them first"):
            await LmdbStorage.open(path, keep_history=TILE)
        storage = await LmdbStorage.open(path, durability="process")  # still a writer's store
        with pytest.raises(ValueError, match="user projections fold from"):
            await storage.trim(TILE + 1)
        assert storage.log.first() == 1
        await storage.close()

    asyncio.run(run())


def test_a_base_of_another_projections_schema_is_refused_by_a_rebuild(tmp_path: Path) -> None:
    """The base holds projection rows: a program whose schema does not read that schema's rows
    cannot fold them as they are, so its rebuild refuses, naming both schemas, and leaves the
    store as it was."""

    from pi_durable_lmdb.errors import StoreStateError
    from pi_durable_lmdb.projections import tables as t
    from pi_durable_lmdb.projections.rebuild import rebuild

    async def run() -> None:
        path = tmp_path / "store"
        storage = await LmdbStorage.open(path, durability="process")
        await _fill(storage, Workload(7), 60)
        assert (await storage.trim(TILE + 1)).records == TILE
        env, log = storage._env, storage.log
        rewrite_base(env, min(t.READABLE_SCHEMAS) - 1)
        with pytest.raises(
            StoreStateError,
            match=f"schema {min(t.READABLE_SCHEMAS) - 1}.*schema {t.SCHEMA_VERSION}",
        ):
            rebuild(env, log)
        await storage.close()

    asyncio.run(run())
