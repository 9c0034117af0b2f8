"""Batches too big for the stream, in every mode.

With ``nats=`` in ``power`` or ``process`` mode a batch over the server's ``max_payload`` used to
be acknowledged locally; the shipper then failed on it forever (``lastError`` set, ``stopped``
False) and neither it nor any later batch reached the stream. The rule now, in every mode: a batch
the store acknowledges reaches the stream, or it is refused before it is acknowledged. A shipper
that still meets a record it can never publish (written before the store had a stream, or while
the server took bigger messages) stops and says so: ``status()``, a log line at ERROR under
``pi_durable_lmdb``, and ``durable-log stats``. Tested against a server started with a small
``max_payload``."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, ReplicationError

from ..support.natsserver import NatsNode

LIMIT = 64 * 1024


@pytest.fixture
def small(tmp_path: Path) -> Iterator[NatsNode]:
    node = NatsNode(tmp_path / "nats", max_payload=LIMIT)
    try:
        node.start()
        yield node
    finally:
        node.stop()


def entry(id: int, size: int) -> list[dict[str, object]]:
    """An entry of about ``size`` bytes that compression cannot shrink much (the log stores batches
    compressed since format 2 (zstd frames since format 3): a run of one letter would fit any stream)."""

    text = base64.b85encode(os.urandom(size))[:size].decode()
    return [
        {"type": "entry", "value": {"id": id, "conversationId": 1, "kind": "message", "text": text}}
    ]


@pytest.mark.parametrize("durability", ["power", "process", "replicated"])
async def test_a_batch_the_stream_cannot_take_is_refused_before_it_is_acknowledged(
    tmp_path: Path, small: NatsNode, durability: str
) -> None:
    storage = await LmdbStorage.open(
        tmp_path / "store", durability=durability, nats=small.url, stream="SMALL"
    )  # type: ignore[arg-type]
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        head = storage.log.head()
        with pytest.raises(ReplicationError, match=f"at most {LIMIT} bytes"):
            await storage.commit(entry(2, LIMIT), CTX)
        assert storage.log.head() == head and await storage.entry(2, CTX) is None, (
            "nothing of it was committed"
        )
        seq = await storage.commit(
            entry(3, LIMIT // 4), CTX
        )  # later batches go on, and reach the stream
        if durability != "replicated":
            assert await storage._link.arun(storage.replication.drain(10)), (
                storage.replication.status()
            )  # type: ignore[union-attr]
            status = storage.replication.status()  # type: ignore[union-attr]
            assert status.shipped_seq == seq and not status.stopped, status
    finally:
        await storage.close()


async def test_a_shipper_that_meets_a_record_it_can_never_publish_stops_and_says_so(
    tmp_path: Path, small: NatsNode, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store"
    local = await LmdbStorage.open(path, durability="process")  # written before it had a stream
    await local.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    await local.commit(entry(2, 2 * LIMIT), CTX)  # too big for the stream even compressed
    await local.close()
    caplog.set_level(logging.ERROR, logger="pi_durable_lmdb")
    storage = await LmdbStorage.open(path, durability="process", nats=small.url, stream="SMALL")
    try:
        shipper = storage.replication
        for _ in range(200):
            if shipper.status().stopped:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
        status = shipper.status()  # type: ignore[union-attr]
        assert (
            status.stopped is True
            and "record 2" in status.last_error
            and "max_payload" in status.last_error
        ), status
        assert status.shipped_seq == 1, "the record before it was shipped"
        assert any(
            r.levelno == logging.ERROR and "stopped" in r.getMessage() for r in caplog.records
        ), caplog.records
        done = subprocess.run(
            [sys.executable, "-m", "pi_durable_lmdb.cli", "stats", str(path), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        shown = json.loads(done.stdout)["shipping"]
        assert shown["stopped"] is True and "record 2" in shown["reason"]
        text = subprocess.run(
            [sys.executable, "-m", "pi_durable_lmdb.cli", "stats", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "shipping         STOPPED" in text.stdout, text.stdout
    finally:
        await storage.close()
