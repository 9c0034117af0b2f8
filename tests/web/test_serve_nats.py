"""``serve --nats URL --stream S``: /healthz and /metrics read the stream that carries the store's
log too (a real nats-server on 127.0.0.1), and call a store that fell behind it stale."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from tests.support.audit_writer_child import batch
from tests.support.natsserver import NatsNode, running_node
from tests.support.served import get, serve

STREAM = "WEB"


async def _commit(path: Path, url: str, numbers: range) -> None:
    storage = await LmdbStorage.open(path, durability="replicated", nats=url, stream=STREAM)
    try:
        for n in numbers:
            await storage.commit(batch(n), CTX)
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsNode]:
    with running_node(tmp_path_factory.mktemp("nats")) as node:
        yield node


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^pi_durable_lmdb_{name} (\S+)$", text, re.M)
    assert found, (name, text)
    return float(found.group(1))


def test_a_store_behind_its_stream_is_stale_and_its_lag_is_measured(
    nats: NatsNode, tmp_path: Path
) -> None:
    writer, behind = tmp_path / "writer", tmp_path / "behind"
    asyncio.run(_commit(writer, nats.url, range(3)))
    shutil.copytree(writer, behind)  # a copy that stops at sequence 3 (the writer is closed)
    asyncio.run(_commit(writer, nats.url, range(3, 8)))

    with serve(writer, "--nats", nats.url, "--stream", STREAM) as served:
        status, body, _ = get(served.url + "/healthz")
        assert status == 200, body
        assert json.loads(body)["stream"] == {"headSeq": 8, "lagRecords": 0}
        metrics = get(served.url + "/metrics")[1]
        assert (
            _metric(metrics, "stream_up") == 1 and _metric(metrics, "replication_lag_records") == 0
        )
        assert _metric(metrics, "stream_head_seq") == 8

    with serve(behind, "--nats", nats.url, "--stream", STREAM, "--max-lag", "2") as served:
        status, body, _ = get(served.url + "/healthz")
        assert status == 503, body
        found = json.loads(body)
        assert found["status"] == "stale" and found["stream"] == {"headSeq": 8, "lagRecords": 5}
        assert "5 records behind stream 'WEB'" in found["reason"]
        assert _metric(get(served.url + "/metrics")[1], "replication_lag_records") == 5

    with serve(behind, "--nats", nats.url, "--stream", STREAM, "--max-lag", "5") as served:
        assert get(served.url + "/healthz")[0] == 200  # within the lag it is allowed


def test_healthz_says_503_when_the_stream_cannot_be_read(nats: NatsNode, tmp_path: Path) -> None:
    store = tmp_path / "store"
    asyncio.run(_commit(store, nats.url, range(1)))
    with serve(store, "--nats", nats.url, "--stream", "NOSUCH") as served:
        status, body, _ = get(served.url + "/healthz")
        assert status == 503 and "stream 'NOSUCH' cannot be read" in json.loads(body)["reason"], (
            body
        )
        assert _metric(get(served.url + "/metrics")[1], "stream_up") == 0
