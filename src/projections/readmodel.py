"""Queries over the projected tables, each inside a caller's (short) transaction.

The same queries serve the Storage reads and the commit checks, so both see one truth. Results
are freshly decoded objects: nothing returned aliases stored state.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from typing import Any, Final

import lmdb
import msgspec
from pi_durable.errors import StorageRequestError

from ..errors import CorruptProjectionError
from ..log import Environment, codec, zstd
from . import tables as t
from .documents import Documents
from .ranges import ids_in_range as ids_in_range  # the projector's scans import them from here
from .ranges import key_range as key_range
from .ranges import rows_in_range as rows_in_range
from .ranges import seek as seek

MAX_SAFE_INTEGER: Final = 9_007_199_254_740_991
_FAR_BELOW: Final = -(2**63)
_FAR_ABOVE: Final = 2**63 - 1


_pack = t.u64
_U64_PAIR_FROM = struct.Struct(">QQ").unpack
_decode_entry = t.entry_decoder.decode


def as_key_id(value: object) -> int | None:
    """``value`` as an integer key part, or None when no stored id can equal it."""

    if type(value) is int:
        return value if 0 <= value <= t.MAX_ID else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= t.MAX_ID:
        return value
    return None


def scope_key(scope: Any) -> bytes:
    """The reference's scope identity, its text: session, a conversation, or (anything else) a
    task; an owner id is written as Python writes it, so equal texts are one scope."""

    kind = scope["kind"]
    if kind == "session":
        return t.text_key('["session"]')
    if kind == "conversation":
        return t.text_key(f'["conversation",{scope["conversationId"]}]')
    return t.text_key(f'["task",{scope["taskId"]}]')


def address_key(address: Any) -> bytes:
    """The reference's address identity: the JSON text (ASCII, escaped) of kind, scope kind, owner
    and optional key. A surrogate pair held as two code points and the character it encodes are
    one address there, as is an absent key and a null one; so they are here."""

    scope = address["scope"]
    owner = None if scope["kind"] == "session" else scope.get("conversationId", scope.get("taskId"))
    return t.text_key(
        json.dumps(
            [address["kind"], scope["kind"], owner, address.get("key")], separators=(",", ":")
        )
    )


def is_current_only(record: Any) -> bool:
    kind: str = record["scope"]["kind"]
    history: str | None = record.get("history")
    return kind != "conversation" or history == "latest"


def is_alive_at(record: Any, at: Any) -> bool:
    if at == "current":
        return "retiredAt" not in record
    return record["createdAt"] <= at and ("retiredAt" not in record or at < record["retiredAt"])


def point_bound(at: Any) -> int:
    """The newest sequence a document point alive in some record reaches: the reference compares
    a point with sequences by ``<=``, so ``3.5`` and ``3.0`` read as ``3``, ``True`` as ``1``,
    and a point past the key space (``2**70``, infinity) as its end."""

    try:
        whole: int = math.floor(at)
        return min(whole, t.MAX_ID)
    except OverflowError:  # infinity; minus infinity is alive in no record
        return t.MAX_ID


def _unchecked(raw: bytes, table: str, key: bytes) -> bytes:
    return raw[t.SUM_SIZE :]


class ReadModel:
    """Handles to every projected table of one environment, and the queries over them."""

    def __init__(self, env: Environment, generation: int, verify_checksums: bool = True) -> None:
        self.env = env
        self.generation = generation
        self.unseal = t.unseal if verify_checksums else _unchecked
        self.checked = verify_checksums
        self.db = {name: env.db(t.db_name(generation, name)) for name in t.TABLES}
        self.documents = Documents(env, self.db, self.unseal)
        """Document values: head rows, the value cache, replay (shared with the projector)."""

    # ── records by id ───────────────────────────────────────────────────────

    def value(self, txn: lmdb.Transaction[bytes], table: str, key: bytes) -> bytes | None:
        """The checked value at ``key``: damage raises ``CorruptProjectionError``."""

        raw = txn.get(key, db=self.db[table])
        return None if raw is None else self.unseal(raw, table, key)

    def _get(self, txn: lmdb.Transaction[bytes], table: str, id: object) -> Any | None:
        key = as_key_id(id)
        if key is None:
            return None
        packed = _pack(key)
        raw = self.value(txn, table, packed)
        if raw is None:
            return None
        return t.decode_row(t.any_decoder, t.row_body(table, raw), table, packed)

    def record_type(self, txn: lmdb.Transaction[bytes], id: int) -> str | None:
        key = as_key_id(id)
        if key is None:
            return None
        packed = t.u64(key)
        raw = self.value(txn, t.RECORD_IDS, packed)
        return None if raw is None else t.record_type_name(raw, packed)

    def max_record_id(self, txn: lmdb.Transaction[bytes]) -> int:
        cursor = txn.cursor(db=self.db[t.RECORD_IDS])
        return t.read_u64(cursor.key()) if cursor.last() else 0

    def conversation(self, txn: lmdb.Transaction[bytes], id: object) -> Any | None:
        return self._get(txn, t.CONVERSATIONS, id)

    def task(self, txn: lmdb.Transaction[bytes], id: object) -> Any | None:
        return self._get(txn, t.TASKS, id)

    def submission(self, txn: lmdb.Transaction[bytes], id: object) -> Any | None:
        return self._get(txn, t.SUBMISSIONS, id)

    def document_record(self, txn: lmdb.Transaction[bytes], id: object) -> Any | None:
        return self._get(txn, t.DOCUMENTS, id)

    def entry_row(self, txn: lmdb.Transaction[bytes], id: object) -> t.EntryRow | None:
        key = as_key_id(id)
        if key is None:
            return None
        registered = self.value(txn, t.RECORD_IDS, t.u64(key))
        if registered is None or registered[:1] != t.RECORD_TYPES["entry"]:
            return None
        conversation = registered[9:17]  # after the type code and the claiming commit's sequence
        row_key = conversation + t.u64(key)
        raw = self.value(txn, t.ENTRIES_BY_CONVERSATION, row_key)
        return None if raw is None else t.decode_entry(raw, row_key)

    def submission_id_by_request(
        self, txn: lmdb.Transaction[bytes], conversation_id: object, request_id: object
    ) -> int | None:
        key = as_key_id(conversation_id)
        if key is None:
            return None
        raw = self.value(txn, t.SUBMISSIONS_BY_REQUEST, t.u64(key) + t.text_key(request_id))
        return None if raw is None else t.read_u64(raw)

    # ── scans ───────────────────────────────────────────────────────────────

    def scan_table(
        self,
        txn: lmdb.Transaction[bytes],
        table: str,
        index: str | None,
        prefix: bytes,
        after: int | None,
        descending: bool,
    ) -> Iterator[Any]:
        """Records of ``table`` in id order after a cursor, through ``index`` when given."""

        if descending:
            low, high = 0, t.MAX_ID if after is None else after - 1
        else:
            low, high = (0 if after is None else after + 1), t.MAX_ID
        rows = rows_in_range(txn, self.db[index or table], prefix, low, high, descending)
        decode, checked, seal_of = codec.decode, self.unseal is t.unseal, t.seal_of
        records = self.db[table]
        body = t.WRITER_SIZE if table in t.LOGGED_TABLES else 0  # past a row's writer
        for key, raw in rows:
            if index is not None:
                key = key[-8:]  # the index key ends with the record's id
                found = txn.get(key, db=records)
                if found is None:  # an index row whose record is gone
                    raise CorruptProjectionError(table, key)
                raw = found
            value = raw[t.SUM_SIZE :]  # a scan loop: the checksum checked inline
            if checked and seal_of(value) != raw[: t.SUM_SIZE]:
                raise CorruptProjectionError(table, key)
            try:
                decoded = decode(value[body:] if body else value)
            except (msgspec.DecodeError, ValueError):
                raise CorruptProjectionError(table, key) from None
            yield decoded

    def own_entries(
        self, txn: lmdb.Transaction[bytes], conversation_id: Any, after: int | None, limit: int
    ) -> tuple[list[Any], bool]:
        """Up to ``limit`` (>= 0) entries that conversation ``conversation_id`` holds itself (not
        through its fork ancestry), oldest first after id ``after``, and whether one more exists:
        each entry of the store once, for a listing of them all."""

        key = as_key_id(conversation_id)
        if key is None:
            return [], False
        table = t.ENTRIES_BY_CONVERSATION
        low = 0 if after is None else after + 1
        records: list[Any] = []
        for row_key, raw in rows_in_range(txn, self.db[table], t.u64(key), low, t.MAX_ID, False):
            if len(records) == limit:
                return records, True
            value = self.unseal(raw, table, row_key)
            records.append(t.decode_entry(value, row_key).record)
        return records, False

    def entry_page(
        self,
        txn: lmdb.Transaction[bytes],
        conversation_id: Any,
        min_entry_id: Any,
        max_entry_id: Any,
        descending: bool,
        limit: int,
    ) -> tuple[list[t.EntryRow], bool]:
        """Up to ``limit`` (>= 0) entry rows visible from a conversation through its fork
        ancestry, each parent capped at the fork point, newest or oldest first, and whether one
        more exists. The read hosts spend their time in, so it is one loop: no generator layers
        per row, and the row that proves a next page is seen, not decoded."""

        minimum = _FAR_BELOW if min_entry_id is None else min_entry_id
        upper = _FAR_ABOVE if max_entry_id is None else max_entry_id
        segments = self._fork_segments(txn, conversation_id, minimum, upper)
        cursor = txn.cursor(db=self.db[t.ENTRIES_BY_CONVERSATION])
        walk = cursor.iterprev if descending else cursor.iternext
        checked, seal_of, decode, framed, packed = (
            self.checked,
            t.seal_of,
            _decode_entry,
            t.FRAMED[0],
            t.PACKED[0],
        )
        claim, decompress = zstd.frame_reader()  # zstd.unframe inline: a call a row is a sixth
        bound, zstd_error = zstd.MAX_EXPANSION, zstd.Error
        skip = t.SUM_SIZE
        rows: list[t.EntryRow] = []
        for segment_id, segment_upper in segments if descending else reversed(list(segments)):
            bounds = key_range(t.u64(segment_id), minimum, segment_upper)
            if bounds is None:
                continue
            first, last = bounds
            if not seek(cursor, first, last, descending):
                continue
            for key, raw in walk():  # (key, value) pairs made in C, from the current row on
                if key < first or key > last:
                    break
                if len(rows) == limit:
                    return rows, True
                value = raw[skip:]
                if checked and seal_of(value) != raw[:skip]:
                    raise CorruptProjectionError(t.ENTRIES_BY_CONVERSATION, key)
                if value and value[0] == framed:  # an int: no one-byte slice a row
                    try:
                        if not 0 < claim(value) <= bound * len(value):
                            raise CorruptProjectionError(t.ENTRIES_BY_CONVERSATION, key)
                        value = decompress(value)
                    except (zstd_error, MemoryError):
                        raise CorruptProjectionError(t.ENTRIES_BY_CONVERSATION, key) from None
                elif value and value[0] == packed:  # schema 10's form, from a log's base
                    value = t.unpack_entry(value, t.ENTRIES_BY_CONVERSATION, key)
                try:
                    rows.append(decode(value))
                except RecursionError:  # an entry nested deeper than the default stack allows
                    rows.append(t.decode_entry(value, key))
                except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
                    raise CorruptProjectionError(t.ENTRIES_BY_CONVERSATION, key) from None
        return rows, False

    def _fork_segments(
        self, txn: lmdb.Transaction[bytes], conversation_id: Any, minimum: Any, upper: Any
    ) -> Iterator[tuple[int, Any]]:
        """``(conversation id, highest visible entry id)`` from a conversation up to its root.

        An unknown conversation raises before anything is yielded. Past it, a segment is yielded
        before its parent row is read, as the reference walks: a missing ancestor fails only when
        the walk goes past it.
        """

        current = as_key_id(conversation_id)
        fork = None if current is None else self.value(txn, t.CONVERSATION_PARENTS, t.u64(current))
        if fork is None:
            raise StorageRequestError(f"Unknown conversation: {conversation_id}")
        return self._walk_forks(txn, current, fork, minimum, upper)  # type: ignore[arg-type]

    def _walk_forks(
        self,
        txn: lmdb.Transaction[bytes],
        current: int,
        fork: bytes | None,
        minimum: Any,
        upper: Any,
    ) -> Iterator[tuple[int, Any]]:
        while True:
            yield current, upper
            if fork is None:
                fork = self.value(txn, t.CONVERSATION_PARENTS, t.u64(current))
                if fork is None:
                    raise KeyError(current)
            if not fork:
                return
            current, at = _U64_PAIR_FROM(fork)
            upper = min(upper, at)
            if upper < minimum:
                return
            fork = None

    def latest_head_marker(
        self, txn: lmdb.Transaction[bytes], conversation_id: Any, at_or_before: Any
    ) -> Any | None:
        upper = MAX_SAFE_INTEGER if at_or_before is None else at_or_before
        heads = self.db[t.HEADS_BY_CONVERSATION]
        for segment_id, segment_upper in self._fork_segments(
            txn, conversation_id, _FAR_BELOW, upper
        ):
            for id, _ in ids_in_range(txn, heads, t.u64(segment_id), 0, segment_upper, True):
                key = t.u64_pair(segment_id, id)
                raw = self.value(txn, t.ENTRIES_BY_CONVERSATION, key)
                if raw is None:  # a head whose entry is gone
                    raise CorruptProjectionError(t.ENTRIES_BY_CONVERSATION, key)
                return t.decode_entry(raw, key).record
        return None

    # ── documents ───────────────────────────────────────────────────────────

    def current_document_id(self, txn: lmdb.Transaction[bytes], address: bytes) -> int | None:
        raw = self.value(txn, t.DOCUMENT_CURRENT, address)
        return None if raw is None else t.read_u64(raw)

    def incarnations(self, txn: lmdb.Transaction[bytes], address: bytes) -> Iterator[int]:
        for id, _ in ids_in_range(
            txn, self.db[t.DOCUMENT_INCARNATIONS], address, 0, t.MAX_ID, False
        ):
            yield id

    def current_value(self, txn: lmdb.Transaction[bytes], id: int) -> t.CurrentValue | None:
        found = self.current_encoded(txn, id)
        return None if found is None else found[0]

    def current_encoded(
        self, txn: lmdb.Transaction[bytes], id: int
    ) -> tuple[t.CurrentValue, bytes] | None:
        """A live document's row and the bytes it is stored as (``Documents``)."""

        return self.documents.current_encoded(txn, id)

    def last_revision_version(self, txn: lmdb.Transaction[bytes], id: int) -> int | None:
        for seq, raw in ids_in_range(
            txn, self.db[t.DOCUMENT_REVISIONS], t.u64(id), 0, t.MAX_ID, True
        ):
            key = t.u64_pair(id, seq)
            version: int = t.decode_row(
                t.revision_decoder,
                self.unseal(raw, t.DOCUMENT_REVISIONS, key),
                t.DOCUMENT_REVISIONS,
                key,
            ).version
            return version
        return None

    def revisions(self, txn: lmdb.Transaction[bytes], id: int) -> Iterator[tuple[int, t.Revision]]:
        """``(seq, revision)`` of every stored content command of one incarnation, oldest first:
        the versions a reader can pick (a current-only document keeps none)."""

        for seq, raw in ids_in_range(
            txn, self.db[t.DOCUMENT_REVISIONS], t.u64(id), 0, t.MAX_ID, False
        ):
            key = t.u64_pair(id, seq)
            yield (
                seq,
                t.decode_row(
                    t.revision_decoder,
                    self.unseal(raw, t.DOCUMENT_REVISIONS, key),
                    t.DOCUMENT_REVISIONS,
                    key,
                ),
            )

    def materialize(self, txn: lmdb.Transaction[bytes], id: Any, at: Any) -> dict[str, Any] | None:
        """One incarnation at a point: ``{record, version, value, deltasSinceBase}``."""

        record = self.document_record(txn, id)
        if record is None:
            return None
        if at != "current" and is_current_only(record):
            raise StorageRequestError(f"Document {id} does not retain historical content")
        if not is_alive_at(record, at):
            return None
        upper = None if at == "current" else point_bound(at)
        version, value, deltas = self.documents.value(txn, id, upper)
        return {"record": record, "version": version, "value": value, "deltasSinceBase": deltas}

    def replay(self, txn: lmdb.Transaction[bytes], id: int, upper: int) -> tuple[int, Any, int]:
        """The value at ``upper`` (``Documents.replay``)."""

        return self.documents.replay(txn, id, upper)


__all__ = [
    "MAX_SAFE_INTEGER",
    "ReadModel",
    "address_key",
    "as_key_id",
    "ids_in_range",
    "is_alive_at",
    "is_current_only",
    "key_range",
    "rows_in_range",
    "scope_key",
    "seek",
]
