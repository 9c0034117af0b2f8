"""The engines every role's contract suite runs on: ``MemoryLink`` and ``JetStreamLink`` against a
real nats-server (one per module, on 127.0.0.1), so the fake cannot drift from the real thing.

Each test gets an ``Engine``: a link to a stream of its own (so tests never share subjects,
buckets or keys) and the one thing the two cannot do alike, letting a lease's time pass: the
in-memory engine's clock is moved, the JetStream one is waited on (bounded, never timed).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from pi_durable_lmdb.log.stream.jetstream import JetStreamLink
from pi_durable_lmdb.log.stream.link import StreamLink
from pi_durable_lmdb.log.stream.memory import ManualClock, MemoryLink, MemoryStream
from pi_durable_lmdb.log.stream.message import (
    IdReservation,
    control_headers,
    encode_control,
    subject_of,
)

from ...support.natsserver import NatsNode, running_node

T = TypeVar("T")
ENGINES = ("memory", "jetstream")
_names = itertools.count(1)


@dataclass
class Engine:
    """One link under test, and how to let an engine's time pass."""

    kind: str
    link: StreamLink
    memory: MemoryStream | None

    async def __call__(self, coro: Any) -> Any:
        """Run one of the link's coroutines on its loop."""

        return await self.link.arun(coro)

    def subject(self, store: str = "s1") -> str:
        return subject_of(self.link.stream, store)

    async def lease_gone(self, key: str, ttl: float) -> None:
        """Let ``ttl`` seconds pass for the lease ``key``: the memory clock moves past it; the
        server is polled until it drops the key (at most a minute, which no load crosses)."""

        if self.memory is not None:
            clock = self.memory.clock
            assert isinstance(clock, ManualClock)
            clock.advance(ttl + 0.001)
            return
        for _ in range(600):
            value, _revision = await self(self.link.keys.lease_get(key))
            if value is None:
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"the server kept the lease {key} a minute past its {ttl} s")

    async def lose_chunks(self, name: str) -> None:
        """Damage snapshot ``name`` where it is stored: the in-memory bucket's copy loses its
        head; JetStream's object keeps only its last chunk (the others purged from the bucket's
        own stream), its description unchanged."""

        if self.memory is not None:
            content, digest = self.memory.objects[name]
            self.memory.objects[name] = (content[len(content) // 2 :], digest)
            return
        link = self.link
        assert isinstance(link, JetStreamLink)

        async def purge() -> None:
            bucket = f"{link.stream}-snapshots"
            info = await (await link.js.object_store(bucket)).get_info(name)
            await link.js.purge_stream(
                f"OBJ_{bucket}", subject=f"$O.{bucket}.C.{info.nuid}", keep=1
            )

        await self(purge())


def message(store: str = "s1", upto: int = 1) -> tuple[dict[str, str], bytes]:
    """A valid message of ``store``'s subject (an id reservation), with a message id of its own."""

    return control_headers(store, "ids", 1, upto), encode_control(IdReservation(1, upto))


@pytest.fixture(scope="module")
def nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsNode]:
    with running_node(tmp_path_factory.mktemp("nats")) as node:
        yield node


async def _engine(kind: str, nats: NatsNode, create: bool) -> AsyncIterator[Engine]:
    name = f"C{next(_names)}{kind.upper()}"
    memory: MemoryStream | None = None
    if kind == "memory":
        memory = MemoryStream(name, clock=ManualClock())
        link: StreamLink = MemoryLink(memory)
    else:
        link = JetStreamLink(nats.url, name, timeout=10.0)
    try:
        await link.arun(link.connect())
        if create:
            await link.arun(link.messages.ensure_stream(create=True))
        yield Engine(kind, link, memory)
    finally:
        await asyncio.to_thread(link.close)


@pytest.fixture(params=ENGINES)
async def engine(request: pytest.FixtureRequest, nats: NatsNode) -> AsyncIterator[Engine]:
    """A link to a stream of its own, made."""

    async for made in _engine(request.param, nats, create=True):
        yield made


@pytest.fixture(params=ENGINES)
async def bare(request: pytest.FixtureRequest, nats: NatsNode) -> AsyncIterator[Engine]:
    """A connected link to a stream that does not exist."""

    async for made in _engine(request.param, nats, create=False):
        yield made
