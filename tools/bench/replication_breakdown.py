"""``python -m tools.bench.replication --breakdown``: instrumented runs after the measured rounds,
splitting a replicated commit, replica lag and catch-up into where the time goes (they wrap private
methods, so they are kept out of the measured runs)."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from typing import Any

from tools.bench.concurrent import percentile
from tools.bench.replication_commits import (
    COMMITTERS,
    STREAM,
    ReplicatedStore,
    measure_lag,
    run_committers,
)

# ── where the time goes (--breakdown) ────────────────────────────────────────


async def breakdown(
    urls: list[str], base: str, store: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Instrumented runs, after the measured rounds: the replicated commit's group split into
    the publish (``StreamWriter._send``, on the writer thread, waiting for the stream) and the
    rest of the group (checks, fold, LMDB commit and syncs); replica lag by the replica's
    durability; and catch-up split into its stages (``breakdown_catch_up``)."""

    out: dict[str, Any] = {"groups": {}, "lag": {"power": [], "process": []}}
    for committers in COMMITTERS if "commits" in args.parts else ():
        path = tempfile.mkdtemp(dir=base, prefix="breakdown-")
        store_handle = ReplicatedStore(path, urls)
        await store_handle.open()
        storage = store_handle.storage
        writer, committer = storage.replication, storage._committer
        sends: list[tuple[float, int]] = []
        runs: list[float] = []
        send, run = writer._send, committer._run

        def timed_send(txn: Any, messages: Any, *rest: Any, **options: Any) -> Any:
            started = time.perf_counter()
            try:
                return send(txn, messages, *rest, **options)
            finally:
                sends.append((time.perf_counter() - started, len(messages)))

        def timed_run(jobs: Any) -> Any:
            started = time.perf_counter()
            try:
                return run(jobs)
            finally:
                runs.append(time.perf_counter() - started)

        writer._send, committer._run = timed_send, timed_run
        try:
            figures = await run_committers(storage, committers, args.commits)
        finally:
            await store_handle.close()
            shutil.rmtree(path, ignore_errors=True)
        sends, runs = sends[committers:], runs[committers:]  # not the set-up commits
        out["groups"][committers] = {
            "commit_p50": figures["p50"],
            "rate": figures["rate"],
            "groups": len(runs),
            "size": statistics.median(size for _, size in sends),
            "group": percentile(runs, 0.5),
            "publish": percentile([t for t, _ in sends], 0.5),
            "local": percentile([r - t for r, (t, _) in zip(runs, sends)], 0.5),
        }
    for _ in range(3 if "lag" in args.parts else 0):
        for durability in ("power", "process"):
            lag = await measure_lag(urls, base, 3.0, args.lag_rate, durability, instrument=True)
            out["lag"][durability].append(lag)
    if "recovery" in args.parts:
        out.update(await breakdown_catch_up(urls, base, store, args))
    return out


async def breakdown_catch_up(
    urls: list[str], base: str, store: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Catch-up split into its stages, each alone, wall-clock and this process's CPU per record:
    nats-py's ordered consumer alone, ``parse_message`` (after nats-py's ``msg.metadata``), the
    fold (``Follower._apply``, chunks of 1,024); and, where the tree has them, batched pull
    requests alone (``link.messages.fetch``, 4,096 a batch), ``parse_message`` of what they return, and the
    check and fold as a catch-up does them (``Follower._take_raw``)."""

    import nats
    from nats.js.api import ConsumerConfig, DeliverPolicy
    from pi_durable_lmdb.log.stream.jetstream import parse_message, subject_of
    from pi_durable_lmdb.storage import LmdbStorage
    from pi_durable_lmdb.storage.replica import Follower

    out: dict[str, Any] = {}
    clocks: list[float] = []

    def start() -> None:
        clocks[:] = [time.perf_counter(), time.process_time()]

    def stop(name: str, count: int) -> None:
        out[name] = (
            (time.perf_counter() - clocks[0]) / count,
            (time.process_time() - clocks[1]) / count,
        )

    subject = subject_of(STREAM, store)
    nc = await nats.connect(servers=urls)
    try:
        js = nc.jetstream(timeout=5)
        messages: list[Any] = []
        done = asyncio.Event()
        last = str(args.records)

        async def take(msg: Any) -> None:
            messages.append(msg)
            if (
                msg.headers
                and msg.headers.get("Pd-Kind") == "record"
                and msg.headers.get("Pd-Seq") == last
            ):
                done.set()

        start()
        sub = await js.subscribe(
            subject,
            stream=STREAM,
            cb=take,
            ordered_consumer=True,
            idle_heartbeat=0.5,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=1,
                filter_subject=subject,
            ),
            pending_msgs_limit=65536,
            pending_bytes_limit=256 * 1024 * 1024,
        )
        await asyncio.wait_for(done.wait(), 300)
        stop("consume", len(messages))
        await sub.unsubscribe()
    finally:
        await nc.close()
    start()
    parsed = [
        parse_message(STREAM, m.metadata.sequence.stream, m.headers, m.data, store)
        for m in messages
    ]
    stop("parse", len(parsed))
    messages.clear()  # the raw messages' memory is not counted in the fold stage
    await _fold_stage(
        out, start, stop, base, store, parsed, 1024, ("power", "process"), args.records
    )
    from pi_durable_lmdb.audit.tail import open_stream

    link = await open_stream(urls, STREAM)
    try:
        raws: list[Any] = []
        start()
        while batch := await link.arun(
            link.messages.fetch(subject, raws[-1].stream_seq if raws else 0, batch=4096)
        ):
            raws.extend(batch)
        stop("fetch", len(raws))
        start()
        for raw in raws:  # each decoded record dropped at once, as a catch-up does
            parse_message(STREAM, raw.stream_seq, raw.headers, raw.data, store)
        stop("parse_raw", len(raws))
        path = tempfile.mkdtemp(dir=base, prefix="breakdown-take-")
        storage = await LmdbStorage.open(path, durability="process", store=store)
        try:
            follower = Follower(
                argparse.Namespace(stream=STREAM, loop=asyncio.get_running_loop()),
                storage,
                store,
            )  # type: ignore[arg-type]
            start()
            for index in range(0, len(raws), 4096):  # each checked just before it is folded
                await follower._take_raw(raws[index : index + 4096], None)
            stop("take_raw", args.records)
        finally:
            await storage.close()
            shutil.rmtree(path, ignore_errors=True)
    finally:
        await asyncio.to_thread(link.close)
    return out


async def _fold_stage(
    out: dict[str, Any],
    start: Any,
    stop: Any,
    base: str,
    store: str,
    parsed: list[Any],
    chunk: int,
    modes: tuple[str, ...],
    records: int,
    suffix: str = "",
) -> None:
    """The fold alone (``Follower._apply``) of ``parsed`` in chunks of ``chunk``, per mode."""

    from pi_durable_lmdb.storage import LmdbStorage
    from pi_durable_lmdb.storage.replica import Follower

    for mode in modes:
        path = tempfile.mkdtemp(dir=base, prefix="breakdown-apply-")
        storage = await LmdbStorage.open(path, durability=mode, store=store)
        try:
            link = argparse.Namespace(stream=STREAM, loop=asyncio.get_running_loop())
            follower = Follower(link, storage, store)  # type: ignore[arg-type]
            start()
            for index in range(0, len(parsed), chunk):
                await follower._apply(parsed[index : index + chunk])
            stop(f"apply_{mode}{suffix}", records)
        finally:
            await storage.close()
            shutil.rmtree(path, ignore_errors=True)
