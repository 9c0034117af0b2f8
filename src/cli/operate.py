"""Operating a store: ``rebuild`` its projections, ``compact`` its file, ``erase`` a conversation,
``trim`` its old history, keep a ``replica`` level with its NATS stream,
``promote`` a copy to be its stream's writer. These take the writer's place (the lock, the lease);
they never create a store they were meant to repair."""

from __future__ import annotations

import argparse
import asyncio
import sys

from ..audit.numbers import LEASE_TTL, argument
from ..audit.stats import refuse_foreign_files, require_store, stored_projections
from ..audit.words import format_bytes, plural
from ..log.environment import check_store_id
from .common import (
    EXIT_DAMAGE,
    EXIT_OK,
    Progress,
    add_command,
    conversation_id,
    interval,
    nats_options,
    note,
    point,
    progress_on,
    progress_option,
    run_until_signalled,
    seq_or_time,
    store_argument,
    usage,
)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_rebuild(commands)
    _register_compact(commands)
    _register_erase(commands)
    _register_trim(commands)
    _register_replica(commands)
    _register_promote(commands)


# ── rebuild ───────────────────────────────────────────────────────────────────


def _register_rebuild(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "rebuild",
        "fold the whole log into fresh projections beside the live ones, then swap",
        "Fold the whole log into fresh core projections beside the live ones, then swap them in "
        "(a killed rebuild resumes). Takes the writer lock; never creates a store.",
        example="durable-log rebuild demo-store",
    )
    store_argument(sub)
    sub.add_argument(
        "--projection",
        default="core",
        metavar="NAME",
        help="core (default), or a user projection's name (see projections): its databases and status are "
        "deleted now, and the program that defines it folds the whole log into it again on its next open",
    )
    progress_option(sub)
    sub.set_defaults(run=_rebuild)


def _rebuild(args: argparse.Namespace) -> int:
    from ..storage.lmdb_storage import LmdbStorage

    require_store(args.path)
    if args.projection != "core":
        known = stored_projections(args.path)
        if args.projection not in known:
            names = ", ".join(["core", *sorted(known)])
            raise usage(f"The store has no projection {args.projection!r}; it has: {names}")

    async def run() -> None:
        storage = await LmdbStorage.open(args.path)
        try:
            if args.projection == "core":
                head = storage.log.head()
                await storage.rebuild(Progress("rebuild", head, progress_on(args)))
                print(
                    f"{args.path}: rebuilt the core projections from {plural(head, 'log record')}"
                )
            else:
                dropped = await storage.projections.drop(args.projection)
                print(
                    f"{args.path}: dropped projection {args.projection!r}: deleted its "
                    f"{plural(len(dropped), 'database')} ({', '.join(dropped) or '-'}) and its status; the program "
                    "that defines it folds the whole log into it again on its next open"
                )
        finally:
            await storage.close()

    asyncio.run(run())
    return EXIT_OK


# ── compact ───────────────────────────────────────────────────────────────────


def _register_compact(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "compact",
        "give the file's free pages back: LMDB's compacting copy swapped in place",
        "Write LMDB's compacting copy of the store beside it, sync it, check it and rename it over "
        "data.mdb (atomic; an interrupted compact leaves the store as it was). Needs the store "
        "closed everywhere: refuses while a writer or another process's reader has it open. A "
        "power writer's journal left by a power cut is replayed first. "
        "Never creates a store.",
        example="durable-log compact demo-store",
    )
    store_argument(sub)
    progress_option(sub)
    sub.set_defaults(run=_compact)


def _compact(args: argparse.Namespace) -> int:
    import os

    from ..errors import JournalReplayPending
    from ..log.compact import compact

    require_store(args.path)
    if progress_on(args):
        size = format_bytes(os.path.getsize(os.path.join(args.path, "data.mdb")))
        note(
            f"compact: copying {args.path} ({size}) without its free pages, then checking and "
            "swapping in the copy"
        )
    try:
        report = compact(args.path)
    except JournalReplayPending:
        # A power writer stopped by a power cut: its journal holds commits data.mdb may not.
        # Its open replays them (and its close syncs them and removes the marker); then compact.
        from ..storage.lmdb_storage import LmdbStorage

        async def replay() -> None:
            await (await LmdbStorage.open(args.path)).close()

        print(
            f"durable-log: {args.path}: replaying the journal of a power writer that stopped uncleanly first",
            file=sys.stderr,
        )
        asyncio.run(replay())
        report = compact(args.path)
    print(
        f"{args.path}: compacted {format_bytes(report.before)} to {format_bytes(report.after)} "
        f"({plural(report.records, 'log record')}, head sequence {report.head})"
    )
    return EXIT_OK


# ── erase ───────────────────────────────────────────────────────────────────


def _register_erase(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "erase",
        "erase a conversation from the log, the projections and the disk; proofs still hold",
        "Erase conversation ID: its entries, tasks, submissions and the documents scoped to it "
        "leave the log (each record holding them becomes a tombstone that keeps its leaf hash, "
        "so every proof still holds) and the projections, and an erasure record with REASON is "
        "appended. Then, the store closed, the word index is deleted, the journal's segments "
        "zeroed and data.mdb compacted: no file of the store holds the erased bytes. Takes the "
        "writer lock and needs the store closed everywhere; never creates a store. A "
        "conversation with forks is refused, naming them, unless --with-forks. Run again on a "
        "conversation already erased, it finishes the scrub (after an erase that was stopped). "
        "With --nats URL --stream S, the store is opened as the stream's replicated writer: the "
        "erasure travels the stream to every replica, the erased records' messages are deleted "
        "from it and its snapshots taken again.",
        example="durable-log erase demo-store --conversation 22 --reason 'erasure request 17'",
    )
    store_argument(sub)
    sub.add_argument(
        "--conversation",
        required=True,
        type=conversation_id,
        metavar="ID",
        help="the conversation to erase",
    )
    sub.add_argument(
        "--reason", required=True, metavar="TEXT", help="why, kept in the erasure record"
    )
    sub.add_argument(
        "--by", default="", metavar="TEXT", help="who asked, kept in the erasure record"
    )
    sub.add_argument(
        "--with-forks",
        action="store_true",
        help="erase the conversation's forks and owned conversations too (else they are refused)",
    )
    sub.add_argument(
        "--nats",
        metavar="URL",
        help="the store's NATS servers, for a replicated store (with --stream)",
    )
    sub.add_argument(
        "--stream", metavar="S", help="the stream that carries the store's log (with --nats)"
    )
    sub.set_defaults(run=_erase)


def _erase(args: argparse.Namespace) -> int:
    from ..projections import StorageRequestError
    from ..storage.erase import erased_by, scrub
    from ..storage.lmdb_storage import LmdbStorage

    require_store(args.path)
    if (args.nats is None) != (args.stream is None):
        raise usage("--nats and --stream go together")

    async def run() -> str:
        storage = (
            await LmdbStorage.open(args.path)
            if args.nats is None
            else await LmdbStorage.open(
                args.path, durability="replicated", nats=args.nats, stream=args.stream
            )
        )
        try:
            try:
                report = await storage.erase_conversation(
                    args.conversation, reason=args.reason, by=args.by, with_forks=args.with_forks
                )
            except StorageRequestError:
                done = erased_by(storage.log, args.conversation)
                if done is None:
                    raise
                # Erased by a run that stopped before its scrub: this one finishes it.
                return f"{args.path}: conversation {args.conversation} was erased by erasure record {done}"
        finally:
            await storage.close()
        return (
            f"{args.path}: erased conversation{'s' if len(report.conversations) > 1 else ''} "
            f"{', '.join(map(str, report.conversations))}: "
            f"{plural(report.writes, 'write')} from {plural(len(report.records), 'record')} "
            f"(tombstones now), erasure record {report.seq}"
        )

    said = asyncio.run(run())
    compacted = scrub(args.path)
    print(
        f"{said}; scrubbed the disk: data.mdb compacted from {format_bytes(compacted.before)} to "
        f"{format_bytes(compacted.after)}, journal zeroed, word index deleted"
    )
    return EXIT_OK


# ── trim ────────────────────────────────────────────────────────────────────


def _register_trim(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "trim",
        "drop the log's records before a point, folded into its base; proofs still hold",
        "Drop the log's records before SEQ (or those committed before TIME), keeping in their "
        "place the state they fold to (the log's base), then compact data.mdb so the file "
        "shrinks. The point is rounded down to a whole tile of the log's Merkle tree (16 "
        "records), the head is always kept; reads now are unchanged, every root and proof still "
        "holds, and a read as of a sequence before the point is refused. Takes the writer lock "
        "and needs the store closed everywhere; refused on a store with user projections; never "
        "creates a store.",
        example="durable-log trim demo-store --before 4097",
    )
    store_argument(sub)
    sub.add_argument(
        "--before",
        required=True,
        type=point,
        metavar="SEQ|TIME",
        help="the first log sequence to keep, or a time (ISO 8601): the records committed before it go",
    )
    sub.set_defaults(run=_trim)


def _trim(args: argparse.Namespace) -> int:
    from ..audit.export import seq_at
    from ..log.compact import compact
    from ..storage.lmdb_storage import LmdbStorage

    require_store(args.path)
    before, at_time = seq_or_time(args.before)

    async def run() -> str:
        storage = await LmdbStorage.open(args.path)
        try:
            asked = before if at_time is None else seq_at(storage.log, at_time - 1) + 1
            if asked is None or asked < 1:
                raise usage(f"--before must name sequence 1 or later, not {asked}")
            report = await storage.trim(asked)
        finally:
            await storage.close()
        if report.records == 0:
            return f"{args.path}: nothing to trim before {asked}: the log keeps sequence {report.point} on"
        return (
            f"{args.path}: trimmed {plural(report.records, 'record')} before sequence "
            f"{report.point} into the log's base ({plural(report.rows, 'row')})"
        )

    said = asyncio.run(run())
    compacted = compact(args.path)
    print(
        f"{said}; data.mdb compacted from {format_bytes(compacted.before)} to "
        f"{format_bytes(compacted.after)}"
    )
    return EXIT_OK


# ── replica ───────────────────────────────────────────────────────────────────


def _register_replica(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "replica",
        "keep a replica of a store level with its NATS stream, until Ctrl-C",
        "Open (or create) at PATH a replica of store ID, take in what the NATS stream S holds of it "
        "and keep taking each new record until Ctrl-C or SIGTERM (exit 0), printing where it stands "
        "to stderr every --interval seconds. Exit 1 if a message of the stream is refused (not a "
        "sound record of the store): the replica keeps what came before it.",
        example="durable-log replica replica-store --nats nats://127.0.0.1:4222 --stream LOGS --store ID",
    )
    sub.add_argument("path", metavar="PATH", help="the replica's directory (made when missing)")
    nats_options(sub)
    sub.add_argument(
        "--interval",
        type=interval,
        default=10.0,
        metavar="SECONDS",
        help="print the status every SECONDS (default 10)",
    )
    sub.set_defaults(run=_replica)


def _replica(args: argparse.Namespace) -> int:
    check_store_id(args.store)
    refuse_foreign_files(args.path)
    return int(run_until_signalled(_keep_replica(args)))


async def _keep_replica(args: argparse.Namespace) -> int:
    from ..storage.lmdb_storage import LmdbStorage
    from ..storage.replica import Follower

    replica = await LmdbStorage.open_replica(
        args.path, nats=args.nats, stream=args.stream, store=args.store
    )
    follower = replica.replication
    assert isinstance(follower, Follower)

    def say(text: str) -> None:
        print(f"durable-log: replica {args.path}: {text}", file=sys.stderr, flush=True)

    def status() -> str:
        now = follower.status()
        text = f"applied sequence {now.applied_seq} (stream message {now.stream_seq}), " + (
            f"lag {plural(now.lag_records, 'record')}, {now.lag_ms / 1000:.1f} s"
            if follower.heard
            else "lag not known yet (the stream has not said how far it reaches)"
        )
        return text + (f"; last error: {now.last_error}" if now.last_error else "")

    try:
        say(f"store {args.store}, following subject {follower.subject}; Ctrl-C or SIGTERM stops")
        shown = -1.0
        loop = asyncio.get_running_loop()
        while True:
            if follower.error is not None:
                say(f"stopped at applied sequence {replica.log.head()}")
                print(f"durable-log: damage: {follower.error}", file=sys.stderr, flush=True)
                return EXIT_DAMAGE
            if loop.time() - shown >= args.interval:
                say(status())
                shown = loop.time()
            await asyncio.sleep(min(0.1, args.interval))
    except asyncio.CancelledError:
        say(f"stopping: {status()}")
        raise
    finally:
        await replica.close()


# ── promote ───────────────────────────────────────────────────────────────────


def _register_promote(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "promote",
        "make a replica (or any copy) of a store the writer of its stream",
        "Take over store PATH's stream as its writer: wait for the old writer's lease to expire "
        "(--force: fence the old writer out at once), take the lease with a higher epoch, put a "
        "fence on the store's subject (no earlier writer's append can land after it) and take in "
        "everything the stream holds. Then the lease is released, so the host that opens PATH "
        "next with durability='replicated' writes at once. Exit 2 if another writer keeps its lease.",
        example="durable-log promote replica-store --nats nats://127.0.0.1:4222 --stream LOGS",
    )
    store_argument(sub)
    sub.add_argument(
        "--nats",
        required=True,
        metavar="URL",
        help="a NATS server URL, or several, comma-separated",
    )
    sub.add_argument(
        "--stream", required=True, metavar="S", help="the JetStream stream that carries the log"
    )
    sub.add_argument(
        "--force",
        action="store_true",
        help="fence the old writer out now, without waiting for its lease",
    )
    sub.add_argument(
        "--lease-ttl",
        type=argument(LEASE_TTL),
        default=None,
        metavar="SECONDS",
        help="the lease's time to live",
    )
    sub.set_defaults(run=_promote)


def _promote(args: argparse.Namespace) -> int:
    from ..log.environment import Environment
    from ..log.stream.lease import DEFAULT_LEASE_TTL

    require_store(args.path)
    env = Environment(args.path, readonly=True)
    store = env.store_id
    env.close()
    if store is None:
        raise usage(f"{args.path} has no store id yet (open it once with a writer of this version)")

    async def run() -> int:
        from ..storage.lmdb_storage import LmdbStorage

        storage = await LmdbStorage.open(
            args.path,
            durability="replicated",
            nats=args.nats,
            stream=args.stream,
            store=store,
            take_over="force" if args.force else True,
            lease_ttl=args.lease_ttl or DEFAULT_LEASE_TTL,
        )
        try:
            writer = storage.replication
            epoch = getattr(writer, "epoch", None)
            print(
                f"promoted {args.path}: store {store}, writer epoch {epoch}, head sequence {storage.log.head()}"
            )
        finally:
            await storage.close()
        return EXIT_OK

    return asyncio.run(run())


__all__ = [
    "register",
]
