"""The ``Stream`` role's promises (``log.stream.link``), the same tests on every engine."""

from __future__ import annotations

import asyncio

import pytest
from pi_durable_lmdb.errors import ReplicationError, StreamMissingError, StreamMovedError
from pi_durable_lmdb.log.stream.message import H_MSG_ID, H_STORE, RECORD_HEADROOM

from .conftest import Engine, message


async def test_a_missing_stream_is_named_missing_until_it_is_made(bare: Engine) -> None:
    stream = bare.link.messages
    with pytest.raises(StreamMissingError):
        await bare(stream.ensure_stream(create=False))
    with pytest.raises(StreamMissingError):
        await bare(stream.last(bare.subject(), None))
    with pytest.raises(StreamMissingError):
        await bare(stream.fetch(bare.subject(), 0, batch=10))
    for follow in (False, True):

        async def first(follow: bool = follow) -> object:
            return await anext(stream.read(bare.subject(), 0, store=None, follow=follow))

        with pytest.raises(StreamMissingError):
            await bare(first())
    with pytest.raises(StreamMissingError):
        await bare(stream.trim(bare.subject(), 5))
    with pytest.raises(ReplicationError):  # JetStream hears no answer: it cannot say why
        await bare(stream.publish(bare.subject(), [message()], 0))
    await bare(stream.ensure_stream(create=True))
    await bare(stream.ensure_stream(create=False))  # made once, found after
    assert await bare(stream.last(bare.subject(), None)) is None


async def test_an_append_lands_only_where_the_writer_expects_the_subject(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    assert await engine(stream.last(subject, "s1")) is None
    first = await engine(stream.publish(subject, [message()], 0))
    assert first > 0
    last = await engine(stream.last(subject, "s1"))
    assert last is not None and (last.stream_seq, last.kind, last.store) == (first, "ids", "s1")
    with pytest.raises(StreamMovedError) as moved:
        await engine(stream.publish(subject, [message(upto=2)], 0))
    assert (moved.value.expected, moved.value.found) == (0, first)
    three = [message(upto=n) for n in (2, 3, 4)]
    with pytest.raises(StreamMovedError):  # a batch not at the subject's last: none of it
        await engine(stream.publish(subject, three, first - 1 if first > 1 else first + 7))
    assert (await engine(stream.last(subject, "s1"))).stream_seq == first
    end = await engine(stream.publish(subject, three, first))
    assert end == first + 3
    assert (await engine(stream.last(subject, "s1"))).seq == 4
    assert await engine(stream.publish(subject, [], end)) == end  # nothing to append


async def test_a_message_id_the_subject_holds_is_refused_as_a_move(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    headers, body = message()
    first = await engine(stream.publish(subject, [(headers, body)], 0))
    again = ({**message(upto=2)[0], H_MSG_ID: headers[H_MSG_ID]}, message(upto=2)[1])
    with pytest.raises(StreamMovedError):
        await engine(stream.publish(subject, [again], first))
    assert (await engine(stream.last(subject, "s1"))).stream_seq == first


async def test_stream_sequences_grow_across_subjects(engine: Engine) -> None:
    stream = engine.link.messages
    a = await engine(stream.publish(engine.subject("a"), [message("a")], 0))
    b = await engine(stream.publish(engine.subject("b"), [message("b")], 0))
    a2 = await engine(stream.publish(engine.subject("a"), [message("a", 2)], a))
    assert a < b < a2
    with pytest.raises(StreamMovedError):  # expected is the subject's last, not the stream's
        await engine(stream.publish(engine.subject("b"), [message("b", 2)], a2))


async def test_a_read_gives_what_follows_a_sequence_with_how_many_more(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    first = await engine(stream.publish(subject, [message(upto=n) for n in (1, 2, 3, 4)], 0)) - 3

    async def read(after: int) -> list[tuple[int, int, int]]:
        return [
            (found.stream_seq, found.seq, pending)
            async for found, pending in stream.read(subject, after, store="s1", follow=False)
        ]

    assert await engine(read(0)) == [(first + n, n + 1, 3 - n) for n in range(4)]
    assert await engine(read(first + 1)) == [(first + 2, 3, 1), (first + 3, 4, 0)]
    assert await engine(read(first + 3)) == []


async def test_a_followed_read_gives_what_is_appended_after_it_began(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    first = await engine(stream.publish(subject, [message()], 0))
    seen: list[int] = []
    two = asyncio.Event()

    async def follow() -> None:
        async for found, _pending in stream.read(subject, 0, store="s1", follow=True, idle=0.1):
            seen.append(found.seq)
            if len(seen) == 2:
                two.set()
                return

    task = asyncio.ensure_future(engine(follow()))
    try:
        await engine(stream.publish(subject, [message(upto=2)], first))
        await asyncio.wait_for(two.wait(), 60)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert seen == [1, 2]


async def test_a_fetch_gives_the_next_batch_unchecked(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    last = await engine(stream.publish(subject, [message(upto=n) for n in (1, 2, 3, 4, 5)], 0))
    first = last - 4
    got = await engine(stream.fetch(subject, 0, batch=2))
    assert [(raw.stream_seq, raw.pending) for raw in got] == [(first, 4), (first + 1, 3)]
    assert got[0].headers is not None and got[0].headers[H_STORE] == "s1"
    rest = await engine(stream.fetch(subject, first + 1, batch=10))
    assert [(raw.stream_seq, raw.pending) for raw in rest] == [
        (first + 2, 2),
        (first + 3, 1),
        (first + 4, 0),
    ]
    assert await engine(stream.fetch(subject, last, batch=10)) == []
    assert await engine(stream.fetch(subject, 0, batch=0)) == []


async def test_a_message_over_the_largest_is_refused_whole(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    first = await engine(stream.publish(subject, [message()], 0))
    limit = 1 << 20  # the default of nats-server and of the in-memory stream
    assert stream.too_big(limit - RECORD_HEADROOM) is None
    assert "too big" in (stream.too_big(limit) or "")
    with pytest.raises(ReplicationError, match="too big"):
        stream.check_size(limit)
    headers, _ = message(upto=2)
    with pytest.raises(ReplicationError):
        await engine(stream.publish(subject, [(headers, bytes(limit + 1))], first))
    assert (await engine(stream.last(subject, "s1"))).stream_seq == first


async def test_a_trim_drops_what_is_below_and_never_reuses_a_sequence(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    last = await engine(stream.publish(subject, [message(upto=n) for n in (1, 2, 3, 4)], 0))
    other = await engine(stream.publish(engine.subject("other"), [message("other")], 0))
    await engine(stream.trim(subject, last - 1))
    got = await engine(stream.fetch(subject, 0, batch=10))
    assert [raw.stream_seq for raw in got] == [last - 1, last]
    assert [
        raw.stream_seq for raw in await engine(stream.fetch(engine.subject("other"), 0, batch=10))
    ] == [other]
    after = await engine(stream.publish(subject, [message(upto=5)], last))
    assert after > other


async def test_a_subject_trimmed_to_nothing_is_empty_again(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    last = await engine(stream.publish(subject, [message(upto=n) for n in (1, 2)], 0))
    await engine(stream.trim(subject, last + 1))
    assert await engine(stream.last(subject, "s1")) is None
    assert await engine(stream.fetch(subject, 0, batch=10)) == []
    with pytest.raises(StreamMovedError):
        await engine(stream.publish(subject, [message(upto=3)], last))
    assert await engine(stream.publish(subject, [message(upto=3)], 0)) > last


async def test_a_deleted_message_is_gone_and_deleting_it_again_is_no_error(engine: Engine) -> None:
    stream, subject = engine.link.messages, engine.subject()
    last = await engine(stream.publish(subject, [message(upto=n) for n in (1, 2, 3)], 0))
    await engine(stream.delete(last - 1))
    await engine(stream.delete(last - 1))
    got = await engine(stream.fetch(subject, 0, batch=10))
    assert [raw.stream_seq for raw in got] == [last - 2, last]

    async def read() -> list[int]:
        return [m.stream_seq async for m, _ in stream.read(subject, 0, store=None, follow=False)]

    assert await engine(read()) == [last - 2, last]
    assert (await engine(stream.last(subject, "s1"))).stream_seq == last
    assert await engine(stream.publish(subject, [message(upto=4)], last)) > last
