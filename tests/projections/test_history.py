"""``as_of(seq)`` answers every read exactly as a MemoryStorage fed the first ``seq`` commits."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.projections.documents import SNAPSHOT_EVERY, SNAPSHOT_SHARE
from pi_durable_lmdb.storage import LmdbStorage

from tests.support.compare import REFUSALS

from ..support.workload import Workload, snapshot


async def _fill(
    path: Path, seed: int, commits: int
) -> tuple[LmdbStorage, Workload, list[list[dict]]]:
    storage = await LmdbStorage.open(path, durability="process")
    reference = MemoryStorage()
    work = Workload(seed)
    accepted: list[list[dict]] = []
    while len(accepted) < commits:
        writes = work.batch()
        try:
            reference.prepare_commit(writes)
        except REFUSALS as error:
            with pytest.raises(type(error)):
                await storage.commit(writes, CTX)
            continue
        await reference.commit(writes, CTX)
        assert await storage.commit(writes, CTX) == len(accepted) + 1
        accepted.append(writes)
    return storage, work, accepted


async def _memory_after(batches: list[list[dict]]) -> MemoryStorage:
    memory = MemoryStorage()
    for writes in batches:
        await memory.commit(writes, CTX)
    return memory


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 2**32), data=st.data())
async def test_as_of_equals_memory_storage_fed_the_prefix(
    tmp_path: Path, seed: int, data: st.DataObject
) -> None:
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    storage, work, batches = await _fill(directory, seed, 24)
    try:
        points = data.draw(
            st.lists(st.integers(0, len(batches)), min_size=2, max_size=4, unique=True)
        )
        for seq in points + [len(batches)]:
            view = await storage.as_of(seq)
            expected = await snapshot(await _memory_after(batches[:seq]), work, seq)
            actual = await snapshot(view, work, seq)
            differing = [key for key in expected if expected[key] != actual[key]]
            assert not differing, (
                seq,
                differing[:3],
                [(expected[k], actual[k]) for k in differing[:2]],
            )
    finally:
        await storage.close(CTX)


async def test_live_reads_equal_memory_storage_and_survive_reopen(tmp_path: Path) -> None:
    storage, work, batches = await _fill(tmp_path / "store", 7, 60)
    expected = await snapshot(await _memory_after(batches), work, len(batches))
    assert await snapshot(storage, work, len(batches)) == expected
    await storage.close(CTX)
    reopened = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        assert await snapshot(reopened, work, len(batches)) == expected
    finally:
        await reopened.close(CTX)


async def test_views_are_read_only_and_bounded(tmp_path: Path) -> None:
    storage, _, batches = await _fill(tmp_path / "store", 3, 5)
    try:
        view = await storage.as_of(2)
        with pytest.raises(PermissionError, match="read-only"):
            await view.commit([], CTX)
        for bad in (-1, len(batches) + 1, "2"):
            with pytest.raises(ValueError, match="committed sequence"):
                await storage.as_of(bad)  # type: ignore[arg-type]
    finally:
        await storage.close(CTX)


async def test_long_document_tails_read_from_snapshots_equal_memory_storage(tmp_path: Path) -> None:
    """Past reads start from the kept snapshot nearest below them; they must equal a full replay,
    across a broken delta, a new base and a version change."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    reference = MemoryStorage()
    record = {
        "id": 2,
        "kind": "notes",
        "scope": {"kind": "conversation", "conversationId": 1},
        "history": "rewindable",
        "fork": "asOf",
    }
    batches: list[list[dict]] = [
        [{"type": "conversation", "value": {"id": 1}}],
        [
            {
                "type": "document.create",
                "record": record,
                "content": {"kind": "base", "version": 1, "value": {"t": "", "n": []}},
            }
        ],
    ]
    for step in range(300):
        if step == 150:
            content = {"kind": "base", "version": 2, "value": {"t": "reset", "n": []}}
        else:
            ops = [["a", ["t"], str(step % 10)], ["p", ["n"], 0, 0, [step]]]
            if step == 100:
                ops = [
                    ["d", ["missing", "path"]]
                ]  # fails to apply: reads raise until the next base
            content = {"kind": "delta", "version": 1 if step < 150 else 2, "ops": ops}
        batches.append([{"type": "document.change", "id": 2, "content": content}])
    try:
        for writes in batches:
            await reference.commit(writes, CTX)
            await storage.commit(writes, CTX)

        async def outcome(store, *args):
            try:
                return ("ok", await store.document(*args))
            except REFUSALS as error:
                return ("error", type(error).__name__, str(error))

        for at in list(range(1, len(batches) + 1)) + ["current"]:
            assert await outcome(storage, 2, at, CTX) == await outcome(reference, 2, at, CTX), at
        for seq in (70, 130, 250):
            view = await storage.as_of(seq)
            past = await _memory_after(batches[:seq])
            assert await outcome(view, 2, "current", CTX) == await outcome(
                past, 2, "current", CTX
            ), seq
    finally:
        await storage.close(CTX)


async def test_a_long_growing_document_keeps_snapshots_linear_in_its_deltas_and_reads_equal_memory_storage(
    tmp_path: Path,
) -> None:
    """A transcript of 20 KB that grows by a line per commit (never a new base): snapshots are
    spaced by the bytes of the deltas as well as their count, so together they hold at most
    ``SNAPSHOT_SHARE + 1`` times the bytes of the deltas (at one per 64 deltas they were about
    six times more here, and grew with the square of the history); every past read, each through
    a run of appends joined, still equals the reference's."""

    from pi_durable_lmdb.projections import tables as t

    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    reference = MemoryStorage()
    record = {
        "id": 2,
        "kind": "transcript",
        "scope": {"kind": "conversation", "conversationId": 1},
        "history": "rewindable",
        "fork": "asOf",
    }
    batches: list[list[dict]] = [
        [{"type": "conversation", "value": {"id": 1}}],
        [
            {
                "type": "document.create",
                "record": record,
                "content": {"kind": "base", "version": 1, "value": {"text": "x" * 20_000}},
            }
        ],
    ]
    for step in range(700):
        ops = [["a", ["text"], f"Turn {step}: ran the tests, {1834 + step % 97} tokens.\n"]]
        if step % 50 == 7:
            ops.append(["s", ["turns"], step])  # another verb inside a run of appends
        batches.append(
            [
                {
                    "type": "document.change",
                    "id": 2,
                    "content": {"kind": "delta", "version": 1, "ops": ops},
                }
            ]
        )
    try:
        for writes in batches:
            await reference.commit(writes, CTX)
            await storage.commit(writes, CTX)
        for at in [*range(1, len(batches) + 1, 7), len(batches), "current"]:
            assert await storage.document(2, at, CTX) == await reference.document(2, at, CTX), at
    finally:
        await storage.close(CTX)
    # Snapshots are packed off the commit path by a thread, stored by a later fold or at the
    # close: counted once it is closed.
    reader = await LmdbStorage.open(tmp_path / "store", readonly=True)
    try:
        model = reader._model  # the projections' own tables: what the snapshots cost
        with model.env.read() as txn:
            kept = list(txn.cursor(db=model.db[t.DOCUMENT_SNAPSHOTS]).iternext())
            deltas = list(txn.cursor(db=model.db[t.DOCUMENT_REVISIONS]).iternext())
    finally:
        await reader.close(CTX)
    snapshot_bytes = sum(len(t.unpack_row(value[t.SUM_SIZE :], "", key)) for key, value in kept)
    delta_bytes = sum(len(value) for _, value in deltas[1:])
    assert 0 < len(kept) < 700 // SNAPSHOT_EVERY, [
        int.from_bytes(key[8:], "big") for key, _ in kept
    ]
    assert snapshot_bytes <= (SNAPSHOT_SHARE + 1) * delta_bytes, (snapshot_bytes, delta_bytes)


async def test_reads_without_checksum_checks_answer_the_same(tmp_path: Path) -> None:
    storage, work, batches = await _fill(tmp_path / "store", 11, 40)
    expected = await snapshot(storage, work, len(batches))
    await storage.close(CTX)
    unchecked = await LmdbStorage.open(tmp_path / "store", readonly=True, verify_checksums=False)
    try:
        assert await snapshot(unchecked, work, len(batches)) == expected
    finally:
        await unchecked.close(CTX)
