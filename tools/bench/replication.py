"""Replication through NATS JetStream: commit latency, replica lag, catch-up, restore, failover.

Starts its own 3-node JetStream cluster (``nats-server`` from the venv, default server settings,
routes on 127.0.0.1, free ports, store directories in a temporary directory; the servers are
killed at exit, and die with this process should it be killed) and measures, in one run, each
round doing a share of every part:

1. ``durability="replicated"`` commits (R3 stream) beside local ``power`` LMDB and pi-durable's
   SQLite WAL ``synchronous=FULL`` (``tools/bench/report.py``'s ``Store``): per-commit latency p50/p99
   and throughput with 1 sequential committer and with 64 concurrent ones (the ``commit_turn``
   shape of ``tools/bench/concurrent.py``: an entry and its task per commit), fresh stores each
   run, backends rotated per round; ratios paired per round.
2. Replica lag under a paced writer (``--lag-rate`` commits/s, open loop: commit ``i`` starts at
   ``i / rate`` s whatever the earlier ones do): for each commit, from ``commit()`` returning on
   the writer to ``replica.wait(seq)`` returning on a replica (``open_replica``, same process,
   its own directory); beside it the event loop's stalls and the full GCs meanwhile.
3. With ``--records`` records of one store on the stream, each into a fresh directory: catch-up
   (``open_replica`` until its log holds them all), restore (``audit.restore.restore()``, when
   the tree has it), and a replicated writer ``open``ed on the store id (it takes the stream in
   before it returns: a failover to a machine without a replica).
4. Failover: a writer in a child process commits in a loop and is SIGKILLed; a new writer in
   this process opens with ``take_over=True, lease_ttl=2`` (fresh directory) and commits once:
   the time from the kill to that commit returning.

For context also: raw nats-py ``js.publish`` of a record-sized message to an R3 stream on the
same cluster (one at a time, awaited), p50/p99. Every replicated writer holds a lease (renewed
every ``ttl / 3`` s, checked before each publish), so "with lease" and "without lease" are not
separable: the replicated figures include it. ``--breakdown`` adds instrumented runs after the
rounds (they wrap private methods, so they are kept out of the measured ones): a replicated
group split into its publish and the rest, catch-up split into its stages, replica lag with a
``power`` and a ``process`` replica.

Usage::

    python -m tools.bench.replication --quick            # ~30 s smoke run
    python -m tools.bench.replication --breakdown        # 5 rounds, 20 failovers (~3 minutes)
    python -m tools.bench.replication --rounds 7 --commits 2000 --failovers 28 --lag-seconds 42 --breakdown
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import ctypes
import gc
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools import module_command, module_env
from tools.bench.report import LABELS, Store, _fmt_time, _rotated, _source_version
from tools.bench.concurrent import TICK, _percentile
from tools.bench.workloads import Ids, conversation, entry, task

NATS_SERVER = os.path.join(os.path.dirname(sys.executable), "nats-server")
STREAM = "BENCH"
RAW_STREAM = "RAWPUB"
REPLICATED = "replicated"
BACKENDS = (REPLICATED, "lmdb", "sqlite")
LABEL = {REPLICATED: "replicated (R3)", "lmdb": LABELS[("lmdb", "power")], "sqlite": LABELS[("sqlite", "power")]}
COMMITTERS = (1, 64)
PARTS = ("commits", "lag", "recovery", "failover", "snapshot")

# ── processes we start (and only those are ever killed) ──────────────────────

_STARTED: list[subprocess.Popen[Any]] = []


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it should this process die (even by SIGKILL)."""

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
    process = subprocess.Popen(argv, preexec_fn=_die_with_parent, **kwargs)
    _STARTED.append(process)
    return process


def _kill_started() -> None:
    for process in _STARTED:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + 5
    for process in _STARTED:
        if process.poll() is None:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


atexit.register(_kill_started)


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ── the cluster ──────────────────────────────────────────────────────────────


async def _quiet(error: Exception) -> None:
    """nats-py's error callback while the cluster starts (refused connections are expected)."""


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class Cluster:
    """Three JetStream servers routed to each other on loopback."""

    def __init__(self, base: str, size: int = 3) -> None:
        self.base, self.size = base, size
        ports = _free_ports(2 * size)
        self.client_ports, self.cluster_ports = ports[:size], ports[size:]
        self.processes: list[subprocess.Popen[Any]] = []

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{port}" for port in self.client_ports]

    def start(self) -> None:
        routes = ", ".join(f'"nats-route://127.0.0.1:{port}"' for port in self.cluster_ports)
        for index in range(self.size):
            directory = os.path.join(self.base, f"n{index}")
            os.makedirs(directory)
            config = os.path.join(directory, "server.conf")
            with open(config, "w") as handle:
                handle.write(
                    f'server_name: "n{index}"\n'
                    f"listen: 127.0.0.1:{self.client_ports[index]}\n"
                    f'jetstream {{ store_dir: "{directory}/js" }}\n'
                    f"cluster {{ name: bench, listen: 127.0.0.1:{self.cluster_ports[index]}, routes: [{routes}] }}\n"
                )
            log = open(os.path.join(directory, "server.log"), "w")
            self.processes.append(_spawn([NATS_SERVER, "-c", config], stdout=log, stderr=subprocess.STDOUT))
            log.close()

    async def ready(self, timeout: float = 60.0) -> None:
        """Until an R3 stream can be made (a meta leader and all peers known); makes the raw
        publish stream."""

        import nats
        from nats.js.api import StorageType, StreamConfig

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"nats-server exited with {process.returncode} (logs in {self.base})")
            try:
                nc = await nats.connect(servers=self.urls, connect_timeout=1, allow_reconnect=False,
                                        max_reconnect_attempts=0, error_cb=_quiet)
                try:
                    js = nc.jetstream(timeout=2)
                    await js.add_stream(StreamConfig(name=RAW_STREAM, subjects=["rawpub.>"], num_replicas=3,
                                                     storage=StorageType.FILE))
                    await js.publish("rawpub.ready", b"x")
                    return
                finally:
                    await nc.close()
            except Exception as error:
                last = error
                await asyncio.sleep(0.5)
        raise RuntimeError(f"The cluster was not ready in {timeout} s: {last!r}")

    def cpu(self) -> float:
        """CPU seconds the servers used so far (user + system, from /proc; 0 where unreadable)."""

        total = 0.0
        for process in self.processes:
            try:
                with open(f"/proc/{process.pid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                pass
        return total

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# ── part 1: commit latency and throughput ────────────────────────────────────


class ReplicatedStore(Store):
    """``tools/bench/report.py``'s store handle for a ``durability="replicated"`` LMDB store."""

    def __init__(self, path: str, urls: list[str]) -> None:
        super().__init__("lmdb", REPLICATED, path)
        self.urls = urls

    async def open(self) -> None:
        from pi_durable_lmdb.storage import LmdbStorage

        os.makedirs(self.path, exist_ok=True)
        self.storage = await LmdbStorage.open(
            self.path, durability="replicated", nats=self.urls, stream=STREAM, replicas=3
        )


def turn(ids: Ids, conversation_id: int, task_id: int, n: int) -> list[dict[str, Any]]:
    status = "running" if n % 3 else "sleeping"
    return [
        {"type": "entry", "value": entry(ids(), conversation_id, n, task_id)},
        {"type": "task", "value": task(task_id, conversation_id, n, status)},
    ]


async def own(storage: Any, ids: Ids, count: int) -> list[tuple[int, int]]:
    """``count`` conversations, each with its task (untimed set-up commits)."""

    owned = []
    for _ in range(count):
        conversation_id, task_id = ids(), ids()
        await storage.commit(
            [conversation(conversation_id), {"type": "task", "value": task(task_id, conversation_id, 0, "pending")}],
            CTX,
        )
        owned.append((conversation_id, task_id))
    return owned


async def run_committers(storage: Any, committers: int, commits: int) -> dict[str, float]:
    """``commits`` turn commits spread over ``committers`` concurrent committers."""

    ids = Ids()
    owned = await own(storage, ids, committers)
    per = max(1, commits // committers)
    latencies: list[float] = []

    async def committer(conversation_id: int, task_id: int) -> None:
        for n in range(1, per + 1):
            writes = turn(ids, conversation_id, task_id, n)
            started = time.perf_counter()
            await storage.commit(writes, CTX)
            latencies.append(time.perf_counter() - started)

    gc.collect()
    started = time.perf_counter()
    await asyncio.gather(*(committer(c, t) for c, t in owned))
    elapsed = time.perf_counter() - started
    return {
        "rate": per * committers / elapsed,
        "p50": _percentile(latencies, 0.50),
        "p99": _percentile(latencies, 0.99),
    }


async def measure_commits(backend: str, committers: int, commits: int, base: str, urls: list[str]) -> dict[str, float]:
    path = tempfile.mkdtemp(dir=base, prefix=f"{backend}-")
    store = ReplicatedStore(path, urls) if backend == REPLICATED else Store(backend, "power", path)
    await store.open()
    try:
        return await run_committers(store.storage, committers, commits)
    finally:
        await store.close()
        shutil.rmtree(path, ignore_errors=True)


# ── raw publish, for context ─────────────────────────────────────────────────


async def raw_publish(urls: list[str], count: int, size: int) -> list[float]:
    import nats

    nc = await nats.connect(servers=urls)
    try:
        js = nc.jetstream(timeout=5)
        body = os.urandom(size)
        latencies = []
        for n in range(count):
            started = time.perf_counter()
            await js.publish(f"rawpub.s{n % 8}", body)
            latencies.append(time.perf_counter() - started)
        return latencies
    finally:
        await nc.close()


# ── part 2: replica lag under a paced writer ─────────────────────────────────


async def measure_lag(
    urls: list[str], base: str, seconds: float, rate: float, replica_durability: str = "power", instrument: bool = False
) -> dict[str, Any]:
    from pi_durable_lmdb.storage import LmdbStorage

    writer_dir = tempfile.mkdtemp(dir=base, prefix="lag-writer-")
    replica_dir = tempfile.mkdtemp(dir=base, prefix="lag-replica-")
    writer = await LmdbStorage.open(writer_dir, durability="replicated", nats=urls, stream=STREAM, replicas=3)
    replica = None
    try:
        ids = Ids()
        owned = await own(writer, ids, 64)
        replica = await LmdbStorage.open_replica(
            replica_dir, nats=urls, stream=STREAM, store=writer.store_id, durability=replica_durability
        )
        await replica.wait(writer.log.head(), 30)
        applies: list[tuple[float, int]] = []
        if instrument:  # --breakdown: each transaction the replica takes a chunk in with
            follower = replica.replication
            write = follower._write

            def timed_write(chunk: Any) -> Any:
                started = time.perf_counter()
                try:
                    return write(chunk)
                finally:
                    applies.append((time.perf_counter() - started, len(chunk)))

            follower._write = timed_write
        total = max(1, int(seconds * rate))
        commit_latency: list[float] = []
        lags: list[float] = []
        errors: list[str] = []

        async def one(n: int) -> None:
            conversation_id, task_id = owned[n % len(owned)]
            writes = turn(ids, conversation_id, task_id, n + 1)
            started = time.perf_counter()
            seq = await writer.commit(writes, CTX)
            acked = time.perf_counter()
            commit_latency.append(acked - started)
            try:
                await replica.wait(seq, 30)
            except Exception as error:
                errors.append(f"{type(error).__name__}: {error}")
                return
            lags.append(time.perf_counter() - acked)

        gc.collect()
        pauses: list[float] = []
        began: list[float] = [0.0]

        def note(phase: str, info: dict[str, int]) -> None:  # the collector's pauses meanwhile
            if phase == "start":
                began[0] = time.perf_counter()
            elif info.get("generation") == 2:
                pauses.append(time.perf_counter() - began[0])

        gc.callbacks.append(note)
        stalls: list[float] = []
        ticking = True

        async def ticker() -> None:  # how late the loop wakes (as tools/bench/concurrent.py)
            loop = asyncio.get_running_loop()
            while ticking:
                before = loop.time()
                await asyncio.sleep(TICK)
                stalls.append(max(0.0, loop.time() - before - TICK))

        tick = asyncio.create_task(ticker())
        tasks = []
        started = time.perf_counter()
        for n in range(total):
            delay = started + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(n)))
        issued = time.perf_counter() - started
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        gc.callbacks.remove(note)
        ticking = False
        await tick
        return {
            "gc": pauses, "stalls": stalls, "applies": applies,
            "commits": total, "offered": total / issued if issued else rate, "achieved": total / elapsed,
            "commit_latency": commit_latency, "lags": lags, "errors": errors,
        }
    finally:
        if replica is not None:
            await replica.close()
        await writer.close()
        shutil.rmtree(writer_dir, ignore_errors=True)
        shutil.rmtree(replica_dir, ignore_errors=True)


# ── part 3: catch-up and restore ─────────────────────────────────────────────


async def fill(urls: list[str], base: str, records: int) -> tuple[str, float, int]:
    """A replicated store of ``records`` records (64 committers); returns its id, commits/s and
    the size of one turn's record."""

    from pi_durable_lmdb.storage import LmdbStorage

    path = tempfile.mkdtemp(dir=base, prefix="fill-")
    writer = await LmdbStorage.open(path, durability="replicated", nats=urls, stream=STREAM, replicas=3)
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


async def snapshot_restore(urls: list[str], base: str, records: int, tail: int, runs: int) -> dict[str, Any]:
    """A store of ``records`` records whose snapshot was taken ``tail`` records before its end
    (``durable-log snapshot``'s ``take_snapshot``), then ``restore()`` into fresh directories:
    the newest snapshot that verifies plus the log after it."""

    from pi_durable_lmdb.storage import LmdbStorage
    from pi_durable_lmdb.audit.restore import restore
    from pi_durable_lmdb.storage.snapshot import take_snapshot
    from pi_durable_lmdb.audit.tail import open_stream

    path = tempfile.mkdtemp(dir=base, prefix="snapshot-fill-")
    out: dict[str, Any] = {"records": records, "tail": tail, "restores": []}
    try:
        writer = await LmdbStorage.open(path, durability="replicated", nats=urls, stream=STREAM, replicas=3)
        try:
            ids = Ids()
            owned = await own(writer, ids, 64)
            started = time.perf_counter()
            await _turns(writer, ids, owned, records - tail - writer.log.head())
            out["fill_rate"] = (records - tail) / (time.perf_counter() - started)
            store = writer.store_id
            _log(f"  filled {writer.log.head():,} records at {out['fill_rate']:,.0f}/s")
            link = await open_stream(urls, STREAM)
            try:
                report = await take_snapshot(path, link)
            finally:
                await asyncio.to_thread(link.close)
            out["snapshot"] = {"seconds": report.seconds, "size": report.size, "stored": report.stored, "seq": report.seq}
            _log(f"  snapshot at record {report.seq:,}: {report.size / 1e6:,.0f} MB as {report.stored / 1e6:,.0f} MB "
                 f"in {report.seconds:.1f} s")
            await _turns(writer, ids, owned, records - writer.log.head())
        finally:
            await writer.close()
        shutil.rmtree(path, ignore_errors=True)
        for run in range(runs):
            target = os.path.join(tempfile.mkdtemp(dir=base, prefix="snapshot-restore-"), "store")
            started = time.perf_counter()
            head = await restore(urls, STREAM, store, target)
            elapsed = time.perf_counter() - started
            if head != records:
                raise RuntimeError(f"the restored store holds {head} records, not {records}")
            out["restores"].append(elapsed)
            _log(f"  restore with a snapshot {tail:,} records old: {elapsed:.2f} s")
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
    writer = await LmdbStorage.open(path, durability="replicated", nats=urls, stream=STREAM, store=store)
    try:
        elapsed = time.perf_counter() - started
        if writer.log.head() != records:
            raise RuntimeError(f"the restored store holds {writer.log.head()} records, not {records}")
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
            path, durability="replicated", nats=urls.split(","), stream=STREAM, replicas=3, lease_ttl=ttl
        )
        ids = Ids()
        [(conversation_id, task_id)] = await own(storage, ids, 1)
        await storage.commit(turn(ids, conversation_id, task_id, 1), CTX)
        print(json.dumps({"store": storage.store_id, "conversation": conversation_id, "task": task_id}), flush=True)
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
    child = _spawn(
        module_command("tools.bench.replication", "--child-writer", old_dir, ",".join(urls), str(ttl)),
        stdout=subprocess.PIPE, stderr=errors, text=True, env=module_env(),
    )
    errors.close()
    new = None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the child writer exited with {child.wait()} (see {base}/failover-child.log)")
        info = json.loads(line)
        await asyncio.sleep(random.uniform(0.3, 1.0))  # kill at any phase of its lease renewals
        killed = time.perf_counter()
        child.send_signal(signal.SIGKILL)
        await asyncio.to_thread(child.wait)
        new = await LmdbStorage.open(
            new_dir, durability="replicated", nats=urls, stream=STREAM, store=info["store"],
            take_over=True, lease_ttl=ttl,
        )
        opened = time.perf_counter()
        head = new.log.head()
        ids = Ids()
        ids.next = 10_000_000 + 1000 * run
        await new.commit(turn(ids, info["conversation"], info["task"], 1_000_000), CTX)
        done = time.perf_counter()
        return {"total": done - killed, "open": opened - killed, "commit": done - opened, "taken_in": head}
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
    "catch_up": (measure_catch_up, "catch-up: `open_replica` (fresh directory) until its log holds them all", True),
    "restore": (measure_restore, "restore: `audit.restore.restore()` into a new directory", True),
    "writer_take_in": (measure_writer_take_in, "a replicated writer `open`ed in a fresh directory on the store id "
                       "(takes the stream in before it returns)", False),
}
if _restore_function() is None:
    del RECOVERY["restore"]


# ── where the time goes (--breakdown) ────────────────────────────────────────


async def breakdown(urls: list[str], base: str, store: str, args: argparse.Namespace) -> dict[str, Any]:
    """Instrumented runs, after the measured rounds: the replicated commit's group split into
    the publish (``StreamWriter._send``, on the writer thread, waiting for the stream) and the
    rest of the group (checks, fold, LMDB commit and syncs); replica lag by the replica's
    durability; and catch-up split into its stages (``breakdown_catch_up``)."""

    from pi_durable_lmdb.storage import LmdbStorage

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
            "commit_p50": figures["p50"], "rate": figures["rate"], "groups": len(runs),
            "size": statistics.median(size for _, size in sends),
            "group": _percentile(runs, 0.5), "publish": _percentile([t for t, _ in sends], 0.5),
            "local": _percentile([r - t for r, (t, _) in zip(runs, sends)], 0.5),
        }
    for _ in range(3 if "lag" in args.parts else 0):
        for durability in ("power", "process"):
            lag = await measure_lag(urls, base, 3.0, args.lag_rate, durability, instrument=True)
            out["lag"][durability].append(lag)
    if "recovery" in args.parts:
        out.update(await breakdown_catch_up(urls, base, store, args))
    return out


async def breakdown_catch_up(urls: list[str], base: str, store: str, args: argparse.Namespace) -> dict[str, Any]:
    """Catch-up split into its stages, each alone, wall-clock and this process's CPU per record:
    nats-py's ordered consumer alone, ``parse_message`` (after nats-py's ``msg.metadata``), the
    fold (``Follower._apply``, chunks of 1,024); and, where the tree has them, batched pull
    requests alone (``link.fetch``, 4,096 a batch), ``parse_message`` of what they return, and the
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
        out[name] = ((time.perf_counter() - clocks[0]) / count, (time.process_time() - clocks[1]) / count)

    subject = subject_of(STREAM, store)
    nc = await nats.connect(servers=urls)
    try:
        js = nc.jetstream(timeout=5)
        messages: list[Any] = []
        done = asyncio.Event()
        last = str(args.records)

        async def take(msg: Any) -> None:
            messages.append(msg)
            if msg.headers and msg.headers.get("Pd-Kind") == "record" and msg.headers.get("Pd-Seq") == last:
                done.set()

        start()
        sub = await js.subscribe(
            subject, stream=STREAM, cb=take, ordered_consumer=True, idle_heartbeat=0.5,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1, filter_subject=subject),
            pending_msgs_limit=65536, pending_bytes_limit=256 * 1024 * 1024,
        )
        await asyncio.wait_for(done.wait(), 300)
        stop("consume", len(messages))
        await sub.unsubscribe()
    finally:
        await nc.close()
    start()
    parsed = [parse_message(STREAM, m.metadata.sequence.stream, m.headers, m.data, store) for m in messages]
    stop("parse", len(parsed))
    del messages
    await _fold_stage(out, start, stop, base, store, parsed, 1024, ("power", "process"), args.records)
    from pi_durable_lmdb.audit.tail import open_stream

    link = await open_stream(urls, STREAM)
    try:
        if hasattr(link, "fetch"):
            raws: list[Any] = []
            start()
            while batch := await link.arun(link.fetch(subject, raws[-1].stream_seq if raws else 0, batch=4096)):
                raws.extend(batch)
            stop("fetch", len(raws))
            start()
            for raw in raws:  # each decoded record dropped at once, as a catch-up does
                parse_message(STREAM, raw.stream_seq, raw.headers, raw.data, store)
            stop("parse_raw", len(raws))
            path = tempfile.mkdtemp(dir=base, prefix="breakdown-take-")
            storage = await LmdbStorage.open(path, durability="process", store=store)
            try:
                follower = Follower(argparse.Namespace(stream=STREAM, loop=asyncio.get_running_loop()), storage, store)  # type: ignore[arg-type]
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
    out: dict[str, Any], start: Any, stop: Any, base: str, store: str, parsed: list[Any], chunk: int,
    modes: tuple[str, ...], records: int, suffix: str = "",
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


# ── the run ──────────────────────────────────────────────────────────────────


def _spread(total: int, rounds: int, round: int) -> int:
    return total // rounds + (1 if round < total % rounds else 0)


async def main_async(args: argparse.Namespace, base: str) -> dict[str, Any]:
    cluster = Cluster(os.path.join(base, "cluster"))
    os.makedirs(cluster.base)
    cluster.start()
    try:
        await cluster.ready()
        _log(f"cluster up at {', '.join(cluster.urls)}")
        urls = cluster.urls
        results: dict[str, Any] = {"commits": {}, "raw": [], "lag": [], "failover": [], "urls": urls,
                                   "source": _source_version(), **{key: [] for key in RECOVERY}}
        parts = args.parts
        store = ""
        if parts & {"commits", "recovery"}:  # the store recovered, and the record size of the raw publishes
            _log(f"filling a store with {args.records:,} records (64 committers)")
            store, rate, size = await fill(urls, base, args.records)
            results["fill_rate"], results["record_size"] = rate, size
            _log(f"  {rate:,.0f} commits/s")
        load = os.getloadavg()[0]
        started = time.perf_counter()
        for round in range(args.rounds):
            for committers in COMMITTERS if "commits" in parts else ():
                for backend in _rotated(BACKENDS, round):
                    figures = await measure_commits(backend, committers, args.commits, base, urls)
                    results["commits"].setdefault((backend, committers), []).append(figures)
                    _log(f"round {round} {LABEL[backend]:>16} committers={committers:<3} {figures['rate']:>8,.0f}/s "
                         f"p50 {figures['p50'] * 1e3:6.2f} ms p99 {figures['p99'] * 1e3:6.2f} ms")
            if "commits" in parts:
                raw = await raw_publish(urls, args.raw, size)
                results["raw"].extend(raw)
                _log(f"round {round} raw js.publish p50 {_percentile(raw, 0.5) * 1e3:.2f} ms")
            if "lag" in parts:
                lag = await measure_lag(urls, base, args.lag_seconds / args.rounds, args.lag_rate)
                results["lag"].append(lag)
                _log(
                    f"round {round} lag at {lag['achieved']:,.0f}/s: p50 {_percentile(lag['lags'], 0.5) * 1e3:.2f} ms "
                    f"p99 {_percentile(lag['lags'], 0.99) * 1e3:.2f} ms ({len(lag['errors'])} errors); loop stall p99 "
                    f"{_percentile(lag['stalls'], 0.99) * 1e3:.2f} ms max {max(lag['stalls'], default=0) * 1e3:.1f} ms; "
                    f"load {os.getloadavg()[0]:.1f}"
                )
            for key in _rotated(tuple(RECOVERY), round) if "recovery" in parts else ():
                cpu, servers = time.process_time(), cluster.cpu()
                seconds = await RECOVERY[key][0](urls, base, store, args.records)
                cpu, servers = time.process_time() - cpu, cluster.cpu() - servers
                results[key].append(seconds)
                results.setdefault(f"{key}_cpu", []).append((cpu, servers))
                _log(f"round {round} {key}: {args.records / seconds:,.0f} records/s; CPU per record "
                     f"{cpu / args.records * 1e6:.1f} µs here, {servers / args.records * 1e6:.1f} µs in the servers")
            for _ in range(_spread(args.failovers, args.rounds, round) if "failover" in parts else 0):
                figures = await measure_failover(urls, base, args.lease_ttl, len(results["failover"]))
                results["failover"].append(figures)
                _log(f"round {round} failover {figures['total']:.2f} s (open {figures['open']:.2f} s, "
                     f"commit {figures['commit'] * 1e3:.1f} ms, {figures['taken_in']} records taken in)")
        results["elapsed"] = time.perf_counter() - started
        if "snapshot" in parts:
            _log(f"a store of {args.snapshot_records:,} records with a snapshot {args.snapshot_tail:,} records before its end")
            results["snapshot"] = await snapshot_restore(urls, base, args.snapshot_records, args.snapshot_tail, args.rounds)
        if args.breakdown:
            results["breakdown"] = await breakdown(urls, base, store, args)
        results["source_end"] = _source_version()
        results["load"] = (load, os.getloadavg()[0])
        return results
    finally:
        cluster.stop()


# ── reporting ────────────────────────────────────────────────────────────────


def _ms(seconds: float) -> str:
    return _fmt_time(seconds)


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(results: dict[str, Any], args: argparse.Namespace, command: str) -> str:
    lines = [
        f"Command: `{command}`  ",
        f"Engine: git {results['source']}"
        + ("" if results["source_end"] == results["source"] else f" at the start, {results['source_end']} at the end")
        + "  ",
        f"Machine: {os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}; 3 nats-server "
        f"({_nats_version()}) on loopback, same machine; {args.rounds} rounds, {args.commits} commits per run; "
        f"rounds took {results['elapsed']:.0f} s; load average {results['load'][0]:.1f} at the start, "
        f"{results['load'][1]:.1f} at the end (other work shares the machine)",
    ]
    targets: list[tuple[str, str, str, bool]] = []
    if "commits" in args.parts:
        lines += render_commits(results, targets)
    if "lag" in args.parts:
        lines += render_lag(results, args, targets)
    if "recovery" in args.parts:
        lines += render_recovery(results, args, targets)
    if "failover" in args.parts:
        lines += render_failover(results, args, targets)
    if "snapshot" in args.parts:
        lines += render_snapshot(results)
    if "commits" in args.parts:
        lines += render_context(results, args)
    if "breakdown" in results:
        lines += render_breakdown(results, args)
    lines += [
        "### Targets",
        "",
        "| target | goal | measured | met |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {goal} | {measured} | {_met(ok)} |" for name, goal, measured, ok in targets]
    return "\n".join(lines) + "\n"


def render_commits(results: dict[str, Any], targets: list[tuple[str, str, str, bool]]) -> list[str]:
    commits = results["commits"]
    lines = [
        "",
        "### Commits (turn: an entry + its task per commit; fresh store per run)",
        "",
        "Median over rounds of each run's p50 / p99 / commits/s; range = min–max over rounds of commits/s.",
        "",
        "| committers | backend | p50 | p99 | commits/s | range |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for committers in COMMITTERS:
        for backend in BACKENDS:
            runs = commits[(backend, committers)]
            rates = [run["rate"] for run in runs]
            lines.append(
                f"| {committers} | {LABEL[backend]} | {_ms(statistics.median(r['p50'] for r in runs))} "
                f"| {_ms(statistics.median(r['p99'] for r in runs))} | {statistics.median(rates):,.0f} "
                f"| {min(rates):,.0f}–{max(rates):,.0f} |"
            )

    def paired(backend: str, other: str, committers: int, key: str) -> list[float]:
        return [mine[key] / theirs[key] for mine, theirs in zip(commits[(backend, committers)], commits[(other, committers)])]

    for committers in COMMITTERS:
        ratios = paired(REPLICATED, "lmdb", committers, "p50")
        median = statistics.median(ratios)
        targets.append((f"replicated p50 vs local power p50, {committers} committer{'s' if committers > 1 else ''}",
                        "<= 2x", f"{median:.2f}x [{min(ratios):.2f}–{max(ratios):.2f}]", median <= 2.0))
    ratios = paired(REPLICATED, "sqlite", 64, "rate")
    median = statistics.median(ratios)
    targets.append(("replicated commits/s vs SQLite FULL, 64 committers", ">= 2x",
                    f"{median:.2f}x [{min(ratios):.2f}–{max(ratios):.2f}]", median >= 2.0))
    ratios = paired(REPLICATED, "sqlite", 1, "rate")
    lines += ["", f"(Paired per round, median [min–max]. For reference, 1 committer: replicated commits/s vs "
                  f"SQLite FULL {statistics.median(ratios):.2f}x; replicated vs local power "
                  f"{statistics.median(paired(REPLICATED, 'lmdb', 1, 'rate')):.2f}x.)"]
    return lines


def render_lag(results: dict[str, Any], args: argparse.Namespace, targets: list[tuple[str, str, str, bool]]) -> list[str]:
    lag_all = [value for lag in results["lag"] for value in lag["lags"]]
    commit_all = [value for lag in results["lag"] for value in lag["commit_latency"]]
    errors = [error for lag in results["lag"] for error in lag["errors"]]
    per_round_p99 = [_percentile(lag["lags"], 0.99) for lag in results["lag"]]
    gcs = [pause for lag in results["lag"] for pause in lag["gc"]]
    stall_all = [stall for lag in results["lag"] for stall in lag["stalls"]]
    lines = [
        "",
        f"### Replica lag (paced writer, {args.lag_rate:,.0f} commits/s offered, open loop; replica in the same process)",
        "",
        "From `commit()` returning on the writer to `replica.wait(seq)` returning; all rounds pooled. Loop stall: "
        "how late a task sleeping 1 ms at a time woke on the event loop that runs the commits and the waits "
        "(`tools/bench/concurrent.py`'s ticker); full GCs: generation-2 collections meanwhile (`gc.callbacks`).",
        "",
        "| commits | offered | achieved | writer commit p50 / p99 | lag p50 | lag p99 | lag max | p99 per round "
        "| loop stall p99 / max | full GCs meanwhile (count, longest) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        f"| {sum(lag['commits'] for lag in results['lag']):,} "
        f"| {statistics.median(lag['offered'] for lag in results['lag']):,.0f}/s "
        f"| {statistics.median(lag['achieved'] for lag in results['lag']):,.0f}/s "
        f"| {_ms(_percentile(commit_all, 0.5))} / {_ms(_percentile(commit_all, 0.99))} "
        f"| {_ms(_percentile(lag_all, 0.5))} | {_ms(_percentile(lag_all, 0.99))} | {_ms(max(lag_all, default=0))} "
        f"| {', '.join(_ms(v) for v in per_round_p99)} (median {_ms(statistics.median(per_round_p99))}) "
        f"| {_ms(_percentile(stall_all, 0.99))} / {_ms(max(stall_all, default=0.0))} "
        f"| {len(gcs)}, {_ms(max(gcs, default=0.0))} |",
    ]
    if errors:
        lines += ["", f"{len(errors)} waits failed, first: {errors[0]}"]
    lag_p99 = _percentile(lag_all, 0.99)
    targets.append((f"replica lag p99 at {args.lag_rate:,.0f} commits/s (all rounds pooled)", "<= 50 ms",
                    f"{_ms(lag_p99)} (per round: median {_ms(statistics.median(per_round_p99))}, "
                    f"worst {_ms(max(per_round_p99))})", lag_p99 <= 0.050 and not errors))
    return lines


def render_recovery(results: dict[str, Any], args: argparse.Namespace, targets: list[tuple[str, str, str, bool]]) -> list[str]:
    n = args.records
    lines = [
        "",
        f"### Catch-up and restore ({n:,} records of one store on the stream; fresh directory each time)",
        "",
        "CPU per record: this process's CPU time (user + system, every thread) and the three servers' "
        "(from /proc), divided by the records, median over runs: on a shared machine a steadier measure "
        "of the work than the wall-clock rate.",
        "",
        "| what | runs | seconds (median) | records/s (median) | range | CPU per record: here / servers |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, (_measure, what, target) in RECOVERY.items():
        if not results[key]:
            continue
        rates = [n / seconds for seconds in results[key]]
        cpu = results.get(f"{key}_cpu", [(0.0, 0.0)])
        lines.append(f"| {what} | {len(rates)} | {statistics.median(results[key]):.2f} | "
                     f"{statistics.median(rates):,.0f} | {min(rates):,.0f}–{max(rates):,.0f} "
                     f"| {statistics.median(c for c, _ in cpu) / n * 1e6:.1f} µs / "
                     f"{statistics.median(s for _, s in cpu) / n * 1e6:.1f} µs |")
        if target:
            targets.append((f"{key.replace('_', '-')} rate", ">= 50,000 records/s", f"{statistics.median(rates):,.0f}/s",
                            statistics.median(rates) >= 50_000))
    lines.append("")
    return lines


def render_snapshot(results: dict[str, Any]) -> list[str]:
    out = results["snapshot"]
    snap, restores = out["snapshot"], out["restores"]
    return [
        "",
        f"### Restore from a snapshot ({out['records']:,} records; the snapshot holds all but the last {out['tail']:,})",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| filling the store (replicated, 64 committers) | {out['fill_rate']:,.0f} commits/s |",
        f"| taking the snapshot (compacting copy, zstd, upload to the R3 object store) | {snap['seconds']:.1f} s |",
        f"| snapshot: the copy / the object | {snap['size'] / 1e6:,.1f} MB / {snap['stored'] / 1e6:,.1f} MB |",
        f"| `restore()`: newest snapshot that verifies + the log after it, {len(restores)} runs, median (min–max) "
        f"| {statistics.median(restores):.2f} s ({min(restores):.2f}–{max(restores):.2f} s) |",
        "",
    ]


def render_failover(results: dict[str, Any], args: argparse.Namespace, targets: list[tuple[str, str, str, bool]]) -> list[str]:
    runs = results["failover"]
    totals = [run["total"] for run in runs]
    lines = [
        "",
        f"### Failover (writer SIGKILLed in a child process -> first commit on a new writer, take_over=True, "
        f"lease_ttl={args.lease_ttl})",
        "",
        "| runs | p50 | max | min | open (lease wait + fence + take-in) p50 | first commit p50 | records taken in (median) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {len(runs)} | {statistics.median(totals):.2f} s | {max(totals):.2f} s | {min(totals):.2f} s "
        f"| {statistics.median(run['open'] for run in runs):.2f} s | {_ms(statistics.median(run['commit'] for run in runs))} "
        f"| {statistics.median(run['taken_in'] for run in runs):,.0f} |",
    ]
    limit = args.lease_ttl + 1
    targets.append((f"failover (kill -> first commit), max of {len(runs)}", f"<= {limit} s (TTL + 1 s)",
                    f"p50 {statistics.median(totals):.2f} s, max {max(totals):.2f} s", max(totals) <= limit))
    return lines


def render_context(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    n = args.records
    raw = results["raw"]
    lines = [
        "",
        "### Context",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| raw nats-py `await js.publish()` to an R3 stream, {results['record_size']:,} B, one at a time: p50 / p99 "
        f"({len(raw):,} publishes) | {_ms(_percentile(raw, 0.5))} / {_ms(_percentile(raw, 0.99))} |",
        f"| filling the {n:,}-record store, replicated, 64 committers | {results['fill_rate']:,.0f} commits/s |",
        "",
        "Every replicated writer holds the store's lease (renewed every ttl / 3 s on the link's loop, "
        "checked before each publish): there is no replicated writer without one, so the cost of the "
        "lease is inside the replicated figures and is not reported separately.",
        "",
    ]
    return lines


def render_breakdown(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    n = args.records
    parts = results["breakdown"]
    lines = ["### Where the time goes (`--breakdown`: instrumented runs after the rounds)", ""]
    if parts["groups"]:
        lines += [
            "| committers | commit p50 | commits/s | groups | batches per group (median) | group on the writer thread p50 "
            "| of which publish (`_send`) p50 | rest of the group (checks, fold, LMDB commit + 2 syncs) p50 |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for committers, group in parts["groups"].items():
            lines.append(
                f"| {committers} | {_ms(group['commit_p50'])} | {group['rate']:,.0f} | {group['groups']:,} | {group['size']:.0f} "
                f"| {_ms(group['group'])} | {_ms(group['publish'])} | {_ms(group['local'])} |"
            )
        lines.append("")
    if "consume" in parts:
        def stage(key: str) -> str:
            wall, cpu = parts[key]
            return f"{wall * 1e6:.1f} µs ({cpu * 1e6:.1f} µs CPU)"

        lines += [
            f"Catch-up per record ({n:,} records), each stage alone, wall-clock (this process's CPU): "
            f"nats-py ordered consumer alone (callback, headers parsed) {stage('consume')}; nats-py's `msg.metadata` + "
            f"`parse_message` (headers, CRC, decompress, decode) {stage('parse')}; the fold (`Follower._apply`, chunks "
            f"of 1,024, one transaction each) {stage('apply_power')} (`power` replica), {stage('apply_process')} (`process`)."
            + (f" Batched pull requests alone (`link.fetch`, 4,096 a batch) {stage('fetch')}; `parse_message` of what "
               f"they return, each decoded record dropped at once {stage('parse_raw')}; checked and folded as a catch-up "
               f"does (`Follower._take_raw`: each message checked just before it is folded, 4,096 a transaction) "
               f"{stage('take_raw')} (`process`). The stages with a decoded batch held whole (the first two) pay for "
               "the garbage collector walking it."
               if "fetch" in parts else "")
            + " 50,000 records/s is 20 µs a record.",
            "",
        ]
    if any(parts["lag"].values()):
        lines += [
            f"Replica lag by the replica's durability (3 s segments at {args.lag_rate:,.0f} commits/s, alternating "
            "power/process, 3 each; a transaction = one chunk the replica took in):",
            "",
            "| replica | lag p50 | lag p99 | lag max | transactions | records per transaction p50 / max "
            "| transaction p50 / p99 / max | loop stall p99 / max |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for durability, segments in parts["lag"].items():
            lags = [value for lag in segments for value in lag["lags"]]
            applies = [apply for lag in segments for apply in lag["applies"]]
            times = [seconds for seconds, _ in applies]
            sizes = [size for _, size in applies]
            stalls = [stall for lag in segments for stall in lag["stalls"]]
            lines.append(
                f"| {durability} | {_ms(_percentile(lags, 0.5))} | {_ms(_percentile(lags, 0.99))} | {_ms(max(lags, default=0.0))} "
                f"| {len(applies):,} | {_percentile(sizes, 0.5):.0f} / {max(sizes, default=0):,} "
                f"| {_ms(_percentile(times, 0.5))} / {_ms(_percentile(times, 0.99))} / {_ms(max(times, default=0.0))} "
                f"| {_ms(_percentile(stalls, 0.99))} / {_ms(max(stalls, default=0.0))} |"
            )
        lines.append("")
    return lines


def _nats_version() -> str:
    try:
        return subprocess.run([NATS_SERVER, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "nats-server"


# ── command line ─────────────────────────────────────────────────────────────


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, 300 commits, 3 failovers")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; --quick 2)")
    parser.add_argument("--commits", type=int, default=None, help="commits per latency run (default 1500; --quick 300)")
    parser.add_argument("--failovers", type=int, default=None, help="failover runs in all (default 20; --quick 3)")
    parser.add_argument("--records", type=int, default=None, help="records for catch-up/restore (default 20000; --quick 5000)")
    parser.add_argument("--lag-seconds", type=float, default=None, help="paced-writer seconds in all (default 20; --quick 4)")
    parser.add_argument("--lag-rate", type=float, default=1000.0, help="paced writer commits/s (default 1000)")
    parser.add_argument("--lease-ttl", type=int, default=2, help="lease TTL in the failover runs (default 2)")
    parser.add_argument("--raw", type=int, default=None, help="raw publishes per round (default 500; --quick 200)")
    parser.add_argument("--breakdown", action="store_true", help="also instrumented runs: where the time goes")
    parser.add_argument("--snapshot-records", type=int, default=None,
                        help="records of the store restored from a snapshot (default 100000; --quick 20000)")
    parser.add_argument("--snapshot-tail", type=int, default=1000,
                        help="records committed after its snapshot was taken (default 1000)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--dir", help="parent of the temporary directory (default: the system temp dir)")
    parser.add_argument("--child-writer", nargs=3, metavar=("PATH", "URLS", "TTL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if not args.parts or not args.parts <= set(PARTS):
        parser.error(f"--parts takes a comma-separated list of {', '.join(PARTS)}")
    if args.child_writer:
        path, urls, ttl = args.child_writer
        child_writer(path, urls, int(ttl))
        return 0
    quick = args.quick
    for name, full, short in (("rounds", 5, 2), ("commits", 1500, 300), ("failovers", 20, 3), ("records", 20_000, 5_000),
                              ("lag_seconds", 20.0, 4.0), ("raw", 500, 200),
                              ("snapshot_records", 100_000, 20_000)):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else full)
    if not os.path.exists(NATS_SERVER):
        parser.error(f"no nats-server at {NATS_SERVER}")
    signal.signal(signal.SIGTERM, _terminate)
    base = tempfile.mkdtemp(prefix="bench-replication-", dir=args.dir)
    try:
        results = asyncio.run(main_async(args, base))
    finally:
        _kill_started()
        shutil.rmtree(base, ignore_errors=True)
    command = "python -m tools.bench.replication" + ("" if argv is None and len(sys.argv) == 1 else " " + " ".join(sys.argv[1:] if argv is None else argv))
    print(render(results, args, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
