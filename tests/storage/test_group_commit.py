"""Group commit: many commits at once, from one loop or from several threads each with its own.

Concurrent commits share write transactions (``storage.committer``); each must still get its own
sequence in log order, be checked against the batches before it, fail alone when rejected, and
never be lost once acknowledged. The final store is compared with pi-durable's ``MemoryStorage``
fed the accepted batches in sequence order.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.json import FrozenDict, FrozenList
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log import encode_batch, write_to_builtins
from pi_durable_lmdb.log.records import encode_record
from pi_durable_lmdb.storage import LmdbStorage

from tests.support.compare import REFUSALS

from ..support.compare import canonical
from ..support.polling import until_async
from ..support.workload import Workload, snapshot


def _entry(id: int, conversation: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "type": "entry",
        "value": {"id": id, "conversationId": conversation, "kind": "message", **extra},
    }


def _in_threads(count: int, body: Callable[[int], Coroutine[Any, Any, None]]) -> None:
    """Run ``body(n)`` on ``count`` threads, each in an event loop of its own; re-raise the first
    failure."""

    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            asyncio.run(body(n))
        except BaseException as error:  # noqa: BLE001 - re-raised once the threads are joined
            errors.append(error)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive(), "a committing thread hung"
    if errors:
        raise errors[0]


def _log_entries(storage: LmdbStorage) -> dict[int, list[int]]:
    """Sequence -> the entry ids its record holds, read from the log itself."""

    out: dict[int, list[int]] = {}
    for commit in storage.log.read():
        out[commit.seq] = [
            write_to_builtins(w)["value"]["id"]
            for w in commit.writes
            if write_to_builtins(w)["type"] == "entry"
        ]
    return out


def _fork_memory(memory: MemoryStorage) -> MemoryStorage:
    """An independent copy of a ``MemoryStorage`` (its frozen values are shared: immutable)."""

    memo: dict[int, Any] = {}

    def share_frozen(value: Any) -> None:
        if isinstance(value, (FrozenDict, FrozenList)):
            memo[id(value)] = value
        elif isinstance(value, dict):
            for item in value.values():
                share_frozen(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                share_frozen(item)
        elif dataclasses.is_dataclass(value):
            for field in dataclasses.fields(value):
                share_frozen(getattr(value, field.name))

    share_frozen(memory._state)
    return copy.deepcopy(memory, memo)


# ── issue #12, item 1: a second thread ──────────────────────────────────────


@pytest.mark.parametrize("durability", ["process", "power"])
def test_two_threads_with_their_own_loops_lose_no_acknowledged_commit(
    tmp_path: Path, durability: str
) -> None:
    """Two threads, each with its own event loop, 300 one-entry commits each on one store:
    every acknowledged commit is in the log under its sequence, and the store verifies."""

    path = str(tmp_path / "store")
    storage = asyncio.run(LmdbStorage.open(path, durability=durability))
    asyncio.run(storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX))
    acked: dict[int, int] = {}
    lock = threading.Lock()

    async def committer(n: int) -> None:
        for i in range(300):
            id = 1000 + n * 1000 + i
            seq = await storage.commit([_entry(id)], CTX)
            with lock:
                assert seq not in acked, f"sequence {seq} acknowledged twice"
                acked[seq] = id

    _in_threads(2, committer)
    assert len(acked) == 600
    logged = _log_entries(storage)
    assert sorted(logged) == list(range(1, 602)), "the log's sequences are not contiguous"
    for seq, id in acked.items():
        assert logged[seq] == [id], f"acknowledged sequence {seq} ({id}) holds {logged.get(seq)}"
        read = asyncio.run(storage.entry(id, CTX))
        assert read is not None and read["commitSeq"] == seq
    asyncio.run(storage.close())
    assert verify(path) is None


def test_threads_and_loops_mixing_commits_mint_id_and_reads(tmp_path: Path) -> None:
    """Four threads (each its own loop, several tasks each) mint ids, commit, and read their own
    writes back at once: ids never repeat, every commit is visible when acknowledged, in the
    log under its sequence, and survives reopening; a fresh mint is above everything handed out."""

    path = str(tmp_path / "store")
    storage = asyncio.run(LmdbStorage.open(path, durability="power"))
    asyncio.run(storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX))
    minted: list[int] = []
    acked: dict[int, list[int]] = {}
    lock = threading.Lock()

    async def agent(n: int, k: int) -> None:
        rng = random.Random(n * 100 + k)
        for turn in range(40):
            ids = [await storage.mint_id() for _ in range(rng.randint(1, 3))]
            with lock:
                minted.extend(ids)
            if rng.random() < 0.3:  # some ids are minted and never used
                continue
            seq = await storage.commit([_entry(id, data={"n": n, "turn": turn}) for id in ids], CTX)
            for id in ids:  # read-your-writes, right after the acknowledgement
                read = await storage.entry(id, CTX)
                assert read is not None and read["commitSeq"] == seq, (id, seq, read)
            # Other threads mint between two mints of one agent: their entries may lie between.
            between: list[int] = []
            cursor = None
            while True:
                page = await storage.scan_entries(
                    {"conversationId": 1, "minEntryId": ids[0], "maxEntryId": ids[-1]},
                    50,
                    cursor,
                    CTX,
                )
                between += [entry["id"] for entry in page["items"]]
                cursor = page.get("next")
                if cursor is None:
                    break
            assert between == sorted(between, reverse=True)
            assert [id for id in between if id in ids] == sorted(ids, reverse=True)
            with lock:
                assert seq not in acked
                acked[seq] = ids

    async def thread(n: int) -> None:
        await asyncio.gather(*(agent(n, k) for k in range(4)))

    try:
        _in_threads(4, thread)
        assert len(minted) == len(set(minted)), "mint_id handed out an id twice"
        logged = _log_entries(storage)
        for seq, ids in acked.items():
            assert logged[seq] == ids
        assert len(logged) == len(acked) + 1
    finally:
        asyncio.run(storage.close())  # a failure here leaves no writer thread to the next test
    assert verify(path) is None

    async def reopened() -> int:
        again = await LmdbStorage.open(path)
        try:
            return await again.mint_id()
        finally:
            await again.close()

    assert asyncio.run(reopened()) > max(minted)


# ── one loop, many agents ───────────────────────────────────────────────────


@pytest.mark.parametrize("durability", ["process", "power"])
async def test_concurrent_commits_with_rejections_match_memory_storage(
    tmp_path: Path, durability: str
) -> None:
    """24 agents commit 240 random batches at once, a fifth of them repeating an earlier batch (so
    rejections mix in, some against a batch of the same group). Every rejection is one
    ``MemoryStorage`` also gives, at a point between the commit's start and its failure; the
    accepted batches, fed to ``MemoryStorage`` in sequence order, get the same sequences and
    leave a store that answers every read the same."""

    seed = random.randrange(2**32)
    work = Workload(seed)
    batches: list[list[dict[str, Any]]] = []
    rng = random.Random(seed)
    while len(batches) < 240:
        if batches and rng.random() < 0.2:
            batches.append(copy.deepcopy(rng.choice(batches[-12:])))
        else:
            batches.append(work.batch())
    storage = await LmdbStorage.open(tmp_path / "store", durability=durability)
    accepted: dict[int, list[dict[str, Any]]] = {}
    rejected: list[tuple[int, int, list[dict[str, Any]], BaseException]] = []
    seq = await storage.commit(batches[0], CTX)  # the root conversation, first
    accepted[seq] = batches[0]
    queue = iter(batches[1:])

    async def agent() -> None:
        for writes in queue:
            before = storage.log.head()
            try:
                seq = await storage.commit(writes, CTX)
            except REFUSALS as error:
                rejected.append((before, storage.log.head(), writes, error))
            else:
                assert seq not in accepted
                accepted[seq] = writes

    await asyncio.gather(*(agent() for _ in range(24)))
    assert len(accepted) + len(rejected) == len(batches)
    assert sorted(accepted) == list(range(1, len(accepted) + 1))
    assert len(rejected) >= 10, f"seed {seed}: too few rejections to mean anything"

    memory = MemoryStorage()
    explained: set[int] = set()
    for count, seq in enumerate([0, *sorted(accepted)]):
        if seq:
            assert await memory.commit(copy.deepcopy(accepted[seq]), CTX) == seq
        for index, (low, high, writes, error) in enumerate(rejected):
            if index in explained or not low <= count <= high:
                continue
            probe = _fork_memory(memory)
            try:
                await probe.commit(copy.deepcopy(writes), CTX)
            except REFUSALS as expected:
                if type(expected) is type(error) and str(expected) == str(error):
                    explained.add(index)
    unexplained = [
        (writes, str(error))
        for index, (_, _, writes, error) in enumerate(rejected)
        if index not in explained
    ]
    assert not unexplained, f"seed {seed}: rejections MemoryStorage never gives: {unexplained[:3]}"
    head = storage.log.head()
    assert canonical(await snapshot(storage, work, head)) == canonical(
        await snapshot(memory, work, head)
    ), f"seed {seed}"
    await storage.close()
    assert verify(tmp_path / "store") is None


async def test_concurrent_commits_share_write_transactions(tmp_path: Path) -> None:
    """64 commits awaited at once take far fewer than 64 LMDB write transactions."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    before = storage._env.env.info()["last_txnid"]
    seqs = await asyncio.gather(*(storage.commit([_entry(100 + n)], CTX) for n in range(64)))
    transactions = storage._env.env.info()["last_txnid"] - before
    assert sorted(seqs) == list(range(2, 66))
    assert transactions <= 16, f"64 concurrent commits took {transactions} write transactions"
    for n, seq in enumerate(seqs):
        assert (await storage.entry(100 + n, CTX))["commitSeq"] == seq
    await storage.close()


@pytest.mark.parametrize("durability", ["process", "power"])
async def test_a_group_stores_each_record_as_it_is_stored_alone(
    tmp_path: Path, durability: str
) -> None:
    """Every record a group stores is byte for byte what ``encode_record`` makes of that batch
    alone, whichever form it takes (too short to compress: raw; compressed, small or long)."""

    rng = random.Random(23)
    texts = [
        "turn " * 40,  # compressed, a small value
        "a long message, " * 400,  # compressed, a long one
        "".join(chr(rng.randrange(0x20, 0xD7FF)) for _ in range(600)),  # compressed a little
    ]
    storage = await LmdbStorage.open(tmp_path / "store", durability=durability)
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    batches = [
        [{"type": "conversation", "value": {"id": 100 + n}}]  # too short to compress: kept raw
        if n % 4 == 3
        else [_entry(100 + n, text=texts[n % 4])]
        for n in range(48)
    ]
    at = [1_760_000_000_000 + n for n in range(len(batches))]
    before = storage._env.env.info()["last_txnid"]
    committer = storage._committer
    committer._lock.acquire()  # the store is busy: no commit may run on its caller's thread
    try:
        commits = [
            asyncio.ensure_future(storage.commit(batch, CTX, committed_at=when))
            for batch, when in zip(batches, at)
        ]
        await until_async(
            lambda: committer._unresolved == len(batches), timeout=60, what="every commit queued"
        )
    finally:
        committer._lock.release()
    seqs = await asyncio.gather(*commits)
    assert storage._env.env.info()["last_txnid"] - before < len(
        batches
    )  # groups, not one transaction each
    formats = set()
    with storage._env.read() as txn:
        for seq, batch, when in zip(seqs, batches, at):
            stored = storage.log.record(txn, seq)
            assert stored == encode_record(encode_batch(batch).payload, when), f"record {seq}"
            formats.add(msgspec.msgpack.decode(stored)[0])
    assert formats == {1, 3}
    await storage.close()
    assert verify(tmp_path / "store") is None


async def test_concurrent_power_commits_sync_off_the_loop(tmp_path: Path) -> None:
    """Eight agents committing at once in ``power`` mode: their groups run (and sync) on the
    writer thread while the loop keeps running other tasks between them."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="power")
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0)

    async def agent(n: int) -> None:
        for turn in range(20):
            await storage.commit([_entry(1000 * (n + 1) + turn)], CTX)

    task = asyncio.create_task(ticker())
    await asyncio.gather(*(agent(n) for n in range(8)))
    stop = True
    await task
    assert any(thread.name.startswith("lmdb-writer") for thread in threading.enumerate())
    assert ticks > 20, f"the loop ran {ticks} other steps during 160 concurrent synced commits"
    await storage.close()
    assert not any(thread.name.startswith("lmdb-writer") for thread in threading.enumerate())


# ── close under load ────────────────────────────────────────────────────────


@pytest.mark.parametrize("durability", ["process", "power"])
async def test_close_during_load_keeps_every_acknowledged_commit(
    tmp_path: Path, durability: str
) -> None:
    """32 agents (and a second thread) commit while the store is closed under them: every commit
    is either acknowledged and in the log after reopening, or refused as closed; the log holds
    nothing else, and close() returned only after the commits in flight resolved."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability=durability)
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    acked: dict[int, int] = {}
    refused = 0
    next_id = iter(range(100, 10**6))
    lock = threading.Lock()

    async def agent() -> None:
        nonlocal refused
        while True:
            id = next(next_id)
            try:
                seq = await storage.commit([_entry(id)], CTX)
            except RuntimeError as error:
                assert "closed" in str(error)
                with lock:
                    refused += 1
                return
            with lock:
                acked[seq] = id

    def other_thread() -> None:
        asyncio.run(agent())

    thread = threading.Thread(target=other_thread)
    agents = [asyncio.create_task(agent()) for _ in range(32)]
    thread.start()
    while len(acked) < 200:
        await asyncio.sleep(0.001)
    await storage.close()
    in_flight = [task for task in agents if not task.done()]
    await asyncio.gather(*agents)
    await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive()
    assert refused == 33
    assert len(in_flight) <= 32  # those still waiting when close returned were refused, not lost
    again = await LmdbStorage.open(path)
    logged = _log_entries(again)
    assert {seq: ids[0] for seq, ids in logged.items() if ids} == acked
    await again.close()
    assert verify(path) is None


async def test_a_direct_commit_waits_for_a_yielding_holder_which_lets_go_when_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user projection's chunk holds the lock through ``yielding()`` and ends when
    ``contended()``: a direct commit waits for it (no writer thread); an ``exclusive()`` holder
    (a rebuild) sends the commit to the writer thread instead, and it waits there. The wait is
    made longer than any load can stretch the holder's answer (2 ms in the package)."""

    from pi_durable_lmdb.storage import committer as committer_module

    monkeypatch.setattr(committer_module, "YIELD_WAIT", 30.0)
    storage = await LmdbStorage.open(tmp_path / "s", durability="process")
    committer = storage._committer
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        held, told = threading.Event(), threading.Event()

        def chunk() -> None:
            with committer.yielding():
                held.set()
                for _ in range(30_000):  # a fold checking after each record, 30 s at most
                    if committer.contended():
                        told.set()
                        break
                    threading.Event().wait(0.001)

        worker = threading.Thread(target=chunk)
        worker.start()
        held.wait(5)
        await storage.commit([_entry(2)], CTX)
        worker.join(5)
        assert told.is_set() and committer._thread is None, (
            "the commit waited directly, and the holder was told"
        )

        def rebuild_like() -> None:
            with committer.exclusive():
                held.set()
                threading.Event().wait(0.05)

        held.clear()
        worker = threading.Thread(target=rebuild_like)
        worker.start()
        held.wait(5)
        await storage.commit([_entry(3)], CTX)
        worker.join(5)
        assert committer._thread is not None, (
            "behind an exclusive() holder the commit went to the writer thread"
        )
    finally:
        await storage.close()
