"""Failover (issue #15): one writer at a time across machines, with a lease, fencing and promotion.

Real processes and real servers: a 3-node JetStream cluster (``tests/support/natsserver.py``), the stream
and the lease bucket at R3, writers in child processes (``tests/support/failover_child.py``) that are
SIGKILLed, SIGSTOPped and SIGCONTed while they commit; every process is stopped at the end. Checked:

* ``test_sigkilled_writer_is_replaced_within_its_ttl``: a writer under load (4 agents) is
  SIGKILLed (lease_ttl=2); a second directory opened with ``take_over=True`` accepts commits within
  TTL + 3 s of the kill (the figure is printed, about 2 s); every commit the dead writer
  acknowledged is on the new writer at its sequence; the lease shows in ``status()``; the dead
  writer's directory reopened as a replicated writer without ``take_over`` refuses
  (``NotWriterError``), opened as a replica it refuses commits and converges to the new writer's
  head and ``durable-log export``.
* ``test_paused_writer_is_fenced_out``: a writer under load is SIGSTOPped for 4 s, another takes
  over (``take_over=True``) and commits, then SIGCONT: its later commits fail with
  ``NotWriterError``; every commit it acknowledged is in the stream (before the new fence), none
  that failed with ``NotWriterError`` is, every record is the old writer's (acknowledged, or of
  unknown outcome) or the new one's, and the subject is one linear history.
* ``test_writer_paused_between_lease_check_and_publish``: the same, with the pause in the window
  between the writer's last lease check and its publish (a hook in the child makes the writer
  thread linger there 0.5 s; the parent SIGSTOPs it then).
* ``test_force_take_over_deposes_the_old_writer``: in one process, ``take_over="force"`` while the
  old writer lives; its next commits (one record alone, or a group) must fail with
  ``NotWriterError`` and never land, and the new writer keeps writing.
* ``test_take_over_epoch_is_above_every_epoch_on_the_subject``: a writer that waited for the lease
  while two others took the store over and left must fence above their epochs.
* ``test_mint_ids_after_failover``: every id the new writer mints is above every id the killed
  writer handed out and above the id blocks it reserved on the stream.
* ``test_session_continues_after_failover``: a pi-durable ``Harness`` task left sleeping, and one
  left inside a running phase, on a SIGKILLed writer are finished by a Harness on the new writer,
  each phase once.

``test_failover_random.py`` holds the randomized run.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, NotWriterError

from tests.support.compare import REFUSALS

from ..support.failover_helpers import (
    STREAM,
    TTL,
    acked,
    check_linear,
    children,  # noqa: F401  (fixtures)
    converge,
    conversation,
    export,
    failed,
    intents,
    open_replica,
    open_writer,
    read_subject,
    writer_args,
)
from ..support.natsserver import NatsCluster, nats_cluster  # noqa: F401  (the fixture)

pytestmark = pytest.mark.cluster  # every test here runs a 3-node nats-server cluster


# ── SIGKILL: promotion within the TTL ───────────────────────────────────────


async def test_sigkilled_writer_is_replaced_within_its_ttl(
    tmp_path: Path, nats_cluster: NatsCluster, children: Any
) -> None:
    store = secrets.token_hex(8)
    old = children(
        "writer",
        tmp_path / "a",
        *writer_args(nats_cluster, store, "--agents", "4", "--take-over", "no"),
        name="a",
    )
    await old.wait_line("opened", 20)
    await old.wait_for(lambda: old.count("ack") >= 120, 30, "120 acks")
    killed_at = time.monotonic()
    old.kill()
    before = acked(old)
    assert len(before) >= 120

    new = await open_writer(nats_cluster, tmp_path / "b", store, take_over=True)
    try:
        opened_after = time.monotonic() - killed_at
        seq = await new.commit([conversation(await new.mint_id(), by="b")], CTX)
        promoted_after = time.monotonic() - killed_at
        print(
            f"\nfailover after SIGKILL (lease_ttl={TTL}): open returned after {opened_after:.2f} s, "
            f"first commit acknowledged after {promoted_after:.2f} s"
        )
        assert promoted_after < TTL + 3, f"promotion took {promoted_after:.2f} s"
        status = new.replication.status()
        assert status.lease.epoch == new.replication.epoch and status.lease.ttl == TTL
        assert status.lease.holder.endswith(str(tmp_path / "b"))
        assert 0 < status.lease.expires_in <= TTL

        # every acknowledged commit is on the new writer, at its sequence
        assert seq > max(before.values())
        for cid, acked_seq in before.items():
            record = await new.conversation(cid, CTX)
            assert record is not None, (
                f"acknowledged commit {acked_seq} (conversation {cid}) is lost"
            )
            entries = (
                await new.scan_entries({"conversationId": cid, "order": "ascending"}, 10, None, CTX)
            )["items"]
            lookup = await new.entry(entries[0]["id"], CTX)
            assert lookup is not None and lookup["commitSeq"] == acked_seq

        # the old directory: refused as a writer without take_over, follows as a replica
        with pytest.raises(NotWriterError):
            await open_writer(nats_cluster, tmp_path / "a", store, take_over=False)
        for n in range(20):
            await new.commit([conversation(await new.mint_id(), n=n)], CTX)
        head = new.log.head()
        replica = await open_replica(nats_cluster, tmp_path / "a", store)
        try:
            await replica.wait(head, timeout=20)
            with pytest.raises(NotWriterError):
                await replica.commit([conversation(10**12)], CTX)
            for cid in before:
                assert await replica.conversation(cid, CTX) == await new.conversation(cid, CTX)
        finally:
            await replica.close()
    finally:
        await new.close()
    assert export(tmp_path / "a") == export(tmp_path / "b")
    records = check_linear(await read_subject(nats_cluster, store), store)
    assert len(records) == head


# ── SIGSTOP: a paused writer is fenced out ──────────────────────────────────


async def paused_writer_round(
    tmp_path: Path, cluster: NatsCluster, children: Any, *extra: str, stall: bool = False
) -> None:
    store = secrets.token_hex(8)
    old = children(
        "writer",
        tmp_path / "a",
        *writer_args(cluster, store, "--take-over", "no", "--after-deposed", "3", *extra),
        name="a",
    )
    await old.wait_line("opened", 20)
    await old.wait_for(lambda: old.count("ack") >= 40, 30, "40 acks")
    if stall:
        await old.wait_line("stalled", 30)
    old.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    old_epoch = int(old.words("opened")[0][1])

    new = await open_writer(cluster, tmp_path / "b", store, take_over=True)
    try:
        took = time.monotonic() - stopped_at
        assert took < TTL + 3, f"take-over took {took:.2f} s"
        assert new.replication.epoch > old_epoch
        mine = {}
        for _n in range(10):
            cid = await new.mint_id()
            mine[cid] = await new.commit([conversation(cid, by="b")], CTX)
        await asyncio.sleep(max(0.0, 4.0 - (time.monotonic() - stopped_at)))
        old.signal(signal.SIGCONT)
        await old.wait_line("done", 30)
        assert old.proc.wait(10) == 0, old.tail()
        for _n in range(5):
            cid = await new.mint_id()
            mine[cid] = await new.commit([conversation(cid, by="b")], CTX)
        head = new.log.head()
    finally:
        await new.close()

    ok, refused, other = acked(old), failed(old, "NotWriterError"), failed(old)
    late = [cid for cid in intents(old) if cid >= 9 * 10**12]
    assert late and all(cid in refused for cid in late), (
        f"commits after deposition were not refused:\n{old.tail()}"
    )
    assert refused, "the old writer's commits never failed"
    messages = await read_subject(cluster, store)
    records = check_linear(messages, store)
    in_stream = Counter(record["cid"] for record in records)
    assert len(records) == head
    fence = next(
        m for m in messages if m["kind"] == "fence" and m["epoch"] == new.replication.epoch
    )
    for cid, seq in ok.items():
        assert in_stream[cid] == 1, (
            f"commit {seq} (conversation {cid}) acknowledged by the paused writer is not in the stream"
        )
        record = next(r for r in records if r["cid"] == cid)
        assert record["seq"] == seq and record["stream_seq"] < fence["stream_seq"]
    for cid in refused:
        assert cid not in in_stream, (
            f"conversation {cid}: refused with NotWriterError, yet in the stream"
        )
    for cid, seq in mine.items():
        assert in_stream[cid] == 1 and next(r for r in records if r["cid"] == cid)["seq"] == seq
    unknown = {cid: kind for cid, kind in other.items() if kind != "NotWriterError"}
    for record in (
        records
    ):  # nothing else: each is the old writer's (acked, or of unknown outcome) or the new one's
        assert record["cid"] in ok or record["cid"] in mine or record["cid"] in unknown, (
            f"record {record['seq']} is nobody's: {record}"
        )
    print(
        f"\npaused writer: {len(ok)} acked, {len(refused)} refused (NotWriterError), other failures {unknown}"
    )
    assert export(tmp_path / "b") == await converge(cluster, tmp_path / "a", store, head)


async def test_paused_writer_is_fenced_out(
    tmp_path: Path, nats_cluster: NatsCluster, children: Any
) -> None:
    await paused_writer_round(tmp_path, nats_cluster, children, "--agents", "4")


async def test_writer_paused_between_lease_check_and_publish(
    tmp_path: Path, nats_cluster: NatsCluster, children: Any
) -> None:
    # a single agent: the stalled publish is one record alone (a plain conditional publish)
    await paused_writer_round(
        tmp_path, nats_cluster, children, "--agents", "1", "--stall-after-check", "60", stall=True
    )


# ── take_over="force": the fence deposes a live writer ──────────────────────


@pytest.mark.parametrize("group", [False, True], ids=["one-record", "group"])
async def test_force_take_over_deposes_the_old_writer(
    tmp_path: Path, nats_cluster: NatsCluster, group: bool
) -> None:
    store = secrets.token_hex(8)
    # a long TTL: the old writer learns of the take-over from the stream, not from a renewal
    old = await LmdbStorage.open(
        tmp_path / "a",
        durability="replicated",
        nats=nats_cluster.urls,
        stream=STREAM,
        replicas=3,
        store=store,
        lease_ttl=30,
    )
    new = None
    try:
        await old.commit([conversation(100, by="a")], CTX)
        new = await LmdbStorage.open(
            tmp_path / "b",
            durability="replicated",
            nats=nats_cluster.urls,
            stream=STREAM,
            replicas=3,
            store=store,
            take_over="force",
            lease_ttl=30,
        )
        theirs = {}
        cids = [200, 201, 202]
        if group:
            seqs = await asyncio.gather(
                *(new.commit([conversation(cid, by="b")], CTX) for cid in cids)
            )
        else:
            seqs = [await new.commit([conversation(cid, by="b")], CTX) for cid in cids]
        theirs.update(zip(cids, seqs))

        outcomes: dict[int, str] = {}

        async def attempt(cid: int) -> None:
            try:
                outcomes[cid] = (
                    f"acknowledged as {await old.commit([conversation(cid, by='a')], CTX)}"
                )
            except REFUSALS as error:
                outcomes[cid] = type(error).__name__

        if group:
            await asyncio.gather(*(attempt(cid) for cid in (300, 301, 302)))
        else:
            await attempt(300)
        await attempt(400)  # and the next one
        more = 500
        try:
            theirs[more] = await new.commit([conversation(more, by="b")], CTX)
        except REFUSALS as error:
            raise AssertionError(
                f"the new writer (epoch {new.replication.epoch}) was deposed after the old one's attempts {outcomes}: {error}"
            ) from None
        messages = await read_subject(nats_cluster, store)
        in_stream = {m["cid"]: m for m in messages if m["kind"] == "record"}
        check_linear(messages, store)
        for cid, outcome in outcomes.items():
            assert cid in in_stream or not outcome.startswith("acknowledged"), (
                f"the old writer's commit {outcome} (conversation {cid}) is not in the stream: its attempts {outcomes}"
            )
        for cid, seq in theirs.items():
            assert cid in in_stream and in_stream[cid]["seq"] == seq, (
                f"the new writer's commit {seq} is not in the stream"
            )
        assert outcomes == {cid: "NotWriterError" for cid in outcomes}, (
            f"the old writer's commits after the fence: {outcomes}"
        )
        await old.wait(new.log.head(), timeout=10)
        for cid in outcomes:
            assert await old.conversation(cid, CTX) is None
        assert await old.conversation(more, CTX) is not None
    finally:
        await old.close()
        if new is not None:
            await new.close()


# ── the epoch of a take-over that waited ────────────────────────────────────


async def test_take_over_epoch_is_above_every_epoch_on_the_subject(
    tmp_path: Path, nats_cluster: NatsCluster
) -> None:
    """A writer that waits for a lease must, once it takes it, fence with an epoch above every
    epoch the subject carries by then, not only above those it saw when it began to wait: here
    two writers take the store over (``force``) and go while it waits, each fencing the subject
    with a higher epoch."""

    store = secrets.token_hex(8)
    opened: list[LmdbStorage] = []
    try:
        first = await open_writer(nats_cluster, tmp_path / "first", store, take_over=False)
        opened.append(first)
        await first.commit([conversation(1)], CTX)
        waiting = asyncio.ensure_future(
            open_writer(nats_cluster, tmp_path / "waiting", store, take_over=True)
        )
        await asyncio.sleep(0.5)  # it has read the subject (epoch 1) and polls the lease
        assert not waiting.done()
        for number in range(2):
            other = await open_writer(
                nats_cluster, tmp_path / f"other{number}", store, take_over="force"
            )
            opened.append(other)
            await other.commit([conversation(10 + number)], CTX)
        assert not waiting.done()
        for storage in opened:
            await storage.close()  # the last one releases the lease: ``waiting`` takes it
        late = await asyncio.wait_for(waiting, 15)
        opened.append(late)
        highest = max(  # of the others' fences
            m["epoch"]
            for m in await read_subject(nats_cluster, store)
            if m["kind"] == "fence"
            and not m["control"]["holder"].endswith(str(tmp_path / "waiting"))
        )
        try:
            seq = await late.commit([conversation(20)], CTX)
        except NotWriterError:
            seq = None
        messages = await read_subject(nats_cluster, store)
        summary = [(m["kind"], m["epoch"], m["seq"]) for m in messages]
        assert late.replication.epoch > highest, (
            f"the writer that waited took epoch {late.replication.epoch}; the subject had a fence of epoch "
            f"{highest} (its commit: {seq}); the subject: {summary}"
        )
        check_linear(messages, store)
        replica = await open_replica(nats_cluster, tmp_path / "replica", store)
        try:
            await replica.wait(max(m["seq"] for m in messages if m["kind"] == "record"), timeout=10)
        finally:
            await replica.close()
    finally:
        for storage in opened:
            await storage.close()


# ── mint_id across writers ──────────────────────────────────────────────────


async def test_mint_ids_after_failover(
    tmp_path: Path, nats_cluster: NatsCluster, children: Any
) -> None:
    store = secrets.token_hex(8)
    old = children(
        "mint",
        tmp_path / "a",
        *writer_args(nats_cluster, store, "--take-over", "no", "--count", "5000"),
        name="a",
    )
    await old.wait_line("ready", 60)
    old.kill()
    handed_out = [
        int(value)
        for line in old.snapshot()
        if line.startswith("minted ")
        for value in line.split()[1:]
    ]
    assert len(handed_out) == len(set(handed_out)) == 5000
    messages = await read_subject(nats_cluster, store)

    new = await open_writer(nats_cluster, tmp_path / "b", store, take_over=True)
    try:
        fresh = [await new.mint_id() for _ in range(200)]
        assert len(set(fresh)) == 200
        assert min(fresh) > max(handed_out), (
            f"the new writer minted {min(fresh)}, the old one had handed out up to {max(handed_out)}"
        )
        await new.commit([conversation(fresh[0])], CTX)
    finally:
        await new.close()
    # the id blocks the old writer reserved are on the stream, and the new writer started above them
    blocks = [m["control"]["upto"] for m in messages if m["kind"] == "ids"]
    assert blocks and max(blocks) > max(handed_out)
    assert min(fresh) >= max(blocks)


# ── a Session continues on the new writer ───────────────────────────────────


async def test_session_continues_after_failover(
    tmp_path: Path, nats_cluster: NatsCluster, children: Any
) -> None:
    from pi_durable import Harness

    from ..support.failover_child import HANG_ENV, Step, Trail, harness_options

    assert not os.environ.get(HANG_ENV)
    store = secrets.token_hex(8)
    old = children(
        "session",
        tmp_path / "a",
        *writer_args(nats_cluster, store, "--take-over", "no"),
        name="session",
    )
    ready = await old.wait_line("ready", 60)
    sleeper, worker, head = (int(part) for part in (ready[1] + " " + ready[2]).split())
    root = int(old.words("root")[0][1])
    assert old.count("hanging") == 1
    old.kill()

    clock = [1_700_000_000_000 + 120_000]  # past the sleeper's wake-up time
    storage = await open_writer(nats_cluster, tmp_path / "b", store, take_over=True)
    assert storage.log.head() >= head
    harness = await Harness.open(storage, harness_options(clock), CTX)
    try:
        left = await harness.get_task(sleeper, CTX)
        assert left is not None and left["state"]["status"] == "sleeping"
        cut = await harness.get_task(worker, CTX)
        assert (
            cut is not None
            and cut["state"]["status"] == "pending"
            and cut["state"]["checkpoint"] == {"phase": "work"}
        )
        assert cut.get("restarts") == 1
        harness.resume()
        for task in (sleeper, worker):
            settled = await asyncio.wait_for(harness.wait_for_task(task, CTX), 30)
            assert settled["state"] == {
                "status": "terminal",
                "outcome": {"status": "completed", "result": {"last": "finish"}},
            }
        lines = (await harness.snapshot(Trail, root, CTX))["lines"]
        assert [line for line in lines if line.startswith(f"{sleeper}:")] == [
            f"{sleeper}:{p}" for p in ("start", "wake", "finish")
        ]
        assert [line for line in lines if line.startswith(f"{worker}:")] == [
            f"{worker}:{p}" for p in ("start", "work", "finish")
        ]
        entries = (
            await harness.storage.scan_entries(
                {"conversationId": root, "order": "ascending"}, 1000, None, CTX
            )
        )["items"]
        steps = [
            (entry["data"]["task"], entry["data"]["phase"])
            for entry in entries
            if entry["kind"] == Step.kind
        ]
        assert [phase for task, phase in steps if task == sleeper] == ["start", "wake", "finish"]
        assert [phase for task, phase in steps if task == worker] == ["start", "work", "finish"]
    finally:
        await harness.close(CTX)
    # the dead writer's directory follows the stream to the same history
    records = check_linear(await read_subject(nats_cluster, store), store)
    assert export(tmp_path / "b") == await converge(
        nats_cluster, tmp_path / "a", store, len(records)
    )
