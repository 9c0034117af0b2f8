"""Versioned documents: revisions, bases and snapshots, the head row, the value cache, replay.

A document's content commands are its revisions (``DOCUMENT_REVISIONS``: a base value or a batch
of delta ops, keyed by the commit). ``DOCUMENT_VALUES`` holds one row per live document, a
``CurrentValue``: a short value is kept whole in it (a read is one row); once the value's bytes
pass ``tables.CHUNK`` the row is a *head* (``held``): the counters, the last revision's sequence
and ``chain``, no value. A commit to a long document then writes its delta row and the head row,
never the value, and the value is found (in this order):

- in the process's ``DocumentCache``, under the head's ``chain``: the writer advances its entry
  by each delta it commits, so the writer's reads and checks cost the delta, not the value;
- else from the newest snapshot (``DOCUMENT_SNAPSHOTS``) or base at or before the head's
  sequence and the deltas after it (``replay``), which the snapshot policy bounds
  (``tables.SNAPSHOT_SHARE``): a reader in another process, or an evicted entry.

``chain`` links each revision to the ones before it: BLAKE2b-128 of the previous chain, the
revision's sequence and its stored bytes (a base starts a chain). It names the value the head
stands for, so a cached entry is served only when it was folded from exactly the revisions the
reader's own transaction holds: an entry left by a transaction that did not commit (a group run
again after the map grew reuses its sequences) never matches, and unlike a checksum of the
value, no crafted value can match another's (XXH3-64 is not collision resistant). It is derived
from the log alone, so a rebuild writes the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, NamedTuple, Protocol

import lmdb

from ..errors import StoreClosedError
from ..log import Environment
from ..log.records import BaseContent, DeltaContent
from ..log.threads import Worker
from . import tables as t
from .delta import Folding, Json, PathError, UnsafePathError, apply_batches, apply_ops, copy_json
from .history import AsOfTxn
from .ranges import ids_in_range
from .rows import Rows

SNAPSHOT_EVERY: Final = 64
"""A document's value is kept (a snapshot) at most every this many deltas, so a read at a past
point (or in a view) of a small document replays at most this many deltas however long the
tail is."""
SNAPSHOT_SHARE: Final = 8
"""...and only once the deltas since the last snapshot (or base) hold at least 1/8 of the bytes of
the value then (``CurrentValue.size``). Why: a snapshot is the whole value, so at a fixed count a
document that grows every turn (a transcript never checkpointed) stored its whole text every 64
turns: bytes quadratic in its history, where SQLite's backend keeps deltas only. With this share,
snapshots hold at most nine times the bytes of the deltas they follow (before they are
deflated), so a document's bytes stay linear in its history, and a past read replays at most an
eighth of the value in deltas (a run of appends is joined and applied once,
``delta.apply_batches``), about what decoding the snapshot itself costs."""
LOOK_CHUNK: Final = 256
"""Head rows a read transaction of the packer's look for lost snapshots reads at most."""


def link(chain: str, seq: int, encoded_revision: bytes) -> str:
    """The chain after revision ``encoded_revision`` of commit ``seq`` (``""`` for a base), in
    hex (rows are encoded with the log's codec, which keeps text, not bytes)."""

    digest = hashlib.blake2b(chain.encode(), digest_size=16)
    digest.update(t.u64(seq))
    digest.update(encoded_revision)
    return digest.hexdigest()


def is_long(size: int) -> bool:
    """Whether a value of ``size`` bytes (as the revisions count them) is kept as a head row."""

    return size > t.CHUNK


class _Entry:
    __slots__ = ("chain", "folding", "size")

    def __init__(self, chain: str, folding: Folding, size: int) -> None:
        self.chain = chain
        self.folding = folding
        self.size = size


class DocumentCache:
    """Long documents' values in memory, by id, each under the chain of the revisions it was
    folded from (``link``), at most ``BYTES`` of values (as their revisions count them) and
    ``ENTRIES`` entries, the least recently used going first.

    Entries are advanced in place by the writer and copied out for readers under one lock, so a
    reader never sees a value mid-delta; values handed out are copies (``copy_json``: the text
    of a transcript is shared, being immutable, so a copy costs its containers, not its bytes).
    """

    ENTRIES: Final = 64
    BYTES: Final = 64 << 20

    def __init__(self) -> None:
        self._items: dict[int, _Entry] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def read(self, id: int, chain: str) -> Json | None:
        """A copy of the value under ``chain``, or None (a value of JSON null is then replayed
        at each read: a document holding only null is short anyway)."""

        with self._lock:
            entry = self._items.get(id)
            if entry is None or entry.chain != chain:
                return None
            self._items[id] = self._items.pop(id)  # the most recently used goes last
            return copy_json(entry.folding.joined())

    def advance(self, id: int, chain: str, after: str, ops: Any, size: int) -> bool | None:
        """Apply a delta to the entry under ``chain`` and file it under ``after``: True; False
        when no such entry is held; None when the delta failed (the entry is dropped)."""

        with self._lock:
            entry = self._items.get(id)
            if entry is None or entry.chain != chain:
                return False
            try:
                entry.folding.apply(ops)
            except Exception:
                self._drop(id)
                return None
            entry.chain = after
            self._items[id] = self._items.pop(id)
            self._bytes += size - entry.size
            entry.size = size
            self._trim(id)
            return True

    def take(self, id: int, chain: str) -> _Entry | None:
        """Take out the entry under ``chain`` (a write transaction advances it apart, and puts
        it back once it commits), or None."""

        with self._lock:
            entry = self._items.get(id)
            if entry is None or entry.chain != chain:
                return None
            self._drop(id)
            return entry

    def put(self, id: int, chain: str, folding: Folding, size: int) -> None:
        """Hold ``folding`` (owned by the cache from now on) under ``chain``."""

        self.hold(id, _Entry(chain, folding, size))

    def hold(self, id: int, entry: _Entry) -> None:
        """Hold ``entry`` as it is (a committed transaction's own, which nothing else holds)."""

        with self._lock:
            self._drop(id)
            self._items[id] = entry
            self._bytes += entry.size
            self._trim(id)

    def discard(self, id: int) -> None:
        with self._lock:
            self._drop(id)

    def _drop(self, id: int) -> None:
        entry = self._items.pop(id, None)
        if entry is not None:
            self._bytes -= entry.size

    def _trim(self, keep: int) -> None:
        while len(self._items) > 1 and (
            len(self._items) > self.ENTRIES or self._bytes > self.BYTES
        ):
            oldest = next(iter(self._items))
            if oldest == keep:
                self._items[keep] = self._items.pop(keep)
                oldest = next(iter(self._items))
            self._drop(oldest)


Unseal = Callable[[bytes, str, bytes], bytes]


class _Staged:
    """What one write transaction changes in the cache (entries it advanced or replayed, by id;
    None for one it dropped) and whether it put the packed snapshots: applied to the cache only
    once the transaction commits, forgotten if it does not."""

    __slots__ = ("entries", "landed", "txn")

    def __init__(self, txn: lmdb.Transaction[bytes]) -> None:
        self.txn = txn
        self.entries: dict[int, _Entry | None] = {}
        self.landed: list[bytes] | None = None
        """The keys of the packed snapshots it put (or dropped), once it did."""


class _Look:
    """The packer's work of looking for snapshots lost in a crash (``look_for_lost``)."""


class _Packing:
    """A snapshot to pack: its key, the chain of the revision it was made at, its row."""

    __slots__ = ("chain", "key", "row")

    def __init__(self, key: bytes, chain: str, row: t.CurrentValue) -> None:
        self.key, self.chain, self.row = key, chain, row


class Documents:
    """Reads of document values over one generation's tables, and the cache they share with the
    writer (``Projector`` writes through the same object).

    In a write transaction nothing here changes outside LMDB until the transaction commits
    (``Environment.effects``): the cache entries it advances are taken out and kept apart
    (``_Staged``), and put back under their new chains on commit; the snapshots it places are
    queued for packing on commit; the packed snapshots it puts leave the queue on commit. A
    transaction that fails, or is run again after a map growth, leaves nothing behind but
    entries taken out of the cache (a later read replays them)."""

    def __init__(self, env: Environment, db: dict[str, lmdb._Database], unseal: Unseal) -> None:
        self.env = env
        self.db = db
        self.unseal = unseal
        self.cache = DocumentCache()
        self._staged: _Staged | None = None
        """The cache changes of the write transaction running now, if it made any."""
        lock = threading.Lock()
        self._wake = threading.Condition(lock)
        """Wakes the packer (``Worker``) when a snapshot is queued, or at close."""
        self._packed = threading.Condition(lock)
        """Wakes ``drain`` when the packer has packed all it was given."""
        self._packing: deque[_Packing | _Look] = deque()
        """Snapshots to pack, in order, and looks for those lost in a crash."""
        self._ready: dict[bytes, tuple[str, bytes]] = {}
        """Snapshots packed off the commit's path, by key (chain, packed bytes), until a
        transaction that puts them commits."""
        self._scheduled: set[bytes] = set()
        """Keys queued or packed and not yet put (``recover`` packs none twice)."""
        self._queued = 0
        self._closing = False
        self._packer: Worker[_Packing | _Look] = Worker(
            "lmdb-snapshots", self._wake, self._next_packing, self._pack, self._packer_done
        )
        self._inline = False

    # ── the head row ────────────────────────────────────────────────────────

    def current_encoded(
        self, txn: lmdb.Transaction[bytes], id: int
    ) -> tuple[t.CurrentValue, bytes] | None:
        """A live document's row and the bytes it is stored as (a head, for a long one)."""

        raw = t.get_value(txn, self.db[t.DOCUMENT_VALUES], id, self.unseal)
        return (
            None
            if raw is None
            else (t.decode_row(t.current_decoder, raw, t.DOCUMENT_VALUES, t.u64(id)), raw)
        )

    def current(self, txn: lmdb.Transaction[bytes], id: int, row: t.CurrentValue) -> Json:
        """The value a live, unbroken row stands for, the caller's own copy."""

        if not row.held:
            return row.value  # freshly decoded from the row
        value = self._read(txn, id, row.chain)
        if value is None:
            folding = self.folding(txn, id, row)
            value = copy_json(folding.joined())
            self._hold(txn, id, row.chain, folding, row.size + row.tail_bytes)
        return value

    # ── the cache, through the transaction that reads or changes it ─────────

    def _stage(self, txn: lmdb.Transaction[bytes]) -> _Staged | None:
        """The cache changes of ``txn`` when it is the write transaction running now (created
        on first use, with its effects), else None: a read transaction uses the cache itself."""

        writing = self.env.writing
        if writing is None or writing.txn is not txn:
            return None
        staged = self._staged
        if staged is None or staged.txn is not txn:
            staged = self._staged = _Staged(txn)
            writing.on_commit(lambda: self._publish(staged))
            writing.on_abort(lambda: self._forget(staged))
        return staged

    def _publish(self, staged: _Staged) -> None:
        """``staged``'s transaction committed: its entries go into the cache."""

        if self._staged is staged:
            self._staged = None
        for id, entry in staged.entries.items():
            if entry is None:
                self.cache.discard(id)
            else:
                self.cache.hold(id, entry)  # the transaction's own entry, no other holds it
        if staged.landed:
            with self._wake:  # put: they leave the queue of what is ready
                for key in staged.landed:
                    self._ready.pop(key, None)
                    self._scheduled.discard(key)

    def _forget(self, staged: _Staged) -> None:
        if self._staged is staged:
            self._staged = None

    def _read(self, txn: lmdb.Transaction[bytes], id: int, chain: str) -> Json | None:
        """A copy of the value under ``chain``, as ``txn`` sees the cache, or None."""

        staged = self._stage(txn)
        if staged is not None and id in staged.entries:
            entry = staged.entries[id]
            if entry is None or entry.chain != chain:
                return None
            return copy_json(entry.folding.joined())
        return self.cache.read(id, chain)

    def _hold(
        self, txn: lmdb.Transaction[bytes], id: int, chain: str, folding: Folding, size: int
    ) -> None:
        staged = self._stage(txn)
        if staged is None:
            self.cache.put(id, chain, folding, size)
        else:
            staged.entries[id] = _Entry(chain, folding, size)

    def _discard(self, txn: lmdb.Transaction[bytes], id: int) -> None:
        staged = self._stage(txn)
        if staged is None:
            self.cache.discard(id)
        else:
            staged.entries[id] = None

    def _advance(
        self, txn: lmdb.Transaction[bytes], id: int, chain: str, after: str, ops: Any, size: int
    ) -> bool | None:
        """``DocumentCache.advance`` within ``txn``: the entry is taken out of the cache and
        advanced apart until the transaction commits."""

        staged = self._stage(txn)
        if staged is None:
            return self.cache.advance(id, chain, after, ops, size)
        if id in staged.entries:
            entry = staged.entries[id]
            if entry is None or entry.chain != chain:
                return False
        else:
            entry = self.cache.take(id, chain)
            if entry is None:
                return False
        try:
            entry.folding.apply(ops)
        except Exception:
            staged.entries[id] = None
            return None
        entry.chain, entry.size = after, size
        staged.entries[id] = entry
        return True

    def value(
        self, txn: lmdb.Transaction[bytes], id: int, upper: int | None
    ) -> tuple[int, Json, int]:
        """A live incarnation's ``(version, value, deltas since its base)`` at ``upper`` (None:
        its current value as ``txn`` sees it): the current row's value, from the cache where it
        is held, else a replay of its revisions. A view (``history.AsOfTxn``) has no current
        rows: it replays up to its own sequence."""

        if upper is None:
            if isinstance(txn, AsOfTxn):
                upper = txn.horizon
            else:
                found = self.current_encoded(txn, id)
                if found is not None and not found[0].broken:
                    row = found[0]
                    return row.version, self.current(txn, id, row), row.deltas_since_base
                upper = t.MAX_ID  # a broken one replays, raising as the reference does
        return self.replay(txn, id, upper)

    def folding(self, txn: lmdb.Transaction[bytes], id: int, row: t.CurrentValue) -> Folding:
        """A fresh folding of a held row's value, replayed from the store (nothing cached)."""

        return Folding(self.replay(txn, id, row.seq)[1])

    # ── replay ──────────────────────────────────────────────────────────────

    def replay(self, txn: lmdb.Transaction[bytes], id: int, upper: int) -> tuple[int, Any, int]:
        """The value at ``upper``: the newest base at or before it with the deltas after it
        applied, starting from a kept snapshot when one is newer than that base. Linear in the
        bytes read (``delta.Folding``), whatever the ops."""

        snapshot: t.CurrentValue | None = None
        snapshot_seq = 0
        for snapshot_seq, raw in _ids_before(txn, self.db[t.DOCUMENT_SNAPSHOTS], id, 0, upper):
            key = t.u64_pair(id, snapshot_seq)
            packed = self.unseal(raw, t.DOCUMENT_SNAPSHOTS, key)
            snapshot = t.decode_row(
                t.current_decoder,
                t.unpack_row(packed, t.DOCUMENT_SNAPSHOTS, key),
                t.DOCUMENT_SNAPSHOTS,
                key,
            )
            break
        deltas: list[t.Revision] = []
        base: t.Revision | None = None
        revisions = self.db[t.DOCUMENT_REVISIONS]
        for seq, raw in _ids_before(txn, revisions, id, snapshot_seq + 1, upper):
            key = t.u64_pair(id, seq)
            revision = t.decode_row(
                t.revision_decoder,
                self.unseal(raw, t.DOCUMENT_REVISIONS, key),
                t.DOCUMENT_REVISIONS,
                key,
            )
            if revision.kind == "base":
                base = revision
                break
            deltas.append(revision)
        if base is not None or snapshot is None:
            if base is None:
                raise ValueError(f"Document {id} is missing a required base")
            version, value, earlier = base.version, base.body, 0
        else:
            version, value, earlier = snapshot.version, snapshot.value, snapshot.deltas_since_base
        deltas.reverse()
        for revision in deltas:
            if revision.version != version:
                raise ValueError(f"Document {id} crosses a stored version boundary without a base")
        value = apply_batches(value, [revision.body for revision in deltas])
        return version, value, earlier + len(deltas)

    # ── writing (the projector's document commands) ─────────────────────────

    def put_base(self, rows: Rows, id: int, content: BaseContent, current_only: bool) -> None:
        """Store a base revision and the row it leaves (a head when the value is long)."""

        if current_only:
            self.drop_revisions(rows, id)
        else:
            found = self.current_encoded(rows.txn, id)
            if found is not None:
                self.recover(rows.txn, id, found[0])
        encoded = t.encode_row(t.Revision("base", content.version, content.value))
        seq = rows.seq
        rows.put(t.DOCUMENT_REVISIONS, t.u64_pair(id, seq), encoded)
        held = is_long(len(encoded))
        current = t.CurrentValue(
            content.version, 0, None if held else content.value, False, 0, 0, len(encoded)
        )
        current.seq, current.chain, current.held = seq, link("", seq, encoded), held
        self._discard(rows.txn, id)  # a read replays from this base: one revision
        t.put_value(rows.txn, self.db[t.DOCUMENT_VALUES], id, t.encode_row(current))

    def put_delta(
        self,
        rows: Rows,
        id: int,
        content: DeltaContent,
        checked: tuple[t.CurrentValue, bytes] | None,
        values: dict[int, t.CurrentValue] | None = None,
    ) -> None:
        """Store a delta revision and the row it leaves: for a long document the head row alone,
        the delta applied to the value in the cache (or, evicted, to one replayed); a snapshot
        when the policy says one is due (``tables.SNAPSHOT_SHARE``). ``checked``: the row the
        checks read and its bytes; ``values``: where an unchecked fold keeps rows back
        (``Projector.fold``)."""

        previous, stored = checked if checked is not None else (None, None)
        if previous is None and values is not None:
            previous = values.get(id)
        if previous is None:
            found = self.current_encoded(rows.txn, id)
            assert found is not None, f"document {id} has no current value"
            previous, stored = found
        seq = rows.seq
        encoded = t.encode_row(t.Revision("delta", content.version, content.ops))
        rows.put(t.DOCUMENT_REVISIONS, t.u64_pair(id, seq), encoded)
        tail_bytes = previous.tail_bytes + len(encoded)
        current = t.CurrentValue(
            previous.version,
            previous.deltas_since_base + 1,
            None,
            previous.broken,
            previous.tail + 1,
            tail_bytes,
            previous.size,
            seq,
            link(previous.chain, seq, encoded),
            previous.held or is_long(previous.size + tail_bytes),
        )
        size = current.size + tail_bytes
        txn = rows.txn
        if previous.held:
            if not current.broken:
                advanced = self._advance(txn, id, previous.chain, current.chain, content.ops, size)
                if advanced is False:  # not held here: replayed once, then held
                    folding = self.folding(txn, id, previous)
                    try:
                        folding.apply(content.ops)
                    except Exception:
                        current.broken = True
                    else:
                        self._hold(txn, id, current.chain, folding, size)
                elif advanced is None:
                    current.broken = True
        else:
            current.value = previous.value  # freshly decoded, or the fold's own: applied in place
            if not current.broken:
                try:
                    current.value = apply_ops(current.value, content.ops)
                except Exception:
                    current.broken = True
            if current.held:  # it grew long: from now on a head row
                if not current.broken:
                    self._hold(txn, id, current.chain, Folding(current.value), size)
                current.value = None
        if (
            not current.broken
            and current.tail >= SNAPSHOT_EVERY
            and current.tail_bytes * SNAPSHOT_SHARE >= current.size
        ):
            current.size += current.tail_bytes
            current.tail = current.tail_bytes = 0
            current.snapshot, current.snapshot_chain = seq, current.chain
            writing = self.env.writing
            if current.held and not self._inline and writing is not None and writing.txn is txn:
                key, row = t.u64_pair(id, seq), self._snapshot_row(txn, id, current)
                writing.on_commit(lambda: self._defer(_Packing(key, current.chain, row)))
            else:  # a short value, or a fold (a rebuild): here, as a live commit's lands
                self._put_snapshot(rows, id, current)
        elif previous.snapshot and not self._inline:
            self.recover(rows.txn, id, previous)
        if values is not None:
            values[id] = current
            return
        t.put_value(
            rows.txn, self.db[t.DOCUMENT_VALUES], id, t.encode_row(current), stored
        )  # not versioned: no history

    def _put_snapshot(self, rows: Rows, id: int, current: t.CurrentValue) -> None:
        """Keep the value ``current`` stands for, deflated, under this commit's sequence."""

        row = self._snapshot_row(rows.txn, id, current)
        rows.put(t.DOCUMENT_SNAPSHOTS, t.u64_pair(id, rows.seq), _pack(row))

    def _snapshot_row(
        self, txn: lmdb.Transaction[bytes], id: int, current: t.CurrentValue
    ) -> t.CurrentValue:
        """The snapshot row of the value ``current`` stands for (the caller's own copy of it):
        what a replay starts from, and nothing a later commit could not re-derive."""

        value = current.value
        if current.held:
            value = self._read(txn, id, current.chain)
            if value is None:
                value = self.replay(txn, id, current.seq)[1]
        return t.CurrentValue(
            current.version,
            current.deltas_since_base,
            value,
            size=current.size,
            seq=current.seq,
            chain=current.chain,
        )

    # ── snapshots off the commit's path ─────────────────────────────────────
    #
    # A long document's snapshot is encoded and deflated (~86 ms at 4 MB) by the packer (a
    # ``Worker`` thread) from a copy of the value taken in the commit, queued only once that
    # commit returned, and put by the next transaction that folds (``land``, the projector's
    # first step) or at close. The head row names the snapshot the policy placed
    # (``CurrentValue.snapshot``) and the chain of the revision it was made at
    # (``snapshot_chain``), which ``land`` compares with the packed snapshot's, so no snapshot is
    # stored for a revision it was not made from. One lost with the process before it was put is packed again at the document's next commit,
    # rebase or retirement, or by the look the packer takes after a writer opens
    # (``look_for_lost``); until then reads replay from the one before. A snapshot is a
    # shortcut, kept without history: ``verify`` counts one the log's fold places and the store
    # lacks as pending, never as a difference. Its bytes are those a fold writes in the commit
    # itself, so a rebuild is identical once it is put.

    @contextlib.contextmanager
    def inline(self) -> Iterator[None]:
        """Within: snapshots are written in the commit that places them (a fold: a rebuild, a
        catch-up, ``verify``'s fresh fold), so its tables are complete when it ends."""

        self._inline = True
        try:
            yield
        finally:
            self._inline = False

    def _defer(self, packing: _Packing | _Look) -> None:
        """Queue a snapshot for the packer (after the commit that placed it), or a look for
        snapshots lost in a crash. Nothing is queued once the packer is closing."""

        with self._wake:
            if self._closing:
                return
            if isinstance(packing, _Packing):
                if packing.key in self._scheduled:
                    return
                self._scheduled.add(packing.key)
            self._queued += 1
            self._packing.append(packing)
            self._packer.wake()

    def _next_packing(self) -> _Packing | _Look | None:
        """Under the lock, for the packer: the next piece of work, or None."""

        return self._packing.popleft() if self._packing else None

    def _packer_done(self) -> bool:
        return self._closing and not self._packing

    def _pack(self, packing: _Packing | _Look) -> None:
        """On the packer's thread: deflate one snapshot, or look for lost ones."""

        if isinstance(packing, _Look):
            try:
                self._look()
            finally:
                self._packed_one(None, None)
            return
        try:
            packed: bytes | None = _pack(packing.row)
        except Exception:  # cannot happen to a value a commit encoded; recover() retries
            packed = None
        self._packed_one(packing, packed)

    def _packed_one(self, packing: _Packing | None, packed: bytes | None) -> None:
        with self._wake:
            self._queued -= 1
            if packing is not None:
                if packed is None:
                    self._scheduled.discard(packing.key)
                else:
                    self._ready[packing.key] = (packing.chain, packed)
            if self._queued == 0:
                self._packed.notify_all()

    def look_for_lost(self) -> None:
        """Have the packer look for snapshots that heads name and the store lacks (lost with a
        process that stopped before putting them) and pack them again: a writer's open."""

        self._defer(_Look())

    def _look(self) -> None:
        """The look of ``look_for_lost``, in short read transactions; one the store's close
        ends (the next open looks again)."""

        try:
            self._look_through()
        except StoreClosedError:
            pass

    def _look_through(self) -> None:

        after = b""
        while not self._closing:
            lost: list[tuple[int, t.CurrentValue]] = []
            with self.env.read() as txn:
                cursor = txn.cursor(db=self.db[t.DOCUMENT_VALUES])
                found = cursor.set_range(after) if after else cursor.first()
                keys: list[bytes] = []
                while found and len(keys) < LOOK_CHUNK:
                    key = cursor.key()
                    if len(key) == 8:
                        keys.append(key)
                    found = cursor.next()
                snapshots = self.db[t.DOCUMENT_SNAPSHOTS]
                for key in keys:
                    id = t.read_u64(key)
                    found_row = self.current_encoded(txn, id)
                    row = None if found_row is None else found_row[0]
                    if (
                        row is not None
                        and row.held
                        and row.snapshot
                        and txn.get(t.u64_pair(id, row.snapshot), db=snapshots) is None
                    ):
                        lost.append((id, row))
                for id, head in lost:
                    self._defer(self._repacking(txn, id, head))
            if len(keys) < LOOK_CHUNK:
                return
            after = keys[-1] + b"\0"

    def recover(self, txn: lmdb.Transaction[bytes], id: int, head: t.CurrentValue) -> None:
        """Pack again the snapshot ``head`` names if the store lacks it and none is on its way
        (it was lost with the process that placed it), once ``txn`` commits."""

        key = t.u64_pair(id, head.snapshot)
        if (
            not head.snapshot
            or key in self._scheduled
            or txn.get(key, db=self.db[t.DOCUMENT_SNAPSHOTS]) is not None
        ):
            return
        writing = self.env.writing
        if writing is None or writing.txn is not txn:
            return  # not a live commit of this handle: the next one, or the packer's look, will
        packing = self._repacking(txn, id, head)
        writing.on_commit(lambda: self._defer(packing))

    def _repacking(self, txn: lmdb.Transaction[bytes], id: int, head: t.CurrentValue) -> _Packing:
        """The snapshot ``head`` names, replayed in ``txn``, to be packed again."""

        version, value, deltas = self.replay(txn, id, head.snapshot)
        row = t.CurrentValue(
            version, deltas, value, size=head.size, seq=head.snapshot, chain=head.snapshot_chain
        )
        return _Packing(t.u64_pair(id, head.snapshot), head.snapshot_chain, row)

    def land(self, txn: lmdb.Transaction[bytes]) -> None:
        """Put the snapshots packed so far. One is dropped when its revision is gone (its
        current-only document was rebased or retired), or when its document's head names its
        sequence under another chain: it was not made from the revision stored there. One a
        newer snapshot passed before it was put is put while its revision stands: it was queued
        only once the commit of that revision returned. They leave the queue once ``txn``
        commits; if it does not, a later transaction puts them."""

        if not self._ready:
            return
        staged = self._stage(txn)
        if staged is not None and staged.landed is not None:
            return  # this transaction put them already (each batch of a group begins here)
        with self._wake:
            ready = dict(self._ready)
        snapshots, revisions = self.db[t.DOCUMENT_SNAPSHOTS], self.db[t.DOCUMENT_REVISIONS]
        for key, (chain, packed) in ready.items():
            if txn.get(key, db=revisions) is None or txn.get(key, db=snapshots) is not None:
                continue  # its revision was retired or rebased away; or it is there already
            found = self.current_encoded(txn, t.read_u64(key))
            if found is None or found[0].snapshot != t.read_u64(key, 8):
                txn.put(key, t.seal(packed), db=snapshots)  # passed by a newer one, still valid
            elif found[0].snapshot_chain == chain:
                txn.put(key, t.seal(packed), db=snapshots)
        if staged is not None:
            staged.landed = list(ready)
        else:  # a transaction of no live handle: it holds the only copy, nothing to keep apart
            with self._wake:
                for key in ready:
                    self._ready.pop(key, None)
                    self._scheduled.discard(key)

    def drain(self) -> bool:
        """Wait until every queued snapshot is packed (and a look for lost ones has ended);
        whether any is left to ``land``."""

        with self._wake:
            self._packed.wait_for(lambda: self._queued == 0)
            return bool(self._ready)

    def close(self) -> None:
        """Stop the packer (what it had not packed is packed again after the next open) and
        wait for its thread."""

        with self._wake:
            self._closing = True
            self._queued -= len(self._packing)  # the one being packed, if any, counts itself out
            self._packing.clear()
            self._packed.notify_all()
            self._packer.wake()
        self._packer.join()

    def write_values(self, txn: lmdb.Transaction[bytes], values: dict[int, t.CurrentValue]) -> None:
        """Store the rows an unchecked fold kept back (the table has no history to keep)."""

        db = self.db[t.DOCUMENT_VALUES]
        for id, current in values.items():
            t.put_value(txn, db, id, t.encode_row(current))
        values.clear()

    def retire(self, rows: Rows, id: int, current_only: bool) -> None:
        """A retired document has no current value; a current-only one keeps no revisions."""

        found = self.current_encoded(rows.txn, id)
        if found is not None and not current_only:
            self.recover(rows.txn, id, found[0])
        t.delete_value(rows.txn, self.db[t.DOCUMENT_VALUES], id)  # not versioned: no history
        self._discard(rows.txn, id)
        if current_only:
            self.drop_revisions(rows, id)

    def drop_revisions(self, rows: Rows, id: int) -> None:
        for table in (t.DOCUMENT_REVISIONS, t.DOCUMENT_SNAPSHOTS):
            stale = [
                t.u64_pair(id, seq)
                for seq, _ in _ids_before(rows.txn, self.db[table], id, 0, t.MAX_ID)
            ]
            for key in stale:
                rows.delete(table, key)


APPLY_ERRORS: Final = (PathError, UnsafePathError, KeyError, IndexError, TypeError, ValueError)
"""What applying a stored change can raise, as the reference's applier raises it (a path that
resolves to nothing, a missing key, a permutation of another length...), so what reading such a
document raises."""


class RevisionLike(Protocol):
    """A stored content command as a reader lists it (``tables.Revision``, or the contract's
    ``DocumentRevision``): a base value or a batch of delta ops, of a definition's version."""

    @property
    def kind(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def body(self) -> Any: ...


class Failing(NamedTuple):
    """The change a replay fails at: its log sequence, its revision, and what it raised."""

    seq: int
    revision: RevisionLike
    error: BaseException


def failing_revision(revisions: Iterable[tuple[int, RevisionLike]]) -> Failing | None:
    """The change of ``revisions`` (``(seq, revision)``, oldest first) after their last base
    that cannot be applied to the value before it, or None if every one applies."""

    value: Any = None
    failed: Failing | None = None
    for seq, revision in revisions:
        if revision.kind == "base":  # a new value: whatever failed before it no longer matters
            value, failed = revision.body, None
        elif failed is None:
            try:
                value = apply_batches(value, [revision.body])
            except APPLY_ERRORS as raised:
                failed = Failing(seq, revision, raised)
    return failed


def _pack(row: t.CurrentValue) -> bytes:
    return t.pack_row(t.encode_row(row))


def _ids_before(
    txn: lmdb.Transaction[bytes], db: lmdb._Database, id: int, low: int, high: int
) -> Iterator[tuple[int, bytes]]:
    """``(seq, value)`` of keys ``u64(id) + u64(seq)``, ``low <= seq <= high``, newest first."""

    return ids_in_range(txn, db, t.u64(id), low, high, True)


__all__ = [
    "APPLY_ERRORS",
    "LOOK_CHUNK",
    "SNAPSHOT_EVERY",
    "SNAPSHOT_SHARE",
    "DocumentCache",
    "Documents",
    "Failing",
    "RevisionLike",
    "Unseal",
    "failing_revision",
    "is_long",
    "link",
]
