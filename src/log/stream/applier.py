"""Taking a store's messages from its stream into its log and projections.

One path for every reader of the stream: a replicated writer settling before a group
(``writer.py``), a replica following (``storage.replica``) and a restore. A record is appended
exactly as the stream holds it (checksums checked on receipt) and folded through the store's
``Admitter`` (the projections' ``Projector``: the same checks and fold as a local commit), so
a replica's reads equal the writer's. A message that is not the next record of this store stops
it with ``ForeignMessageError`` naming its stream sequence.

An erasure (``erasure.py``): a ``tombstones`` message puts each tombstone over the record this
store holds (the same leaf hash, or it is refused), then ``on_rewrite`` is called in the same
transaction (the store marks its projections for a rebuild). Where an erased record's message was
deleted, the record after the gap finds the missing records' tombstones through ``tombstones``
(a ``TombstoneLookup``) and they are appended and folded in its place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Final, Protocol

import lmdb

from ...errors import CorruptRecordError, DamageError, ForeignMessageError, ProjectionsBehind
from .. import WriteLog, decode_record
from ..records import Write, record_leaf
from .message import StreamMessage, Tombstones
from .position import POSITION_FORMAT, StreamPosition, put_position

_logger = logging.getLogger(__name__)

FETCH_CHUNK: Final = 4096
"""Messages taken from the stream per transaction when a store catches up."""


class Admitter(Protocol):
    """What folds a record into the store's tables (``projections.Projector``): check ``writes``
    against ``txn``, call ``append()`` (which logs the record and returns its sequence), fold;
    returns the sequence and highest id, or the checks' error with nothing written."""

    def admit(
        self, txn: lmdb.Transaction[bytes], writes: list[Write], append: Callable[[], int]
    ) -> tuple[int, int] | Exception: ...


class StreamApplier:
    """Takes a store's messages from the stream into its log and projections."""

    def __init__(self, stream: str, store: str, log: WriteLog, meta: lmdb._Database) -> None:
        self.stream, self.store, self.log, self.meta = stream, store, log, meta
        self.max_id = 0
        """The highest record id among the records applied (callers raise their mint floor)."""
        self.tombstones: Callable[[int, list[int]], dict[int, bytes]] | None = None
        """Where the tombstones of deleted records' messages are found: called with the stream
        sequence after which to look and the log sequences missing (``TombstoneLookup``)."""
        self.on_rewrite: Callable[[lmdb.Transaction[bytes]], None] | None = None
        """Called in the transaction that put a tombstone over a record this store held."""
        self.erasure_ahead = 0
        """The latest erasure record named by a tombstone taken for a deleted message (a reader
        that stops before it holds a tombstone its log cannot account for)."""

    def apply(
        self,
        txn: lmdb.Transaction[bytes],
        projector: Admitter,
        messages: Iterable[StreamMessage],
        position: StreamPosition,
    ) -> StreamPosition:
        """Append and fold the records of ``messages`` (in stream order; an iterator may check
        each as it is taken, and must be a fresh one for each run of a transaction) inside ``txn``; returns the new position, also written in ``txn``. The first message that is not the next record
        of this store raises ``ForeignMessageError`` naming it; what came before it stays in
        ``txn`` (the caller decides whether to commit that)."""

        log = self.log
        head = log.head(txn)
        for message in messages:
            if message.stream_seq <= position.stream_seq:
                continue
            if message.kind == "record":
                if message.epoch < position.epoch:
                    raise ForeignMessageError(
                        self.stream,
                        message.stream_seq,
                        f"record {message.seq} is of writer epoch {message.epoch}, after epoch {position.epoch} fenced it",
                    )
                if message.seq > head + 1:
                    head = self._fill_gap(txn, projector, message, head)
                if message.seq <= head:
                    if not self._same(log.record(txn, message.seq), message):
                        raise ForeignMessageError(
                            self.stream,
                            message.stream_seq,
                            f"record {message.seq} differs from this store's own record {message.seq} (the histories forked)",
                        )
                elif message.seq != head + 1:
                    raise ForeignMessageError(
                        self.stream,
                        message.stream_seq,
                        f"record {message.seq} does not follow this store's head {head}",
                    )
                else:
                    if message.root is not None:
                        self._check_root(txn, message, head)
                    commit = message.commit or decode_record(message.seq, message.data)
                    outcome = projector.admit(
                        txn,
                        commit.writes,
                        lambda: log.append_record(txn, message.seq, message.data),
                    )
                    if isinstance(outcome, Exception):
                        raise ForeignMessageError(
                            self.stream,
                            message.stream_seq,
                            f"record {message.seq} is not a valid commit here: {outcome}",
                        )
                    self.max_id = max(self.max_id, outcome[1])
                    head = message.seq
            else:
                control = message.control
                if message.kind == "ids":
                    position.ids_reserved = max(position.ids_reserved, control.upto)  # type: ignore[union-attr]
                elif isinstance(control, Tombstones):
                    self._put_tombstones(txn, message, control, head)
            position = (
                StreamPosition(  # records up to message.seq are the stream's (controls name it too)
                    POSITION_FORMAT,
                    self.stream,
                    message.stream_seq,
                    message.seq,
                    max(position.epoch, message.epoch),
                    position.ids_reserved,
                )
            )
        put_position(txn, self.meta, position)
        return position

    @staticmethod
    def _same(local: bytes | None, message: StreamMessage) -> bool:
        """Whether this store's record is the message's: the same bytes, or a tombstone this
        store put over it (which keeps its leaf hash)."""

        if local is None or local == message.data:
            return local is not None
        try:
            return decode_record(message.seq, local).tombstone is not None and record_leaf(
                message.seq, local
            ) == record_leaf(message.seq, message.data)
        except CorruptRecordError:
            return False

    def _fill_gap(
        self,
        txn: lmdb.Transaction[bytes],
        projector: Admitter,
        message: StreamMessage,
        head: int,
    ) -> int:
        """Records ``head + 1`` up to the one before ``message``, whose messages an erasure
        deleted: their tombstones, appended and folded. Returns the new head."""

        missing = list(range(head + 1, message.seq))
        found = {} if self.tombstones is None else self.tombstones(message.stream_seq, missing)
        if len(found) != len(missing):
            raise ForeignMessageError(
                self.stream,
                message.stream_seq,
                f"record {message.seq} does not follow this store's head {head}, and the stream "
                f"holds no tombstone of records {[s for s in missing if s not in found][:10]}",
            )
        for seq in missing:
            data = found[seq]
            try:
                commit = decode_record(seq, data)
            except CorruptRecordError as error:
                raise ForeignMessageError(
                    self.stream,
                    message.stream_seq,
                    f"the tombstone of record {seq}: {error.reason}",
                ) from None
            if commit.tombstone is None:
                raise ForeignMessageError(
                    self.stream, message.stream_seq, f"the tombstone of record {seq} is not one"
                )
            outcome = projector.admit(
                txn,
                commit.writes,
                lambda seq=seq, data=data: self.log.append_record(txn, seq, data),  # type: ignore[misc]
            )
            if isinstance(outcome, Exception):
                raise ForeignMessageError(
                    self.stream,
                    message.stream_seq,
                    f"the tombstone of record {seq} is not a valid commit here: {outcome}",
                )
            self.max_id = max(self.max_id, outcome[1])
            self.erasure_ahead = max(self.erasure_ahead, commit.tombstone.erasure)
        return message.seq - 1

    def _put_tombstones(
        self,
        txn: lmdb.Transaction[bytes],
        message: StreamMessage,
        control: Tombstones,
        head: int,
    ) -> None:
        """Put each tombstone over the record this store holds (unless it is there already)."""

        rewritten = False
        for seq, data in control.records:
            local = self.log.record(txn, seq) if seq <= head else None
            if local is None:
                raise ForeignMessageError(
                    self.stream,
                    message.stream_seq,
                    f"a tombstone of record {seq}, which this store (head {head}) does not hold",
                )
            if local == data:
                continue
            try:
                if decode_record(seq, data).tombstone is None:
                    raise CorruptRecordError(seq, "it is not a tombstone")
                same = record_leaf(seq, data) == record_leaf(seq, local)
            except CorruptRecordError as error:
                raise ForeignMessageError(
                    self.stream,
                    message.stream_seq,
                    f"the tombstone of record {seq}: {error.reason}",
                ) from None
            if not same:
                raise ForeignMessageError(
                    self.stream,
                    message.stream_seq,
                    f"the tombstone of record {seq} does not keep its leaf hash (the histories forked)",
                )
            self.log.replace(txn, seq, data)
            rewritten = True
        if rewritten and self.on_rewrite is not None:
            self.on_rewrite(txn)

    def _check_root(self, txn: lmdb.Transaction[bytes], message: StreamMessage, head: int) -> None:
        """Refuse, before it is appended, a record after which this store's tree would not have
        the root its writer's had: the histories forked."""

        try:
            root = self.log.tree_root(txn, head, record_leaf(message.seq, message.data))
        except (DamageError, ProjectionsBehind) as error:  # this store's own tree: verify names it
            _logger.error("record %d's tree root was not checked: %s", message.seq, error)
            return
        if root != message.root:
            raise ForeignMessageError(
                self.stream,
                message.stream_seq,
                f"record {message.seq} would give this store's log tree the root {root.hex()}, not its writer's "
                f"{(message.root or b'').hex()} (the histories forked)",
            )


__all__ = [
    "FETCH_CHUNK",
    "Admitter",
    "StreamApplier",
]
