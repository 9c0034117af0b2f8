"""Callers cancelled at any await point of ``commit``, ``mint_id`` and ``close``.

A commit whose caller is cancelled (``task.cancel()``, ``asyncio.wait_for`` timing out) while
it waits for its group may still be committed. It used to be committed without raising the id
floor, so ``mint_id()`` later handed out an id the store already held, and a task committed under
it silently replaced the stored one (pi-durable's ``MemoryStorage`` never hands out an id twice).
The rule tested here: a batch that entered the log has all its effects (the id floor, followers
woken), whatever happened to its caller, and a cancelled ``close()`` still closes the store.

Hypothesis chooses the operations, how many turns of the loop each caller gets before it is
cancelled (0 = before its first await), and whether it is cancelled by ``cancel()`` or by a
``wait_for`` timeout.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log import Durability


def task_write(id: int, status: str = "running") -> dict[str, Any]:
    return {
        "type": "task",
        "value": {
            "id": id,
            "conversationId": 1,
            "kind": "job",
            "state": {"status": status},
            "background": False,
            "abortRequested": False,
        },
    }


@dataclass
class Ledger:
    """What the callers saw: acknowledged commits, ids handed out, ids a commit may have used."""

    acked: dict[int, int] = field(default_factory=dict)  # task id -> sequence
    minted: list[int] = field(default_factory=list)
    attempted: set[int] = field(default_factory=set)
    next_explicit: int = 1_000


Op = tuple[str, int, str]  # (kind, turns before the cancel or -1 for none, how)

ops = st.lists(
    st.tuples(
        st.sampled_from(["commit", "commit-minted", "mint"]),
        st.integers(min_value=-1, max_value=6),
        st.sampled_from(["cancel", "wait_for"]),
    ),
    min_size=1,
    max_size=12,
)


async def run_op(storage: LmdbStorage, ledger: Ledger, kind: str) -> None:
    if kind == "mint":
        ledger.minted.append(await storage.mint_id())
        return
    if kind == "commit-minted":
        id = await storage.mint_id()
        ledger.minted.append(id)
    else:  # an id the caller chose: right above everything so far, where mint_id would look next
        ledger.next_explicit += 1
        id = ledger.next_explicit
    ledger.attempted.add(id)
    seq = await storage.commit([task_write(id)], CTX)
    ledger.acked[id] = seq


async def cancel_after(turns: int, how: str, coro: Any) -> None:
    """Run ``coro`` as a task; after ``turns`` turns of the loop, cancel it (``-1``: never)."""

    if how == "wait_for" and turns >= 0:
        try:
            await asyncio.wait_for(coro, timeout=turns * 0.0005)
        except TimeoutError:
            pass
        return
    task = asyncio.ensure_future(coro)
    if turns >= 0:
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


async def scenario(
    directory: str,
    rounds: list[list[Op]],
    close_turns: int,
    close_how: str,
    durability: Durability = "process",
) -> None:
    ledger = Ledger()
    storage = await LmdbStorage.open(directory, durability=durability)
    storage._env.clock = lambda: 0.0  # power: every flush fast, lone commits on the caller's thread
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    for round in rounds:
        ledger.next_explicit = max([ledger.next_explicit, *ledger.minted]) + 1
        await asyncio.gather(
            *(cancel_after(turns, how, run_op(storage, ledger, kind)) for kind, turns, how in round)
        )
        await check(storage, ledger)
    # close, cancelled at a chosen point; a second close finishes it, and nothing is lost
    await cancel_after(close_turns, close_how, storage.close())
    await storage.close()
    assert storage._env.closed, "a cancelled close() left the environment open"
    reopened = await LmdbStorage.open(directory, durability=durability)
    try:
        assert verify(directory) is None
        await check(reopened, ledger)
    finally:
        await reopened.close()


async def check(storage: LmdbStorage, ledger: Ledger) -> None:
    assert len(set(ledger.minted)) == len(ledger.minted), (
        f"an id was handed out twice: {ledger.minted}"
    )
    landed = {id for id in ledger.attempted if await storage.task(id, CTX) is not None}
    assert set(ledger.acked) <= landed, "an acknowledged commit is missing"
    for id, seq in ledger.acked.items():
        record = await storage.task(id, CTX)
        assert record is not None and record["id"] == id
        assert storage.log.get(seq) is not None
    fresh = [await storage.mint_id() for _ in range(3)]
    ledger.minted.extend(fresh)
    assert not set(fresh) & landed, (
        f"mint_id handed out ids the store holds: {sorted(set(fresh) & landed)}"
    )
    assert min(fresh) > max(landed | {1}), (
        f"mint_id {fresh} is not above the stored ids {sorted(landed)[-5:]}"
    )


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(
    rounds=st.lists(ops, min_size=1, max_size=3),
    close_turns=st.integers(min_value=-1, max_value=8),
    close_how=st.sampled_from(["cancel", "wait_for"]),
)
def test_cancelled_callers_never_cost_an_id_or_a_commit(
    rounds: list[list[Op]], close_turns: int, close_how: str
) -> None:
    directory = tempfile.mkdtemp(prefix="cancel-")
    try:
        asyncio.run(scenario(directory + "/store", rounds, close_turns, close_how))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.slow
@settings(max_examples=15, deadline=None)
@given(
    rounds=st.lists(ops, min_size=1, max_size=3),
    close_turns=st.integers(min_value=-1, max_value=8),
    close_how=st.sampled_from(["cancel", "wait_for"]),
)
def test_cancelled_power_callers_never_cost_an_id_or_a_commit(
    rounds: list[list[Op]], close_turns: int, close_how: str
) -> None:
    """The same in ``power`` mode with fast flushes: lone commits on the caller's thread."""

    directory = tempfile.mkdtemp(prefix="cancel-")
    try:
        asyncio.run(scenario(directory + "/store", rounds, close_turns, close_how, "power"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_commit_cancelled_in_its_group_raises_the_id_floor(tmp_path: Any) -> None:
    """The case the issue reported, at each point of the wait: two commits from one turn of the
    loop, the caller of the one with the higher id cancelled after 0 to 7 turns. Where its batch
    was committed anyway, ``mint_id`` must not hand out its id (it did, from 3 turns on)."""

    async def main() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            committed = 0
            for turns in range(8):
                floor = await storage.mint_id() + 10
                first = asyncio.ensure_future(storage.commit([task_write(floor + 1)], CTX))
                second = asyncio.ensure_future(storage.commit([task_write(floor + 2)], CTX))
                for _ in range(turns):
                    await asyncio.sleep(0)
                second.cancel()
                await first
                for _ in range(200):  # whatever the writer thread still had of that group
                    await asyncio.sleep(0)
                stored = await storage.task(floor + 2, CTX) is not None
                committed += stored
                minted = await storage.mint_id()
                highest = floor + 2 if stored else floor + 1
                assert minted > highest, (
                    f"cancelled after {turns} turns: mint_id handed out {minted}, not above the stored {highest}"
                )
            assert committed >= 3, "the cancelled batch was committed anyway in some of the runs"
        finally:
            await storage.close()

    asyncio.run(main())


def test_an_id_a_commit_made_visible_is_not_minted_before_its_floor_is_raised(
    tmp_path: Any,
) -> None:
    """A commit made on one thread is visible to readers as soon as LMDB's commit returns, and
    raises the id floor in its effects right after: a ``mint_id`` on another thread in between
    must not hand out an id that commit stores. The commit's effects are held at the floor's
    raise until the other thread has asked for its id; the id it gets is above the stored one."""

    import threading

    from pi_durable_lmdb.storage import ids as ids_module

    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            taken = await storage.mint_id()  # the reservation is made: no commit needed to mint
            stored = taken + 1  # the id the next mint would hand out
            visible, go = threading.Event(), threading.Event()
            original = ids_module.IdMinter.raise_floor

            def held(self: Any, max_id: int) -> None:
                if max_id == stored:
                    visible.set()  # LMDB's commit returned: readers see the task
                    go.wait(30)
                original(self, max_id)

            ids_module.IdMinter.raise_floor = held  # type: ignore[method-assign]
            try:
                committer = threading.Thread(
                    target=lambda: asyncio.run(storage.commit([task_write(stored)], CTX))
                )
                committer.start()
                assert visible.wait(60)
                minted: list[int] = []
                minter = threading.Thread(
                    target=lambda: minted.append(asyncio.run(storage.mint_id()))
                )
                minter.start()
                minter.join(0.2)  # an id handed out now is one the floor does not cover yet
                go.set()
                minter.join(60)
                committer.join(60)
            finally:
                ids_module.IdMinter.raise_floor = original  # type: ignore[method-assign]
            assert await storage.task(stored, CTX) is not None
            assert minted and minted[0] > stored, (minted, stored)
        finally:
            await storage.close()

    asyncio.run(run())
