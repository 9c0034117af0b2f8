"""Commits acknowledged by a NATS JetStream stream (``durability="replicated"``), and the one way
records that come from the stream enter a store (``StreamApplier``: a writer settling, a replica).

Order of events for a group of commits (the stream decides, LMDB follows):

1. In the group's LMDB write transaction (not yet committed), each batch is checked against the
   state the batches before it left, appended and folded: this gives it its sequence.
2. Their records go to the stream as one atomic batch, conditional on the store's subject still
   ending at the message this writer last appended (``Nats-Expected-Last-Subject-Sequence``).
3. Only after the stream acknowledged them (with R3: stored on a quorum of servers) does the LMDB
   transaction commit; only then do the callers hear back.

So no acknowledged commit can be missing from the stream. A writer killed between 2 and 3 left
records in the stream that its store lacks: before its first group (at open, and after any
publish the stream refused or did not answer) the writer *settles*: it asks the stream's leader
for the subject's last message, takes in every record beyond its own head (in the same
transaction as the group that follows), or ships records the stream lacks (a store that was
written locally before), and refuses to go on if the two histories differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Final

import lmdb

from ...errors import (
    ForeignMessageError,
    LeaseLapsedError,
    NotWriterError,
    OutcomeUnknownError,
    ReplicationError,
    StreamMovedError,
)
from .. import Environment, WriteLog
from .applier import FETCH_CHUNK, Admitter, StreamApplier
from .erasure import TombstoneLookup, tombstone_messages
from .lease import WriterLease
from .link import StreamLink
from .message import (
    H_EPOCH,
    H_KIND,
    H_SEQ,
    Fence,
    IdReservation,
    RawMessage,
    StreamMessage,
    carried_root,
    control_headers,
    encode_control,
    parse_message,
    record_headers,
    subject_of,
)
from .position import POSITION_FORMAT, StreamPosition, put_position, read_position
from .status import WriterStatus

SHIP_CHUNK: Final = 256
"""Records per atomic batch when a writer ships history the stream lacks."""


class StreamWriter:
    """The replicated-durability side of a writer: settles, then publishes each group's records
    before its transaction commits (see the module docstring). Runs on the writer thread."""

    def __init__(
        self, link: StreamLink, env: Environment, log: WriteLog, store: str, meta: lmdb._Database
    ) -> None:
        self.link, self.env, self.log, self.store, self.meta = link, env, log, store, meta
        self.subject = subject_of(link.stream, store)
        self.applier = StreamApplier(link.stream, store, log, meta)
        self.applier.tombstones = TombstoneLookup(link, self.subject, store)
        self.epoch = 0
        self.expected = 0
        """The stream sequence of the subject's last message, as this writer last saw it."""
        self.settled = False
        self.in_doubt = False
        """Records were published in a transaction that has not committed yet."""
        self.in_doubt_seqs: list[int] = []
        """The sequences of those records."""
        self.landed: frozenset[int] = frozenset()
        """Records of the group being run that the stream already holds: its transaction was
        published, then failed to commit (a map growth), and the run again took them in from the
        stream; the committer hands their callers the outcome of the first run instead of
        appending them twice. Cleared when the group is done."""
        self.failure: NotWriterError | None = None
        self.lease: WriterLease | None = None
        """Held by a writer of a store on the stream: checked before every publish."""
        self.fence_pending = False
        """A new lease's fence goes to the subject before anything else."""
        self.position: StreamPosition | None = None
        self.acked_seq = 0
        self.last_error: str | None = None

    # ── settling ────────────────────────────────────────────────────────────

    def settle(self, txn: lmdb.Transaction[bytes], projector: Admitter) -> None:
        """Make the store and its subject level before a group (no-op once settled)."""

        if self.failure is not None:
            raise self.failure
        if self.lease is not None and self.lease.epoch != self.epoch:
            # The lease lapsed and the renewer (on the link's loop) took it again: the new epoch
            # is taken here, on the writer thread, between groups, so a group never publishes
            # under an epoch whose fence is not on the subject before it.
            self.epoch, self.fence_pending, self.settled = self.lease.epoch, True, False
        if self.in_doubt:
            # A transaction whose records the stream took did not commit (a map growth runs it
            # again, or its batches run alone): its records come back from the stream, never
            # published twice, and their callers get the outcome they had (``landed``).
            self.in_doubt = self.settled = False
            self.landed = self.landed | frozenset(self.in_doubt_seqs)
            self.in_doubt_seqs = []
        if self.settled:
            return
        if self.fence_pending:
            self._fence(txn)
        position = read_position(txn, self.meta, self.link.stream)
        last = self.link.run(self.link.messages.last(self.subject, self.store))
        head = self.log.head(txn)
        if last is None:
            if position.stream_seq:
                raise ReplicationError(
                    f"Stream {self.link.stream!r} holds nothing of store {self.store}, yet this store took in "
                    f"its message {position.stream_seq}: the stream was purged or replaced; restore the store "
                    "or open it with another stream"
                )
            self.expected = 0
            position = self._ship(txn, 1, head, position)
        elif last.seq > head or last.stream_seq > position.stream_seq:
            position = self._take_in(txn, projector, position, last.stream_seq)
            self.expected = position.stream_seq
            if position.seq < head:  # the stream lacks records this store wrote alone
                position = self._ship(txn, position.seq + 1, head, position)
        else:
            if last.kind == "record" and self.log.record(txn, last.seq) != last.data:
                raise ForeignMessageError(
                    self.link.stream,
                    last.stream_seq,
                    f"record {last.seq} differs from this store's own record {last.seq} (the histories forked)",
                )
            self.expected = last.stream_seq
            position = self._ship(txn, last.seq + 1, head, position)
        if self.lease is not None and position.epoch > self.epoch:
            raise self._fenced_out(position.epoch, "took in its fence")
        self.position = position
        self.settled = True
        self.last_error = None

    def _fenced_out(self, epoch: int | None, how: str) -> NotWriterError:
        """This writer's epoch is behind the subject's: depose it (the lease's ``on_lost``)."""

        deposed = NotWriterError(
            f"Store {self.store} is written by a writer of epoch {epoch} (this writer {how}); "
            f"this writer (epoch {self.epoch}) takes no more commits",
            self.store,
            epoch,
        )
        if self.lease is not None:
            self.lease.depose(deposed)
        return deposed

    def _fence(self, txn: lmdb.Transaction[bytes]) -> None:
        """Put this writer's fence on the subject: from it on, only this epoch's appends land."""

        assert self.lease is not None
        for _ in range(20):
            last = self.link.run(self.link.messages.last(self.subject, self.store))
            head = 0 if last is None else last.seq
            if last is not None and last.epoch >= self.epoch:
                if (
                    last.kind == "fence"
                    and last.epoch == self.epoch
                    and getattr(last.control, "holder", None) == self.lease.holder
                ):
                    self.fence_pending = False  # our own fence, whose answer was lost
                    return
                raise self._fenced_out(
                    last.epoch, "found its message on the subject before fencing"
                )
            self.lease.check()
            fence = (
                control_headers(self.store, "fence", self.epoch, head),
                encode_control(Fence(self.epoch, self.lease.holder)),
            )
            try:
                self.link.run(
                    self.link.messages.publish(
                        self.subject, [fence], 0 if last is None else last.stream_seq
                    )
                )
            except StreamMovedError:
                continue  # the old writer appended meanwhile: fence after that
            self.fence_pending = False
            return
        raise ReplicationError(
            f"Store {self.store}'s subject kept moving: this writer could not fence it"
        )

    def _take_in(
        self,
        txn: lmdb.Transaction[bytes],
        projector: Admitter,
        position: StreamPosition,
        until: int,
    ) -> StreamPosition:
        while position.stream_seq < until:
            raws = self.link.run(
                self.link.messages.fetch(self.subject, position.stream_seq, batch=FETCH_CHUNK)
            )
            messages: Iterable[StreamMessage] = (
                self._checked(raws, until)
                if raws
                else self.link.run(self._consume(position.stream_seq, until))
            )
            before = position.stream_seq
            position = self.applier.apply(txn, projector, messages, position)
            if position.stream_seq == before:
                raise ReplicationError(
                    f"Stream {self.link.stream!r} did not deliver messages {before + 1}..{until} of {self.subject}"
                )
        return position

    def _checked(self, raws: list[RawMessage], until: int) -> Iterator[StreamMessage]:
        """``raws`` up to stream sequence ``until``, each checked just before it is folded (no
        batch of decoded records is held for the garbage collector to walk)."""

        for raw in raws:
            if raw.stream_seq > until:
                return
            yield parse_message(self.link.stream, raw.stream_seq, raw.headers, raw.data, self.store)

    async def _consume(self, after: int, until: int) -> list[StreamMessage]:
        """The next messages after ``after`` from a consumer (what a batch did not answer)."""

        messages: list[StreamMessage] = []
        async for message, pending in self.link.messages.read(
            self.subject, after, store=self.store, follow=False
        ):
            messages.append(message)
            if message.stream_seq >= until or pending == 0 or len(messages) >= FETCH_CHUNK:
                break
        return messages

    def _ship(
        self, txn: lmdb.Transaction[bytes], first: int, last: int, position: StreamPosition
    ) -> StreamPosition:
        """Publish records ``first..last`` this store holds and the stream lacks."""

        seq = first
        while seq <= last:
            chunk = list(range(seq, min(last, seq + SHIP_CHUNK - 1) + 1))
            position = self._publish(txn, chunk)
            seq = chunk[-1] + 1
        return position

    # ── publishing ──────────────────────────────────────────────────────────

    def publish(self, txn: lmdb.Transaction[bytes], seqs: list[int]) -> None:
        """Publish the records ``seqs`` appended in ``txn``; returns once the stream holds them.
        Anything else raises, and the caller must abort ``txn``."""

        if self.failure is not None:
            raise self.failure
        self._publish(txn, seqs)

    def publish_erasure(
        self, txn: lmdb.Transaction[bytes], seq: int, tombstones: list[tuple[int, bytes]]
    ) -> None:
        """Publish erasure record ``seq`` appended in ``txn`` and, in the same atomic batch, the
        ``tombstones`` (log sequence, record) it put in place (``erasure.py``); returns once the
        stream holds them. Anything else raises, and the caller must abort ``txn``."""

        if self.failure is not None:
            raise self.failure
        limit = getattr(self.link.messages, "max_payload", 0)
        messages = [
            self._record_message(txn, seq),
            *tombstone_messages(self.store, self.epoch, seq, tombstones, limit),
        ]
        self._send(txn, messages, seq)
        self.in_doubt_seqs = [seq]

    def check_size(self, payload: bytes) -> None:
        """Refuse, before it is appended, a batch whose record the server could not take."""

        self.link.messages.check_size(len(payload))

    def publish_ids(self, txn: lmdb.Transaction[bytes], upto: int) -> None:
        """Put an id block reservation on the subject (in ``txn``, which also keeps it locally):
        a later writer starts minting above it."""

        if self.failure is not None:
            raise self.failure
        head = self.log.head(txn)
        message = (
            control_headers(self.store, "ids", self.epoch, head),
            encode_control(IdReservation(self.epoch, upto)),
        )
        self._send(txn, [message], head, upto)

    def _publish(self, txn: lmdb.Transaction[bytes], seqs: list[int]) -> StreamPosition:
        messages = [self._record_message(txn, seq) for seq in seqs]
        return self._send(txn, messages, seqs[-1], seqs=seqs)

    def _record_message(
        self, txn: lmdb.Transaction[bytes], seq: int
    ) -> tuple[dict[str, str], bytes]:
        """The message of record ``seq`` as ``txn`` holds it: its headers and its bytes."""

        data = self.log.record(txn, seq)
        assert data is not None
        root = carried_root(seq, lambda: self.log.tree_root(txn, seq))
        return record_headers(self.store, seq, self.epoch, root), data

    def _send(
        self,
        txn: lmdb.Transaction[bytes],
        messages: list[tuple[dict[str, str], bytes]],
        head: int,
        ids: int = 0,
        seqs: Sequence[int] = (),
    ) -> StreamPosition:
        if self.lease is not None:
            self.lease.check()
            if (
                self.lease.epoch != self.epoch
            ):  # it lapsed and was taken again since this group settled
                self.settled = False
                raise LeaseLapsedError(
                    f"The lease of store {self.store} lapsed and was taken again (epoch {self.lease.epoch}, was "
                    f"{self.epoch}) while this commit was written: nothing was committed; the next commit "
                    "fences the new epoch first",
                    self.store,
                    self.epoch,
                )
        try:
            last = self.link.run(self.link.messages.publish(self.subject, messages, self.expected))
        except StreamMovedError as error:
            self.settled = False
            self.last_error = str(error)
            epoch = (
                self._last_epoch()
            )  # a foreign message there raises ForeignMessageError: damage, not ownership
            if epoch is not None and epoch == self.epoch:  # an earlier append of ours landed late
                raise ReplicationError(
                    f"Store {self.store} was not committed to: {error}. Nothing of this commit was stored; "
                    "the store takes in what the stream holds before its next commit"
                ) from None
            deposed = NotWriterError(
                f"Store {self.store} is written by another writer"
                + ("" if epoch is None else f" (epoch {epoch})")
                + f": {error}. Nothing of this commit was stored; this writer (epoch {self.epoch}) takes no more commits",
                self.store,
                epoch,
            )
            if self.lease is not None:
                self.lease.depose(deposed)
            raise deposed from None
        except OutcomeUnknownError as error:
            self.settled = False
            self.last_error = str(error)
            last = self._landed(messages, error)
        except ReplicationError as error:
            self.settled = False
            self.last_error = str(error)
            raise
        self.expected = last
        # In doubt from here: the local puts below can fail (a full map) after the stream took
        # the records, and the run again must know which of its batches landed.
        self.in_doubt, self.in_doubt_seqs = True, list(seqs)
        self.acked_seq = head
        position = read_position(txn, self.meta, self.link.stream)
        position = StreamPosition(
            POSITION_FORMAT,
            self.link.stream,
            last,
            head,
            max(position.epoch, self.epoch),
            max(position.ids_reserved, ids),
        )
        put_position(txn, self.meta, position)
        self.position = position
        return position

    def committed(self) -> None:
        """The transaction holding the last publish committed."""

        self.in_doubt = False
        self.in_doubt_seqs = []

    def _last_epoch(self) -> int | None:
        try:
            last = self.link.run(self.link.messages.last(self.subject, self.store))
        except ForeignMessageError as error:
            self.last_error = str(error)
            raise
        except ReplicationError:
            return None
        return None if last is None else last.epoch

    def _landed(
        self, messages: list[tuple[dict[str, str], bytes]], error: OutcomeUnknownError
    ) -> int:
        """After an unanswered publish: the stream sequence of the last of ``messages`` if the
        subject holds them all right after ``self.expected`` (the publish went through, whatever
        another writer appended after them: the commit is stored, and the next group learns who
        writes now). Raises ``error`` when none of them is there or the stream cannot say, and an
        ``OutcomeUnknownError`` naming what landed when only the first few did."""

        async def first_after() -> list[StreamMessage]:
            found: list[StreamMessage] = []
            async for message, _ in self.link.messages.read(
                self.subject, self.expected, store=self.store, follow=False
            ):
                found.append(message)
                if len(found) == len(messages):
                    break
            return found

        try:
            found = self.link.run(first_after())
        except ReplicationError:
            raise error from None
        count = 0
        for (headers, body), message in zip(messages, found):
            if (message.kind, message.seq, message.epoch, message.data) != (
                headers[H_KIND],
                int(headers[H_SEQ]),
                int(headers[H_EPOCH]),
                body,
            ):
                break
            count += 1
        if count == len(messages):
            try:
                last = self.link.run(self.link.messages.last(self.subject, self.store))
            except ReplicationError:
                last = None
            self.settled = last is not None and last.stream_seq == found[-1].stream_seq
            return found[-1].stream_seq
        if count == 0:
            raise error
        raise OutcomeUnknownError(
            f"{error}. The stream holds the first {count} of the {len(messages)} messages sent "
            f"(through log sequence {found[count - 1].seq}, stream sequence {found[count - 1].stream_seq}) "
            f"and not the rest: the records up to log sequence {found[count - 1].seq} are stored, later ones are not"
        ) from None

    def status(self) -> WriterStatus:
        return WriterStatus(
            stream=self.link.stream,
            subject=self.subject,
            shipped_seq=self.acked_seq if self.acked_seq else self.log.head(),
            lag_records=0,
            lag_ms=0.0,
            last_error=self.last_error or self.link.last_error,
            epoch=self.epoch,
            lease=None if self.lease is None else self.lease.status(),
            failed=None if self.failure is None else str(self.failure),
        )


__all__ = [
    "SHIP_CHUNK",
    "StreamWriter",
]
