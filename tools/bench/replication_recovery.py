"""Recovery for ``tools.bench.replication``: catch-up, restore (also from a snapshot), a writer
taking the stream in, and failover from a SIGKILLed writer to a new one."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools import module_command, module_env
from tools.bench.cluster import progress, spawn
from tools.bench.replication_commits import STREAM, own, turn
from tools.bench.workloads import Ids

# ── part 3: catch-up and restore ─────────────────────────────────────────────


async def fill(urls: list[str], base: str, records: int) -> tuple[str, float, int]:
    """A replicated store of ``records`` records (64 committers); returns its id, commits/s and
    the size of one turn's record."""

    from pi_durable_lmdb.storage import LmdbStorage

    path = tempfile.mkdtemp(dir=base, prefix="fill-")
    writer = await LmdbStorage.open(
        path, durability="replicated", nats=urls, stream=STREAM, replicas=3
    )
    try:
        ids = Ids()
        owned = await own(writer, ids, 64)
        left = records - writer.log.head()
        counter = 0
        started = time.perf_counter()

        async def committer(conversation_id: int, task_id: int) -> None:
            nonlocal counter
            n = 0
            while counter < left:
                counter += 1
                n += 1
                await writer.commit(turn(ids, conversation_id, task_id, n), CTX)

        await asyncio.gather(*(committer(c, t) for c, t in owned))
        rate = left / (time.perf_counter() - started)
        if writer.log.head() != records:
            raise RuntimeError(f"filled to {writer.log.head()}, not {records}")
        with writer._env.read() as txn:  # one turn's record as the stream carries it
            size = len(writer.log.record(txn, records))
        return writer.store_id, rate, size
    finally:
        await writer.close()  # releases the lease: a restore opens without waiting for it
        shutil.rmtree(path, ignore_errors=True)


async def snapshot_restore(
    urls: list[str], base: str, records: int, tail: int, runs: int
) -> dict[str, Any]:
    """A store of ``records`` records whose snapshot was taken ``tail`` records before its end
    (``durable-log snapshot``'s ``take_snapshot``), then ``restore()`` into fresh directories:
    the newest snapshot that verifies plus the log after it."""

    from pi_durable_lmdb.audit.restore import restore
    from pi_durable_lmdb.audit.tail import open_stream
    from pi_durable_lmdb.storage import LmdbStorage
    from pi_durable_lmdb.storage.snapshot import take_snapshot

    path = tempfile.mkdtemp(dir=base, prefix="snapshot-fill-")
    out: dict[str, Any] = {"records": records, "tail": tail, "restores": []}
    try:
        writer = await LmdbStorage.open(
            path, durability="replicated", nats=urls, stream=STREAM, replicas=3
        )
        try:
            ids = Ids()
            owned = await own(writer, ids, 64)
            started = time.perf_counter()
            await _turns(writer, ids, owned, records - tail - writer.log.head())
            out["fill_rate"] = (records - tail) / (time.perf_counter() - started)
            store = writer.store_id
            progress(f"  filled {writer.log.head():,} records at {out['fill_rate']:,.0f}/s")
            link = await open_stream(urls, STREAM)
            try:
                report = await take_snapshot(path, link)
            finally:
                await asyncio.to_thread(link.close)
            out["snapshot"] = {
                "seconds": report.seconds,
                "size": report.size,
                "stored": report.stored,
                "seq": report.seq,
            }
            progress(
                f"  snapshot at record {report.seq:,}: {report.size / 1e6:,.0f} MB as {report.stored / 1e6:,.0f} MB "
                f"in {report.seconds:.1f} s"
            )
            await _turns(writer, ids, owned, records - writer.log.head())
        finally:
            await writer.close()
        shutil.rmtree(path, ignore_errors=True)
        for _run in range(runs):
            target = os.path.join(tempfile.mkdtemp(dir=base, prefix="snapshot-restore-"), "store")
            started = time.perf_counter()
            head = await restore(urls, STREAM, store, target)
            elapsed = time.perf_counter() - started
            if head != records:
                raise RuntimeError(f"the restored store holds {head} records, not {records}")
            out["restores"].append(elapsed)
            progress(f"  restore with a snapshot {tail:,} records old: {elapsed:.2f} s")
            shutil.rmtree(os.path.dirname(target), ignore_errors=True)
        return out
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def _turns(writer: Any, ids: Ids, owned: list[tuple[int, int]], count: int) -> None:
    """``count`` turn commits by 64 committers (one per owned conversation)."""

    left = count

    async def committer(conversation_id: int, task_id: int) -> None:
        nonlocal left
        n = 0
        while left > 0:
            left -= 1
            n += 1
            await writer.commit(turn(ids, conversation_id, task_id, n), CTX)

    await asyncio.gather(*(committer(c, t) for c, t in owned))


async def measure_catch_up(urls: list[str], base: str, store: str, records: int) -> float:
    from pi_durable_lmdb.storage import LmdbStorage

    path = tempfile.mkdtemp(dir=base, prefix="catch-up-")
    started = time.perf_counter()
    replica = await LmdbStorage.open_replica(path, nats=urls, stream=STREAM, store=store)
    try:
        await replica.wait(records, 600)
        elapsed = time.perf_counter() - started
        if replica.log.head() != records:
            raise RuntimeError(f"the replica holds {replica.log.head()} records, not {records}")
        return elapsed
    finally:
        await replica.close()
        shutil.rmtree(path, ignore_errors=True)


def _restore_function() -> Any:
    """``audit.restore.restore`` when this tree has it (else ``None``)."""

    try:
        from pi_durable_lmdb.audit.restore import restore
    except ImportError:
        return None
    return restore


async def measure_restore(urls: list[str], base: str, store: str, records: int) -> float:
    """``restore()`` (``src/audit/restore.py``) of ``store`` into a new directory."""

    restore = _restore_function()
    path = os.path.join(tempfile.mkdtemp(dir=base, prefix="restore-"), "store")
    started = time.perf_counter()
    try:
        head = await restore(urls, STREAM, store, path)
        elapsed = time.perf_counter() - started
        if head != records:
            raise RuntimeError(f"the restored store holds {head} records, not {records}")
        return elapsed
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


async def measure_writer_take_in(urls: list[str], base: str, store: str, records: int) -> float:
    """A replicated writer opened in a fresh directory for ``store``: ``open`` returns once it
    took the stream in (what a failover to a machine without a replica does)."""

    from pi_durable_lmdb.storage import LmdbStorage

    path = tempfile.mkdtemp(dir=base, prefix="take-in-")
    started = time.perf_counter()
    writer = await LmdbStorage.open(
        path, durability="replicated", nats=urls, stream=STREAM, store=store
    )
    try:
        elapsed = time.perf_counter() - started
        if writer.log.head() != records:
            raise RuntimeError(
                f"the restored store holds {writer.log.head()} records, not {records}"
            )
        return elapsed
    finally:
        await writer.close()
        shutil.rmtree(path, ignore_errors=True)


# ── part 4: failover ─────────────────────────────────────────────────────────


def child_writer(path: str, urls: str, ttl: int) -> None:
    """In the child: a replicated writer committing turns in a loop until it is killed."""

    from pi_durable_lmdb.storage import LmdbStorage

    async def run() -> None:
        storage = await LmdbStorage.open(
            path,
            durability="replicated",
            nats=urls.split(","),
            stream=STREAM,
            replicas=3,
            lease_ttl=ttl,
        )
        ids = Ids()
        [(conversation_id, task_id)] = await own(storage, ids, 1)
        await storage.commit(turn(ids, conversation_id, task_id, 1), CTX)
        print(
            json.dumps(
                {"store": storage.store_id, "conversation": conversation_id, "task": task_id}
            ),
            flush=True,
        )
        n = 1
        while True:
            n += 1
            await storage.commit(turn(ids, conversation_id, task_id, n), CTX)

    asyncio.run(run())


async def measure_failover(urls: list[str], base: str, ttl: int, run: int) -> dict[str, float]:
    from pi_durable_lmdb.storage import LmdbStorage

    old_dir = tempfile.mkdtemp(dir=base, prefix="failover-old-")
    new_dir = tempfile.mkdtemp(dir=base, prefix="failover-new-")
    errors = open(os.path.join(base, "failover-child.log"), "a")
    child = spawn(
        module_command(
            "tools.bench.replication", "--child-writer", old_dir, ",".join(urls), str(ttl)
        ),
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
        env=module_env(),
    )
    errors.close()
    new = None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(
                f"the child writer exited with {child.wait()} (see {base}/failover-child.log)"
            )
        info = json.loads(line)
        await asyncio.sleep(random.uniform(0.3, 1.0))  # kill at any phase of its lease renewals
        killed = time.perf_counter()
        child.send_signal(signal.SIGKILL)
        await asyncio.to_thread(child.wait)
        new = await LmdbStorage.open(
            new_dir,
            durability="replicated",
            nats=urls,
            stream=STREAM,
            store=info["store"],
            take_over=True,
            lease_ttl=ttl,
        )
        opened = time.perf_counter()
        head = new.log.head()
        ids = Ids()
        ids.next = 10_000_000 + 1000 * run
        await new.commit(turn(ids, info["conversation"], info["task"], 1_000_000), CTX)
        done = time.perf_counter()
        return {
            "total": done - killed,
            "open": opened - killed,
            "commit": done - opened,
            "taken_in": head,
        }
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
        if new is not None:
            await new.close()
        shutil.rmtree(old_dir, ignore_errors=True)
        shutil.rmtree(new_dir, ignore_errors=True)


RECOVERY: dict[str, tuple[Any, str, bool]] = {
    "catch_up": (
        measure_catch_up,
        "catch-up: `open_replica` (fresh directory) until its log holds them all",
        True,
    ),
    "restore": (measure_restore, "restore: `audit.restore.restore()` into a new directory", True),
    "writer_take_in": (
        measure_writer_take_in,
        "a replicated writer `open`ed in a fresh directory on the store id "
        "(takes the stream in before it returns)",
        False,
    ),
}
if _restore_function() is None:
    del RECOVERY["restore"]
