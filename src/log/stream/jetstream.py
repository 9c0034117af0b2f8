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
import threading
from collections.abc import AsyncIterator, Coroutine, Sequence
from typing import Any, Final, Literal, NamedTuple, TypeVar

import msgspec

from ...errors import (
    ForeignMessageError,
    NatsUnavailableError,
    OutcomeUnknownError,
    ReplicationError,
    StreamMissingError,
    StreamMovedError,
)
from ...errors import CorruptRecordError
from ..records import Commit, decode_record

T = TypeVar("T")

MESSAGE_FORMAT: Final = 1
"""The version of the message layout (headers and body); every message carries it."""

H_FORMAT: Final = "Pd-Format"
H_STORE: Final = "Pd-Store"
H_SEQ: Final = "Pd-Seq"
H_KIND: Final = "Pd-Kind"
H_EPOCH: Final = "Pd-Epoch"
H_MSG_ID: Final = "Nats-Msg-Id"
H_EXPECTED: Final = "Nats-Expected-Last-Subject-Sequence"

Kind = Literal["record", "fence", "ids"]
KINDS: Final = ("record", "fence", "ids")
"""``record``: a log record. ``fence``: a new writer's first message, which moves the subject on
so that no earlier writer's conditional append can land after it. ``ids``: an id block reserved."""

_STREAM_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,200}")
WRONG_LAST_SEQUENCE: Final = 10071
"""``wrong last sequence: N``: the subject's last message is at N, not where this writer expected."""
WRONG_LAST_SEQUENCE_CONSTANT: Final = 10164
"""``wrong last sequence`` without the number: a clustered stream's answer to a conditional append
that raced another (seen on 3-node clusters during a forced take-over)."""
DUPLICATE_IN_BATCH: Final = 10201
RECORD_HEADROOM: Final = 1024
"""Bytes kept below ``max_payload`` for a record message's headers and framing."""
"""An atomic batch holds a ``Nats-Msg-Id`` the stream already has (another writer's record)."""
DEFAULT_TIMEOUT: Final = 5.0
"""Seconds a request to the stream may take before it counts as unanswered."""



MOVED_CODES: Final = frozenset({WRONG_LAST_SEQUENCE, WRONG_LAST_SEQUENCE_CONSTANT, DUPLICATE_IN_BATCH})
"""Refusals that mean the subject moved under this writer (another appended or fenced it)."""
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
        return StreamMissingError(f"The stream refused an append to {subject}: {description} (JetStream error {code})")
    if code in UNAVAILABLE_CODES or refusal.get("code") == 503:
        return NatsUnavailableError(f"The stream could not take an append to {subject}: {description} (JetStream error {code})")
    if code == TOO_BIG:
        return ReplicationError(f"The stream refused an append to {subject} as too big: {description} (JetStream error {code})")
    return ReplicationError(f"The stream refused an append to {subject}: {description} (JetStream error {code})")


class Fence(msgspec.Struct, tag="fence", forbid_unknown_fields=True):
    epoch: int
    holder: str


class IdReservation(msgspec.Struct, tag="ids", forbid_unknown_fields=True):
    epoch: int
    upto: int


Control = Fence | IdReservation
_control_encoder: Final = msgspec.msgpack.Encoder()
_control_decoder: Final = msgspec.msgpack.Decoder(Control)


def encode_control(control: Fence | IdReservation) -> bytes:
    return _control_encoder.encode(control)


class StreamMessage(NamedTuple):
    """One verified message of a store's subject."""

    stream_seq: int
    store: str
    kind: Kind
    epoch: int
    seq: int
    """The record's log sequence (``record``), else the log head the control message follows."""
    data: bytes
    """The record as the log stores it (``record``), else the encoded control message."""
    commit: Commit | None = None
    """A record's decoded batch (decoded once, when its checksum was checked)."""

    @property
    def control(self) -> Fence | IdReservation:
        return _control_decoder.decode(self.data)


def subject_of(stream: str, store: str) -> str:
    return f"{stream}.{store}.log"


def stream_subjects(stream: str) -> list[str]:
    return [f"{stream}.*.log"]


def check_stream_name(stream: object) -> str:
    if not isinstance(stream, str) or not _STREAM_NAME.fullmatch(stream):
        raise ValueError(f"A stream name is letters, digits, '-' or '_' (NATS stream names), not {stream!r:.80}")
    return stream


def parse_servers(servers: str | Sequence[str]) -> list[str]:
    """``servers``: a URL, a comma-separated list of URLs, or a sequence of them."""

    items = servers.split(",") if isinstance(servers, str) else list(servers)
    urls = [item.strip() for item in items if isinstance(item, str) and item.strip()]
    if not urls or len(urls) != len([item for item in items if not isinstance(item, str) or item.strip()]):
        raise ValueError(f"NATS servers are given as a URL or a comma-separated list of URLs, not {servers!r:.120}")
    return [url if "://" in url else f"nats://{url}" for url in urls]


def record_headers(store: str, seq: int, epoch: int) -> dict[str, str]:
    return {
        H_MSG_ID: f"{store}:{seq}",
        H_FORMAT: str(MESSAGE_FORMAT),
        H_STORE: store,
        H_KIND: "record",
        H_SEQ: str(seq),
        H_EPOCH: str(epoch),
    }


def control_headers(store: str, kind: Kind, epoch: int, head: int) -> dict[str, str]:
    """A control message's headers; ``Pd-Seq`` is the log head it follows."""

    return {
        H_MSG_ID: f"{store}:{kind}:{epoch}:{secrets.token_hex(6)}",
        H_FORMAT: str(MESSAGE_FORMAT),
        H_STORE: store,
        H_KIND: kind,
        H_SEQ: str(head),
        H_EPOCH: str(epoch),
    }


def parse_message(
    stream: str, stream_seq: int, headers: dict[str, str] | None, data: bytes | None, store: str | None
) -> StreamMessage:
    """Check one message of a store's subject (its headers, and a record's checksum); anything
    else raises ``ForeignMessageError`` naming its stream sequence."""

    headers = headers or {}
    body = data or b""

    def refuse(reason: str) -> ForeignMessageError:
        return ForeignMessageError(stream, stream_seq, reason)

    if headers.get(H_FORMAT) != str(MESSAGE_FORMAT):
        raise refuse(f"it has no {H_FORMAT}: {MESSAGE_FORMAT} header (not written by pi-durable-lmdb)")
    found = headers.get(H_STORE)
    if found is None or (store is not None and found != store):
        raise refuse(f"it belongs to store {found!r}, not {store!r}")
    kind = headers.get(H_KIND)
    if kind not in KINDS:
        raise refuse(f"unknown kind {kind!r}")
    try:
        epoch = int(headers.get(H_EPOCH, "0"))
    except ValueError:
        raise refuse(f"its epoch {headers.get(H_EPOCH)!r} is not an integer") from None
    raw_seq = headers.get(H_SEQ, "")
    if not (raw_seq.isascii() and raw_seq.isdigit()) or (kind == "record" and int(raw_seq) < 1):
        raise refuse(f"its {H_SEQ} {raw_seq!r} is not a log sequence")
    seq = int(raw_seq)
    if kind != "record":
        try:
            control = _control_decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            raise refuse(f"an undecodable {kind} message ({error})") from None
        if not isinstance(control, Fence if kind == "fence" else IdReservation):
            raise refuse(f"its body is a {type(control).__name__}, not what a {kind!r} message carries")
        return StreamMessage(stream_seq, found, kind, epoch, seq, body)  # type: ignore[arg-type]
    if headers.get(H_MSG_ID) != f"{found}:{seq}":
        raise refuse(f"its {H_MSG_ID} {headers.get(H_MSG_ID)!r} does not name record {seq} of store {found}")
    try:
        commit = decode_record(seq, body)
    except CorruptRecordError as error:
        raise refuse(f"record {seq}: {error.reason}") from None
    return StreamMessage(stream_seq, found, "record", epoch, seq, body, commit)


class JetStreamLink:
    """One NATS connection, on a thread and event loop of its own, to one stream."""

    def __init__(self, servers: str | Sequence[str], stream: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        try:
            import nats  # noqa: F401
        except ImportError:  # pragma: no cover - the extra is not installed
            raise ImportError(
                "Replication through NATS needs nats-py: pip install 'pi-durable-lmdb[nats]'"
            ) from None
        self.servers = parse_servers(servers)
        self.stream = check_stream_name(stream)
        self.timeout = timeout
        self.atomic = True
        """Whether the stream takes atomic batches (``allow_atomic``); else records go one by one."""
        self._nc: Any = None
        self._js: Any = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"nats {stream}", daemon=True)
        self._thread.start()
        self._closed = False
        self.last_error: str | None = None

    # ── running on the link's loop ─────────────────────────────────────────

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the link's loop and wait for it, from any other thread."""

        if threading.current_thread() is self._thread:
            raise RuntimeError("JetStreamLink.run() called from the link's own thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run on the link's loop, from a coroutine on any loop."""

        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    # ── connection and stream (coroutines of the link's loop) ───────────────

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
        except (asyncio.TimeoutError, OSError, Exception) as error:
            raise NatsUnavailableError(
                f"No NATS server answered at {', '.join(self.servers)} ({type(error).__name__}: {error})"
            ) from None
        self._js = self._nc.jetstream(timeout=self.timeout)

    async def ensure_stream(self, replicas: int = 1, create: bool = True) -> None:
        """Check the stream carries store subjects; make it (``replicas`` copies) when missing."""

        import nats.js.errors
        from nats.js.api import StorageType, StreamConfig

        try:
            info = await self._js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            if not create:
                raise StreamMissingError(f"NATS has no stream {self.stream!r} (at {', '.join(self.servers)})") from None
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
                info = await self._js.add_stream(config)
            except nats.js.errors.ServiceUnavailableError as error:
                raise _unanswered(f"stream {self.stream!r}", error) from None
            except nats.js.errors.Error as error:
                raise ReplicationError(f"NATS refused to create stream {self.stream!r} with {replicas} replicas: {error}") from None
            except (nats.errors.Error, asyncio.TimeoutError) as error:
                raise _unanswered(f"stream {self.stream!r}", error) from None
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError) as error:
            raise NatsUnavailableError(
                f"NATS at {', '.join(self.servers)} did not answer for stream {self.stream!r} ({type(error).__name__})"
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
            raw = await self._js.get_last_msg(self.stream, subject)
        except nats.js.errors.NotFoundError:
            return None
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError) as error:
            raise NatsUnavailableError(f"NATS did not answer for the last message of {subject} ({type(error).__name__})") from None
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
        if self.atomic and len(messages) > 1:
            return await self._publish_atomic(subject, messages, expected)
        last = expected
        for headers, body in messages:
            last = await self._request(subject, {**headers, H_EXPECTED: str(last)}, body, expected=last)
        return last

    async def _publish_atomic(self, subject: str, messages: Sequence[tuple[dict[str, str], bytes]], expected: int) -> int:
        batch = secrets.token_hex(8)
        count = len(messages)
        for index, (headers, body) in enumerate(messages[:-1], 1):
            batch_headers = {**headers, "Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(index)}
            if index == 1:
                batch_headers[H_EXPECTED] = str(expected)
            await self._nc.publish(subject, body, headers=batch_headers)
        headers, body = messages[-1]
        final = {**headers, "Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(count), "Nats-Batch-Commit": "1"}
        return await self._request(subject, final, body, expected=expected)

    async def _request(self, subject: str, headers: dict[str, str], body: bytes, *, expected: int) -> int:
        import nats.errors

        try:
            reply = await self._nc.request(subject, body, timeout=self.timeout, headers=headers)
        except nats.errors.NoRespondersError:
            raise NatsUnavailableError(
                f"No stream answers for {subject} (stream {self.stream!r} missing, or without a leader)"
            ) from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError, nats.errors.ConnectionClosedError) as error:
            self.last_error = f"publish to {subject}: no answer in {self.timeout} s"
            raise OutcomeUnknownError(
                f"The stream did not acknowledge an append to {subject} within {self.timeout} s "
                f"({type(error).__name__}); it may or may not hold it"
            ) from None
        try:
            ack = json.loads(reply.data)
        except ValueError:
            raise ReplicationError(f"The stream answered an append to {subject} with {reply.data[:200]!r}") from None
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
        arrived: collections.deque[Any] = collections.deque()
        ready = asyncio.Event()

        async def take(msg: Any) -> None:  # a callback: far cheaper per message than next_msg()
            arrived.append(msg)
            ready.set()

        try:
            sub = await self._js.subscribe(
                subject,
                stream=self.stream,
                cb=take,
                ordered_consumer=True,
                config=config,
                idle_heartbeat=max(idle, 0.5),
                pending_msgs_limit=65536,
                pending_bytes_limit=256 * 1024 * 1024,
            )
        except (nats.errors.Error, asyncio.TimeoutError) as error:  # no consumer: a 503, no answer
            raise _unanswered(f"a consumer of {subject}", error) from None
        try:
            while True:
                if not arrived:
                    ready.clear()
                    try:
                        await asyncio.wait_for(ready.wait(), idle)
                    except asyncio.TimeoutError:
                        if not follow:
                            latest = await self.last(subject, None)
                            if latest is None or latest.stream_seq <= after:
                                return
                        continue
                while arrived:
                    msg = arrived.popleft()
                    stream_seq, pending = _delivery(msg)
                    if stream_seq <= after:
                        continue
                    after = stream_seq
                    # pending counts what the server still holds back, plus what already waits here
                    yield parse_message(self.stream, stream_seq, msg.headers, msg.data, store), pending + len(arrived)
                    if not follow and pending == 0 and not arrived:
                        return
        finally:
            try:
                await sub.unsubscribe()
            except Exception:
                pass

    @property
    def max_payload(self) -> int:
        """The largest message the connected server takes (0: not connected)."""

        return int(getattr(self._nc, "max_payload", 0) or 0) if self._nc is not None else 0

    def too_big(self, size: int) -> str | None:
        """Why a record of ``size`` bytes can never be published (None: it fits). One rule for
        every mode: such a batch is refused before it is acknowledged."""

        limit = self.max_payload
        if limit and size + RECORD_HEADROOM > limit:
            return (
                f"a record of {size} bytes is too big for the stream: the NATS server takes messages "
                f"of at most {limit} bytes (max_payload), headers included"
            )
        return None

    def check_size(self, size: int) -> None:
        """Refuse, before it is committed, a batch whose record the server could not take."""

        reason = self.too_big(size)
        if reason is not None:
            raise ReplicationError(f"A batch was refused: {reason}; nothing was committed")

    async def disconnect(self) -> None:
        """Close the connection and end every task left on the link's loop (consumers' own)."""

        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        if self._nc is not None:
            try:
                await asyncio.wait_for(self._nc.drain(), 2.0)
            except Exception:
                try:
                    await self._nc.close()
                except Exception:
                    pass
            self._nc = None
        leftover = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in leftover:
            task.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)

    # ── lifecycle ───────────────────────────────────────────────────────────

    def close(self) -> None:
        """Disconnect and stop the link's thread (from any thread but the link's)."""

        if self._closed:
            return
        self._closed = True
        try:
            self.run(self.disconnect(), timeout=5)
        except Exception:
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._loop.is_running():
            self._loop.close()


def _unanswered(what: str, error: BaseException) -> ReplicationError:
    """A nats-py error met while asking NATS for ``what``, as one of this module's: JetStream
    without a quorum or a meta leader answers 503 (``ServiceUnavailableError``), which is
    unavailability, as are a lost connection and no answer; any other API error is a refusal."""

    import nats.js.errors

    if isinstance(error, nats.js.errors.ServiceUnavailableError):
        return NatsUnavailableError(f"NATS could not answer for {what}: {error.description or 'service unavailable'} (503)")
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

