"""Signed checkpoints witnessed on NATS JetStream (``audit.witness``), against a real nats-server:
a checkpoint published only if the store's tree extends the last one in the bucket, and the
refusals that make a forked or rewritten history show up as a refused write and a logged error,
through the Python API and ``durable-log checkpoint --publish``. (The bucket's compare-and-set
itself is the key-value contract's: ``tests/replication/contract/test_keys.py``.)

One nats-server (``tests/support/natsserver.py``) serves the whole module on 127.0.0.1; each test
uses a stream name of its own, so buckets never mix.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import CheckpointRefusedError, LmdbStorage, tlog
from pi_durable_lmdb.audit.witness import BUCKET, publish, publish_checkpoint
from pi_durable_lmdb.log.stream.jetstream import JetStreamLink
from pi_durable_lmdb.log.stream.memory import MemoryKeys, MemoryLink, MemoryStream

from ..support.natsserver import NatsNode, running_node

T0 = 1_767_225_600_000
ORIGIN = "audit.example.com/orders"


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsNode]:
    with running_node(tmp_path_factory.mktemp("nats")) as node:
        yield node


async def make_store(path: Path, ids: list[int]) -> None:
    """A store whose record n is a conversation ``ids[n]`` committed at T0 + n: two stores made
    from lists with a common prefix share that prefix's tree."""

    storage = await LmdbStorage.open(path, durability="process")
    try:
        for n, conversation in enumerate(ids):
            if n >= storage.log.head():
                await storage.commit(
                    [{"type": "conversation", "value": {"id": conversation}}],
                    CTX,
                    committed_at=T0 + n,
                )
    finally:
        await storage.close()


async def connected(url: str, stream: str) -> JetStreamLink:
    link = JetStreamLink(url, stream)
    await link.arun(link.connect())
    return link


async def test_publishing_follows_the_log_and_refuses_a_fork(
    nats: NatsNode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signer = tlog.generate_signer(ORIGIN)
    writer, fork = tmp_path / "writer", tmp_path / "fork"
    await make_store(writer, [1, 2, 3, 4, 5])
    await make_store(
        fork, [1, 2, 3, 40, 50, 60]
    )  # the same first three records, then another history
    link = await connected(nats.url, "WITNESS")
    try:
        storage = await LmdbStorage.open(writer, durability="process")
        try:
            first = await publish(storage.log, signer, link)
            assert (
                first.bucket,
                first.key,
                first.tree_size,
                first.previous_size,
                first.published,
            ) == ("WITNESS-checkpoints", ORIGIN, 5, None, True)
            assert tlog.verify_checkpoint(first.note, signer.verifier()).root == storage.log.root()
            again = await publish(storage.log, signer, link)
            assert (again.revision, again.published) == (first.revision, False)
            await storage.commit(
                [{"type": "conversation", "value": {"id": 6}}], CTX, committed_at=T0 + 5
            )
            later = await publish(storage.log, signer, link)
            assert (later.tree_size, later.previous_size, later.published) == (6, 5, True)
            assert later.revision > first.revision
        finally:
            await storage.close()

        stored = await link.arun(link.keys.kv_get(BUCKET, ORIGIN))
        assert stored == (later.note.encode(), later.revision)
        caplog.set_level(logging.ERROR, logger="pi_durable_lmdb.audit.witness")
        storage = await LmdbStorage.open(fork, durability="process")
        try:
            with pytest.raises(
                CheckpointRefusedError,
                match="does not extend the last checkpoint in WITNESS-checkpoints",
            ) as refused:
                await publish(storage.log, signer, link)
            assert "forked" in str(refused.value)
            with pytest.raises(CheckpointRefusedError, match="covers 6 records, this one 3"):
                await publish(
                    storage.log, signer, link, size=3
                )  # a prefix, yet smaller than witnessed
            other = tlog.generate_signer(ORIGIN)  # the same name, another key
            with pytest.raises(
                CheckpointRefusedError, match=f"is not a checkpoint of {ORIGIN} signed by {ORIGIN}"
            ):
                await publish(storage.log, other, link)
        finally:
            await storage.close()
        assert (
            await link.arun(link.keys.kv_get(BUCKET, ORIGIN)) == stored
        )  # every refusal wrote nothing
        errors = [
            record.getMessage() for record in caplog.records if record.levelno == logging.ERROR
        ]
        assert len(errors) == 3 and all(
            message.startswith("refused to publish a checkpoint: ") for message in errors
        )
    finally:
        await asyncio.to_thread(link.close)


async def test_a_publisher_that_lost_the_race_checks_the_winners_checkpoint(tmp_path: Path) -> None:
    """Between this publisher's read and its put another one moves the key: the put is refused,
    and the checkpoint read again is checked before this one goes in."""

    signer = tlog.generate_signer(ORIGIN)
    await make_store(tmp_path / "a", [1, 2, 3])
    await make_store(tmp_path / "b", [1, 2, 3, 4])
    await make_store(tmp_path / "fork", [1, 2, 9, 10])
    server = MemoryStream("RACE")

    class Raced(MemoryKeys):
        """A key-value whose first put finds the key moved: ``then`` publishes before it."""

        def __init__(self, then: Path) -> None:
            super().__init__(server)
            self.then: Path | None = then

        async def kv_put(self, bucket: str, key: str, value: bytes, revision: int) -> int | None:
            if self.then is not None:
                then, self.then = self.then, None
                await asyncio.to_thread(publish_memory, then)
            return await super().kv_put(bucket, key, value, revision)

    def publish_memory(path: Path) -> None:
        async def run() -> None:
            storage = await LmdbStorage.open(path, durability="process")
            link = MemoryLink(server)
            try:
                await publish(storage.log, signer, link)
            finally:
                await storage.close()
                await asyncio.to_thread(link.close)

        asyncio.run(run())

    for racer, expected in (("a", "published"), ("fork", "refused")):
        server.buckets.clear()
        link = MemoryLink(server)
        link.keys = Raced(tmp_path / racer)
        storage = await LmdbStorage.open(tmp_path / "b", durability="process")
        try:
            if expected == "published":
                done = await publish(storage.log, signer, link)
                assert (done.tree_size, done.previous_size, done.published) == (4, 3, True)
            else:  # the winner forked at record 3: the loser's store does not extend it
                with pytest.raises(CheckpointRefusedError, match="does not extend"):
                    await publish(storage.log, signer, link)
        finally:
            await storage.close()
            await asyncio.to_thread(link.close)


def durable_log(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_checkpoint_publish_on_the_command_line(nats: NatsNode, tmp_path: Path) -> None:
    key = tmp_path / "orders.key"
    assert durable_log("keygen", ORIGIN, "--out", key).returncode == 0
    await make_store(tmp_path / "writer", [1, 2, 3])
    await make_store(tmp_path / "fork", [1, 7, 8, 11])
    publishing = ("--key", key, "--nats", nats.url, "--stream", "CLIWITNESS", "--publish")

    done = await asyncio.to_thread(durable_log, "checkpoint", tmp_path / "writer", *publishing)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{ORIGIN}\n3\n")
    assert f"published: CLIWITNESS-checkpoints key {ORIGIN} revision" in done.stderr

    refused = await asyncio.to_thread(durable_log, "checkpoint", tmp_path / "fork", *publishing)
    assert refused.returncode == 1 and refused.stdout == ""
    assert "Refused to publish the checkpoint: the store's log does not extend" in refused.stderr
    assert "Traceback" not in refused.stderr

    usage = await asyncio.to_thread(
        durable_log, "checkpoint", tmp_path / "writer", "--key", key, "--publish"
    )
    assert usage.returncode == 2 and "--publish goes with --nats URL and --stream S" in usage.stderr

    signer = tlog.parse_signer(key.read_text().strip())
    same = await asyncio.to_thread(
        publish_checkpoint, tmp_path / "writer", signer, nats.url, "CLIWITNESS"
    )
    assert (same.tree_size, same.published) == (3, False)
