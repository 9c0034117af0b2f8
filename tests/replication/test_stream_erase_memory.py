"""Erasures on a replicated store, on the in-memory stream engine (the same code path as on
JetStream, deterministic): a record erased twice (its first tombstone kept another conversation's
writes the second erasure removes) leaves the stream with no message holding either
conversation's bytes and a current tombstone of every erased record; a replica that held the
records (following, or closed meanwhile) and one that meets the gaps all hold the writer's log
byte for byte; a replica refuses to erase."""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.errors import OutcomeUnknownError
from pi_durable_lmdb.log.records import decode_record
from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryStream
from pi_durable_lmdb.log.stream.message import H_KIND, H_SEQ, Tombstones
from pi_durable_lmdb.storage import LmdbStorage, lmdb_storage

from ..support.polling import until_async
from ..support.workload import message
from .test_stream_erase import _files_holding, _log_holding, _reads, _record_holds

STREAM, STORE = "mem", "erasing-store"


def _log(storage: LmdbStorage) -> list[tuple[int, bytes]]:
    return storage.log.raw_chunk(1, None, limit=1 << 30)


def test_a_record_erased_twice_and_a_replica_meeting_the_gaps(tmp_path: Path) -> None:
    server = MemoryStream(STREAM)
    a_marker, b_marker = "a" + secrets.token_hex(16), "b" + secrets.token_hex(16)

    async def body() -> None:
        writer = await LmdbStorage.open(
            tmp_path / "w",
            durability="replicated",
            nats=MemoryLink(server),
            stream=STREAM,
            store=STORE,
        )
        ids = {name: await writer.mint_id() for name in ("a", "b", "c", "doc", "task")}
        a, b, c = ids["a"], ids["b"], ids["c"]
        await writer.commit([{"type": "conversation", "value": {"id": i}} for i in (a, b, c)], CTX)
        for turn in range(6):
            writes: list[dict[str, Any]] = [
                message(await writer.mint_id(), a, f"{turn} {a_marker}"),
                message(await writer.mint_id(), b, f"{turn} {b_marker}"),
                message(await writer.mint_id(), c, f"c {turn}"),
            ]
            await writer.commit(writes, CTX)
            await writer.commit([message(await writer.mint_id(), b, f"{turn} {b_marker}")], CTX)
            await writer.commit(
                [
                    message(await writer.mint_id(), a, f"{turn} {a_marker}"),
                    message(await writer.mint_id(), c, f"c {turn} again"),
                ],
                CTX,
            )
        replica = await LmdbStorage.open_replica(
            tmp_path / "r", nats=MemoryLink(server), stream=STREAM, store=STORE
        )
        await replica.wait(writer.log.head(), timeout=30)
        away = await LmdbStorage.open_replica(
            tmp_path / "away", nats=MemoryLink(server), stream=STREAM, store=STORE
        )
        await away.wait(writer.log.head(), timeout=30)
        await away.close()  # closed while the erasures happen: it takes them in when it opens

        with pytest.raises(PermissionError, match="not its stream's writer"):
            await replica.erase_conversation(a, reason="a replica takes erasures from its writer")
        first = await writer.erase_conversation(a, reason="first")
        second = await writer.erase_conversation(b, reason="second")
        # Half of A's records held B's writes too; the others' tombstones travel again.
        assert set(first.records) & set(second.records) and set(first.records) - set(second.records)
        head = writer.log.head()
        assert head == second.seq

        subject = f"{STREAM}.{STORE}.log"
        messages = server.subject_messages(subject)
        current: dict[int, bytes] = {}
        for m in messages:
            kind, seq = m.headers[H_KIND], int(m.headers[H_SEQ])
            if kind == "record":
                assert seq not in second.records
                assert not _record_holds(seq, m.data, a_marker)
                assert not _record_holds(seq, m.data, b_marker)
            elif kind == "tombstones":
                for number, data in msgspec.msgpack.decode(m.data, type=Tombstones).records:
                    assert not _record_holds(number, data, a_marker)
                    assert not _record_holds(number, data, b_marker)
                    current[number] = data
        # Every tombstone of the writer's log is on the stream as the log holds it.
        tombstones = {
            seq: data
            for seq, data in _log(writer)
            if decode_record(seq, data).tombstone is not None
        }
        assert set(tombstones) == set(first.records) | set(second.records)
        assert {seq: current[seq] for seq in tombstones} == tombstones

        end = writer.stream_position(STREAM).stream_seq
        await until_async(
            lambda: replica.replication.status().stream_seq >= end,
            timeout=30,
            what="the replica takes the tombstones in",
        )
        late = await LmdbStorage.open_replica(
            tmp_path / "late", nats=MemoryLink(server), stream=STREAM, store=STORE
        )
        await late.wait(head, timeout=30)
        away = await LmdbStorage.open_replica(
            tmp_path / "away", nats=MemoryLink(server), stream=STREAM, store=STORE
        )
        await until_async(
            lambda: away.replication.status().stream_seq >= end,
            timeout=30,
            what="the reopened replica takes the erasures in",
        )
        expected = await _reads(writer, ids, head)
        for other in (replica, late, away):
            assert _log(other) == _log(writer)
            assert other.log.root() == writer.log.root()
            assert await _reads(other, ids, head) == expected
        assert expected[0]["conversation a"] is None and expected[0]["conversation b"] is None
        for storage in (away, late, replica, writer):
            await storage.close()
        for name in ("w", "r", "late", "away"):  # scrubbed as they closed
            for marker in (a_marker, b_marker):
                assert _files_holding(tmp_path / name, marker.encode()) == [], name
                assert _log_holding(tmp_path / name, marker) == [], name

    asyncio.run(body())


async def _writer_of_two(
    path: Path, server: MemoryStream, marker: str, turns: int
) -> tuple[LmdbStorage, int, int]:
    """A replicated writer on ``server`` with conversations ``a`` and ``b``, and ``turns``
    commits each holding a message of both, ``a``'s with ``marker``."""

    writer = await LmdbStorage.open(
        path, durability="replicated", nats=MemoryLink(server), stream=STREAM, store=STORE
    )
    a, b = await writer.mint_id(), await writer.mint_id()
    await writer.commit([{"type": "conversation", "value": {"id": i}} for i in (a, b)], CTX)
    for turn in range(turns):
        await writer.commit(
            [
                message(await writer.mint_id(), a, f"{turn} {marker}"),
                message(await writer.mint_id(), b, f"b {turn}"),
            ],
            CTX,
        )
    return writer, a, b


_READ = """
import asyncio, json, sys
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

async def main():
    storage = await LmdbStorage.open(sys.argv[1], readonly=True)
    try:
        conversation = int(sys.argv[2])
        page = await storage.scan_entries({"conversationId": conversation}, 100, None, CTX)
        print(json.dumps({
            "head": storage.log.head(),
            "conversation": await storage.conversation(conversation, CTX) is not None,
            "entries": len(page["items"]),
            "marker": sys.argv[3] in json.dumps(page["items"]),
        }))
    finally:
        await storage.close()

asyncio.run(main())
"""


async def _read_in_a_fresh_process(path: Path, conversation: int, marker: str) -> Any:
    """What a read-only handle in another process reads of ``conversation`` in the store."""

    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _READ,
        str(path),
        str(conversation),
        marker,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(child.communicate(), 120)
    assert child.returncode == 0, err.decode()[-2000:]
    return json.loads(out)


def test_an_erasure_whose_answer_was_lost_or_whose_publish_was_dropped(tmp_path: Path) -> None:
    server = MemoryStream(STREAM)
    marker = "a" + secrets.token_hex(16)

    async def body() -> None:
        writer, a, b = await _writer_of_two(tmp_path / "w", server, marker, 4)
        head = writer.log.head()
        server.drop_requests = 1  # nothing stored, no answer: nothing erased
        with pytest.raises(OutcomeUnknownError):
            await writer.erase_conversation(a, reason="dropped")
        assert writer.log.head() == head and await writer.conversation(a, CTX) is not None
        assert await _read_in_a_fresh_process(tmp_path / "w", a, marker) == {
            "head": head,
            "conversation": True,
            "entries": 4,
            "marker": True,
        }
        server.lose_answers = 1  # stored, the answer lost: the erasure landed, and is committed
        report = await writer.erase_conversation(a, reason="answer lost")
        assert report.seq == head + 1 and await writer.conversation(a, CTX) is None
        subject = f"{STREAM}.{STORE}.log"
        kinds = [
            (m.headers[H_KIND], int(m.headers[H_SEQ])) for m in server.subject_messages(subject)
        ]
        assert kinds.count(("record", report.seq)) == 1 and kinds[-1] == ("tombstones", report.seq)
        await writer.commit([message(await writer.mint_id(), b, "after")], CTX)
        late = await LmdbStorage.open_replica(
            tmp_path / "late", nats=MemoryLink(server), stream=STREAM, store=STORE
        )
        await late.wait(writer.log.head(), timeout=30)
        assert _log(late) == _log(writer)
        for storage in (late, writer):
            await storage.close()

    asyncio.run(body())


def test_an_erasure_whose_scan_meets_a_replica_behind_finds_its_messages_once_they_come(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the stream acknowledged the erasure record, the scan that finds the messages to
    delete may be answered by a replica that does not hold it yet: it scans again until it does
    (a three-node cluster under load met this), and the erased bytes still leave the stream."""

    server = MemoryStream(STREAM)
    marker = "a" + secrets.token_hex(16)
    real_delete = lmdb_storage.delete_erased

    async def behind(*args: Any, **kwargs: Any) -> int:
        server.lagging_fetches = 2  # the next two scans answer without the erasure's append
        return await real_delete(*args, **kwargs)

    monkeypatch.setattr(lmdb_storage, "delete_erased", behind)

    async def body() -> None:
        writer, a, _ = await _writer_of_two(tmp_path / "w", server, marker, 3)
        subject = f"{STREAM}.{STORE}.log"

        def holding() -> list[int]:
            return [
                m.stream_seq
                for m in server.subject_messages(subject)
                if m.headers[H_KIND] == "record"
                and _record_holds(int(m.headers[H_SEQ]), m.data, marker)
            ]

        assert len(holding()) == 3
        report = await writer.erase_conversation(a, reason="a replica behind")
        assert server.lagging_fetches == 0, "the scans did not meet the replica behind"
        assert report.conversations == [a]
        assert holding() == [], "an erased record's message is still on the stream"
        await writer.close()

    asyncio.run(body())
