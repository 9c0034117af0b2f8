"""``durable-log`` against a real NATS JetStream server: store ids and replication positions in
``stats``, ``restore`` of a store from its stream alone (to its end or to a sequence), ``tail`` of a
stream with no local store, the ``replica`` command kept running and stopped by SIGTERM, and the
refusals (unreachable servers, a missing stream, a store the stream does not carry, a non-empty
target) that exit 2 with a message and leave nothing behind.

One nats-server (``tests/support/natsserver.py``) serves the whole module on a free 127.0.0.1 port and is
stopped at its end; every subprocess runs under a timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, NotWriterError, StoreDamagedError

from ..support.natsserver import NatsNode, running_node
from ..support.polling import until

DURABLE_LOG = [sys.executable, "-m", "pi_durable_lmdb.cli"]
STREAM = "CLI"
T0 = 1_767_225_600_000
MINUTE = 60_000

DOC = {"id": 6, "kind": "notes", "scope": {"kind": "conversation", "conversationId": 1}}
BATCHES: list[list[dict[str, Any]]] = [
    [{"type": "conversation", "value": {"id": 1}}, {"type": "conversation", "value": {"id": 2}}],
    [
        {
            "type": "entry",
            "value": {
                "id": 3,
                "conversationId": 1,
                "kind": "m",
                "data": {"lone": "x\ud800", "huge": 10**30},
            },
        }
    ],
    [{"type": "entry", "value": {"id": 4, "conversationId": 2, "kind": "m", "data": "other"}}],
    [{"type": "entry", "value": {"id": 5, "conversationId": 1, "kind": "m", "data": "again"}}],
    [
        {
            "type": "document.create",
            "record": DOC,
            "content": {"kind": "base", "version": 1, "value": {"n": 0}},
        }
    ],
    [
        {
            "type": "document.change",
            "id": 6,
            "content": {"kind": "delta", "version": 1, "ops": [["s", ["n"], 1]]},
        }
    ],
    [{"type": "entry", "value": {"id": 7, "conversationId": 2, "kind": "m", "data": "late"}}],
]
"""Commit n + 1 is BATCHES[n], committed at T0 + n minutes."""


def run(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DURABLE_LOG, *map(str, args)],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=timeout,
    )


def ok(*args: object) -> str:
    done = run(*args)
    assert done.returncode == 0, (args, done.returncode, done.stderr)
    return done.stdout


def refused(*args: object) -> str:
    """``durable-log ARGS`` must exit 2 with one message and nothing on stdout; its stderr."""

    done = run(*args)
    assert done.returncode == 2, (args, done.returncode, done.stdout, done.stderr)
    assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    return done.stderr


async def write_store(
    path: Path, url: str, batches: list[list[dict[str, Any]]], start: int = 0
) -> str:
    """Commit ``batches`` to a replicated store at ``path`` (made when missing); its store id."""

    storage = await LmdbStorage.open(path, durability="replicated", nats=url, stream=STREAM)
    try:
        for n, writes in enumerate(batches, start):
            await storage.commit(writes, CTX, committed_at=T0 + n * MINUTE)
        assert storage.store_id is not None
        return storage.store_id
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsNode]:
    """One JetStream server for the module, stopped at its end."""

    with running_node(tmp_path_factory.mktemp("nats")) as node:
        yield node


@pytest.fixture(scope="module")
def writer(nats: NatsNode, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A replicated store holding BATCHES (closed), and its store id."""

    path = tmp_path_factory.mktemp("writer") / "store"
    return path, asyncio.run(write_store(path, nats.url, BATCHES))


@pytest.fixture(scope="module")
def other(
    nats: NatsNode, writer: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str]:
    """A second store on the same stream, committed after the first."""

    path = tmp_path_factory.mktemp("other") / "store"
    return path, asyncio.run(write_store(path, nats.url, BATCHES[:2]))


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ── stats ─────────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_stats_carries_the_store_id_and_the_replication_position(
    writer: tuple[Path, str], tmp_path: Path
) -> None:
    path, store = writer
    info = json.loads(ok("stats", path, "--json"))
    assert info["storeId"] == store
    assert info["replication"] == {
        "stream": STREAM,
        "streamSeq": info["replication"]["streamSeq"],
        "seq": len(BATCHES),
        "epoch": info["replication"]["epoch"],
    }
    assert info["replication"]["streamSeq"] >= len(BATCHES)
    text = ok("stats", path)
    assert f"store id         {store}" in text
    assert (
        f"replication      stream {STREAM}: log sequence {len(BATCHES)} at stream message" in text
    )

    async def local() -> str:
        storage = await LmdbStorage.open(tmp_path / "local", durability="process")
        try:
            await storage.commit(BATCHES[0], CTX)
            return str(storage.store_id)
        finally:
            await storage.close()

    local_id = asyncio.run(local())
    info = json.loads(ok("stats", tmp_path / "local", "--json"))
    assert info["storeId"] == local_id and "replication" not in info  # never linked to a stream
    assert "replication" not in ok("stats", tmp_path / "local")

    # a store made before store ids: a read-only open sees none, its next writer assigns one
    from pi_durable_lmdb.log.environment import _HEADER_KEY, Environment
    from pi_durable_lmdb.log.storeid import StoreHeader, encode_header

    env = Environment(tmp_path / "local", durability="process")
    try:
        meta = env.db("meta")
        env.write(lambda txn: txn.put(_HEADER_KEY, encode_header(StoreHeader(1, T0)), db=meta))
    finally:
        env.close()
    assert json.loads(ok("stats", tmp_path / "local", "--json"))["storeId"] is None
    assert "store id         - (its next writer assigns one)" in ok("stats", tmp_path / "local")

    async def reopen() -> None:
        await (await LmdbStorage.open(tmp_path / "local", durability="process")).close()

    asyncio.run(reopen())
    assert json.loads(ok("stats", tmp_path / "local", "--json"))["storeId"] not in (None, local_id)


# ── restore ───────────────────────────────────────────────────────────────────


@pytest.mark.slow
def test_restore_builds_the_store_from_the_stream_alone(
    nats: NatsNode, writer: tuple[Path, str], tmp_path: Path
) -> None:
    path, store = writer
    out = ok(
        "restore", "--nats", nats.url, "--stream", STREAM, "--store", store, tmp_path / "restored"
    )
    assert f"restored store {store} from stream {STREAM}: {len(BATCHES)} log records" in out
    assert ok("export", tmp_path / "restored") == ok("export", path)
    info = json.loads(ok("stats", tmp_path / "restored", "--json"))
    assert info["storeId"] == store and info["replication"]["seq"] == len(BATCHES)
    assert "the projections match the log" in ok("verify", tmp_path / "restored")
    assert sorted(os.listdir(tmp_path)) == ["restored"], "no temporary directory is left"


@pytest.mark.slow
def test_restore_to_a_sequence_with_progress(
    nats: NatsNode, writer: tuple[Path, str], tmp_path: Path
) -> None:
    path, store = writer
    # a list of URLs, one of them dead, is taken where one is
    urls = f"nats://127.0.0.1:{unused_port()},{nats.url}"
    done = run(
        "restore",
        "--nats",
        urls,
        "--stream",
        STREAM,
        "--store",
        store,
        tmp_path / "at3",
        "--to",
        3,
        "--progress",
    )
    assert done.returncode == 0, done.stderr
    assert "restore: 3/3 records" in done.stderr
    assert ok("export", tmp_path / "at3") == ok("export", path, "--to", 3)
    stderr = refused(
        "restore",
        "--nats",
        nats.url,
        "--stream",
        STREAM,
        "--store",
        store,
        tmp_path / "beyond",
        "--to",
        99,
    )
    assert f"up to {len(BATCHES)}, not 99" in stderr
    assert sorted(os.listdir(tmp_path)) == ["at3"]


@pytest.mark.slow
def test_restore_to_a_time(nats: NatsNode, writer: tuple[Path, str], tmp_path: Path) -> None:
    """``--to TIME`` ends at the last record committed at or before it (commit n at minute n-1)."""

    path, store = writer
    base = ("restore", "--nats", nats.url, "--stream", STREAM, "--store", store)
    out = ok(*base, tmp_path / "at3", "--to", "2026-01-01T00:02:30Z")
    assert "3 log records, up to sequence 3" in out
    assert ok("export", tmp_path / "at3") == ok("export", path, "--to", 3)
    ok(*base, tmp_path / "exact", "--to", "2026-01-01T00:03:00+00:00")  # at a commit's time: kept
    assert ok("export", tmp_path / "exact") == ok("export", path, "--to", 4)
    stderr = refused(*base, tmp_path / "before", "--to", "2025-12-31")
    assert "committed at or before 2025-12-31T00:00:00.000Z" in stderr
    for bad, says in (("0", "is not a log sequence"), ("yesterday", "nor a time (ISO 8601")):
        stderr = refused(*base, tmp_path / "bad", "--to", bad)
        assert "argument --to" in stderr and says in stderr, stderr
    assert sorted(os.listdir(tmp_path)) == ["at3", "exact"], "a refusal leaves nothing"


@pytest.mark.slow
def test_restore_refusals_are_named_and_leave_nothing(
    nats: NatsNode, writer: tuple[Path, str], tmp_path: Path
) -> None:
    _path, store = writer
    target = tmp_path / "new"
    stderr = refused(
        "restore",
        "--nats",
        f"127.0.0.1:{unused_port()}",
        "--stream",
        STREAM,
        "--store",
        store,
        target,
    )
    assert "No NATS server answered at nats://127.0.0.1:" in stderr
    stderr = refused("restore", "--nats", nats.url, "--stream", "NOSUCH", "--store", store, target)
    assert "NATS has no stream 'NOSUCH'" in stderr
    stderr = refused("restore", "--nats", nats.url, "--stream", STREAM, "--store", "nobody", target)
    assert f"Stream {STREAM!r} holds no messages of store nobody" in stderr
    stderr = refused("restore", "--nats", nats.url, "--stream", STREAM, "--store", "a.b", target)
    assert "A store id is" in stderr
    assert sorted(os.listdir(tmp_path)) == []
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    stderr = refused(
        "restore", "--nats", nats.url, "--stream", STREAM, "--store", store, tmp_path / "full"
    )
    assert (
        f"{tmp_path / 'full'} is not empty (it holds keep.txt); restore only into a new store"
        in stderr
    )
    assert sorted(os.listdir(tmp_path)) == ["full"] and os.listdir(tmp_path / "full") == [
        "keep.txt"
    ]
    (tmp_path / "empty").mkdir()  # an empty directory is taken, as import takes one
    ok(
        "restore",
        "--nats",
        nats.url,
        "--stream",
        STREAM,
        "--store",
        store,
        tmp_path / "empty",
        "--to",
        1,
    )


# ── tail of a stream ──────────────────────────────────────────────────────────


@pytest.mark.slow
def test_tail_of_one_store_reads_as_the_local_tail(
    nats: NatsNode, writer: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cli_call import call

    def in_process(*args: object) -> str:
        """The command's entry point in this process: the first case and the last check run as processes."""

        code, out, err = call(capsys, *args)
        assert code == 0, (args, code, err)
        return out

    path, store = writer
    remote = ["tail", "--nats", nats.url, "--stream", STREAM, "--store", store]
    for n, options in enumerate(
        (
            [],  # the last 10
            ["--json", "--from", "1"],
            ["--limit", "2"],
            ["--json", "--conversation", "1"],  # the document's change is placed by its create
            ["--conversation", "2"],
            ["--type", "document.change", "--type", "document.create", "--json"],
            ["--from", "3", "--type", "entry"],
            ["--since", "2026-01-01T00:02:00Z", "--until", "2026-01-01T00:04:00Z", "--json"],
        )
    ):
        tail = ok if n == 0 else in_process
        assert tail(*remote, *options) == tail("tail", path, *options), options
    lines = [json.loads(line) for line in ok(*remote, "--json", "--conversation", "1").splitlines()]
    assert [line["seq"] for line in lines] == [1, 2, 4, 5, 6]
    assert lines[1]["writes"][0]["value"]["data"]["lone"] == "x\ud800"  # lossless, as the local one


def test_tail_of_every_store_names_each_store(
    nats: NatsNode, writer: tuple[Path, str], other: tuple[Path, str]
) -> None:
    (_, first), (_, second) = writer, other
    remote = ["tail", "--nats", nats.url, "--stream", STREAM]
    every = ok(*remote, "--json", "--from", "1").splitlines()
    lines = [
        line for line in map(json.loads, every) if line["store"] in (first, second)
    ]  # others' tests add stores
    assert [(line["store"], line["seq"]) for line in lines] == [
        *((first, seq) for seq in range(1, len(BATCHES) + 1)),
        (second, 1),
        (second, 2),
    ]
    text = [
        line
        for line in ok(*remote, "--conversation", "1", "--type", "entry").splitlines()
        if line.split()[0] in (first, second)
    ]
    assert [line.split()[:2] for line in text] == [[first, "2"], [first, "4"], [second, "2"]]
    assert "entry 3 in 1 (m)" in text[0]
    assert ok(*remote, "--json").splitlines() == every[-10:]  # like tail: the last 10 of the stream


def test_tail_follow_prints_new_commits_until_sigterm(nats: NatsNode, tmp_path: Path) -> None:
    path = tmp_path / "live"
    store = asyncio.run(write_store(path, nats.url, BATCHES[:1]))
    follower = subprocess.Popen(
        [
            *DURABLE_LOG,
            "tail",
            "--nats",
            nats.url,
            "--stream",
            STREAM,
            "--store",
            store,
            "--follow",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = _lines(follower)
    try:
        assert json.loads(_readline(lines, 20))["seq"] == 1
        asyncio.run(write_store(path, nats.url, BATCHES[1:3], start=1))
        assert [json.loads(_readline(lines, 20))["seq"] for _ in range(2)] == [2, 3]
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(20) == 0
    finally:
        _end(follower)


@pytest.mark.slow
def test_tail_of_a_stream_refusals(
    nats: NatsNode, writer: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.support.cli_call import call

    def refused_in_process(*args: object) -> str:
        """``refused`` through the entry point in this process (the first of the option sets below runs as a process)."""

        code, out, err = call(capsys, *args)
        assert code == 2, (args, code, out, err)
        assert out == "" and "Traceback" not in err, err
        return err

    path, store = writer
    assert "No NATS server answered" in refused(
        "tail", "--nats", f"127.0.0.1:{unused_port()}", "--stream", STREAM
    )
    assert "NATS has no stream 'NOSUCH'" in refused(
        "tail", "--nats", nats.url, "--stream", "NOSUCH"
    )
    assert "not both" in refused("tail", path, "--nats", nats.url, "--stream", STREAM)
    assert "--nats needs --stream" in refused("tail", "--nats", nats.url)
    assert "give --nats" in refused("tail", path, "--store", store)
    assert "needs a store's PATH" in refused("tail")
    for n, options in enumerate(
        ([], ["--json"], ["--from", "1"], ["--limit", "3"], ["--conversation", "1"])
    ):
        nothing = (refused if n == 0 else refused_in_process)(
            "tail", "--nats", nats.url, "--stream", STREAM, "--store", "nobody", *options
        )
        assert (
            f"stream {STREAM} holds nothing of store nobody (subject {STREAM}.nobody.log)"
            in nothing
        )


def test_tail_of_a_store_not_on_the_stream_yet_waits_with_follow(
    nats: NatsNode, tmp_path: Path
) -> None:
    store = "feedfacecafe0021"
    follower = subprocess.Popen(
        [
            *DURABLE_LOG,
            "tail",
            "--nats",
            nats.url,
            "--stream",
            STREAM,
            "--store",
            store,
            "--follow",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines, errors = _lines(follower), _lines(follower, stderr=True)
    try:
        assert "waiting for its first commit" in _readline(errors, 20)

        async def write() -> None:
            storage = await LmdbStorage.open(
                tmp_path / "late",
                durability="replicated",
                nats=nats.url,
                stream=STREAM,
                store=store,
            )
            try:
                await storage.commit(BATCHES[0], CTX, committed_at=T0)
            finally:
                await storage.close()

        asyncio.run(write())
        assert json.loads(_readline(lines, 20))["seq"] == 1
        follower.send_signal(signal.SIGTERM)
        assert follower.wait(20) == 0
    finally:
        _end(follower)


# ── the replica command ───────────────────────────────────────────────────────


@pytest.mark.slow
def test_replica_keeps_level_until_sigterm(nats: NatsNode, tmp_path: Path) -> None:
    source = tmp_path / "source"
    store = asyncio.run(write_store(source, nats.url, BATCHES[:3]))
    replica_path = tmp_path / "replica"
    replica = subprocess.Popen(
        [
            *DURABLE_LOG,
            "replica",
            replica_path,
            "--nats",
            nats.url,
            "--stream",
            STREAM,
            "--store",
            store,
            "--interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        until(
            lambda: _export_or_none(replica_path) == ok("export", source),
            timeout=20,
            what="replica equal to its source",
            interval=0.1,
        )
        asyncio.run(write_store(source, nats.url, BATCHES[3:], start=3))
        until(
            lambda: _export_or_none(replica_path) == ok("export", source),
            timeout=20,
            what="replica equal to its source",
            interval=0.1,
        )
        time.sleep(0.5)  # a status line or two at the new head
        replica.send_signal(signal.SIGTERM)
        _stdout, stderr = replica.communicate(timeout=20)
        assert replica.returncode == 0, stderr
    finally:
        _end(replica)
    assert f"following subject {STREAM}.{store}.log" in stderr
    assert (
        f"applied sequence {len(BATCHES)} (stream message" in stderr and "lag 0 records" in stderr
    )
    assert "stopping: applied sequence" in stderr
    for line in stderr.splitlines():  # never level below what the stream held from the start
        applied = re.search(r"applied sequence (\d+) .*lag 0 records", line)
        assert applied is None or int(applied.group(1)) >= 3, line
    assert ok("export", replica_path) == ok("export", source)
    assert json.loads(ok("stats", replica_path, "--json"))["storeId"] == store


@pytest.mark.slow
def test_replica_stops_on_a_refused_message_naming_it(nats: NatsNode, tmp_path: Path) -> None:
    async def forge() -> int:
        import nats as nats_client

        client = await nats_client.connect(nats.url)
        try:
            ack = await client.jetstream().publish(
                f"{STREAM}.forged.log", b"not a record", headers={"Pd-Format": "1"}
            )
            return int(ack.seq)
        finally:
            await client.close()

    asyncio.run(write_store(tmp_path / "any", nats.url, BATCHES[:1]))  # the stream exists
    stream_seq = asyncio.run(forge())
    done = run(
        "replica",
        tmp_path / "replica",
        "--nats",
        nats.url,
        "--stream",
        STREAM,
        "--store",
        "forged",
        "--interval",
        "0.2",
        timeout=30,
    )
    assert done.returncode == 1, done.stderr
    assert f"durable-log: damage: Message {stream_seq} of stream {STREAM} is refused" in done.stderr
    assert (
        json.loads(ok("stats", tmp_path / "replica", "--json"))["headSeq"] == 0
    )  # nothing of it applied
    assert "NATS has no stream 'NOSUCH'" in refused(
        "replica", tmp_path / "r2", "--nats", nats.url, "--stream", "NOSUCH", "--store", "forged"
    )
    assert f"Message {stream_seq} of stream {STREAM} is refused" in _fails_with_damage(
        "restore",
        "--nats",
        nats.url,
        "--stream",
        STREAM,
        "--store",
        "forged",
        tmp_path / "restored",
    )
    assert not (tmp_path / "restored").exists()


# ── helpers ───────────────────────────────────────────────────────────────────


def _fails_with_damage(*args: object) -> str:
    done = run(*args)
    assert done.returncode == 1, (args, done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stderr


def _lines(process: subprocess.Popen[str], stderr: bool = False) -> Any:
    """A queue the process's stdout (or stderr) lines arrive in (read by a thread: no buffering
    surprises, and a line that never comes is a timeout, not a hang)."""

    import queue
    import threading

    lines: queue.Queue[str] = queue.Queue()
    stream = process.stderr if stderr else process.stdout

    def read() -> None:
        assert stream is not None
        for line in stream:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _readline(lines: Any, timeout: float) -> str:
    import queue

    try:
        return str(lines.get(timeout=timeout))
    except queue.Empty:
        raise AssertionError(f"no line in {timeout} s") from None


def _export_or_none(path: Path) -> str | None:
    done = run("export", path)
    return done.stdout if done.returncode == 0 else None


def _end(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


# ── promote and the lease ─────────────────────────────────────────────────────


@pytest.mark.slow
def test_promote_waits_for_a_live_writer_or_fences_it_out_with_force(
    nats: NatsNode, tmp_path: Path
) -> None:
    async def scenario() -> None:
        source = tmp_path / "source"
        writer = await LmdbStorage.open(
            source, durability="replicated", nats=nats.url, stream=STREAM, lease_ttl=2
        )
        try:
            for n, writes in enumerate(BATCHES[:3]):
                await writer.commit(writes, CTX, committed_at=T0 + n * MINUTE)
            store = writer.store_id
            assert store is not None
            epoch = writer.replication.epoch  # type: ignore[union-attr]
            copy = tmp_path / "copy"
            replica = await LmdbStorage.open_replica(
                copy, nats=nats.url, stream=STREAM, store=store
            )
            await replica.wait(3, timeout=10)
            await replica.close()
            lease = json.loads(
                await asyncio.to_thread(
                    ok, "stats", source, "--json", "--nats", nats.url, "--stream", STREAM
                )
            )["lease"]
            assert lease["epoch"] >= epoch and str(source) in lease["holder"]
            # The writer renews its lease: a plain promote waits, then gives up naming the holder.
            message = await asyncio.to_thread(
                refused, "promote", copy, "--nats", nats.url, "--stream", STREAM
            )
            assert "keeps renewing its lease" in message and str(source) in message
            await writer.commit(BATCHES[3], CTX, committed_at=T0 + 3 * MINUTE)  # still the writer
            promoted = await asyncio.to_thread(
                ok, "promote", copy, "--nats", nats.url, "--stream", STREAM, "--force"
            )
            promoted_epoch = int(promoted.split("writer epoch ")[1].split(",")[0])
            assert (
                f"store {store}, writer epoch {promoted_epoch}, head sequence 4" in promoted
                and promoted_epoch > epoch
            )
            # deposed: its next append finds the subject moved, or its lease renewal found the fence first
            with pytest.raises(NotWriterError, match=r"another writer|was taken over"):
                await writer.commit(BATCHES[4], CTX)
            # The promoted copy writes at once (the lease was released), continuing the history.
            successor = await LmdbStorage.open(
                copy, durability="replicated", nats=nats.url, stream=STREAM
            )
            try:
                assert await successor.commit(BATCHES[4], CTX, committed_at=T0 + 4 * MINUTE) == 5
            finally:
                await successor.close()
            await writer.wait(5, timeout=10)  # the deposed writer follows as a replica
        finally:
            await writer.close()
        assert ok("export", source) == ok("export", tmp_path / "copy")

    asyncio.run(scenario())


# ── the local store of a replicated writer after an OS crash ──────────────────


@pytest.mark.slow
def test_a_replicated_store_refused_after_an_os_crash_is_restored_whole_from_the_stream(
    nats: NatsNode, tmp_path: Path
) -> None:
    """A replicated writer syncs no local commit (the stream is the durable copy): a writer killed
    while open leaves its ``process.unsynced`` marker; from an earlier boot (an OS crash) the store
    is refused, naming the restore from the stream, which gives back every acknowledged commit."""

    source = tmp_path / "source"
    child = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(source), nats.url, STREAM],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    store, acknowledged = child.stdout.split()
    assert (source / "process.unsynced").exists()  # a replicated writer's local store is unsynced
    (source / "process.unsynced").write_bytes(
        b"00000000-0000-0000-0000-000000000000\n"
    )  # an earlier boot's
    with pytest.raises(StoreDamagedError) as caught:
        asyncio.run(LmdbStorage.open(source, durability="replicated", nats=nats.url, stream=STREAM))
    assert f"Every commit it acknowledged is on stream {STREAM!r}" in str(caught.value)
    assert "durable-log restore" in str(caught.value)
    restored = tmp_path / "restored"
    ok("restore", "--nats", nats.url, "--stream", STREAM, "--store", store, restored)
    assert json.loads(ok("stats", restored, "--json"))["headSeq"] >= int(acknowledged)
    assert ok("export", restored).count("\n") >= int(acknowledged)


KILLED_WRITER = """
import asyncio, os, signal, sys
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

async def main():
    storage = await LmdbStorage.open(sys.argv[1], durability="replicated", nats=sys.argv[2], stream=sys.argv[3])
    for id in range(1, 51):
        seq = await storage.commit([{"type": "conversation", "value": {"id": id}}], CTX)
    print(storage.store_id, seq, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""
