"""Erasing a conversation of a replicated store (``LmdbStorage.erase_conversation`` on a writer
with ``durability="replicated"``), against a real nats-server, with a replica and a snapshot:

* the replica's reads equal the writer's, now and as of every point, the erased conversation
  absent; every other read is what it was;
* no message of the store's subject and no snapshot in the bucket holds the erased bytes;
* a restore afterwards (from the log alone, meeting the deleted messages' gaps, and from the
  new snapshot) has the writer's reads and tree root and no file holding the bytes; ``verify``
  passes on all of them; a restore to a point before the erasure is refused, named;
* a replica started after the erasure (from the new snapshot) equals the writer;
* a writer that stopped before the messages were deleted finishes on its next open;
* the same on a 3-node cluster (R3), and through `durable-log erase --nats --stream`.
"""

from __future__ import annotations

import asyncio
import io
import os
import secrets
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.errors import StorageRequestError
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.audit.restore import restore
from pi_durable_lmdb.audit.tail import open_stream
from pi_durable_lmdb.log import Environment, WriteLog
from pi_durable_lmdb.log.records import decode_record, decode_record_builtins
from pi_durable_lmdb.log.stream.message import Tombstones
from pi_durable_lmdb.storage import LmdbStorage
from pi_durable_lmdb.storage.lmdb_storage import ERASING_KEY
from pi_durable_lmdb.storage.snapshot import MAGIC, snapshots_of, take_snapshot

from ..support.cli_call import call
from ..support.natsserver import NatsCluster, NatsNode, nats_cluster, nats_server  # noqa: F401
from ..support.polling import until_async
from ..support.replication_helpers import Message, read_subject, subject
from ..support.workload import message

pytestmark = pytest.mark.slow

STREAM = "erasing"


async def _fill(storage: LmdbStorage, marker: str) -> dict[str, int]:
    """Conversations A (``marker`` in its entries, a document's revisions and a task), B (some
    of its writes in A's batches) and C."""

    ids = {name: await storage.mint_id() for name in ("a", "b", "c", "doc", "task")}
    a, b, c = ids["a"], ids["b"], ids["c"]
    await storage.commit([{"type": "conversation", "value": {"id": id}} for id in (a, b, c)], CTX)
    for turn in range(12):
        writes: list[dict[str, Any]] = [
            message(await storage.mint_id(), b, f"b says {turn} " + secrets.token_hex(4)),
            message(await storage.mint_id(), a, f"a says {turn}: {marker}"),
        ]
        if turn == 2:
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
        if turn > 2 and turn % 4 == 0:
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
    # A batch under ``RAW_BELOW``, stored as it is: the marker's bytes are then in what a server
    # stores of it, whatever zstd made of the larger batches (their literals may be coded).
    await storage.commit([message(await storage.mint_id(), a, marker)], CTX)
    return ids


async def _call(method: Any, *args: Any) -> Any:
    try:
        return await method(*args)
    except StorageRequestError as error:
        return ("refused", str(error))


async def _reads_at(store: Any, ids: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("a", "b", "c"):
        id = ids[name]
        out[f"conversation {name}"] = await _call(store.conversation, id, CTX)
        out[f"entries {name}"] = await _call(
            store.scan_entries, {"conversationId": id, "order": "ascending"}, 100, None, CTX
        )
    out["document"] = await _call(store.document, ids["doc"], "current", CTX)
    out["task"] = await _call(store.task, ids["task"], CTX)
    return out


async def _reads(store: LmdbStorage, ids: dict[str, int], upto: int) -> dict[int, Any]:
    """Every read above, now (key 0) and as of every point up to ``upto``."""

    out = {0: await _reads_at(store, ids)}
    for point in range(1, upto + 1):
        out[point] = await _reads_at(await store.as_of(point), ids)
    return out


def _others(reads: dict[str, Any]) -> dict[str, Any]:
    """The reads of B and C."""

    return {k: v for k, v in reads.items() if k.endswith((" b", " c"))}


def _files_holding(path: Path, needle: bytes) -> list[str]:
    found = []
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as file:
                if needle in file.read():
                    found.append(os.path.join(root, name))
    return found


def _record_holds(seq: int, data: bytes, needle: str) -> bool:
    """Whether a record holds ``needle``, as stored or decoded (a compressed record's bytes
    need not show it)."""

    return needle.encode() in data or needle in repr(decode_record_builtins(seq, data))


def _holding(messages: list[Message], needle: str) -> list[int]:
    """The stream sequences of the messages holding ``needle``, records and tombstones decoded."""

    found = []
    for m in messages:
        held = needle.encode() in m.data
        if m.kind == "record":
            held = held or _record_holds(m.seq, m.data, needle)
        elif m.kind == "tombstones":
            tombstones = msgspec.msgpack.decode(m.data, type=Tombstones)
            held = held or any(_record_holds(s, d, needle) for s, d in tombstones.records)
        if held:
            found.append(m.stream_seq)
    return found


def _log_holding(path: Path, needle: str) -> list[int]:
    """The records of the store at ``path`` that hold ``needle`` (decoded)."""

    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        return [
            seq
            for seq, data in log.raw_chunk(1, None, limit=1 << 30)
            if _record_holds(seq, data, needle)
        ]
    finally:
        env.close()


async def _snapshots_holding(url: str, store: str, needle: str, work: Path) -> list[bool]:
    """For each snapshot of ``store`` in the bucket: whether it holds ``needle``, in its bytes
    or in a record of its log (decoded)."""

    out = []
    for index, content in enumerate(await _snapshot_contents(url, store)):
        copy = work / f"snapshot-{index}"
        copy.mkdir(parents=True)
        (copy / "data.mdb").write_bytes(content)
        out.append(needle.encode() in content or bool(_log_holding(copy, needle)))
    return out


async def _snapshot_contents(url: str, store: str) -> list[bytes]:
    """Each snapshot of ``store`` in the bucket, decompressed."""

    link = await open_stream(url, STREAM)
    try:
        out = []
        for found in snapshots_of(await link.arun(link.snapshots.names()), store):
            sink = io.BytesIO()
            await link.arun(link.snapshots.get(found.name, sink))
            raw = sink.getvalue()
            assert raw.startswith(MAGIC)
            (length,) = struct.unpack_from(">I", raw, len(MAGIC))
            body = raw[len(MAGIC) + 4 + length :]
            out.append(zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)).read())
        return out
    finally:
        await asyncio.to_thread(link.close)


def _tombstones_taken(store: LmdbStorage, records: list[int]) -> bool:
    with store.log.env.read() as txn:
        for seq in records:
            data = store.log.record(txn, seq)
            if data is None or decode_record(seq, data).tombstone is None:
                return False
    return True


async def _erase_everywhere(
    tmp_path: Path, url: str, replicas: int, server_files: Path | None = None
) -> None:
    """Writer, replica and snapshot on the stream at ``url`` (``replicas`` copies), an erasure,
    then every check of the module docstring's first three points; ``server_files``: the
    server's store directory, which must not hold the erased bytes either."""

    marker = "m" + secrets.token_hex(20)
    writer = await LmdbStorage.open(
        tmp_path / "writer", durability="replicated", nats=url, stream=STREAM, replicas=replicas
    )
    store = writer.store_id
    assert store is not None
    ids = await _fill(writer, marker)
    head = writer.log.head()
    replica = await LmdbStorage.open_replica(
        tmp_path / "replica", nats=url, stream=STREAM, store=store
    )
    await replica.wait(head, timeout=60)
    link = await open_stream(url, STREAM)
    try:
        await take_snapshot(tmp_path / "writer", link)
    finally:
        await asyncio.to_thread(link.close)
    assert await _snapshots_holding(url, store, marker, tmp_path / "before") == [True]
    before = await _reads(writer, ids, head)
    assert marker in repr(before[0])
    messages = await read_subject(url, STREAM, subject(STREAM, store))
    assert _holding(messages, marker)
    assert any(marker.encode() in m.data for m in messages)  # as stored: what a server's files hold
    if server_files is not None:  # the server writes its message blocks out on its own time
        await until_async(
            lambda: bool(_files_holding(server_files, marker.encode())),
            timeout=30,
            what="the server's files hold the marker before the erasure",
            interval=0.2,
        )

    report = await writer.erase_conversation(ids["a"], reason="erasure request 9", by="dpo")
    assert report.seq == head + 1 and report.conversations == [ids["a"]]
    await replica.wait(report.seq, timeout=60)
    end = writer.stream_position(STREAM).stream_seq  # the erasure's last tombstones message
    await until_async(
        lambda: replica.replication.status().stream_seq >= end,
        timeout=60,
        what="the replica takes the tombstones in and folds its projections again",
    )
    assert _tombstones_taken(replica, report.records)

    after = await _reads(writer, ids, report.seq)
    # (1) the replica answers as the writer, now and as of every point
    assert await _reads(replica, ids, report.seq) == after
    for point, reads in after.items():
        assert marker not in repr(reads), point
        assert reads["conversation a"] is None and reads["document"] is None
        assert reads["task"] is None
        assert _others(reads) == _others(before[point if point <= head else 0]), point
    assert replica.log.root() == writer.log.root()
    # (2) no message of the subject holds the erased bytes
    messages = await read_subject(url, STREAM, subject(STREAM, store))
    assert messages and _holding(messages, marker) == []
    on_stream = {m.seq for m in messages if m.kind == "record"}
    assert on_stream == set(range(1, report.seq + 1)) - set(report.records)
    assert [m.kind for m in messages if m.stream_seq > end - 1] == ["tombstones"]
    # (3) nor any snapshot (the one taken before replaced by one taken after)
    assert await _snapshots_holding(url, store, marker, tmp_path / "work") == [False]
    if server_files is not None:  # secure deletes: the server's files do not hold it either
        assert _files_holding(server_files, marker.encode()) == []
    root = writer.log.root()
    await replica.close()
    await writer.close()

    # (4) restores, from the log alone and from the new snapshot
    for name, snapshots in (("restored", False), ("restored-snap", True)):
        path = tmp_path / name
        assert await restore(url, STREAM, store, path, snapshots=snapshots) == report.seq
        restored = await LmdbStorage.open(path, durability="process")
        try:
            assert await _reads(restored, ids, report.seq) == after
            assert restored.log.root() == root
        finally:
            await restored.close()
        assert _files_holding(path, marker.encode()) == []
        assert _log_holding(path, marker) == []
        assert verify(path) is None
    # To a point before the erasure: refused, named (the erased records are not there).
    with pytest.raises(ValueError, match=f"erased by erasure record {report.seq}"):
        await restore(url, STREAM, store, tmp_path / "to-before", to_seq=head)
    assert not (tmp_path / "to-before").exists()
    # A replica new after the erasure meets the deleted messages' gaps.
    late = await LmdbStorage.open_replica(tmp_path / "late", nats=url, stream=STREAM, store=store)
    try:
        await late.wait(report.seq, timeout=60)
        assert await _reads(late, ids, report.seq) == after
        assert late.log.root() == root
    finally:
        await late.close()
    for path in ("writer", "replica", "late"):
        assert _files_holding(tmp_path / path, marker.encode()) == [], path
        assert _log_holding(tmp_path / path, marker) == [], path
        assert verify(tmp_path / path) is None, path


def test_erasure_reaches_stream_replica_snapshots_and_restores(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    asyncio.run(_erase_everywhere(tmp_path, nats_server.url, 1, nats_server.store_dir))


@pytest.mark.cluster
def test_erasure_on_a_three_node_cluster(tmp_path: Path, nats_cluster: NatsCluster) -> None:
    asyncio.run(_erase_everywhere(tmp_path, nats_cluster.urls, 3))


KILLED_ERASER = """
import asyncio, os, sys
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.storage import lmdb_storage

path, url, stream, conversation = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

async def die(*args, **kwargs):
    print("committed", flush=True)
    os._exit(9)  # killed once the erasure committed, before a message left the stream

lmdb_storage.delete_erased = die

async def main():
    storage = await LmdbStorage.open(path, durability="replicated", nats=url, stream=stream)
    await storage.erase_conversation(conversation, reason="a kill test")

asyncio.run(main())
"""


def test_a_writer_killed_before_the_deletes_finishes_them_on_its_next_open(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    marker = "m" + secrets.token_hex(20)
    url = nats_server.url
    path = tmp_path / "writer"

    async def fill() -> tuple[str, dict[str, int], int]:
        writer = await LmdbStorage.open(path, durability="replicated", nats=url, stream=STREAM)
        try:
            ids = await _fill(writer, marker)
            store = writer.store_id
            assert store is not None
            link = await open_stream(url, STREAM)
            try:
                await take_snapshot(path, link)
            finally:
                await asyncio.to_thread(link.close)
            return store, ids, writer.log.head()
        finally:
            await writer.close()

    store, ids, head = asyncio.run(fill())
    child = subprocess.run(
        [sys.executable, "-c", KILLED_ERASER, str(path), url, STREAM, str(ids["a"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 9 and "committed" in child.stdout, child.stderr
    messages = asyncio.run(read_subject(url, STREAM, subject(STREAM, store)))
    assert _holding(messages, marker)  # not deleted yet

    async def reopen() -> None:
        writer = await LmdbStorage.open(
            path, durability="replicated", nats=url, stream=STREAM, take_over="force"
        )
        try:
            assert writer.log.head() == head + 1
            with writer.log.env.read() as txn:
                assert txn.get(ERASING_KEY, db=writer.log.env.db("meta")) is None
            # Run again: already erased by record head + 1, nothing left to do.
            report = await writer.erase_conversation(ids["a"], reason="again")
            assert report.seq == head + 1
        finally:
            await writer.close()

    asyncio.run(reopen())
    messages = asyncio.run(read_subject(url, STREAM, subject(STREAM, store)))
    assert _holding(messages, marker) == []
    assert asyncio.run(_snapshots_holding(url, store, marker, tmp_path / "work")) == [False]
    assert _files_holding(path, marker.encode()) == []
    assert _log_holding(path, marker) == []
    assert verify(path) is None


def test_durable_log_erase_with_nats_erases_from_the_stream(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, nats_server: NatsNode
) -> None:
    marker = "m" + secrets.token_hex(20)
    url = nats_server.url
    path = tmp_path / "writer"

    async def fill() -> tuple[str, dict[str, int]]:
        writer = await LmdbStorage.open(path, durability="replicated", nats=url, stream=STREAM)
        try:
            ids = await _fill(writer, marker)
            assert writer.store_id is not None
            return writer.store_id, ids
        finally:
            await writer.close()

    store, ids = asyncio.run(fill())
    a = ids["a"]
    code, _, err = call(capsys, "erase", path, "--conversation", a, "--reason", "r", "--nats", url)
    assert code != 0 and "--nats and --stream go together" in err
    code, out, err = call(
        capsys,
        "erase",
        path,
        "--conversation",
        a,
        "--reason",
        "r",
        "--nats",
        url,
        "--stream",
        STREAM,
    )
    assert code == 0, err
    assert "erased conversation" in out
    messages = asyncio.run(read_subject(url, STREAM, subject(STREAM, store)))
    assert _holding(messages, marker) == []
    assert _files_holding(path, marker.encode()) == [] and _log_holding(path, marker) == []
    restored = tmp_path / "restored"
    assert asyncio.run(restore(url, STREAM, store, restored)) == messages[-2].seq
    assert _log_holding(restored, marker) == []
    assert verify(restored) is None and verify(path) is None
