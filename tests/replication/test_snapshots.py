"""Snapshots on the stream's side (``storage.snapshot``, ``durable-log snapshot``): a restore and a
new replica start from the newest snapshot that verifies and take in only the log after it.

* a restore after the log before the snapshot was trimmed away (it can only come from the
  snapshot) equals the writer; the same with a new replica on the in-memory engine;
* snapshots that do not verify -- cut short, a flipped byte, another store's copy under this
  store's name -- are skipped, never started from: the restore comes from the older sound one, or
  from the log, and equals the writer;
* the process publishing a snapshot SIGKILLed at random moments: every snapshot listed verifies,
  and a restore after each kill equals the writer;
* retention only by policy: without --keep nothing is deleted or trimmed; --trim needs --keep.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit import export_lines, verify
from pi_durable_lmdb.audit.restore import restore
from pi_durable_lmdb.audit.tail import open_stream
from pi_durable_lmdb.errors import SnapshotUnsoundError
from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryStream
from pi_durable_lmdb.storage import LmdbStorage
from pi_durable_lmdb.storage.snapshot import (
    SnapshotName,
    read_snapshot,
    seed,
    snapshot_name,
    snapshots_of,
    take_snapshot,
)

from ..support.natsserver import NatsNode, nats_server  # noqa: F401 - fixtures
from ..support.replication_helpers import DURABLE_LOG, ROOT, _bounded, _entry, read_subject, subject


async def _commit(writer: LmdbStorage, first: int, count: int) -> None:
    for id in range(first, first + count):
        await writer.commit([_entry(id, text="x" * (id % 50))], CTX)


async def _writer(path: Path, nats: Any, stream: str) -> LmdbStorage:
    writer = await LmdbStorage.open(path, durability="replicated", nats=nats, stream=stream)
    await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    return writer


def _same(restored: Path, writer: Path) -> None:
    assert verify(restored) is None
    assert list(export_lines(restored)) == list(export_lines(writer))


def test_restore_from_a_snapshot_after_the_log_before_it_was_trimmed(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    stream = "snaps"

    async def body() -> None:
        writer = await _writer(tmp_path / "writer", nats_server.url, stream)
        try:
            await _commit(writer, 100, 150)
            store = writer.store_id
            assert store is not None
            link = await open_stream(nats_server.url, stream)
            try:
                first = await take_snapshot(tmp_path / "writer", link)
                assert (
                    first.seq == writer.log.head()
                    and first.deleted == []
                    and first.trimmed_below == 0
                )
                await _commit(writer, 300, 40)
                second = await take_snapshot(tmp_path / "writer", link, keep=1, trim=True)
                assert second.deleted == [first.name] and second.trimmed_below == second.stream_seq
                names = await link.arun(link.snapshots.names())
                assert names == [second.name]
            finally:
                await asyncio.to_thread(link.close)
            messages = await read_subject(nats_server.url, stream, subject(stream, store))
            assert messages[0].stream_seq == second.stream_seq, (
                "the log before the snapshot kept is trimmed"
            )
            await _commit(writer, 400, 30)
            head = writer.log.head()
        finally:
            await writer.close()
        assert await restore(nats_server.url, stream, store, tmp_path / "restored") == head
        _same(tmp_path / "restored", tmp_path / "writer")
        # to a point between the snapshot and the end; before the snapshot the log is gone
        assert (
            await restore(
                nats_server.url, stream, store, tmp_path / "earlier", to_seq=second.seq + 5
            )
            == second.seq + 5
        )
        with pytest.raises(ValueError, match="trimmed"):
            await restore(
                nats_server.url, stream, store, tmp_path / "too-early", to_seq=second.seq - 5
            )
        assert not (tmp_path / "too-early").exists()

    _bounded(90, body())


def test_restore_to_a_time_starts_from_no_snapshot_that_ends_after_it(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """A snapshot's name gives its head but not its commit time: one whose head was committed
    after the point is passed over for an older one (or for the log)."""

    stream, t0 = "timed", 1_767_225_600_000

    async def body() -> None:
        writer = await LmdbStorage.open(
            tmp_path / "writer", durability="replicated", nats=nats_server.url, stream=stream
        )
        try:
            for n in range(1, 41):  # record n committed at t0 + n seconds
                writes = (
                    [_entry(100 + n)] if n > 1 else [{"type": "conversation", "value": {"id": 1}}]
                )
                await writer.commit(writes, CTX, committed_at=t0 + n * 1000)
                if n in (20, 40):
                    link = await open_stream(nats_server.url, stream)
                    try:
                        assert (await take_snapshot(tmp_path / "writer", link)).seq == n
                    finally:
                        await asyncio.to_thread(link.close)
            store = writer.store_id
            assert store is not None
        finally:
            await writer.close()
        for n in (30, 10, 20):
            target = tmp_path / f"at-{n}"
            assert await restore(nats_server.url, stream, store, target, to_time=t0 + n * 1000) == n
            assert list(export_lines(target)) == list(export_lines(tmp_path / "writer", last=n))
            assert verify(target) is None
        with pytest.raises(ValueError, match=r"no record of store .* committed at or before"):
            await restore(nats_server.url, stream, store, tmp_path / "none", to_time=t0 - 10**9)
        assert not (tmp_path / "none").exists()

    _bounded(90, body())


def _corrupt(packed: bytes, how: str) -> bytes:
    if how == "cut short":
        return packed[: len(packed) * 2 // 3]
    if how == "flipped byte":
        at = len(packed) - 100
        return packed[:at] + bytes([packed[at] ^ 0x40]) + packed[at + 1 :]
    raise AssertionError(how)


def test_snapshots_that_do_not_verify_are_never_started_from(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    stream = "unsound"

    async def body() -> None:
        writer = await _writer(tmp_path / "writer", nats_server.url, stream)
        other = await _writer(tmp_path / "other", nats_server.url, stream)
        try:
            await _commit(writer, 100, 120)
            await _commit(other, 100, 5)
            store = writer.store_id
            assert store is not None
            link = await open_stream(nats_server.url, stream)
            try:
                good = await take_snapshot(tmp_path / "writer", link)
                await _commit(writer, 300, 20)
                packed = io.BytesIO()
                await link.arun(link.snapshots.get(good.name, packed))
                head = writer.log.head()
                later = writer.stream_position(stream).stream_seq
                # newer than the good one, each unsound in its own way
                for offset, how in enumerate(("cut short", "flipped byte"), 1):
                    name = snapshot_name(store, later + offset, head)
                    await link.arun(
                        link.snapshots.put(name, io.BytesIO(_corrupt(packed.getvalue(), how)))
                    )
                foreign = await take_snapshot(tmp_path / "other", link)
                moved = io.BytesIO()
                await link.arun(link.snapshots.get(foreign.name, moved))
                moved.seek(0)
                await link.arun(link.snapshots.put(snapshot_name(store, later + 3, head), moved))
                found = snapshots_of(await link.arun(link.snapshots.names()), store)
                assert len(found) == 4 and found[0].name == good.name
                for bad in found[1:]:
                    spool = io.BytesIO()
                    await link.arun(link.snapshots.get(bad.name, spool))
                    spool.seek(0)
                    directory = tmp_path / f"check-{bad.stream_seq}"
                    directory.mkdir()
                    with pytest.raises(SnapshotUnsoundError):
                        read_snapshot(spool, str(directory), store, stream, bad)
                    assert os.listdir(directory) == [], (
                        "nothing is left of a snapshot that does not verify"
                    )
                # the newest sound one is chosen
                seeded = tmp_path / "seeded"
                seeded.mkdir()
                header = await asyncio.to_thread(seed, link, store, str(seeded))
                assert header is not None and header.stream_seq == good.stream_seq
            finally:
                await asyncio.to_thread(link.close)
        finally:
            await writer.close()
            await other.close()
        assert await restore(nats_server.url, stream, store, tmp_path / "restored") == head
        _same(tmp_path / "restored", tmp_path / "writer")
        assert (
            await restore(nats_server.url, stream, store, tmp_path / "from-log", snapshots=False)
            == head
        )
        _same(tmp_path / "from-log", tmp_path / "writer")

    _bounded(90, body())


def test_a_snapshot_publisher_killed_at_random_moments(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """``durable-log snapshot --every`` SIGKILLed at random moments (3 kills): every snapshot the
    bucket lists verifies, and a restore after each kill equals the writer."""

    stream = "killed"
    rng = random.Random(int(os.environ.get("SNAPSHOT_KILL_SEED", "39")))

    async def fill() -> tuple[str, int]:
        writer = await _writer(tmp_path / "writer", nats_server.url, stream)
        try:
            await _commit(writer, 100, 400)
            assert writer.store_id is not None
            return writer.store_id, writer.log.head()
        finally:
            await writer.close()

    store, head = _bounded(60, fill())
    for round in range(3):
        child = subprocess.Popen(
            [
                str(DURABLE_LOG),
                "snapshot",
                str(tmp_path / "writer"),
                "--nats",
                nats_server.url,
                "--stream",
                stream,
                "--every",
                "0.1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        try:
            time.sleep(rng.uniform(0.3, 1.5))
        finally:
            child.send_signal(signal.SIGKILL)
            _, errors = child.communicate(timeout=10)
        assert child.returncode == -signal.SIGKILL, errors.decode()[-2000:]

        async def check(round: int = round) -> None:
            link = await open_stream(nats_server.url, stream)
            try:
                for found in snapshots_of(await link.arun(link.snapshots.names()), store):
                    spool = io.BytesIO()
                    await link.arun(link.snapshots.get(found.name, spool))
                    spool.seek(0)
                    directory = tmp_path / f"verify-{round}-{found.stream_seq}"
                    directory.mkdir()
                    header = read_snapshot(spool, str(directory), store, stream, found)
                    assert header.seq == head
            finally:
                await asyncio.to_thread(link.close)
            assert (
                await restore(nats_server.url, stream, store, tmp_path / f"restored-{round}")
                == head
            )
            _same(tmp_path / f"restored-{round}", tmp_path / "writer")

        _bounded(60, check())
    done = subprocess.run(
        [
            str(DURABLE_LOG),
            "snapshot",
            str(tmp_path / "writer"),
            "--nats",
            nats_server.url,
            "--stream",
            stream,
        ],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".snapshot-")], (
        "work left by the killed ones"
    )


def test_a_new_replica_starts_from_a_snapshot_on_the_memory_engine(tmp_path: Path) -> None:
    server = MemoryStream("MEMSNAP")

    async def body() -> None:
        writer = await _writer(tmp_path / "writer", MemoryLink(server), server.name)
        try:
            await _commit(writer, 100, 60)
            link = MemoryLink(server)
            try:
                report = await take_snapshot(tmp_path / "writer", link, keep=1, trim=True)
            finally:
                await asyncio.to_thread(link.close)
            assert (
                next(
                    m.stream_seq
                    for m in server.subject_messages(f"{server.name}.{report.store}.log")
                )
                == report.stream_seq
            )
            await _commit(writer, 200, 10)
            head = writer.log.head()
        finally:
            await writer.close()
        replica = await LmdbStorage.open_replica(
            tmp_path / "replica", nats=MemoryLink(server), stream=server.name, store=report.store
        )
        try:
            await replica.wait(head, timeout=20)
        finally:
            await replica.close()
        _same(tmp_path / "replica", tmp_path / "writer")

    _bounded(60, body())


def test_retention_is_by_policy_only(tmp_path: Path) -> None:
    server = MemoryStream("MEMKEEP")

    async def body() -> None:
        writer = await _writer(tmp_path / "writer", MemoryLink(server), server.name)
        link = MemoryLink(server)
        try:
            names = []
            for round in range(3):
                await _commit(writer, 100 + 10 * round, 10)
                names.append((await take_snapshot(tmp_path / "writer", link)).name)
            assert await link.arun(link.snapshots.names()) == sorted(names), (
                "without keep nothing is deleted"
            )
            assert (
                server.subject_messages(f"{server.name}.{writer.store_id}.log")[0].stream_seq == 1
            )
            with pytest.raises(ValueError, match="keep"):
                await take_snapshot(tmp_path / "writer", link, trim=True)
            report = await take_snapshot(
                tmp_path / "writer", link, keep=2
            )  # nothing new: the same name again
            assert (
                report.name == names[-1]
                and report.deleted == names[:1]
                and report.trimmed_below == 0
            )
            assert (
                server.subject_messages(f"{server.name}.{writer.store_id}.log")[0].stream_seq == 1
            )
        finally:
            await asyncio.to_thread(link.close)
            await writer.close()

    _bounded(60, body())


def test_snapshot_command_refuses_trim_without_keep_and_a_missing_store(tmp_path: Path) -> None:
    missing = subprocess.run(
        [
            str(DURABLE_LOG),
            "snapshot",
            str(tmp_path / "none"),
            "--nats",
            "127.0.0.1:1",
            "--stream",
            "S",
        ],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert missing.returncode == 2 and b"Traceback" not in missing.stderr, missing.stderr
    trim = subprocess.run(
        [
            str(DURABLE_LOG),
            "snapshot",
            str(tmp_path),
            "--nats",
            "127.0.0.1:1",
            "--stream",
            "S",
            "--trim",
        ],
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert trim.returncode == 2 and b"--keep" in trim.stderr, trim.stderr


def test_snapshot_names_sort_by_age() -> None:
    names = [
        snapshot_name("abc", 10, 3),
        snapshot_name("abc", 9, 2),
        snapshot_name("xyz", 11, 4),
        "abc.bad",
        "abc.1.x",
    ]
    assert [found.stream_seq for found in snapshots_of(names, "abc")] == [9, 10]
    assert snapshots_of(names, "abc")[0] == SnapshotName(9, 2, snapshot_name("abc", 9, 2))
