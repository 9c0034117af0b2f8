"""User projections across a version change, a kill, a failure and retirement: a new version is
built beside the served one and swapped in whole; a reader always sees one whole version at its
``folded_seq``; a killed build resumes; a failed fold resumes from its record once fixed; a retired
projection is dropped with its databases."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import (
    CorruptProjectionError,
    ProjectionFailed,
    ProjectionNotReady,
    StoreStateError,
)
from pi_durable_lmdb.audit.stats import stats
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.log.records import EntryWrite, TaskWrite
from pi_durable_lmdb.projections.typedrows import TEXT, U64, TypedTable
from pi_durable_lmdb.projections.user import Projection, Tables
from pi_durable_lmdb.projections.userstate import db_names
from pi_durable_lmdb.storage import LmdbStorage

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "pi_durable_lmdb.cli"]


class Counter(Projection):
    """``main``: ``count`` = records folded times ``version``, ``version``, and one row per record:
    a reader can tell a whole version at its position from anything else."""

    name = "counter"
    version = 1
    databases = ("main", "seqs")
    delay = 0.0

    def fold(self, tables: Tables, commit: Commit) -> None:
        raw = tables.get("main", b"count")
        count = 0 if raw is None else int(raw)
        tables.put("main", b"count", str(count + self.version).encode())
        tables.put("main", b"version", str(self.version).encode())
        tables.put("seqs", commit.seq.to_bytes(8, "big"), str(self.version).encode())
        if self.delay:
            time.sleep(self.delay)


class CounterV2(Counter):
    version = 2


class CounterV3(Counter):
    version = 3


def check_whole(tables: Tables) -> int:
    """Assert ``tables`` is one whole version of ``Counter`` at its ``folded_seq``; its version."""

    version, folded = tables.version, tables.folded_seq
    assert int(tables.get("main", b"count") or b"0") == version * folded, (version, folded)
    if folded:
        assert tables.get("main", b"version") == str(version).encode()
    seqs = list(tables.items("seqs"))
    assert len(seqs) == folded and all(
        value == str(version).encode() for _, value in seqs[:1] + seqs[-1:]
    )
    return version


async def _commit_entries(storage: LmdbStorage, first: int, count: int) -> None:
    if first == 2:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        count -= 1
    for id in range(first, first + count):
        await storage.commit(
            [{"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "m"}}], CTX
        )


async def _store(path: Path, commits: int, projections: list[Projection]) -> None:
    storage = await LmdbStorage.open(path, durability="process", projections=projections)
    try:
        await _commit_entries(storage, 2, commits)
        await storage.projections.wait(storage.log.head())
    finally:
        await storage.close()


async def test_a_refold_to_a_new_version_serves_every_read_one_whole_version(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    await _store(path, 20_000, [Counter()])
    storage = await LmdbStorage.open(path, durability="process", projections=[CounterV2()])
    seen: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def reader() -> None:
        while not done.is_set():
            with storage.projections.read("counter") as tables:
                version = check_whole(tables)
                seen.append((version, tables.folded_seq))
            await asyncio.sleep(0)

    try:
        status = storage.projections.status()["counter"]
        assert status.state == "building" and status.version == 1 and status.building is not None
        with pytest.raises(
            ProjectionNotReady, match="serves version 1, not version 2: it is being built"
        ):
            with storage.projections.read("counter", version=2):
                pass
        task = asyncio.ensure_future(reader())
        await _commit_entries(storage, 30_000, 200)  # commits go on during the build
        head = storage.log.head()
        await asyncio.wait_for(storage.projections.wait(head), 120)
        for _ in range(1000):  # the reader's next read, after the swap (it may not have run since)
            if seen and seen[-1][0] == 2:
                break
            await asyncio.sleep(0.01)
        done.set()
        await task
        with storage.projections.read("counter", version=2) as tables:
            assert check_whole(tables) == 2 and tables.folded_seq == head
        versions = [version for version, _ in seen]
        assert versions[0] == 1 and versions[-1] == 2 and versions.count(1) > 10, (
            versions.count(1),
            versions.count(2),
        )
        assert versions == sorted(versions), "never back to the old version once swapped"
        assert all(folded == 20_000 for version, folded in seen if version == 1), (
            "the old version stays at its position"
        )
        for _ in range(200):  # the old slot is dropped once no read holds it
            if storage.projections.status()["counter"].state != "building" and not any(
                storage._env.has_db(name) for name in db_names("counter", 0, ["main", "seqs"])
            ):
                break
            await asyncio.sleep(0.01)
        assert not any(
            storage._env.has_db(name) for name in db_names("counter", 0, ["main", "seqs"])
        )
    finally:
        await storage.close()
    reader_storage = await LmdbStorage.open(path, readonly=True, projections=[CounterV3()])
    try:  # a read-only process serves what is stored, whatever version its program defines
        with reader_storage.projections.read("counter") as tables:
            assert check_whole(tables) == 2
        with pytest.raises(ProjectionNotReady, match="not version 3"):
            with reader_storage.projections.read("counter", version=3):
                pass
        assert isinstance(ProjectionNotReady("x", 1, None, "why"), StoreStateError)
    finally:
        await reader_storage.close()


KILLED_BUILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from tests.projections.test_user_builds import CounterV2
    from pi_durable_lmdb.storage import LmdbStorage
    CounterV2.delay = 0.0005
    async def main():
        storage = await LmdbStorage.open(sys.argv[1], durability="process", projections=[CounterV2()])
        while True:
            build = storage.projections.status()["counter"].building
            if build is not None and build.folded_seq > 0:
                print(build.folded_seq, flush=True)
            await asyncio.sleep(0.01)
    asyncio.run(main())
    """
)


async def test_a_build_killed_half_way_leaves_the_served_version_and_resumes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    await _store(path, 3000, [Counter()])
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_BUILD, str(path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert child.stdout is not None
    first = child.stdout.readline()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert first.strip(), "the build reported no progress"
    reader = await LmdbStorage.open(path, readonly=True)
    try:
        with reader.projections.read("counter") as tables:
            assert check_whole(tables) == 1 and tables.folded_seq == 3000
        build = reader.projections.status()["counter"].building
        assert build is not None and build.version == 2 and 0 < build.folded_seq < 3000, (
            "the kill landed after the swap"
        )
        killed_at = build.folded_seq
    finally:
        await reader.close()
    storage = await LmdbStorage.open(path, durability="process", projections=[CounterV2()])
    try:
        build = storage.projections.status()["counter"].building
        assert build is None or build.folded_seq >= killed_at, "it resumed, not restarted"
        await asyncio.wait_for(storage.projections.wait(storage.log.head()), 60)
        with storage.projections.read("counter") as tables:
            assert check_whole(tables) == 2 and tables.folded_seq == 3000
    finally:
        await storage.close()


class Flaky(Projection):
    name = "flaky"
    version = 1
    broken = True

    def fold(self, tables: Tables, commit: Commit) -> None:
        if self.broken and commit.seq == 7:
            raise RuntimeError("boom")
        raw = tables.get("main", b"n")
        tables.put("main", b"n", str(int(raw or b"0") + 1).encode())
        tables.put("main", commit.seq.to_bytes(8, "big"), b"")


class FlakyV2(Flaky):
    version = 2


class Steady(Flaky):
    name = "steady"
    broken = False


async def test_retry_resumes_a_fixed_fold_from_the_record_it_stopped_at(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process", projections=[Flaky()])
    try:
        await _commit_entries(storage, 2, 20)
        with pytest.raises(ProjectionFailed, match="stopped at log sequence 7"):
            await asyncio.wait_for(storage.projections.wait(20), 10)
        status = storage.projections.status()["flaky"]
        assert (status.state, status.folded_seq, status.failed_seq) == ("failed", 6, 7)
        Flaky.broken = False  # the fold is fixed
        status = await storage.projections.retry("flaky")
        assert status.error is None
        await asyncio.wait_for(storage.projections.wait(20), 10)
        with storage.projections.read("flaky") as tables:
            assert tables.get("main", b"n") == b"20", (
                "records 1-6 folded once, 7-20 after the retry"
            )
    finally:
        Flaky.broken = True
        await storage.close()

    storage = await LmdbStorage.open(path, durability="process", projections=[FlakyV2()])
    try:  # a failed build: version 1 keeps serving; the retry resumes the build and swaps it in
        with pytest.raises(ProjectionFailed):
            await asyncio.wait_for(storage.projections.wait(20), 10)
        with storage.projections.read("flaky") as tables:
            assert (tables.version, tables.get("main", b"n")) == (1, b"20")
        assert storage.projections.status()["flaky"].building.failed_seq == 7  # type: ignore[union-attr]
    finally:
        await storage.close()
    listed = subprocess.run(
        [*CLI, "projections", str(path), "--json"], capture_output=True, text=True, cwd=ROOT
    )
    assert listed.returncode == 1, listed.stderr  # a failed build: a problem found
    info = json.loads(listed.stdout)["flaky"]
    assert info["state"] == "failed" and info["building"]["failedSeq"] == 7 and info["version"] == 1
    assert list(info) == ["version", "foldedSeq", "lag", "state", "failedSeq", "error", "building"]
    assert list(info["building"]) == [
        "version",
        "foldedSeq",
        "lag",
        "rate",
        "eta",
        "failedSeq",
        "error",
    ]
    shown = subprocess.run(
        [*CLI, "stats", str(path), "--json"], capture_output=True, text=True, cwd=ROOT
    )
    build = json.loads(shown.stdout)["projections"]["user"]["flaky"]["building"]
    assert (
        list(build) == ["version", "foldedSeq", "rate", "failedSeq", "error"]
        and build["failedSeq"] == 7
    ), build
    cleared = subprocess.run(
        [*CLI, "projections", "retry", str(path), "flaky"], capture_output=True, text=True, cwd=ROOT
    )
    assert (
        cleared.returncode == 0
        and "cleared the failure" in cleared.stdout
        and "sequence 7" in cleared.stdout
    ), cleared
    FlakyV2.broken = False
    storage = await LmdbStorage.open(path, durability="process", projections=[FlakyV2()])
    try:
        await asyncio.wait_for(storage.projections.wait(20), 10)
        with storage.projections.read("flaky") as tables:
            assert (tables.version, tables.get("main", b"n")) == (2, b"20")
    finally:
        FlakyV2.broken = True
        await storage.close()


async def test_a_retired_projection_is_dropped_with_its_databases(tmp_path: Path) -> None:
    path = tmp_path / "store"
    await _store(path, 50, [Counter(), Steady()])
    storage = await LmdbStorage.open(path, durability="process", projections=[Steady()])
    try:
        assert storage.projections.status()["counter"].state == "retired"
        with pytest.raises(ValueError, match="defined by this program"):
            await storage.projections.drop("steady")
        dropped = await storage.projections.drop("counter")
        assert sorted(dropped) == ["u.counter.main", "u.counter.seqs"]
        assert "counter" not in storage.projections.status()
        assert not any(storage._env.has_db(name) for name in dropped)
        with pytest.raises(KeyError):
            with storage.projections.read("counter"):
                pass
    finally:
        await storage.close()
    assert list(stats(path).projections.user) == ["steady"]
    done = subprocess.run(
        [*CLI, "projections", "drop", str(path), "steady"], capture_output=True, text=True, cwd=ROOT
    )
    assert (
        done.returncode == 0 and "dropped projection 'steady': 1 database deleted" in done.stdout
    ), done
    assert stats(path).projections.user == {}
    missing = subprocess.run(
        [*CLI, "projections", "drop", str(path), "steady"], capture_output=True, text=True, cwd=ROOT
    )
    assert missing.returncode == 2 and "no projection 'steady'" in missing.stderr


class TaskStates(Projection):
    """Reads the core records through ``tables.core``: each task's status as of each commit."""

    name = "task_states"
    version = 1

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is TaskWrite:
                task = tables.core.task(write.value["id"])
                conversation = tables.core.conversation(task["conversationId"])
                tables.put(
                    "main",
                    commit.seq.to_bytes(8, "big"),
                    f"{task['state']['status']} {conversation['id']}".encode(),
                )


async def test_a_fold_reads_core_records_as_they_stood_at_its_batch(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    task = {
        "id": 2,
        "conversationId": 1,
        "kind": "k",
        "version": 1,
        "input": None,
        "background": False,
        "abortRequested": False,
        "state": {"status": "pending"},
    }
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        await storage.commit([{"type": "task", "value": task}], CTX)
        await storage.commit(
            [{"type": "task", "value": {**task, "state": {"status": "running"}}}], CTX
        )
    finally:
        await storage.close()
    storage = await LmdbStorage.open(
        path, durability="process", projections=[TaskStates()]
    )  # folded after all three
    try:
        await storage.projections.wait(3)
        with storage.projections.read("task_states") as tables:
            assert [value for _, value in tables.items("main")] == [b"pending 1", b"running 1"]
    finally:
        await storage.close()


class Legacy(Projection):
    name = "legacy"
    version = 1

    def fold(self, tables: Tables, commit: Commit) -> None:
        tables.put("main", commit.seq.to_bytes(8, "big"), str(self.version).encode())


class LegacyV2(Legacy):
    version = 2


async def test_a_projection_stored_before_builds_existed_is_served_then_rebuilt_beside(
    tmp_path: Path,
) -> None:
    """A status of format 1 (no slot, no database names) and its rows in ``u.<name>.<db>``."""

    import msgspec
    from pi_durable_lmdb.log import Environment
    from pi_durable_lmdb.projections.rebuild import REGISTRY_DB

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    await _commit_entries(storage, 2, 10)
    await storage.close()
    env = Environment(path, durability="process")
    main, registry = env.db("u.legacy.main"), env.db(REGISTRY_DB)
    old = msgspec.msgpack.encode(
        {"version": 1, "folded_seq": 10, "failed_seq": None, "error": None}
    )

    def plant(txn: Any) -> None:
        txn.put(b"user:legacy", old, db=registry)
        txn.put(b"planted", b"by the old layout", db=main)

    env.write(plant)
    env.close()
    storage = await LmdbStorage.open(path, durability="process", projections=[Legacy()])
    try:
        await storage.projections.wait(10)
        with storage.projections.read("legacy") as tables:
            assert (tables.version, tables.folded_seq, tables.get("main", b"planted")) == (
                1,
                10,
                b"by the old layout",
            )
    finally:
        await storage.close()
    storage = await LmdbStorage.open(path, durability="process", projections=[LegacyV2()])
    try:
        await asyncio.wait_for(storage.projections.wait(10), 30)
        with storage.projections.read("legacy") as tables:
            assert (
                tables.version,
                tables.get("main", b"planted"),
                len(list(tables.items("main"))),
            ) == (2, None, 10)
        for _ in range(200):
            if not storage._env.has_db("u.legacy.main"):
                break
            await asyncio.sleep(0.01)
        assert not storage._env.has_db("u.legacy.main"), (
            "the old layout's database is dropped after the swap"
        )
    finally:
        await storage.close()


SLOW_BUILD = textwrap.dedent(
    """
    import asyncio, sys
    from tests.projections.test_user_builds import CounterV2
    from pi_durable_lmdb.storage import LmdbStorage
    CounterV2.delay = 0.001
    async def main():
        storage = await LmdbStorage.open(sys.argv[1], durability="process", projections=[CounterV2()])
        try:
            await asyncio.wait_for(storage.projections.wait(storage.log.head()), 60)
        finally:
            await storage.close()
    asyncio.run(main())
    """
)


@pytest.mark.slow
async def test_a_build_shows_its_progress_to_status_and_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "store"
    await _store(path, 2000, [Counter()])
    writer = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(path)], cwd=ROOT)
    try:
        building = None
        for _ in range(500):
            listed = subprocess.run(
                [*CLI, "projections", str(path), "--json"], capture_output=True, text=True, cwd=ROOT
            )
            building = (
                json.loads(listed.stdout)["counter"]["building"] if listed.returncode == 0 else None
            )
            if building is not None and building["foldedSeq"] > 0 and building["rate"] > 0:
                break
            await asyncio.sleep(0.02)
        assert building is not None and building["version"] == 2 and building["eta"] is not None, (
            building
        )
        text = subprocess.run(
            [*CLI, "projections", str(path)], capture_output=True, text=True, cwd=ROOT
        ).stdout
        assert (
            "counter: building, serves version 1 folded to sequence 2000" in text
            and "records/s, ETA" in text
        ), text
        followed = subprocess.run(
            [*CLI, "projections", str(path), "--follow"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
        assert followed.returncode == 0, followed.stderr
        assert "counter version 2: " in followed.stderr and "records/s, ETA" in followed.stderr
        assert "counter: version 2 is served" in followed.stdout
    finally:
        assert writer.wait(60) == 0
    info = stats(path).projections.user["counter"]
    assert (info.version, info.folded_seq, info.building) == (2, 2000, None)


class Tally(msgspec.Struct):
    entries: int
    last_seq: int


class Typed(Projection):
    """Typed rows: entries per conversation as a Struct under a U64 key, kinds under TEXT keys."""

    name = "typed"
    version = 1
    databases = ("tally", "kinds")

    def fold(self, tables: Tables, commit: Commit) -> None:
        for write in commit.writes:
            if type(write) is EntryWrite:
                tally = TALLY.get(tables, write.value["conversationId"]) or Tally(0, 0)
                TALLY.put(
                    tables, write.value["conversationId"], Tally(tally.entries + 1, commit.seq)
                )
                KINDS.put(tables, write.value["kind"], commit.seq)


TALLY = TypedTable("tally", U64, Tally)
KINDS = TypedTable("kinds", TEXT, int)


async def test_typed_rows_read_and_write_values_and_refuse_a_damaged_one(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(
        tmp_path / "store", durability="process", projections=[Typed()]
    )
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for id, kind in [(2, "b"), (3, "a"), (4, "b")]:
            await storage.commit(
                [{"type": "entry", "value": {"id": id, "conversationId": 1, "kind": kind}}], CTX
            )
        await storage.projections.wait(4)
        with storage.projections.read("typed") as tables:
            assert list(TALLY.items(tables)) == [(1, Tally(3, 4))]
            assert list(KINDS.items(tables)) == [("a", 3), ("b", 4)]
            assert TALLY.get(tables, 9) is None
        with pytest.raises(ValueError, match="U64 key"):
            U64.encode(-1)
        damaged = TypedTable("tally", U64, str)  # the same rows read as another type
        with storage.projections.read("typed") as tables:
            with pytest.raises(CorruptProjectionError, match="'tally'"):
                damaged.get(tables, 1)
    finally:
        await storage.close()


async def test_the_metrics_export_the_lag_of_a_version_being_built(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from pi_durable_lmdb.metrics import register_path
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    path = tmp_path / "store"
    await _store(path, 20, [Steady()])

    class SteadyV2(Steady):
        version = 2
        broken = True  # fails at sequence 7: the build stays at 6

    storage = await LmdbStorage.open(path, durability="process", projections=[SteadyV2()])
    try:
        with pytest.raises(ProjectionFailed):
            await asyncio.wait_for(storage.projections.wait(20), 10)
    finally:
        await storage.close()
    registry = CollectorRegistry()
    register_path(path, registry)
    found = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    assert (
        found[
            (
                "pi_durable_lmdb_projection_build_lag_records",
                (("projection", "steady"), ("version", "2")),
            )
        ]
        == 14
    )
    assert found[("pi_durable_lmdb_projection_lag_records", (("projection", "steady"),))] == 0


async def test_another_version_replaces_an_unfinished_build_and_going_back_drops_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    await _store(path, 500, [Counter()])
    CounterV2.delay = CounterV3.delay = 0.002  # each build would take a second: closed long before
    try:
        storage = await LmdbStorage.open(path, durability="process", projections=[CounterV2()])
        await asyncio.sleep(0.05)
        await storage.close()
        storage = await LmdbStorage.open(path, durability="process", projections=[CounterV3()])
        try:
            build = storage.projections.status()["counter"].building
            assert build is not None and build.version == 3
            assert not any(
                storage._env.has_db(name) for name in db_names("counter", 1, ["main", "seqs"])
            ), "version 2's build is dropped"
            await asyncio.sleep(0.05)
        finally:
            await storage.close()
    finally:
        CounterV2.delay = CounterV3.delay = 0.0
    storage = await LmdbStorage.open(path, durability="process", projections=[Counter()])
    try:
        status = storage.projections.status()["counter"]
        assert (status.state, status.version, status.building) == ("level", 1, None)
        assert not any(
            storage._env.has_db(name) for name in db_names("counter", 2, ["main", "seqs"])
        ), "version 3's build is dropped"
        with storage.projections.read("counter") as tables:
            assert check_whole(tables) == 1 and tables.folded_seq == 500
    finally:
        await storage.close()
