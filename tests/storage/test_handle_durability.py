"""Two handles on one store in one process: each writer gets exactly the durability it asked for,
or a clear error.

py-lmdb allows one LMDB environment per directory per process, so handles on one store share it,
and its sync mode is fixed when it opens. A read-only handle left open after a ``process``-mode
writer closed used to hand that unsynced environment to a later ``power`` writer: its commits were
never synced and no ``process.unsynced`` marker was written, so a power cut could lose them with no
refusal on the next open. Every open order and close order of power / process / read-only handles
(and of replicas, which write their directory too) is tried here; what each writer got is read
from the open environment itself (LMDB's own ``sync`` flag) and from the marker on disk.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import DurabilityConflictError, LmdbStorage, WriterLockedError
from pi_durable_lmdb.log.environment import UNSYNCED_FILE
from pi_durable_lmdb.log.storedir import POWER_FILE

from ..support.natsserver import NatsNode, running_node

LOCAL = ("power", "process", "readonly")
REPLICA = ("replica-power", "replica-process", "readonly")


def durability_of(kind: str) -> str | None:
    """The durability a handle of ``kind`` asks for (None: a reader asks for none)."""

    return None if kind == "readonly" else kind.removeprefix("replica-")


class Opener:
    """Opens handles of each kind on one directory: plain stores, or replicas of a store that a
    writer elsewhere ships to a stream."""

    def __init__(self, path: Path, node: NatsNode | None, store: str | None, stream: str) -> None:
        self.path, self.node, self.store, self.stream = path, node, store, stream
        self.next_id = 100

    async def open(self, kind: str) -> LmdbStorage:
        if kind == "readonly":
            return await LmdbStorage.open(self.path, readonly=True)
        if kind.startswith("replica-"):
            assert self.node is not None and self.store is not None
            return await LmdbStorage.open_replica(
                self.path,
                nats=self.node.url,
                stream=self.stream,
                store=self.store,
                durability=durability_of(kind),  # type: ignore[arg-type]
            )
        return await LmdbStorage.open(self.path, durability=kind)  # type: ignore[arg-type]

    async def commit(self, storage: LmdbStorage) -> int:
        self.next_id += 1
        await storage.commit([{"type": "conversation", "value": {"id": self.next_id}}], CTX)
        return self.next_id


def assert_durability_given(storage: LmdbStorage, kind: str) -> None:
    """What the open environment does on commit, read from LMDB and the disk, not from our state."""

    env = storage._env
    flags = env.env.flags()
    asked = durability_of(kind)
    journaled = (
        kind == "power"
    )  # a local power writer: its journal syncs, LMDB does not (log.journal)
    assert flags["sync"] is (asked == "power" and not journaled), (
        f"{kind} handle got an environment with sync={flags['sync']}"
    )
    assert os.path.exists(os.path.join(env.path, POWER_FILE)) is journaled, (
        f"{kind} handle: power.unsynced"
    )
    assert os.path.isdir(os.path.join(env.path, "journal")) or not journaled, (
        f"{kind} handle: no journal"
    )
    marker = os.path.exists(os.path.join(env.path, UNSYNCED_FILE))
    assert marker is (asked == "process"), f"{kind} handle: process.unsynced present={marker}"


async def run_scenario(
    opener: Opener, first: str, second: str, close_first: bool, reader_last: bool
) -> None:
    handles: list[LmdbStorage] = []
    try:
        one = await opener.open(first)
        handles.append(one)
        if first != "readonly":
            assert_durability_given(one, first)
        if first in ("power", "process"):
            await opener.commit(one)
        reader = await opener.open("readonly")  # left open: it keeps the environment alive
        handles.append(reader)
        if close_first:
            await one.close()
            handles.remove(one)
        asked = durability_of(second)
        if asked is None:
            two = await opener.open(second)
            handles.append(two)
        elif not close_first or first == "readonly":
            with pytest.raises(WriterLockedError):
                await opener.open(second)
            return
        elif asked != durability_of(first):
            with pytest.raises(DurabilityConflictError, match=f"durability={asked!r}") as refused:
                await opener.open(second)
            assert f"durability={durability_of(first)!r}" in str(refused.value)
            return
        else:
            two = await opener.open(second)
            handles.append(two)
            assert_durability_given(two, second)
            if second in ("power", "process"):
                await opener.commit(two)
    finally:
        if reader_last:
            handles.reverse()
        for handle in handles:
            await handle.close()


def kinds_matrix(kinds: tuple[str, ...]) -> Iterator[Any]:
    for first in kinds:
        for second in kinds:
            for close_first in (True, False):
                for reader_last in (True, False):
                    yield pytest.param(
                        first,
                        second,
                        close_first,
                        reader_last,
                        id=f"{first}-then-{second}-{'closed' if close_first else 'open'}-{'reader-last' if reader_last else 'reader-first'}",
                    )


@pytest.mark.parametrize("first,second,close_first,reader_last", list(kinds_matrix(LOCAL)))
async def test_each_local_handle_gets_the_durability_it_asked_for(
    tmp_path: Path, first: str, second: str, close_first: bool, reader_last: bool
) -> None:
    path = tmp_path / "store"
    seed = await LmdbStorage.open(path, durability="power")
    await seed.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    await seed.close()
    opener = Opener(path, None, None, "S")
    await run_scenario(opener, first, second, close_first, reader_last)
    # Every handle is closed: nothing is left unsynced, and every acknowledged commit is there.
    assert not os.path.exists(path / UNSYNCED_FILE) and not os.path.exists(path / POWER_FILE)
    check = await LmdbStorage.open(path, readonly=True)
    try:
        for id in range(101, opener.next_id + 1):
            assert await check.conversation(id, CTX) is not None
    finally:
        await check.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsNode]:
    with running_node(tmp_path_factory.mktemp("nats")) as started:
        yield started


@pytest.mark.parametrize("first,second,close_first,reader_last", list(kinds_matrix(REPLICA)))
async def test_each_replica_handle_gets_the_durability_it_asked_for(
    tmp_path: Path, node: NatsNode, first: str, second: str, close_first: bool, reader_last: bool
) -> None:
    stream = "HANDLES"
    writer = await LmdbStorage.open(
        tmp_path / "writer", durability="replicated", nats=node.url, stream=stream
    )
    try:
        seq = await writer.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        store = writer.store_id
        assert store is not None
    finally:
        await writer.close()
    path = tmp_path / "replica"
    seed = await LmdbStorage.open_replica(path, nats=node.url, stream=stream, store=store)
    await seed.wait(seq, timeout=10)
    await seed.close()
    await run_scenario(Opener(path, node, store, stream), first, second, close_first, reader_last)
    assert not os.path.exists(path / UNSYNCED_FILE)
