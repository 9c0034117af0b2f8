"""The log's link to NATS JetStream: one stream carries the logs of many stores, one subject each.

A store's records go to ``<stream>.<store id>.log``, one message per record, the body being the
record exactly as the local log stores it (``LogRecord``: its CRC-32 is checked on every receipt).
Headers carry what the body does not: the store, the record's sequence, the writer's epoch, and
``Nats-Msg-Id`` = ``<store>:<seq>`` so JetStream drops a record sent twice. Appends are
conditional (``Nats-Expected-Last-Subject-Sequence``): a writer that is not where the stream is
cannot add to it. A group of records goes as one atomic batch (all stored or none).

The NATS client (nats-py, asyncio) runs on a thread of its own with its own event loop, so it can
be called from the store's writer thread (which must not run an event loop) and from any caller's
loop alike, and a caller's loop blocked in a direct commit never starves it.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

from ...errors import (
    NatsUnavailableError,
    OutcomeUnknownError,
    ReplicationError,
    StreamMissingError,
    StreamMovedError,
    install_hint,
)
from .buckets import JetStreamKeys
from .link import LinkLoop, StreamLink
from .message import (  # noqa: F401 - the message layout, importable from here as before
    H_EPOCH,
    H_EXPECTED,
    H_FORMAT,
    H_KIND,
    H_MSG_ID,
    H_SEQ,
    H_STORE,
    KINDS,
    MESSAGE_FORMAT,
    Control,
    Fence,
    IdReservation,
    Kind,
    RawMessage,
    StreamMessage,
    check_size,
    check_stream_name,
    control_headers,
    encode_control,
    parse_message,
    record_headers,
    stream_subjects,
    subject_of,
    too_big,
)
from .objects import JetStreamSnapshots

WRONG_LAST_SEQUENCE: Final = 10071
"""``wrong last sequence: N``: the subject's last message is at N, not where this writer expected."""
WRONG_LAST_SEQUENCE_CONSTANT: Final = 10164
"""``wrong last sequence`` without the number: a clustered stream's answer to a conditional append
that raced another (seen on 3-node clusters during a forced take-over)."""
DUPLICATE_IN_BATCH: Final = 10201
"""An atomic batch holds a ``Nats-Msg-Id`` the stream already has (another writer's record)."""
FETCH_BYTES: Final = 16 << 20
"""Bytes one batched read may carry at most (the server ends the batch before)."""
DEFAULT_TIMEOUT: Final = 5.0
"""Seconds a request to the stream may take before it counts as unanswered."""


MOVED_CODES: Final = frozenset(
    {WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT, DUPLICATE_IN_BATCH}
)
"""Refusals that mean the subject moved under this writer (another appended or fenced it)."""
GONE_CODES: Final = frozenset({10043, 10057})
"""``sequence N not found``, ``no message found``: a message to delete is gone already."""
UNAVAILABLE_CODES: Final = frozenset({10008, 10023, 10028, 10047})
"""Cluster not available, insufficient resources, memory or storage exhausted: try again later."""
MISSING_CODES: Final = frozenset({10059, 10060})
"""No such stream, or not the stream expected."""
TOO_BIG: Final = 10054
"""The message exceeds the stream's (or the server's) maximum size."""


def refusal_error(subject: str, expected: int, refusal: dict[str, Any]) -> ReplicationError:
    """The error for a JetStream refusal of an append (docs/distributed.md lists the codes): the
    subject moved (``StreamMovedError``, which deposes a writer), the servers cannot take it now
    (``NatsUnavailableError``), the stream is missing, or anything else, named with its code."""

    code = refusal.get("err_code")
    description = refusal.get("description", refusal)
    if code in MOVED_CODES:
        match = re.search(r"(\d+)\s*$", str(description)) if code == WRONG_LAST_SEQUENCE else None
        return StreamMovedError(subject, expected, int(match.group(1)) if match else None)
    if code in MISSING_CODES:
        return StreamMissingError(
            f"The stream refused an append to {subject}: {description} (JetStream error {code})"
        )
    if code in UNAVAILABLE_CODES or refusal.get("code") == 503:
        return NatsUnavailableError(
            f"The stream could not take an append to {subject}: {description} (JetStream error {code})"
        )
    if code == TOO_BIG:
        return ReplicationError(
            f"The stream refused an append to {subject} as too big: {description} (JetStream error {code})"
        )
    return ReplicationError(
        f"The stream refused an append to {subject}: {description} (JetStream error {code})"
    )


def parse_servers(servers: str | Sequence[str]) -> list[str]:
    """``servers``: a URL, a comma-separated list of URLs, or a sequence of them."""

    items = servers.split(",") if isinstance(servers, str) else list(servers)
    urls = [item.strip() for item in items if isinstance(item, str) and item.strip()]
    if not urls or len(urls) != len(
        [item for item in items if not isinstance(item, str) or item.strip()]
    ):
        raise ValueError(
            f"NATS servers are given as a URL or a comma-separated list of URLs, not {servers!r:.120}"
        )
    return [url if "://" in url else f"nats://{url}" for url in urls]


def cause_of(error: BaseException, timeout: float, connecting: bool = False) -> str:
    """Why NATS did not answer, in words a user can act on (a timeout's own text is empty)."""

    import nats.errors

    if isinstance(error, nats.errors.NoRespondersError):
        return "no responders: JetStream is not enabled on that server (nats-server -js), or the stream has no leader"
    if isinstance(error, (nats.errors.TimeoutError, asyncio.TimeoutError)):
        if connecting:
            return f"no answer within {timeout + 1:g} s: nothing listening at that address, or a firewall in between"
        return (
            f"no reply within {timeout:g} s: the server is up but JetStream did not answer (a cluster without "
            "a quorum or a meta leader, or an overloaded server)"
        )
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class JetStreamLink(LinkLoop):
    """One NATS connection, on a thread and event loop of its own, to one stream: the bundle of
    the stream (``messages``), its key-value (``keys``) and snapshot (``snapshots``) roles."""

    def __init__(
        self, servers: str | Sequence[str], stream: str, *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        try:
            import nats  # noqa: F401
        except ImportError:  # pragma: no cover - the extra is not installed
            raise ImportError(
                f"Replication through NATS needs nats-py, the [nats] extra: {install_hint('nats')}"
            ) from None
        self.servers = parse_servers(servers)
        self.stream = check_stream_name(stream)
        self.timeout = timeout
        self._nc: Any = None
        self._js: Any = None
        self.messages = JetStreamMessages(self)
        self.keys = JetStreamKeys(self)
        self.snapshots = JetStreamSnapshots(self)
        super().__init__(f"nats {stream}")

    @property
    def nc(self) -> Any:
        """nats-py's client (``None`` until ``connect``)."""

        return self._nc

    @property
    def js(self) -> Any:
        """nats-py's JetStream context (``None`` until ``connect``)."""

        return self._js

    async def connect(self) -> None:
        import nats

        async def noted(error: Exception) -> None:
            self.last_error = f"{type(error).__name__}: {error}"

        try:
            self._nc = await asyncio.wait_for(
                nats.connect(
                    servers=self.servers,
                    connect_timeout=min(2.0, self.timeout),
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.2,
                    error_cb=noted,
                    name="pi-durable-lmdb",
                ),
                self.timeout + 1,
            )
        except (TimeoutError, OSError, Exception) as error:
            raise NatsUnavailableError(
                f"No NATS server answered at {', '.join(self.servers)} ({cause_of(error, self.timeout, connecting=True)})"
            ) from None
        self._js = self._nc.jetstream(timeout=self.timeout)

    async def disconnect(self) -> None:
        """Close the connection and end every task left on the link's loop (consumers' own)."""

        await super().disconnect()
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.drain(), 2.0)
            except Exception:
                try:
                    await self._nc.close()
                except Exception:
                    pass
            self._nc = None
        await super().disconnect()


class JetStreamMessages:
    """The stream role of a ``JetStreamLink`` (``link.Stream``): coroutines of the link's loop."""

    def __init__(self, connection: JetStreamLink) -> None:
        self.connection = connection
        self.atomic = True
        """Whether the stream takes atomic batches (``allow_atomic``); else records go one by one."""

    @property
    def stream(self) -> str:
        return self.connection.stream

    @property
    def timeout(self) -> float:
        return self.connection.timeout

    async def ensure_stream(self, replicas: int = 1, create: bool = True) -> None:
        """Check the stream carries store subjects; make it (``replicas`` copies) when missing."""

        import nats.js.errors
        from nats.js.api import StorageType, StreamConfig

        try:
            info = await self.connection.js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            if not create:
                raise StreamMissingError(
                    f"NATS has no stream {self.stream!r} (at {', '.join(self.connection.servers)})"
                ) from None
            config = StreamConfig(
                name=self.stream,
                subjects=stream_subjects(self.stream),
                num_replicas=replicas,
                storage=StorageType.FILE,
                allow_atomic=True,
                allow_direct=True,
                duplicate_window=120.0,
            )
            try:
                info = await self.connection.js.add_stream(config)
            except nats.js.errors.ServiceUnavailableError as error:
                raise _unanswered(f"stream {self.stream!r}", error) from None
            except nats.js.errors.Error as error:
                raise ReplicationError(
                    f"NATS refused to create stream {self.stream!r} with {replicas} replicas: {error}"
                ) from None
            except (TimeoutError, nats.errors.Error) as error:
                raise _unanswered(f"stream {self.stream!r}", error) from None
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError) as error:
            raise NatsUnavailableError(
                f"NATS at {', '.join(self.connection.servers)} did not answer for stream {self.stream!r} ({cause_of(error, self.timeout)})"
            ) from None
        except nats.errors.Error as error:  # a 503 (no quorum, no meta leader), a lost connection
            raise _unanswered(f"stream {self.stream!r}", error) from None
        subjects = info.config.subjects or []
        if not any(_covers(pattern, f"{self.stream}.x.log") for pattern in subjects):
            raise StreamMissingError(
                f"Stream {self.stream!r} does not carry the subjects {self.stream}.<store>.log (it takes {subjects})"
            )
        self.atomic = bool(info.config.allow_atomic)

    async def last(self, subject: str, store: str | None) -> StreamMessage | None:
        """The subject's last message, from the stream's leader (never a lagging replica)."""

        import nats.js.errors

        try:
            raw = await self.connection.js.get_last_msg(self.stream, subject)
        except nats.js.errors.NotFoundError as error:
            if error.err_code in MISSING_CODES:  # no stream, not a subject without messages
                raise StreamMissingError(
                    f"NATS has no stream {self.stream!r}: {error.description}"
                ) from None
            return None
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError) as error:
            raise NatsUnavailableError(
                f"NATS did not answer for the last message of {subject} ({cause_of(error, self.timeout)})"
            ) from None
        except nats.errors.Error as error:  # a 503 (no quorum, no meta leader), a lost connection
            raise _unanswered(f"the last message of {subject}", error) from None
        return parse_message(self.stream, raw.seq, raw.headers, raw.data, store)

    async def publish(
        self, subject: str, messages: Sequence[tuple[dict[str, str], bytes]], expected: int
    ) -> int:
        """Append ``messages`` (headers, body) after stream sequence ``expected`` (the subject's
        last message; 0: none), all or none; returns the stream sequence of the last one.

        ``StreamMovedError``: the subject is not at ``expected``; ``OutcomeUnknownError``: no
        answer, so the messages may or may not be stored."""

        if not messages:
            return expected
        for _, body in messages:  # the rule ``check_size`` applies, before anything is sent
            reason = self.too_big(len(body))
            if reason is not None:
                raise ReplicationError(
                    f"The stream refused an append to {subject} as too big: {reason}"
                )
        if self.atomic and len(messages) > 1:
            return await self._publish_atomic(subject, messages, expected)
        last = expected
        for headers, body in messages:
            last = await self._request(
                subject, {**headers, H_EXPECTED: str(last)}, body, expected=last
            )
        return last

    async def _publish_atomic(
        self, subject: str, messages: Sequence[tuple[dict[str, str], bytes]], expected: int
    ) -> int:
        batch = secrets.token_hex(8)
        count = len(messages)
        for index, (headers, body) in enumerate(messages[:-1], 1):
            batch_headers = {**headers, "Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(index)}
            if index == 1:
                batch_headers[H_EXPECTED] = str(expected)
            await self.connection.nc.publish(subject, body, headers=batch_headers)
        headers, body = messages[-1]
        final = {
            **headers,
            "Nats-Batch-Id": batch,
            "Nats-Batch-Sequence": str(count),
            "Nats-Batch-Commit": "1",
        }
        return await self._request(subject, final, body, expected=expected)

    async def _request(
        self, subject: str, headers: dict[str, str], body: bytes, *, expected: int
    ) -> int:
        import nats.errors

        try:
            reply = await self.connection.nc.request(
                subject, body, timeout=self.timeout, headers=headers
            )
        except nats.errors.NoRespondersError:
            raise NatsUnavailableError(
                f"No stream answers for {subject} (stream {self.stream!r} missing, or without a leader)"
            ) from None
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.ConnectionClosedError) as error:
            self.connection.last_error = f"publish to {subject}: no answer in {self.timeout} s"
            raise OutcomeUnknownError(
                f"The stream did not acknowledge an append to {subject} within {self.timeout} s "
                f"({type(error).__name__}); it may or may not hold it"
            ) from None
        try:
            ack = json.loads(reply.data)
        except ValueError:
            raise ReplicationError(
                f"The stream answered an append to {subject} with {reply.data[:200]!r}"
            ) from None
        refusal = ack.get("error")
        if refusal:
            raise refusal_error(subject, expected, refusal)
        if ack.get("duplicate"):
            # The stream holds a message of this Nats-Msg-Id already (``<store>:<seq>``: another
            # writer's record of this sequence) and answers with its sequence -- on a cluster
            # before it checks Nats-Expected-Last-Subject-Sequence. This link never sends a
            # message twice, so it is never ours: the subject moved.
            raise StreamMovedError(subject, expected, None)
        return int(ack["seq"])

    async def read(
        self, subject: str, after: int, *, store: str | None, follow: bool, idle: float = 0.5
    ) -> AsyncIterator[tuple[StreamMessage, int]]:
        """The subject's messages after stream sequence ``after``, verified, each with how many
        more were known to follow it (held back by the server or already received here; 0: it
        was the last). Without ``follow`` it ends at the last message the stream holds when the
        subject runs dry."""

        import collections

        import nats.errors
        from nats.js.api import ConsumerConfig, DeliverPolicy

        last = await self.last(subject, None) if not follow else None
        if not follow and (last is None or last.stream_seq <= after):
            return
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after + 1,
            filter_subject=subject,
        )
        arrived: collections.deque[tuple[Any, int, int]] = collections.deque()
        """Messages received, not yet given out: each with its stream sequence and how many more
        the server held back when it sent it."""
        ready = asyncio.Event()

        async def take(msg: Any) -> None:  # a callback: far cheaper per message than next_msg()
            arrived.append((msg, *_delivery(msg)))
            ready.set()

        try:
            sub = await self.connection.js.subscribe(
                subject,
                stream=self.stream,
                cb=take,
                ordered_consumer=True,
                config=config,
                idle_heartbeat=max(idle, 0.5),
                pending_msgs_limit=65536,
                pending_bytes_limit=256 * 1024 * 1024,
            )
        except (TimeoutError, nats.errors.Error) as error:  # no consumer: a 503, no answer
            raise _unanswered(f"a consumer of {subject}", error) from None
        try:
            while True:
                if not arrived:
                    ready.clear()
                    try:
                        await asyncio.wait_for(ready.wait(), idle)
                    except TimeoutError:
                        if not follow:
                            latest = await self.last(subject, None)
                            if latest is None or latest.stream_seq <= after:
                                return
                        continue
                while arrived:
                    msg, stream_seq, pending = arrived.popleft()
                    if stream_seq <= after:
                        continue
                    after = stream_seq
                    if arrived:  # what follows: what waits here, and what the server held back
                        pending = arrived[-1][2] + len(arrived)  # after the newest
                    yield (
                        parse_message(self.stream, stream_seq, msg.headers, msg.data, store),
                        pending,
                    )
                    if not follow and pending == 0 and not arrived:
                        return
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    async def fetch(self, subject: str, after: int, *, batch: int) -> list[RawMessage]:
        """The subject's next messages after stream sequence ``after``, at most ``batch``: one
        pull request (``$JS.API.CONSUMER.MSG.NEXT``, ``no_wait``) to an ephemeral consumer made for
        it (no acks, one replica, in memory) and deleted after. The messages come back to back with
        their own headers only, their stream sequence and how many follow in the reply subject:
        per message, less for nats-py to parse than a direct get's answer or an ordered push
        consumer's bookkeeping."""

        if batch < 1:
            return []
        import nats.errors
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after + 1,
            filter_subject=subject,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=max(30.0, 3 * self.timeout),
            mem_storage=True,
            num_replicas=1,
        )
        got: list[RawMessage] = []
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def take(msg: Any) -> None:  # a callback: cheaper per message than next_msg()
            if (
                not msg.data and msg.headers and msg.headers.get("Status")
            ):  # 404: no more, 408: expired
                if not ended.done():
                    ended.set_result(None)
                return
            stream_seq, pending = _delivery(msg)
            got.append(RawMessage(stream_seq, msg.headers, msg.data, pending))
            if len(got) >= batch and not ended.done():
                ended.set_result(None)

        try:
            info = await self.connection.js.add_consumer(self.stream, config)
            try:
                inbox = self.connection.nc.new_inbox()
                sub = await self.connection.nc.subscribe(
                    inbox,
                    cb=take,
                    pending_msgs_limit=2 * batch + 16,
                    pending_bytes_limit=4 * FETCH_BYTES,
                )
                try:
                    request = json.dumps(
                        {"batch": batch, "no_wait": True, "max_bytes": FETCH_BYTES}
                    ).encode()
                    await self.connection.nc.publish(
                        f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{info.name}",
                        request,
                        reply=inbox,
                    )
                    await asyncio.wait_for(ended, self.timeout)
                finally:
                    await sub.unsubscribe()
            finally:
                try:
                    await self.connection.js.delete_consumer(self.stream, info.name)
                except (TimeoutError, nats.errors.Error):
                    pass  # it goes by itself once inactive
        except (TimeoutError, nats.errors.Error) as error:
            raise _unanswered(f"a batch of {subject} after {after}", error) from None
        return got

    @property
    def max_payload(self) -> int:
        """The largest message the connected server takes (0: not connected)."""

        nc = self.connection.nc
        return int(getattr(nc, "max_payload", 0) or 0) if nc is not None else 0

    def too_big(self, size: int) -> str | None:
        return too_big(size, self.max_payload)

    def check_size(self, size: int) -> None:
        check_size(size, self.max_payload)

    async def trim(self, subject: str, keep_from: int) -> None:
        """Remove the subject's messages below stream sequence ``keep_from``."""

        import nats.errors
        import nats.js.errors

        try:
            await self.connection.js.purge_stream(self.stream, seq=keep_from, subject=subject)
        except (TimeoutError, nats.errors.TimeoutError) as error:
            raise NatsUnavailableError(
                f"NATS did not trim {subject} ({type(error).__name__})"
            ) from None
        except nats.errors.Error as error:
            if isinstance(error, nats.js.errors.NotFoundError) and error.err_code in MISSING_CODES:
                raise StreamMissingError(f"NATS has no stream {self.stream!r} to trim") from None
            raise ReplicationError(f"NATS refused to trim {subject}: {error}") from None

    async def delete(self, stream_seq: int) -> None:
        """Remove message ``stream_seq`` with JetStream's secure delete (``$JS.API.STREAM.MSG.DELETE``
        without ``no_erase``: the server overwrites its bytes); one already gone is no error."""

        import nats.errors
        import nats.js.errors

        try:
            await self.connection.js.delete_msg(self.stream, stream_seq)
        except (TimeoutError, nats.errors.TimeoutError) as error:
            raise NatsUnavailableError(
                f"NATS did not delete message {stream_seq} of {self.stream!r} ({type(error).__name__})"
            ) from None
        except nats.errors.Error as error:
            code = getattr(error, "err_code", None)
            if code in MISSING_CODES:
                raise StreamMissingError(f"NATS has no stream {self.stream!r}") from None
            if code in GONE_CODES:
                return  # the message is gone already
            raise ReplicationError(
                f"NATS refused to delete message {stream_seq} of {self.stream!r}: {error}"
            ) from None


def link_for(nats: str | Sequence[str] | StreamLink, stream: str) -> StreamLink:
    """The link ``nats`` names: server URLs (a JetStream link is made), or a link given as is."""

    if isinstance(nats, (str, Sequence)):
        return JetStreamLink(nats, stream)
    if nats.stream != stream:
        raise ValueError(
            f"The link given as nats= carries stream {nats.stream!r}, not stream={stream!r}"
        )
    return nats


def _unanswered(what: str, error: BaseException) -> ReplicationError:
    """A nats-py error met while asking NATS for ``what``, as one of this module's: JetStream
    without a quorum or a meta leader answers 503 (``ServiceUnavailableError``), which is
    unavailability, as are a lost connection and no answer; any other API error is a refusal."""

    import nats.js.errors

    if isinstance(error, nats.js.errors.NotFoundError) and error.err_code in MISSING_CODES:
        return StreamMissingError(f"NATS has no stream for {what}: {error.description}")
    if isinstance(error, nats.js.errors.ServiceUnavailableError):
        return NatsUnavailableError(
            f"NATS could not answer for {what}: {error.description or 'service unavailable'} (503)"
        )
    if isinstance(error, nats.js.errors.APIError):
        return ReplicationError(f"NATS refused {what}: {error.description or error}")
    return NatsUnavailableError(f"NATS did not answer for {what} ({type(error).__name__}: {error})")


def _delivery(msg: Any) -> tuple[int, int]:
    """A delivered message's stream sequence and how many more the consumer has pending, read
    from its ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>``)
    without building nats-py's metadata objects, a quarter of a replica's reading time."""

    tokens = msg.reply.split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[8])
    meta = msg.metadata  # the newer form, with domain and account hash
    return int(meta.sequence.stream), int(meta.num_pending)


def _covers(pattern: str, subject: str) -> bool:
    """Whether NATS subject ``pattern`` (with ``*`` and ``>``) matches ``subject``."""

    parts, tokens = pattern.split("."), subject.split(".")
    for index, part in enumerate(parts):
        if part == ">":
            return len(tokens) > index
        if index >= len(tokens) or (part != "*" and part != tokens[index]):
            return False
    return len(parts) == len(tokens)


__all__ = [
    "DEFAULT_TIMEOUT",
    "DUPLICATE_IN_BATCH",
    "FETCH_BYTES",
    "H_EXPECTED",
    "MISSING_CODES",
    "MOVED_CODES",
    "TOO_BIG",
    "UNAVAILABLE_CODES",
    "WRONG_LAST_SEQUENCE",
    "WRONG_LAST_SEQUENCE_CONSTANT",
    "JetStreamLink",
    "cause_of",
    "link_for",
    "parse_servers",
    "refusal_error",
]
