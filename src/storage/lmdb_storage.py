"""``LmdbStorage``: pi-durable's ``Storage`` contract on the log and its projections.

A commit encodes the batch once on the caller, then the ``Committer`` checks it against the
projections, appends it to the log and folds it in one LMDB write transaction shared with the
commits made at the same moment (group commit), off the event loop where it must sync; it returns
after that transaction is durable. Reads are short read transactions over the projections, on the
caller's thread. One store may be used from several threads and event loops at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final, Literal, TypeVar

import lmdb
from pi_durable.context import Context
from pi_durable.types import (
    Seq,
    Storage,
    StorageWrite,
)

from ..errors import DamageError, DurableLmdbError, HistoryTrimmed, NotWriterError, StoreStateError
from ..log import (
    Durability,
    Environment,
    StoreClosedError,
    StoreDamagedError,
    WriteLog,
    check_committed_at,
    encode_batch,
)
from ..log.counters import EngineCounters
from ..log.durability import Mode, Role, mode_for
from ..log.environment import DEFAULT_MAP_SIZE
from ..log.journal import JournalOptions
from ..log.journaled import CommitJournal
from ..log.records import decode_record, decode_record_builtins
from ..log.storedir import UNSYNCED_FILE
from ..log.stream.applier import StreamApplier
from ..log.stream.erasure import delete_erased, held_elsewhere, scan_subject
from ..log.stream.jetstream import link_for
from ..log.stream.lease import DEFAULT_LEASE_TTL
from ..log.stream.link import StreamLink
from ..log.stream.message import subject_of
from ..log.stream.position import StreamPosition, read_position
from ..log.stream.shipper import Shipper
from ..log.stream.writer import StreamWriter
from ..projections import Projector, ReadModel, StorageRequestError
from ..projections import tables as t
from ..projections.history import AsOfTxn
from ..projections.rebuild import CORE_KEY, REGISTRY_DB, begin_following, open_core, rebuild
from ..projections.user import Projection, UserProjections
from .committer import Committer
from .erase import (
    ErasurePlan,
    ErasureReport,
    check_reason,
    erased_by,
    erasure_at,
    plan_erasure,
    records_in,
    retire_projections,
    rewrite,
    scrub,
    stored_projections,
)
from .ids import IdMinter
from .options import OpenOptions
from .reads import StorageReads
from .replica import Follower
from .roles import Following, Replication, ReplicationRole, Shipping, Standalone, Writing
from .snapshot import replace_snapshots, seed_new
from .trim import (
    TrimReport,
    check_before,
    commit_trim,
    discard_scratch,
    due,
    fold_base,
    keep_window,
    reach,
)

T = TypeVar("T")
logger = logging.getLogger(__name__)

REPLAY_CHUNK: Final = 64
"""Journal records replayed per write transaction at open."""
ERASING_KEY: Final = b"erasure.stream"
"""In the meta table while a replicated writer's erasure (its record's sequence) still has
messages to delete from the stream and snapshots to take again."""
SCRUB_KEY: Final = b"erasure.scrub"
"""In the meta table from the transaction in which an erasure rewrote a replicated store's log
(its writer's, or a replica's taking it from the stream) until the close that scrubs it."""


class LmdbStorage(StorageReads, Storage):
    """An embedded, event-sourced implementation of ``pi_durable.types.Storage``."""

    def __init__(
        self,
        env: Environment,
        progress: Callable[[int, int], None] | None = None,
        projections: Sequence[Projection] = (),
        verify_checksums: bool = True,
    ) -> None:
        self._env = env
        self.log = WriteLog(env)
        self._meta = env.db("meta")
        self._model = open_core(env, self.log, progress, verify_checksums)
        self._projector = Projector(self._model)
        if env.journal is not None and env.journal.replay_pending:
            self._replay(env.journal)
        if not env.readonly:
            self.log.tree.catch_up(
                self.log, progress
            )  # a store written before the tree, or behind it
            discard_scratch(env.path)  # what a trim killed before its end left
        self.projections = UserProjections(
            env, self.log, projections, lambda: self._committer, lambda: self._model
        )
        ids_lock = threading.RLock()  # the minter's, held by commits until the floor is raised
        self._committer = Committer(
            env, self.log, self._projector, self._after_commit, hold=ids_lock
        )
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self._registry = env.db(REGISTRY_DB)
        self._core: bytes | None = None
        """The core header the read model was checked against; read-only handles compare it at
        each read, so they follow a rebuild's swap made by the writer."""
        self._link: StreamLink | None = None
        self._role: ReplicationRole = Standalone(self)
        self._refold = False
        """Records were rewritten by an erasure taken from the stream: fold the projections again."""
        self._scrub_at_close = False
        """An erasure rewrote this store's log: its files are scrubbed once it is closed."""
        if not env.readonly:
            with env.read() as txn:
                self._scrub_at_close = txn.get(SCRUB_KEY, db=self._meta) is not None
        self._keep_history: int | None = None
        """``keep_history=``: the last records the log keeps (``None``: all)."""
        self._first_kept = self.log.first()
        self._trimming = False
        with env.read() as txn:
            self._ids = IdMinter.load(txn, self._meta, self._model.max_record_id(txn) + 1, ids_lock)

    def _replay(self, journal: CommitJournal) -> None:
        """After an unclean stop of a journaled ``power`` writer: append and fold the journal's
        records past the restored checkpoint, as their commits did (checks included), then sync
        them and begin a new writer life (``log.environment``)."""

        env = self._env
        records = journal.records(self.log.head())
        logger.warning(
            "store %s stopped uncleanly: replaying %d journal records after %d",
            env.path,
            len(records),
            self.log.head(),
        )
        projector, log = self._projector, self.log

        def replay(txn: lmdb.Transaction[bytes], chunk: list[tuple[int, bytes]]) -> None:
            for seq, data in chunk:  # the one sequence every path takes: check, append, fold
                outcome = projector.admit(
                    txn,
                    decode_record(seq, data).writes,
                    lambda seq=seq, data=data: log.append_record(txn, seq, data),  # type: ignore[misc]
                )
                if isinstance(outcome, Exception):
                    raise outcome

        for at in range(0, len(records), REPLAY_CHUNK):
            chunk = records[at : at + REPLAY_CHUNK]
            env.write(lambda txn, chunk=chunk: replay(txn, chunk))  # type: ignore[misc]
        journal.finish_replay()
        logger.info("store %s recovered: head %d", env.path, self.log.head())

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "power",
        readonly: bool = False,
        map_size: int = DEFAULT_MAP_SIZE,
        progress: Callable[[int, int], None] | None = None,
        projections: Sequence[Projection] = (),
        verify_checksums: bool = True,
        nats: str | Sequence[str] | StreamLink | None = None,
        stream: str | None = None,
        replicas: int = 1,
        store: str | None = None,
        take_over: bool | Literal["force"] = False,
        lease_ttl: int = DEFAULT_LEASE_TTL,
        journal: JournalOptions | None = None,
        keep_history: int | None = None,
    ) -> LmdbStorage:
        """Open (or create) the store in directory ``path``; see ``log.environment`` for modes.

        A writer first brings the projections level with the log (rebuilding them when their
        schema changed), calling ``progress(folded, head)`` as it goes; a read-only open refuses
        projections that are not level. ``projections`` are the user projections to keep up to
        date (``storage.projections``), folded behind the commits. ``verify_checksums=False``
        skips the CRC check of projected values on reads (about 0.4 us per value read; commits
        and ``verify`` always check).

        ``nats`` (a URL, or several, comma-separated) and ``stream`` link the store's log to a
        NATS JetStream stream (made with ``replicas`` copies when missing): with
        ``durability="replicated"`` a commit returns once the stream holds it; with ``power`` or
        ``process`` commits are shipped behind (``storage.replication.status()``). ``store``: the
        store id the directory must hold (a new directory takes it). ``nats`` may also be a link
        of the caller's (``log.stream.link.StreamLink``: another stream engine, or the in-memory
        ``log.stream.memory.MemoryLink`` of tests), which the store then owns and closes.

        A replicated writer holds the store's lease (``log.stream.lease``, ``lease_ttl`` seconds after
        each renewal): held by another process, the open fails with ``NotWriterError``, unless
        ``take_over=True`` (wait for it to expire, then fence the old writer out) or
        ``take_over="force"`` (fence it out at once). It then takes in what the stream holds.

        ``keep_history=N``: the writer keeps the log's last ``N`` records and trims the older
        ones into the log's base (``trim``) at the open and whenever the log holds half as many
        again; reads as of a trimmed sequence raise ``HistoryTrimmed``. Not on a stream, nor
        read-only, nor with ``projections``.
        """

        options = OpenOptions(
            durability, readonly, nats, stream, replicas, take_over, keep_window(keep_history)
        )
        if keep_history is not None and projections:
            raise ValueError(
                "keep_history= trims the records user projections fold from: open with one or the other"
            )
        link = options.link()
        mode = mode_for(durability, Role.READER if readonly else Role.WRITER)
        try:
            storage = cls._build(
                link,
                progress,
                projections,
                verify_checksums,
                path=path,
                mode=mode,
                map_size=map_size,
                store_id=store,
                journal=journal,
            )
        except StoreDamagedError as error:
            logger.error("store %s is damaged: %s", path, error)
            if mode is not Mode.REPLICATED:
                raise
            raise StoreDamagedError(
                error.path,
                os.path.join(error.path, UNSYNCED_FILE),
                f"Every commit it acknowledged is on stream {stream!r}: restore the store from it "
                f"(`durable-log restore --nats ... --stream {stream} --store ID NEWPATH`, ID as "
                "`durable-log stats` showed it) and open that, or take over from a replica",
            ) from None
        if link is not None:
            try:
                await storage._link_to(
                    link, replicas, mode is Mode.REPLICATED, take_over, lease_ttl
                )
            except BaseException:
                await storage.close()
                raise
        storage.projections.kick()
        if not readonly:
            storage._model.documents.look_for_lost()  # snapshots a stopped writer never put
        if options.keep_history is not None:
            try:
                if stored_projections(storage._env):
                    raise ValueError(
                        f"keep_history= trims the records user projections fold from, and the "
                        f"store at {storage.path} holds some: drop them first "
                        "(durable-log projections drop)"
                    )
                storage._keep_history = options.keep_history
                await storage._keep_window(storage.log.head())
            except BaseException:
                await storage.close()
                raise
        logger.info(
            "opened store %s (%s%s): head %d",
            storage.path,
            "read-only" if readonly else durability,
            "" if link is None else f", stream {link.stream}",
            storage.log.head(),
        )
        return storage

    @classmethod
    async def open_replica(
        cls,
        path: str | os.PathLike[str],
        *,
        nats: str | Sequence[str] | StreamLink,
        stream: str,
        store: str,
        durability: Literal["power", "process"] = "power",
        map_size: int = DEFAULT_MAP_SIZE,
        progress: Callable[[int, int], None] | None = None,
        projections: Sequence[Projection] = (),
        verify_checksums: bool = True,
    ) -> LmdbStorage:
        """Open (or create: from the newest snapshot that verifies, if any) in ``path`` a replica
        of ``store``: a local store kept level with the store's subject on ``stream``, read like any
        store, refusing commits (``NotWriterError``); ``await replica.wait(seq)`` waits for ``seq``."""

        mode = mode_for(durability, Role.REPLICA)
        link = link_for(nats, stream)
        try:  # the stream first: a replica that cannot follow anything creates nothing
            link.run(link.connect())
            link.run(link.messages.ensure_stream(create=False))
            seed_new(link, store, path)
        except BaseException:
            link.close()
            raise
        storage = cls._build(
            link,
            progress,
            projections,
            verify_checksums,
            path=path,
            mode=mode,
            map_size=map_size,
            store_id=store,
        )
        storage._link = link
        storage._role = Following(storage, Follower(link, storage, store))
        storage._role.start()
        storage.projections.kick()
        storage._model.documents.look_for_lost()  # snapshots a stopped replica never put
        logger.info(
            "opened replica %s of store %s on stream %s: head %d",
            storage.path,
            store,
            stream,
            storage.log.head(),
        )
        return storage

    @classmethod
    def _build(
        cls,
        link: StreamLink | None,
        progress: Callable[[int, int], None] | None,
        projections: Sequence[Projection],
        verify_checksums: bool,
        **env_options: Any,
    ) -> LmdbStorage:
        """The environment and the store on it; if either fails, nothing is left open (nor the link)."""

        try:
            env = Environment(**env_options)
        except BaseException:
            if link is not None:
                link.close()
            raise
        try:
            return cls(env, progress, projections, verify_checksums)
        except BaseException:
            env.close()
            if link is not None:
                link.close()
            raise

    async def _link_to(
        self,
        link: StreamLink,
        replicas: int,
        replicated: bool,
        take_over: bool | Literal["force"] = False,
        lease_ttl: int = DEFAULT_LEASE_TTL,
    ) -> None:
        """Connect to the stream; a replicated writer takes the lease, fences, settles with the
        stream before its first commit; any other writer starts shipping behind its commits."""

        self._link = link
        await link.arun(link.connect())
        await link.arun(link.messages.ensure_stream(replicas, create=True))
        store = self._env.store_id
        assert store is not None
        if replicated:
            role = self._role = await Writing.acquire(
                self, link, self._env, self.log, self._meta, take_over, lease_ttl
            )
            writer = role.writer
            writer.applier.on_rewrite = self._rewritten
            self._committer.replicate(writer)
            role.lease.on_lost = self._deposed
            role.lease.start_renewing()  # now: taking in a long stream must not let the lease lapse
            await self._committer.write(
                lambda txn: None
            )  # a group fences and settles before anything else
            if self._refold:  # it took in another writer's erasure over records it held
                with self._committer.exclusive():
                    self._fold_again()
            await self._finish_erasing(writer)
            self._ids.raise_floor(writer.applier.max_id)
            if writer.position is not None and writer.position.ids_reserved:
                self._ids.skip_reserved(
                    writer.position.ids_reserved
                )  # blocks any earlier writer reserved
        else:
            self._role = Shipping(self, Shipper(link, self.log, store))
            self._role.start()

    async def _finish_erasing(self, writer: StreamWriter) -> None:
        """An erasure this store's writer committed and did not see through (killed before its
        messages left the stream): finish it."""

        with self._env.read() as txn:
            raw = txn.get(ERASING_KEY, db=self._meta)
            erasure = None if raw is None else erasure_at(self.log, txn, int.from_bytes(raw, "big"))
        if raw is not None and erasure is not None:
            logger.warning(
                "erasure record %d: finishing it on the stream", int.from_bytes(raw, "big")
            )
            self._scrub_at_close = True
            await self._finish_stream_erasure(writer, int.from_bytes(raw, "big"), erasure.records)

    @property
    def replication(self) -> Replication:
        """The store's link to its NATS stream, if it has one: ``status()`` says where it stands
        (a ``StreamWriter``, ``Shipper`` or ``Follower``; ``None`` without a stream)."""

        return self._role.replication

    @property
    def store_id(self) -> str | None:
        """The store's id: its subject on a NATS stream is ``<stream>.<store id>.log``."""

        return self._env.store_id

    async def wait(self, seq: int, timeout: float | None = None) -> None:
        """A replica: wait until it holds record ``seq``. Any other store holds what it committed."""

        await self._role.wait(seq, timeout)

    def _after_commit(self, max_id: int) -> None:
        """The committer's ``on_commit``: every id a committed transaction holds (its batches',
        and another writer's records a replicated group took in) is never minted again, and user
        projections fold its records (whether or not its caller still waits for it)."""

        self._ids.raise_floor(max_id)
        self._role.after_commit(self._ids)
        if not self._closed:  # a close waiting for this commit stops the projection worker
            self.projections.kick()

    # ── for a follower taking the stream in (``storage.replica.ReplicaHost``) ─

    def stream_position(
        self, stream: str, txn: lmdb.Transaction[bytes] | None = None
    ) -> StreamPosition:
        """How far this store took in (or shipped to) ``stream``; in ``txn`` when given."""

        if txn is not None:
            return read_position(txn, self._meta, stream)
        with self._env.read() as read_txn:
            return read_position(read_txn, self._meta, stream)

    def stream_applier(self, stream: str, store: str) -> StreamApplier:
        """An applier of ``store``'s messages on ``stream`` to this store's log and position."""

        applier = StreamApplier(stream, store, self.log, self._meta)
        applier.on_rewrite = self._rewritten
        return applier

    def _rewritten(self, txn: lmdb.Transaction[bytes]) -> None:
        """In the transaction that put an erasure's tombstones from the stream over this store's
        records: the projections are marked for a rebuild, folded again once it commits."""

        served = bool(self.projections.projections)  # served here: their program refolds them
        retire_projections(txn, self._env, [] if served else stored_projections(self._env))
        txn.put(SCRUB_KEY, b"", db=self._meta)
        self._env.effects(txn).on_commit(self._erased_here)

    def _erased_here(self) -> None:
        self._refold = self._scrub_at_close = True

    def take_in(self, work: Callable[[lmdb.Transaction[bytes], Projector], T]) -> T:
        """Run ``work`` in one write transaction with no group beside it (on a worker thread,
        never the link's loop, which a commit of a writer being deposed may be waiting on)."""

        with self._committer.exclusive():
            result = self._env.write(lambda txn: work(txn, self._committer.projector))
            if self._refold:
                self.log.committed()
                self._fold_again()
            return result

    def _fold_again(self) -> None:
        """With the committer held: fold the whole log into fresh core projections (after an
        erasure rewrote records)."""

        self._refold = False
        verify_checksums = self._model.unseal is t.unseal
        self._model.documents.close()  # its snapshots are for the tables swapped out
        rebuild(self._env, self.log)
        self._model = open_core(self._env, self.log, verify_checksums=verify_checksums)
        self._projector = self._committer.projector = Projector(self._model)

    def taken_in(self, max_id: int) -> None:
        """After ``take_in`` committed: its ids are never minted, and readers and user
        projections see its records."""

        self._ids.raise_floor(max_id)
        self.log.committed()
        self.projections.kick()

    def _deposed(self, error: NotWriterError) -> None:
        """On the link's loop, once the lease is lost: refuse commits, follow as a replica."""

        if self._closed:
            return
        successor = self._role.deposed(error, self)
        if successor is not None:
            self._role = successor
            successor.start()

    @property
    def path(self) -> str:
        """The store's directory, absolute, as the environment resolved it."""

        return self._env.path

    # ── commits ─────────────────────────────────────────────────────────────

    async def commit(
        self, writes: Sequence[StorageWrite], context: Context, *, committed_at: int | None = None
    ) -> Seq:
        """Validate, log, fold and durably commit one batch; returns its sequence.

        ``committed_at`` (Unix ms) replaces the clock, for imports that keep original times.
        """

        self.check_open()
        self._role.refuse_commits()
        if committed_at is not None:
            committed_at = check_committed_at(committed_at)
        counters = self._env.counters
        began = time.perf_counter()
        try:
            payload, batch = encode_batch(writes)
            self._role.check_payload(payload)
            seq, _ = await self._committer.commit(payload, batch, committed_at)
        except BaseException:
            counters.commit_failures += 1
            raise
        counters.commit_seconds.observe(time.perf_counter() - began)
        if self._keep_history is not None:
            await self._keep_window(seq)
        return Seq(seq)

    @property
    def counters(self) -> EngineCounters:
        """What this handle committed since it opened (``log.counters``; ``metrics.register``)."""

        return self._env.counters

    async def mint_id(self) -> int:
        """A fresh id above every id stored or minted, across reopen and crashes, whichever
        thread or loop asks (blocks of ``ids.ID_BLOCK`` ids are reserved durably, through the
        committer, so minting rarely touches the disk)."""

        self.check_open()
        self._role.refuse_commits()
        return await self._ids.mint(self._reserve_ids)

    def _reserve_ids(self, wanted: int) -> Awaitable[int]:
        """Raise the durable id reservation to ``wanted`` in a group's transaction, with what
        the role does with a reservation (a replicated writer puts it on the stream)."""

        publish, ids = self._role.publish_ids, self._ids
        return self._committer.write(lambda txn: ids.reserve_in(txn, wanted, publish))

    # ── lifecycle ───────────────────────────────────────────────────────────

    async def rebuild(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Fold the whole log into fresh projections beside the live ones, then swap to them."""

        self.check_open()
        if self._env.readonly:
            raise PermissionError(f"The store at {self.path} is open read-only")
        verify_checksums = self._model.unseal is t.unseal
        with self._committer.exclusive():  # no group folds into the tables being swapped
            self._model.documents.close()  # its snapshots are for the tables swapped out
            rebuild(self._env, self.log, progress)
            self.log.tree.rebuild(self.log, progress)
            self._model = open_core(self._env, self.log, verify_checksums=verify_checksums)
            self._projector = self._committer.projector = Projector(self._model)

    def _rewrite(self, work: Callable[[lmdb.Transaction[bytes]], T]) -> T:
        """Run ``work``, which rewrites the log in place and marks the core projections for a
        rebuild (an erasure, a trim), in one write transaction holding the writer, then rebuild
        them. A ``power`` writer takes a checkpoint right before it and another on a fresh
        journal segment right after: a power cut undoes it whole or keeps it."""

        env = self._env
        journal = env.journal
        if journal is not None:
            journal.checkpoint()  # a power cut before the next one undoes the rewrite whole
        done = env.write(work)
        try:  # committed: whatever fails next, reads must not serve the tables it replaced
            if journal is not None:
                journal.checkpoint_rewrite()
        finally:
            self.log.committed()
            self._fold_again()
        return done

    async def erase_conversation(
        self,
        conversation_id: int,
        context: Context | None = None,
        *,
        reason: str,
        by: str = "",
        with_forks: bool = False,
    ) -> ErasureReport:
        """Erase conversation ``conversation_id`` and everything that belongs to it from the log
        and the projections (``storage.erase``): each record holding its writes becomes a
        tombstone keeping its leaf hash, an erasure record naming ``reason`` (and ``by``) is
        appended, and the projections are rebuilt. Forks and owned conversations are refused,
        named, unless ``with_forks``. The bytes leave the disk once the store is closed and
        ``storage.erase.scrub`` ran (``durable-log erase`` does both).

        On a stream, only its replicated writer erases: the erasure record and its tombstones
        are committed through the stream (every replica applies them), then the erased records'
        messages are deleted from it and its snapshots taken again (``log.stream.erasure``), and
        the store is scrubbed when it closes. Asked again for a conversation it erased, it
        finishes what a stopped run left (the messages, the snapshots) and returns its report."""

        self.check_open()
        reason, by = check_reason(reason, by)
        if type(conversation_id) is not int:
            raise TypeError(f"conversation_id must be an int, not {type(conversation_id).__name__}")
        writer = getattr(self._role, "writer", None)
        if self._env.readonly or (self._link is not None and writer is None):
            raise PermissionError(
                f"The store at {self.path} is "
                + ("open read-only" if self._env.readonly else "not its stream's writer")
                + ": an erasure needs its writer (durability='replicated' on a stream)"
            )
        if self.projections.projections:
            raise ValueError(
                "An erasure drops the user projections, which this program defines: open the "
                "store without projections= to erase"
            )
        if writer is not None:
            # The erased ids leave the registry a reopening store takes its id floor from: the
            # durable reservation, published on the stream, keeps them from being minted again.
            await self._reserve_ids(self._ids.floor)
            return await self._erase_on_stream(writer, conversation_id, reason, by, with_forks)
        env, log = self._env, self.log
        if log.trimmed_before():
            raise ValueError(
                f"The log of {self.path} is trimmed: an erasure covers an untrimmed log only "
                "(erase before trimming)"
            )
        with self._committer.exclusive():
            plan = plan_erasure(
                lambda: log.read(decode=decode_record_builtins), conversation_id, with_forks
            )
            names = stored_projections(env)
            ids = self._ids

            def erase(txn: lmdb.Transaction[bytes]) -> int:
                # The erased ids leave the registry a reopening store takes its id floor from:
                # the durable reservation, raised in the same transaction, keeps them from
                # being minted again (nothing commits meanwhile: the committer is held).
                ids.reserve_in(txn, ids.floor)
                return rewrite(txn, env, log, plan, reason, by, names)

            seq = self._rewrite(erase)
        self._erased(plan, seq)
        return ErasureReport(seq, plan.conversations, sorted(plan.erased), plan.writes)

    def _erased(self, plan: ErasurePlan, seq: int) -> None:
        logger.info(
            "erased conversations %s of store %s: %d writes in %d records, erasure record %d",
            plan.conversations,
            self.path,
            plan.writes,
            len(plan.erased),
            seq,
        )

    async def _erase_on_stream(
        self, writer: StreamWriter, conversation_id: int, reason: str, by: str, with_forks: bool
    ) -> ErasureReport:
        """A replicated writer's erasure (``log.stream.erasure``): the rewrite and the erasure
        record in one transaction that commits once the stream holds the record and its
        tombstones; then the erased records' messages leave the stream and its snapshots are
        taken again. Run again after it stopped half way, it finishes what is left."""

        env, log, link = self._env, self.log, writer.link
        subject = subject_of(link.stream, writer.store)
        planned = log.head()
        try:
            plan = plan_erasure(
                lambda: log.read(last=planned, decode=decode_record_builtins),
                conversation_id,
                with_forks,
            )
        except StorageRequestError:
            done = erased_by(log, conversation_id)
            if done is None:
                raise
            logger.warning(
                "conversation %d already erased by record %d, finishing", conversation_id, done
            )
            with env.read() as txn:
                erasure = erasure_at(log, txn, done)
            assert erasure is not None
            await self._finish_stream_erasure(writer, done, erasure.records)
            return ErasureReport(done, erasure.conversations, erasure.records, erasure.writes)
        names = stored_projections(env)

        def work(txn: lmdb.Transaction[bytes]) -> tuple[int, ErasurePlan]:
            head = log.head(txn)
            writer.settle(txn, self._committer.projector)
            for seq in range(head + 1, log.head(txn) + 1):  # this erasure, taken back in from
                erasure = erasure_at(log, txn, seq)  # the stream by a run of this transaction
                if erasure is not None and conversation_id in erasure.conversations:
                    txn.put(ERASING_KEY, seq.to_bytes(8, "big"), db=self._meta)
                    return seq, plan
            planning = plan
            if log.head(txn) != planned:  # commits since the plan: plan again, in txn
                planning = plan_erasure(lambda: records_in(txn, log), conversation_id, with_forks)
            earlier = link.run(scan_subject(link, subject, writer.store))[1]
            seq = rewrite(txn, env, log, planning, reason, by, names)
            again = held_elsewhere(earlier, planning.erased)[1]
            tombstones = []
            for number in sorted(set(planning.erased) | again):
                data = log.record(txn, number)
                assert data is not None
                tombstones.append((number, data))
            txn.put(ERASING_KEY, seq.to_bytes(8, "big"), db=self._meta)
            txn.put(SCRUB_KEY, b"", db=self._meta)
            writer.publish_erasure(txn, seq, tombstones)
            return seq, planning

        with self._committer.exclusive():
            seq, plan = env.write(work)  # failed after the publish: the next group takes it in
            writer.committed()
            log.committed()
            self._scrub_at_close = True
            self._fold_again()
        self._erased(plan, seq)
        await self._finish_stream_erasure(writer, seq, sorted(plan.erased))
        return ErasureReport(seq, plan.conversations, sorted(plan.erased), plan.writes)

    async def _finish_stream_erasure(
        self, writer: StreamWriter, seq: int, records: Sequence[int]
    ) -> None:
        """Delete the messages of erasure record ``seq``'s ``records`` from the stream, take its
        snapshots again, then clear the mark that this is left to do (run again at the next open
        of a writer killed before)."""

        link = writer.link
        subject = subject_of(link.stream, writer.store)
        deleted = await link.arun(delete_erased(link, subject, writer.store, seq, records))
        replaced = await replace_snapshots(self.path, link, writer.store)
        with self._committer.exclusive():
            self._env.write(lambda txn: txn.delete(ERASING_KEY, db=self._meta))
        logger.info(
            "erasure record %d of store %s: %d messages deleted from stream %s, %d snapshots replaced",
            seq,
            self.path,
            deleted,
            link.stream,
            len(replaced),
        )

    async def as_of(self, seq: int) -> StorageView:
        """A read-only view answering every read as the store did right after commit ``seq``.

        Opening it costs nothing; each read seeks the history table once per key it touches.
        """

        self.check_open()
        head = self.log.head()
        if type(seq) is not int or not 0 <= seq <= head:
            raise ValueError(f"as_of() needs a committed sequence from 0 to {head}, not {seq!r}")
        point = self.log.trimmed_before()
        if seq < point:
            raise HistoryTrimmed(point, seq)
        return StorageView(self, seq)

    async def trim(
        self, before: int, progress: Callable[[int, int], None] | None = None
    ) -> TrimReport:
        """Drop the log's records before sequence ``before`` (rounded down to a whole tile of the
        log's tree, the head always kept), folded into the log's base (``storage.trim``): reads
        now are unchanged, reads as of a sequence before the point raise ``HistoryTrimmed``, and
        every root and proof of the log's tree stays valid. Refused on a read-only store, on a
        stream and beside user projections. The file shrinks once the closed store is compacted
        (``durable-log trim`` does both)."""

        self.check_open()
        before = check_before(before)
        if self._env.readonly or self._link is not None:
            raise PermissionError(
                f"The store at {self.path} is "
                + ("open read-only" if self._env.readonly else "on a stream")
                + ": a trim needs a local writer (stores on a stream are not covered)"
            )
        env, log = self._env, self.log
        if self.projections.projections or stored_projections(env):
            raise ValueError(
                "A trim drops the records user projections fold from: trim a store without "
                "user projections (drop them first: durable-log projections drop)"
            )
        with self._committer.exclusive():
            log.tree.catch_up(log)  # the dropped records' leaves must be in stored tiles
            kept = log.trimmed_before()
            with env.read() as txn:
                point = reach(log, txn, before)
            if point <= max(kept, 1):
                return TrimReport(max(kept, 1), before, 0, 0)
            chunks, rows = fold_base(log, point, progress)
            dropped = self._rewrite(lambda txn: commit_trim(txn, env, log, point, chunks, rows))
        logger.info(
            "trimmed store %s: %d records before %d folded into its base (%d rows)",
            self.path,
            dropped,
            point,
            rows,
        )
        return TrimReport(point, before, dropped, rows)

    async def _keep_window(self, head: int) -> None:
        """``keep_history=``: trim back to the window once the log passed it by the margin. A
        trim that fails is logged, not raised: the commit that found it due is durable, and the
        next one tries again."""

        keep = self._keep_history
        if keep is None or self._trimming:
            return
        point = due(self._first_kept, head, keep)
        if point is None:
            return
        self._trimming = True
        try:
            report = await self.trim(point)
            self._first_kept = max(report.point, self._first_kept)
        except Exception:
            logger.exception("store %s: trimming to its last %d records failed", self.path, keep)
        finally:
            self._trimming = False

    async def close(self, context: Context | None = None) -> None:
        """Wait for the commits in flight, sync and release the store; every later call is
        refused. Reads never span an await, so none is in flight here.

        The closing runs as a task of its own: a caller cancelled while it waits (``wait_for``
        timing out) does not leave the store half closed, and a later ``close()`` waits for
        the same closing to finish."""

        closing = self._closing
        if closing is None or (not closing.done() and closing.get_loop().is_closed()):
            self._closed = True  # (each step of _close may run again: a closing whose loop died)
            closing = self._closing = asyncio.ensure_future(self._close())
        await asyncio.shield(closing)

    async def _close(self) -> None:
        self._role.stop()
        await self._committer.close()
        await self._role.release()
        await self.projections.close()
        if self._link is not None:
            self._link.close()
        documents = self._model.documents
        if not self._env.readonly and documents.drain():  # snapshots packed after the last commit
            self._env.write(documents.land)
        documents.close()
        if (
            not self._env.readonly
        ):  # the whole tiles commits left to a later write (tree.WRITE_TILES)
            try:
                self.log.tree.catch_up(self.log)
            except (DamageError, StoreStateError) as error:  # verify names it, rebuild mends it
                logger.error(
                    "the log tree of %s was not brought up to date at close: %s",
                    self._env.path,
                    error,
                )
        if self._scrub_at_close:
            self._env.write(lambda txn: txn.delete(SCRUB_KEY, db=self._meta))
        self._env.close()
        self.log.wake()  # a follower in this process raises StoreClosedError now, not at its next poll
        if self._scrub_at_close:
            try:  # the erased bytes off the disk: free pages, page gaps, the word index
                await asyncio.to_thread(scrub, self._env.path)
            except (OSError, DurableLmdbError) as error:
                logger.error("%s was not scrubbed after an erasure: %s", self._env.path, error)

    def check_open(self) -> None:
        """Raise ``StoreClosedError`` once the store is closed."""

        if self._closed:
            raise StoreClosedError("LmdbStorage is closed")

    def _read(self) -> Any:
        if self._closed:
            raise StoreClosedError("LmdbStorage is closed")
        txn = self._env.read()
        return self._follow(txn) if self._env.readonly else txn

    def _lookup(self, read: Callable[..., T], *args: Any) -> T:
        txn = self._read()
        try:
            return read(self._model, txn, *args)
        finally:
            txn.abort()

    def _follow(self, txn: lmdb.Transaction[bytes]) -> lmdb.Transaction[bytes]:
        """``txn``, or a newer one, served by the generation its snapshot names: a rebuild by the
        writer (another process, or another handle in this one) swaps generations."""

        raw = txn.get(CORE_KEY, db=self._registry)
        if raw == self._core:
            return txn
        txn.abort()
        txn, self._model, self._core = begin_following(self._env, self._model, self._core)
        return txn


class StorageView(StorageReads):
    """The store exactly as it answered right after commit ``seq``; read-only."""

    def __init__(self, storage: LmdbStorage, seq: int) -> None:
        self._storage = storage
        self.seq = seq

    @property
    def _model(self) -> ReadModel:  # type: ignore[override]
        """The store's current tables: a rebuild swaps them, and they hold the same history."""

        return self._storage._model

    @contextmanager
    def _read(self) -> Iterator[AsOfTxn]:
        with self._storage._read() as txn:
            yield AsOfTxn(txn, self._model.db, self.seq, self._model.env)

    def check_open(self) -> None:
        """Raise ``StoreClosedError`` once the store this view reads is closed."""

        self._storage.check_open()

    async def commit(self, writes: Sequence[StorageWrite], context: Context | None = None) -> Seq:
        """Refused: a view shows the past."""

        raise PermissionError(f"A view as of sequence {self.seq} is read-only")

    async def mint_id(self) -> int:
        """Refused: a view shows the past."""

        raise PermissionError(f"A view as of sequence {self.seq} is read-only")

    async def close(self, context: Context | None = None) -> None:
        """Nothing to release: views hold nothing open between reads."""


__all__ = [
    "REPLAY_CHUNK",
    "LmdbStorage",
    "StorageView",
]
