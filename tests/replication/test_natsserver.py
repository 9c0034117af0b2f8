"""Proof that the natsserver fixtures run real JetStream servers and clusters on loopback.

Each check is bounded in time: a single node, an R3 stream on 3 nodes, a crash of the stream
leader (the new leader takes ~4-9 s to be elected), loss of quorum with two of three nodes
down, recovery after restarting them, and no nats-server process outliving its fixture.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck, StreamConfig

from ..support.natsserver import (
    NatsCluster,
    NatsNode,
    find_nats_server,
    nats_cluster,  # noqa: F401 - fixture
    nats_pids,
    nats_server,  # noqa: F401 - fixture
    running_cluster,
    running_node,
)

# Directories of every server the fixtures started in this module; the last test checks them.
_started_dirs: list[str] = []

# Longest time a new stream leader may take after SIGKILL of the old one (raft election
# timeout is randomised 4-9 s in nats-server) plus margin.
ELECTION_BOUND = 20.0


async def _quiet(_e: Exception) -> None:
    """nats-py logs every reconnect failure with a traceback unless given an error_cb."""


async def connect(servers: list[str]) -> Client:
    """Client that fails over quickly between the given servers and keeps reconnecting."""
    return await nats.connect(
        servers=servers,
        connect_timeout=1,
        reconnect_time_wait=0.1,
        max_reconnect_attempts=-1,
        error_cb=_quiet,
    )


async def publish_eventually(
    js: JetStreamContext, subject: str, within: float, msg_id: str | None = None
) -> tuple[PubAck, float]:
    """Publish until acked (same Nats-Msg-Id every try, so a retry cannot duplicate)."""
    msg_id = msg_id or uuid.uuid4().hex
    t0 = time.monotonic()
    last: Exception | None = None
    while time.monotonic() - t0 < within:
        try:
            ack = await js.publish(
                subject, msg_id.encode(), timeout=1.0, headers={"Nats-Msg-Id": msg_id}
            )
            return ack, time.monotonic() - t0
        except nats.errors.Error as e:
            last = e
            await asyncio.sleep(0.05)
    raise AssertionError(f"publish not acked within {within}s; last error {last!r}")


@pytest.fixture
async def cluster_js(
    nats_cluster: NatsCluster,
) -> AsyncIterator[tuple[NatsCluster, JetStreamContext]]:
    """The 3-node cluster with a connected client (all URLs) and an R3 stream "S" on "s.>"."""
    _started_dirs.append(str(nats_cluster.dir))
    nc = await connect(nats_cluster.url_list)
    js = nc.jetstream(timeout=5)
    await js.add_stream(StreamConfig(name="S", subjects=["s.>"], num_replicas=3))
    try:
        yield nats_cluster, js
    finally:
        await nc.close()


def test_binary_is_the_venv_one() -> None:
    assert find_nats_server().endswith("nats-server")


@pytest.mark.slow
async def test_single_node_jetstream_publish(nats_server: NatsNode) -> None:
    _started_dirs.append(str(nats_server.dir))
    assert nats_server.url.startswith("nats://127.0.0.1:")
    nc = await connect([nats_server.url])
    try:
        js = nc.jetstream(timeout=5)
        await js.add_stream(StreamConfig(name="ONE", subjects=["one.>"]))
        ack = await js.publish("one.a", b"hello")
        assert (ack.stream, ack.seq) == ("ONE", 1)

        # restart (crash) keeps port and store dir: the client reconnects and the data is there
        nats_server.restart(graceful=False)
        ack2, _ = await publish_eventually(js, "one.b", within=10)
        assert ack2.seq == 2
        assert (await js.stream_info("ONE")).state.messages == 2

        # a paused (SIGSTOPped) server does not answer; resumed it does
        nats_server.pause()
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish("one.c", b"x", timeout=0.5)
        nats_server.resume()
        ack3, _ = await publish_eventually(js, "one.d", within=10)
        assert ack3.seq >= 3
    finally:
        await nc.close()


@pytest.mark.cluster
async def test_cluster_serves_r3_stream(cluster_js: tuple[NatsCluster, JetStreamContext]) -> None:
    cluster, js = cluster_js
    assert cluster.urls == ",".join(cluster.url_list)
    assert all(u.startswith("nats://127.0.0.1:") for u in cluster.url_list)
    assert cluster.startup_seconds is not None and cluster.startup_seconds < 10
    ack = await js.publish("s.a", b"x")
    assert (ack.stream, ack.seq) == ("S", 1)
    info = await js.stream_info("S")
    assert info.config.num_replicas == 3
    assert info.cluster is not None and info.cluster.leader in {"n0", "n1", "n2"}
    assert len(info.cluster.replicas or []) == 2


@pytest.mark.cluster
async def test_cluster_kill_one_then_two_then_restart(
    cluster_js: tuple[NatsCluster, JetStreamContext],
) -> None:
    cluster, js = cluster_js
    acked: dict[int, str] = {}
    ack, _ = await publish_eventually(js, "s.a", within=5)
    acked[ack.seq] = "before"

    # 1. crash the stream leader: a follower takes over, publishes succeed again
    info = await js.stream_info("S")
    assert info.cluster is not None and info.cluster.leader
    first = cluster.index_of(info.cluster.leader)
    cluster.kill(first)
    assert not cluster.node(first).running
    ack, took = await publish_eventually(js, "s.b", within=ELECTION_BOUND)
    acked[ack.seq] = "after one kill"
    print(f"publish ok {took:.2f}s after killing stream leader n{first}")

    # 2. crash the new leader too: one of three left, no quorum, every publish fails fast
    info = await js.stream_info("S")
    assert info.cluster is not None and info.cluster.leader
    second = cluster.index_of(info.cluster.leader)
    assert second != first
    cluster.kill(second)
    errors: set[str] = set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3.0:
        t1 = time.monotonic()
        with pytest.raises((nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)) as ei:
            await js.publish("s.c", b"no quorum", timeout=1.0)
        assert time.monotonic() - t1 < 2.0
        errors.add(type(ei.value).__name__)
        await asyncio.sleep(0.1)
    print(f"with 2/3 down publishes failed with {sorted(errors)}")

    # 3. restart both: quorum is back, publishes succeed, nothing acked was lost
    cluster.restart(first)
    cluster.restart(second)
    ack, took = await publish_eventually(js, "s.d", within=ELECTION_BOUND)
    acked[ack.seq] = "after restart"
    print(f"publish ok {took:.2f}s after restarting n{first}, n{second}")
    cluster.wait_ready(timeout=ELECTION_BOUND)
    state = (await js.stream_info("S")).state
    assert state.messages == len(acked), (state, acked)
    for seq in acked:
        assert (await js.get_msg("S", seq)).seq == seq


@pytest.mark.cluster
def test_context_manager_cleans_up_on_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with running_cluster(tmp_path / "c", 3) as cluster:
            assert len(nats_pids(str(tmp_path))) == 3
            assert all(n.running for n in cluster.nodes)
            raise RuntimeError("boom")
    assert nats_pids(str(tmp_path)) == []

    with NatsCluster(size=1) as single:  # own temp dir, removed on exit
        own = single.dir
        assert nats_pids(str(own)) != []
    assert nats_pids(str(own)) == []
    assert not own.exists()


@pytest.mark.cluster
def test_zz_no_server_left_after_fixtures(tmp_path: Path) -> None:
    """Every server the fixtures start (``nats_server`` and ``nats_cluster`` are these context
    managers) is gone after their teardown, and so is every server the tests of this module that
    ran before it in this process started (under pytest-xdist, others may run in another worker)."""

    with running_node(tmp_path / "node") as node:
        assert nats_pids(str(node.dir)) != []
    with running_cluster(tmp_path / "cluster", 3) as cluster:
        assert len(nats_pids(str(cluster.dir))) == 3
    for d in [str(node.dir), str(cluster.dir), *_started_dirs]:
        assert nats_pids(d) == [], d
