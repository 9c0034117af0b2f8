"""Task rows as stored since schema 12: led by the sequence of the commit that wrote them, which
the ``HISTORY`` value of a replaced row refers to (no walk of ``HISTORY`` to find it); a row
loaded from the log's base is led by 0 and kept whole when replaced; a status row holds the
sequence that created it, so a status change keeps one ``HISTORY`` row; a base trimmed under
schema 11 (task rows without a writer, empty status rows) still folds."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.errors import CorruptProjectionError
from pi_durable_lmdb.log import Environment
from pi_durable_lmdb.log.tree import TILE
from pi_durable_lmdb.projections import Projector
from pi_durable_lmdb.projections import tables as t
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from tools.harness.faults import commit_fails, failing

from ..support.bases import mark_core_schema, rewrite_base

KEY = t.u64(2)


def task(status: str, n: int) -> dict[str, Any]:
    return {
        "type": "task",
        "value": {
            "id": 2,
            "conversationId": 1,
            "kind": "answer",
            "version": 1,
            "input": {"n": n},
            "background": False,
            "abortRequested": False,
            "state": {"status": status},
        },
    }


def task_row(storage: LmdbStorage) -> bytes:
    with storage._env.read() as txn:
        raw = txn.get(KEY, db=storage._model.db[t.TASKS])
    assert raw is not None
    return t.unseal(bytes(raw), t.TASKS, KEY)


def history_of(storage: LmdbStorage, seq: int) -> bytes | None:
    with storage._env.read() as txn:
        raw = txn.get(t.history_key(t.TASKS, KEY, seq), db=storage._model.db[t.HISTORY])
    return None if raw is None else bytes(raw)


def test_a_task_row_names_its_writer_and_a_change_refers_to_it(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            first = await storage.commit([task("pending", 1)], CTX)
            assert task_row(storage)[: t.WRITER_SIZE] == t.u64(first)
            second = await storage.commit([task("running", 2)], CTX)
            row = task_row(storage)
            assert t.read_u64(row) == second
            assert (
                t.decode_row(t.any_decoder, t.row_body(t.TASKS, row), t.TASKS, KEY)
                == (task("running", 2)["value"])
            )
            kept = history_of(storage, second)
            assert kept is not None and kept[:1] == t.LOGGED
            assert t.read_u64(kept, 1) == first
            # The same value again is no change: the row keeps naming the commit that wrote it.
            assert await storage.commit([task("running", 2)], CTX) == second + 1
            assert t.read_u64(task_row(storage)) == second
            assert history_of(storage, second + 1) is None
            view = await storage.as_of(first)
            assert (await view.task(2, CTX))["input"] == {"n": 1}
            page = await view.scan_tasks({"status": "pending"}, 10, None, CTX)
            assert [item["input"] for item in page["items"]] == [{"n": 1}]
        finally:
            await storage.close()

    asyncio.run(run())
    assert verify(tmp_path / "store") is None


def status_history(storage: LmdbStorage) -> list[tuple[bytes, int]]:
    """The status rows ``HISTORY`` keeps: ``(status key, sequence)``."""

    code = t.TABLE_CODES[t.TASKS_BY_STATUS]
    with storage._env.read() as txn:
        cursor = txn.cursor(db=storage._model.db[t.HISTORY])
        found = cursor.set_range(code)
        kept = []
        while found and cursor.key()[:1] == code:
            key = bytes(cursor.key())
            kept.append((key[1:-8], t.read_u64(key, len(key) - 8)))
            found = cursor.next()
    return kept


def test_a_status_change_keeps_one_history_row_and_views_scan_by_status(tmp_path: Path) -> None:
    statuses = ["pending", "running", "sleeping", "running", "running", "waiting", "running"]

    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            seqs = [
                await storage.commit([task(status, n)], CTX) for n, status in enumerate(statuses)
            ]
            with storage._env.read() as txn:
                rows = list(txn.cursor(db=storage._model.db[t.TASKS_BY_STATUS]))
            assert [(bytes(key), t.unseal(bytes(raw), "", b"")) for key, raw in rows] == [
                (t.TASK_STATUS_KEYS["running"] + KEY, t.u64(seqs[-1]))
            ]
            changes = [
                (t.TASK_STATUS_KEYS[before] + KEY, seq)
                for before, after, seq in zip(statuses[:-1], statuses[1:], seqs[1:], strict=True)
                if before != after
            ]
            assert status_history(storage) == sorted(changes)  # the old status's row alone
            # Within one commit: running -> sleeping -> running, then sleeping -> waiting.
            inner = await storage.commit([task("sleeping", 8), task("running", 9)], CTX)
            moved = await storage.commit([task("sleeping", 10), task("waiting", 11)], CTX)
            history = [None, *statuses, "running", "waiting"]  # None: before the task was
            for at, status in zip([seqs[0] - 1, *seqs, inner, moved], history, strict=True):
                view = await storage.as_of(at)
                for name in t.TASK_STATUSES:
                    page = await view.scan_tasks({"status": name}, 10, None, CTX)
                    assert len(page["items"]) == (name == status), (at, name)
        finally:
            await storage.close()

    asyncio.run(run())
    assert verify(tmp_path / "store") is None


def test_a_task_rewritten_unchanged_then_changed_in_one_commit_reads_as_before_it(
    tmp_path: Path,
) -> None:
    """The first write of a commit leaves the value as it was: the second must still keep the
    value from before the commit, and a view before it reads that value."""

    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            first = await storage.commit([task("pending", 1)], CTX)
            both = [task("pending", 1), task("running", 2)]
            second = await storage.commit(both, CTX)
            again = [task("running", 3), task("running", 3)]
            third = await storage.commit(again, CTX)
            for at, n, status in ((first, 1, "pending"), (second, 2, "running"), (third, 3, None)):
                view = await storage.as_of(at)
                assert (await view.task(2, CTX))["input"] == {"n": n}
                if status is not None:
                    page = await view.scan_tasks({"status": status}, 10, None, CTX)
                    assert [item["input"] for item in page["items"]] == [{"n": n}]
        finally:
            await storage.close()

    asyncio.run(run())
    assert verify(tmp_path / "store") is None


async def _trimmed_store(path: Path) -> tuple[int, int]:
    """A store whose task was last written before the trim's point; returns the point and the
    sequence of a change to the task after it."""

    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for n in range(2, 20):
            await storage.commit([task("running", n)], CTX)
        await storage.commit([submission("placed")], CTX)
        for n in range(20, 2 * TILE + 10):
            await storage.commit([{"type": "conversation", "value": {"id": 1000 + n}}], CTX)
        point = (await storage.trim(2 * TILE + 1)).point
        assert t.read_u64(task_row(storage)) == 0  # its writer is a dropped record
        changed = await storage.commit([task("sleeping", 40)], CTX)
        kept = history_of(storage, changed)
        assert kept is not None and kept[:1] != t.LOGGED  # kept whole
        return point, changed
    finally:
        await storage.close()


async def _check_reads(path: Path, point: int, changed: int) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        view = await storage.as_of(point)
        assert (await view.task(2, CTX))["input"] == {"n": 19}
        page = await view.scan_tasks({"status": "running"}, 10, None, CTX)
        assert [item["input"] for item in page["items"]] == [{"n": 19}]
        page = await view.scan_submissions({"status": "placed"}, 10, None, CTX)
        assert [item["id"] for item in page["items"]] == [3]
        assert (await storage.task(2, CTX))["input"] == {"n": 40}
        later = await storage.commit([task("running", 41)], CTX)
        kept = history_of(storage, later)
        assert kept is not None and kept[:1] == t.LOGGED and t.read_u64(kept, 1) == changed
        assert (await (await storage.as_of(changed)).task(2, CTX))["input"] == {"n": 40}
    finally:
        await storage.close()


def test_a_task_row_from_the_base_is_led_by_0_and_kept_whole(tmp_path: Path) -> None:
    path = tmp_path / "store"
    point, changed = asyncio.run(_trimmed_store(path))
    asyncio.run(_check_reads(path, point, changed))
    assert verify(path) is None


def test_a_base_trimmed_under_schema_11_folds(tmp_path: Path) -> None:
    """A base of schema 11 holds task rows without their writer: a store of schema 11 opens for
    writing into this schema, its rebuild loads them led by 0, and reads and views answer as
    before."""

    path = tmp_path / "store"
    point, changed = asyncio.run(_trimmed_store(path))
    env = Environment(path)
    try:

        def schema_11(name: str, key: bytes, value: bytes) -> bytes:
            if name == t.TASKS:  # schema 11's row: the encoded task alone
                return t.seal(t.unseal(value, name, key)[t.WRITER_SIZE :])
            if name in (t.TASKS_BY_STATUS, t.SUBMISSIONS_BY_STATUS):  # status rows: empty
                return t.seal(b"")
            return value

        old = rewrite_base(env, 11, schema_11)
        assert sum(1 for name, _, _ in old if name == t.TASKS) == 1
        assert sum(1 for name, _, _ in old if name == t.TASKS_BY_STATUS) == 1
        assert sum(1 for name, _, _ in old if name == t.SUBMISSIONS_BY_STATUS) == 1
        mark_core_schema(env, 11)
    finally:
        env.close()
    asyncio.run(_check_reads(path, point, changed))
    assert verify(path) is None


def submission(status: str) -> dict[str, Any]:
    return {"type": "submission", "value": {"id": 3, "conversationId": 1, "status": status}}


def test_a_submission_status_change_keeps_one_history_row_and_views_scan_by_status(
    tmp_path: Path,
) -> None:
    """A submission's status row holds the sequence that created it, as a task's does."""

    statuses = ["queued", "placed", "placed", "done", "unanswered"]
    key = t.u64(3)

    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            seqs = [await storage.commit([submission(status)], CTX) for status in statuses]
            with storage._env.read() as txn:
                rows = list(txn.cursor(db=storage._model.db[t.SUBMISSIONS_BY_STATUS]))
            assert [(bytes(row), t.unseal(bytes(raw), "", b"")) for row, raw in rows] == [
                (t.SUBMISSION_STATUS_KEYS["unanswered"] + key, t.u64(seqs[-1]))
            ]
            code = t.TABLE_CODES[t.SUBMISSIONS_BY_STATUS]
            with storage._env.read() as txn:
                cursor = txn.cursor(db=storage._model.db[t.HISTORY])
                kept = [
                    (bytes(found[1:-8]), t.read_u64(found, len(found) - 8))
                    for found, _ in cursor
                    if found[:1] == code
                ]
            changes = [
                (t.SUBMISSION_STATUS_KEYS[before] + key, seq)
                for before, after, seq in zip(statuses[:-1], statuses[1:], seqs[1:], strict=True)
                if before != after
            ]
            assert kept == sorted(changes)  # the old status's row alone, none for a creation
            for at, status in zip([seqs[0] - 1, *seqs], [None, *statuses], strict=True):
                view = await storage.as_of(at)
                for name in t.SUBMISSION_STATUSES:
                    page = await view.scan_submissions({"status": name}, 10, None, CTX)
                    assert len(page["items"]) == (name == status), (at, name)
        finally:
            await storage.close()

    asyncio.run(run())
    assert verify(tmp_path / "store") is None


def _forge(path: Path, table: str, key: bytes, body: bytes) -> None:
    """Put ``body`` (sealed: its checksum holds) at ``key`` of the core projections' ``table``."""

    env = Environment(path)
    try:
        with env.read() as txn:
            names = [bytes(name).decode() for name, _ in txn.cursor()]
        (name,) = [name for name in names if name.endswith("." + table)]
        db = env.db(name)
        env.write(lambda txn: txn.put(key, t.seal(body), db=db))
    finally:
        env.close()


async def _two_task_commits(path: Path) -> int:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.commit([task("pending", 1)], CTX)
        return await storage.commit([task("running", 2)], CTX)
    finally:
        await storage.close()


async def _commit_refused_as_damage(path: Path, table: str) -> None:
    """A change of the task is refused as damage to ``table`` (a pattern), with nothing written."""

    storage = await LmdbStorage.open(path, durability="process")
    try:
        head = storage.log.head()
        with pytest.raises(CorruptProjectionError, match=table):
            await storage.commit([task("waiting", 3)], CTX)
        assert storage.log.head() == head
    finally:
        await storage.close()


def test_a_task_row_too_short_for_its_writer_refuses_the_commit_as_damage(
    tmp_path: Path,
) -> None:
    """A task row whose checksum holds but which is shorter than its writer's sequence is damage:
    a commit over it is refused with ``CorruptProjectionError``, nothing written."""

    path = tmp_path / "store"
    asyncio.run(_two_task_commits(path))
    _forge(path, t.TASKS, KEY, b"\x91")
    asyncio.run(_commit_refused_as_damage(path, "'tasks'"))


def test_a_status_row_too_short_for_its_creation_is_damage_to_a_view(tmp_path: Path) -> None:
    path = tmp_path / "store"
    second = asyncio.run(_two_task_commits(path))
    _forge(path, t.TASKS_BY_STATUS, t.TASK_STATUS_KEYS["running"] + KEY, b"")

    async def run() -> None:
        storage = await LmdbStorage.open(path, readonly=True)
        try:
            view = await storage.as_of(second)
            with pytest.raises(CorruptProjectionError, match=r"'tasks\.by_status'"):
                await view.scan_tasks({"status": "running"}, 10, None, CTX)
        finally:
            await storage.close()

    asyncio.run(run())


def test_an_id_registry_row_of_an_unknown_type_refuses_the_commit_as_damage(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    asyncio.run(_two_task_commits(path))
    _forge(path, t.RECORD_IDS, KEY, b"z" + t.u64(2))
    asyncio.run(_commit_refused_as_damage(path, "'record_ids'"))


@pytest.mark.parametrize("point", ["work", "commit"])
def test_a_task_change_failing_after_its_checks_leaves_no_row_nobody_committed(
    tmp_path: Path, point: str
) -> None:
    """A commit that changes a task's status and fails after its checks (in its fold, or at
    LMDB's commit) leaves neither its task row, its writer, nor a status or ``HISTORY`` row: the
    next good commit takes its sequence, and a fresh handle's reads, now and as of every point,
    are ``MemoryStorage``'s given only the acknowledged commits."""

    path = tmp_path / "store"
    statuses = ["pending", "running", "sleeping", "running", "waiting", "running"]

    async def write() -> MemoryStorage:
        memory = MemoryStorage()
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for store in (storage, memory):
                await store.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for n, status in enumerate(statuses):
                if n == 3:
                    head = storage.log.head()
                    failed = [task("sleeping", 99), submission("done")]
                    if point == "work":
                        with failing(Projector, "apply", lambda *_: True, OSError(5, "injected")):
                            with pytest.raises(OSError, match="injected"):
                                await storage.commit(failed, CTX)
                    else:
                        with commit_fails(storage._env), pytest.raises(lmdb.Error):
                            await storage.commit(failed, CTX)
                    assert storage.log.head() == head
                for store in (storage, memory):
                    await store.commit([task(status, n), submission("queued")], CTX)
        finally:
            await storage.close()
        return memory

    memory = asyncio.run(write())

    read = subprocess.run(
        [sys.executable, "-c", _READ_VIEWS, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    seen = json.loads(read.stdout)  # read by a fresh process
    assert seen["head"] == len(statuses) + 1
    for at, statuses_seen in enumerate(seen["views"], start=1):
        tasks = {name: inputs for name, inputs in statuses_seen["tasks"].items() if inputs}
        assert tasks == ({statuses[at - 2]: [{"n": at - 2}]} if at >= 2 else {}), at
        submissions = {name: ids for name, ids in statuses_seen["submissions"].items() if ids}
        assert submissions == ({"queued": [3]} if at >= 2 else {}), at
    assert seen["task"] == asyncio.run(memory.task(2, CTX))
    assert seen["submission"] == asyncio.run(memory.submission(3, CTX))
    assert verify(path) is None


_READ_VIEWS = """
import asyncio, json, sys
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.projections import tables as t
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

async def main():
    reader = await LmdbStorage.open(sys.argv[1], readonly=True)
    try:
        head = reader.log.head()
        views = []
        for at in range(1, head + 1):
            view = await reader.as_of(at)
            tasks = {}
            for name in t.TASK_STATUSES:
                page = await view.scan_tasks({"status": name}, 10, None, CTX)
                tasks[name] = [item["input"] for item in page["items"]]
            submissions = {}
            for name in t.SUBMISSION_STATUSES:
                page = await view.scan_submissions({"status": name}, 10, None, CTX)
                submissions[name] = [item["id"] for item in page["items"]]
            views.append({"tasks": tasks, "submissions": submissions})
        print(json.dumps({
            "head": head,
            "views": views,
            "task": await reader.task(2, CTX),
            "submission": await reader.submission(3, CTX),
        }))
    finally:
        await reader.close()

asyncio.run(main())
"""
