"""A publish whose answer is lost, when the records did land.

After an unanswered publish the writer looks at the stream to learn whether its records are
there. It used to look only at the subject's last message: when another writer had fenced and
appended after the records, the caller got ``OutcomeUnknownError`` ("may or may not be stored")
for a commit the stream held and the new writer had taken in. Now the writer reads the subject
from where its publish was to go: records found there landed (the commit is acknowledged, and the
writer learns it was deposed at its next commit); records not all there are named in the error.

The lost answer is injected at the link (the real publish goes through first), and the other
writer is a real one, on the same real nats-server, that takes over with ``force``."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.errors import NotWriterError, OutcomeUnknownError

from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.asyncio

STREAM = "LANDED"


def conversation(id: int) -> list[dict[str, Any]]:
    return [{"type": "conversation", "value": {"id": id}}]


@pytest.mark.parametrize("others_commits", [0, 2])
async def test_records_that_landed_before_another_writer_are_acknowledged(
    tmp_path: Path, nats_server: NatsNode, others_commits: int
) -> None:
    a = await LmdbStorage.open(
        tmp_path / "a",
        durability="replicated",
        nats=nats_server.url,
        stream=STREAM,
        store="s",
        lease_ttl=30,
    )
    writer: Any = a.replication
    real_publish = writer.link.messages.publish
    published, taken_over = threading.Event(), threading.Event()

    async def answer_lost(subject: str, messages: Any, expected: int) -> int:
        await real_publish(subject, messages, expected)
        if any(headers.get("Pd-Kind") == "record" for headers, _ in messages):
            published.set()
            while not taken_over.is_set():  # on the link's loop: the lease renewer keeps running
                await asyncio.sleep(0.02)
            raise OutcomeUnknownError("injected: the append's answer was lost")
        return 0

    b: LmdbStorage | None = None
    try:
        assert await a.commit(conversation(1), CTX) == 1
        writer.link.messages.publish = answer_lost
        pending = asyncio.ensure_future(a.commit(conversation(2), CTX))
        assert await asyncio.to_thread(published.wait, 20)
        b = await LmdbStorage.open(
            tmp_path / "b",
            durability="replicated",
            nats=nats_server.url,
            stream=STREAM,
            store="s",
            take_over="force",
        )
        for n in range(others_commits):
            assert await b.commit(conversation(10 + n), CTX) == 3 + n
        taken_over.set()
        assert await pending == 2  # it landed: acknowledged, not "may or may not"
        with pytest.raises(NotWriterError):
            await a.commit(conversation(3), CTX)
        assert (
            await a.conversation(2, CTX) is not None
        )  # detached read, from the deposed writer's own log
        assert await b.conversation(2, CTX) is not None  # the new writer took it in
        assert await b.commit(conversation(99), CTX) == 3 + others_commits
    finally:
        taken_over.set()
        await a.close()
        if b is not None:
            await b.close()


async def test_records_of_which_only_some_landed_are_named(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    """A stream without atomic batches takes a group's records one by one: when the answer is
    lost after the first landed, the error says which are stored; the next commit takes that one
    in from the stream and the store goes on."""

    a = await LmdbStorage.open(
        tmp_path / "a",
        durability="replicated",
        nats=nats_server.url,
        stream=STREAM,
        store="p",
        lease_ttl=30,
    )
    writer: Any = a.replication
    real_publish = writer.link.messages.publish
    writer.link.messages.atomic = False
    injected: list[int] = []

    async def first_only(subject: str, messages: Any, expected: int) -> int:
        records = [m for m in messages if m[0].get("Pd-Kind") == "record"]
        if len(records) >= 2 and not injected:
            injected.append(int(records[0][0]["Pd-Seq"]))
            await real_publish(subject, messages[:1], expected)
            raise OutcomeUnknownError("injected: the append's answer was lost")
        return int(await real_publish(subject, messages, expected))

    try:
        assert await a.commit(conversation(1), CTX) == 1
        writer.link.messages.publish = first_only
        outcomes = await asyncio.gather(
            *(a.commit(conversation(100 + n), CTX) for n in range(8)), return_exceptions=True
        )
        assert injected, f"no group of two or more records was published: {outcomes}"
        named = [o for o in outcomes if isinstance(o, OutcomeUnknownError)]
        assert named and all(
            f"records up to log sequence {injected[0]} are stored" in str(o) for o in named
        ), outcomes
        assert await a.commit(conversation(999), CTX) > injected[0]
        stored = [n for n in range(8) if await a.conversation(100 + n, CTX) is not None]
        acknowledged = [n for n, o in enumerate(outcomes) if isinstance(o, int)]
        assert len(stored) == len(acknowledged) + 1, (
            stored,
            acknowledged,
        )  # the landed one, besides the acknowledged
    finally:
        await a.close()
