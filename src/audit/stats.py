"""What a store holds and how far each part of it stands (``durable-log stats``), read-only."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import lmdb
import msgspec
from msgspec import UNSET, UnsetType

from ..errors import JournalReplayPending, ProjectionsBehind
from ..log import Environment, WriteLog
from ..log.environment import MAIN_DB, PageStats
from ..log.records import FORMAT_VERSION
from ..log.stream.position import stored_position
from ..log.stream.shipper import stopped_reason
from ..log.writelog import LOG_DB
from ..projections import tables as t
from ..projections import userstate
from ..projections.rebuild import begin_following, folded_through, open_core, projection_state
from ..projections.userstate import ProjectionStatus
from .numbers import format_time
from .tail import open_stream
from .words import format_bytes, plural

# ── results ───────────────────────────────────────────────────────────────────
# What ``stats`` reports, as ``durable-log stats --json``, ``/healthz`` and ``/metrics`` read it:
# each field is written under its camelCase name (``msgspec.json.encode``, ``msgspec.to_builtins``).


class LeaseHolder(msgspec.Struct, frozen=True):
    """Who holds a store's writer lease on its stream, and until when (``stats --nats``)."""

    holder: str
    epoch: int
    ttl: int
    revision: int
    expires: str


class DatabasePages(msgspec.Struct, frozen=True, rename="camel"):
    """One LMDB database's share of the file."""

    entries: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    bytes: int
    bytes_per_entry: float | None


class Footprint(msgspec.Struct, frozen=True, rename="camel"):
    """Where the file's bytes go (``footprint``)."""

    page_size: int
    used_pages: int
    pages_up_to_last_used: int
    free_pages: int
    free_bytes: int
    free_share: float
    log_bytes_per_record: float | None
    databases: dict[str, DatabasePages]


class Counts(msgspec.Struct, frozen=True):
    """Records of each kind the core projections hold."""

    conversations: int
    entries: int
    tasks: int
    submissions: int
    documents: int

    def by_kind(self) -> list[tuple[str, int]]:
        """``(kind, count)`` in the order printed."""

        return [(name, getattr(self, name)) for name in self.__struct_fields__]


class Tree(msgspec.Struct, frozen=True, rename="camel"):
    """The log's Merkle tree: its size, the leaves its stored tiles hold, its root (hex)."""

    size: int
    stored_leaves: int
    root_hash: str | None


class CoreProjection(msgspec.Struct, frozen=True, rename="camel"):
    generation: int
    schema_version: int | None
    folded_seq: int | None


class UserBuild(msgspec.Struct, frozen=True, rename="camel"):
    """A version of a user projection being built beside the served one."""

    version: int
    folded_seq: int
    rate: float
    failed_seq: int | None
    error: str | None


class UserProjection(msgspec.Struct, frozen=True, rename="camel"):
    version: int
    folded_seq: int
    failed_seq: int | None
    error: str | None
    building: UserBuild | None


class Projections(msgspec.Struct, frozen=True):
    core: CoreProjection
    user: dict[str, UserProjection]


class Replication(msgspec.Struct, frozen=True, rename="camel"):
    """The store's stored position on the stream that carries its log."""

    stream: str
    stream_seq: int
    seq: int
    epoch: int


class Shipping(msgspec.Struct, frozen=True):
    """A shipper that stopped for good, and why."""

    stopped: bool
    reason: str


class Stats(msgspec.Struct, frozen=True, rename="camel"):
    """What a store holds and how far each part of it stands. ``replication`` and ``shipping``
    are left out (``UNSET``) when the store has no stream position or no stopped shipper;
    ``lease`` is only there when asked of the stream (``stats --nats``)."""

    path: str
    store_id: str | None
    format_version: int
    head_seq: int
    records: int
    first_committed_at: int | None
    last_committed_at: int | None
    file_bytes: int
    log_bytes: int
    projection_bytes: int
    footprint: Footprint
    counts: Counts
    live_documents: int
    tree: Tree
    projections: Projections
    replication: Replication | UnsetType = UNSET
    shipping: Shipping | UnsetType = UNSET
    lease: LeaseHolder | UnsetType | None = UNSET
    trimmed_before: int | UnsetType = UNSET
    """The log's first record since a trim (``storage.trim``): the records before it are folded
    into the log's base. Left out when the log was never trimmed."""


async def lease_of(nats: str | Sequence[str], stream: str, store: str | None) -> LeaseHolder | None:
    """Who holds store ``store``'s writer lease on ``stream`` now (``None``: nobody)."""

    from ..log.stream.lease import WriterLease

    if store is None:
        return None
    link = await open_stream(nats, stream)
    try:
        lease = WriterLease(link, store, "")
        current, revision = await link.arun(lease.current())
        if current is None:
            return None
        return LeaseHolder(
            holder=current.holder,
            epoch=current.epoch,
            ttl=current.ttl,
            revision=revision,
            expires=f"within {current.ttl} s of its holder's last renewal",
        )
    finally:
        await asyncio.to_thread(link.close)


# ── stats ─────────────────────────────────────────────────────────────────────


def require_store(path: str | os.PathLike[str]) -> None:
    """Refuse a path that holds no store, before a command that takes the writer lock (which
    would create one): no read-or-repair command creates a store."""

    try:
        Environment(path, readonly=True).close()
    except JournalReplayPending:
        pass  # a store whose journal a writer's open replays


def refuse_foreign_files(path: str | os.PathLike[str]) -> None:
    """Before a command makes or opens its own store at ``path`` (``demo``, ``replica``): LMDB
    files there that are not a store of this program (another program's environment) are
    refused by a read-only open, before a writer could write into them."""

    if os.path.exists(os.path.join(os.fspath(path), "data.mdb")):
        require_store(path)


def stored_projections(path: str | os.PathLike[str]) -> list[str]:
    """The names of the user projections a store holds rows for."""

    env = Environment(path, readonly=True)
    try:
        served, builds, _ = userstate.stored(env)
        return sorted(set(served) | set(builds))
    finally:
        env.close()


def stats(path: str | os.PathLike[str]) -> Stats:
    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        model = open_core(env, log)
        head, first, count = log.head(), log.first(), log.count()
        first_commit = log.get(first) if first else None
        last_commit = log.get(head) if head else None
        pages = env.page_stats()
        sizes = {name: db.bytes for name, db in pages.dbs.items() if name != MAIN_DB}
        txn, model, _ = begin_following(env, model)  # a rebuild elsewhere may have swapped
        with txn:
            counts = Counts(
                conversations=txn.stat(model.db[t.CONVERSATIONS])["entries"],
                entries=txn.stat(model.db[t.ENTRIES_BY_CONVERSATION])["entries"],
                tasks=txn.stat(model.db[t.TASKS])["entries"],
                submissions=txn.stat(model.db[t.SUBMISSIONS])["entries"],
                documents=txn.stat(model.db[t.DOCUMENTS])["entries"],
            )
            live_documents = txn.stat(model.db[t.DOCUMENT_CURRENT])["entries"]
            state = projection_state(txn, model)
            # in this snapshot: a rebuild elsewhere may drop its generation right after
            core_folded = None if state is None else folded_through(txn, log, state)
            position = _stored_position(txn, env)
        served, builds, _ = userstate.stored(env)
        users = {
            name: userstate.report(served.get(name), builds.get(name), head, None)
            for name in set(served) | set(builds)
        }
        shipping_stopped = stopped_reason(env.path)
        tree = _tree(env, log, head)
        trimmed = log.trimmed_before()
        return Stats(
            trimmed_before=trimmed or UNSET,
            path=env.path,
            store_id=env.store_id,
            format_version=FORMAT_VERSION,
            head_seq=head,
            records=count,
            first_committed_at=None if first_commit is None else first_commit.committed_at,
            last_committed_at=None if last_commit is None else last_commit.committed_at,
            file_bytes=pages.file_bytes,
            log_bytes=sizes.get("log", 0),
            projection_bytes=sum(size for name, size in sizes.items() if name.startswith("p")),
            footprint=footprint(pages),
            counts=counts,
            live_documents=live_documents,
            tree=tree,
            projections=Projections(
                core=CoreProjection(
                    generation=model.generation,
                    schema_version=None if state is None else state.schema_version,
                    folded_seq=core_folded,
                ),
                user={
                    name: UserProjection(
                        version=status.version,
                        folded_seq=status.folded_seq,
                        failed_seq=status.failed_seq,
                        error=status.error,
                        building=None
                        if status.building is None
                        else UserBuild(
                            version=status.building.version,
                            folded_seq=status.building.folded_seq,
                            rate=status.building.rate,
                            failed_seq=status.building.failed_seq,
                            error=status.building.error,
                        ),
                    )
                    for name, status in sorted(users.items())
                },
            ),
            replication=UNSET
            if position is None
            else Replication(
                stream=position.stream,
                stream_seq=position.stream_seq,
                seq=position.seq,
                epoch=position.epoch,
            ),
            shipping=UNSET
            if shipping_stopped is None
            else Shipping(stopped=True, reason=shipping_stopped),
        )
    finally:
        env.close()


def _tree(env: Environment, log: WriteLog, head: int) -> Tree:
    """The log's Merkle tree (docs/audit.md): its size (every record), the leaves its stored tiles
    hold, and its root (``None`` when a store written before the tree is too far behind to hash
    from a read-only open)."""

    with env.read() as txn:
        stored = log.tree.size(txn)
    try:
        root: str | None = log.root(head).hex()
    except ProjectionsBehind:
        root = None
    return Tree(size=head, stored_leaves=stored, root_hash=root)


def footprint(pages: PageStats) -> Footprint:
    """Where the file's bytes go, for ``stats``: each database's pages, the free pages (counted
    by difference, see ``Environment.page_stats``) and the share of the file a compacting copy
    (``durable-log compact``) would give back."""

    log = pages.dbs.get(LOG_DB)
    return Footprint(
        page_size=pages.page_size,
        used_pages=pages.used_pages,
        pages_up_to_last_used=pages.used_pages,
        free_pages=pages.free_pages,
        free_bytes=pages.free_bytes,
        free_share=round(pages.free_bytes / pages.file_bytes, 4) if pages.file_bytes else 0.0,
        log_bytes_per_record=round(log.bytes / log.entries, 1)
        if log is not None and log.entries
        else None,
        databases={
            name: DatabasePages(
                entries=db.entries,
                depth=db.depth,
                branch_pages=db.branch,
                leaf_pages=db.leaf,
                overflow_pages=db.overflow,
                bytes=db.bytes,
                bytes_per_entry=round(db.bytes / db.entries, 1) if db.entries else None,
            )
            for name, db in sorted(pages.dbs.items())
        },
    )


def format_footprint(info: Stats) -> list[str]:
    """The footprint section of ``format_stats``: databases holding pages, largest first."""

    foot = info.footprint
    per_record = foot.log_bytes_per_record
    lines = [
        f"free pages       {foot.free_pages:,} of the file's {foot.pages_up_to_last_used:,} pages up to its last used one "
        f"(freePages of pagesUpToLastUsed: held by no database, reused before the file grows); "
        f"{format_bytes(foot.free_bytes)} free with the file's tail ({foot.free_share:.1%} of the file)",
        "                 (normal: LMDB never overwrites a page, so each commit frees the old copies of "
        "the pages it rewrote for the next commits to reuse; most of a young store; compact gives "
        "them back)",
        f"log per record   {'-' if per_record is None else format_bytes(int(per_record))}",
        f"{'database':<40} {'entries':>9} {'branch':>7} {'leaf':>7} {'overflow':>8} {'bytes':>10} {'B/entry':>8}",
    ]
    rows = [(name, db) for name, db in foot.databases.items() if db.bytes]
    for name, db in sorted(rows, key=lambda row: -row[1].bytes):
        each = "-" if db.bytes_per_entry is None else f"{db.bytes_per_entry:,.0f}"
        lines.append(
            f"  {name:<38} {db.entries:>9,} {db.branch_pages:>7,} {db.leaf_pages:>7,} "
            f"{db.overflow_pages:>8,} {format_bytes(db.bytes):>10} {each:>8}"
        )
    return lines


def _stored_position(txn: lmdb.Transaction[bytes], env: Environment) -> Any:
    import msgspec

    from ..errors import ReplicationError

    try:
        return stored_position(txn, env.db("meta"))
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ReplicationError(
            f"The replication position of the store at {env.path} is unreadable ({error})"
        ) from None


def format_stats(info: Stats) -> str:
    def when(ms: int | None) -> str:
        return "-" if ms is None else format_time(ms)

    core = info.projections.core
    lines = [
        f"store            {info.path}",
        f"store id         {info.store_id or '- (its next writer assigns one)'}",
        f"format version   {info.format_version}",
        f"head sequence    {info.head_seq}",
        f"log records      {info.records:,}",
        *(
            [f"trimmed before   sequence {info.trimmed_before} (folded into the log's base)"]
            if isinstance(info.trimmed_before, int)
            else []
        ),
        f"first commit     {when(info.first_committed_at)}",
        f"last commit      {when(info.last_committed_at)}",
        f"file size        {format_bytes(info.file_bytes)}",
        f"log size         {format_bytes(info.log_bytes)}",
        f"projection size  {format_bytes(info.projection_bytes)}",
        *format_footprint(info),
        "records          "
        + ", ".join(plural(count, *_KINDS[name]) for name, count in info.counts.by_kind()),
        f"live documents   {info.live_documents:,}",
        f"merkle tree      {plural(info.tree.size, 'record')}, root {info.tree.root_hash or '- (open the store for writing once)'}",
        f"projections      core: schema {core.schema_version}, folded to sequence {core.folded_seq}",
    ]
    for name, user in info.projections.user.items():
        state = f"version {user.version}, folded to sequence {user.folded_seq}"
        if user.error is not None:
            state += f", stopped at sequence {user.failed_seq}: {user.error}"
        build = user.building
        if build is not None:
            state += f"; building version {build.version}, folded to sequence {build.folded_seq}"
            if build.error is not None:
                state += f", stopped at sequence {build.failed_seq}: {build.error}"
        lines.append(f"                 {name}: {state}")
    replication = info.replication
    if replication is not UNSET:
        lines.append(
            f"replication      stream {replication.stream}: log sequence {replication.seq} at stream message "
            f"{replication.stream_seq}, writer epoch {replication.epoch}"
        )
    if info.shipping is not UNSET:
        lines.append(f"shipping         STOPPED: {info.shipping.reason}")
    if info.lease is not UNSET:
        lease = info.lease
        lines.append(
            "writer lease     "
            + (
                "none (nobody writes the store now)"
                if lease is None
                else f"held by {lease.holder}, epoch {lease.epoch}, {lease.expires}"
            )
        )
    return "\n".join(lines)


_KINDS = {
    "conversations": ("conversation", "conversations"),
    "entries": ("entry", "entries"),
    "tasks": ("task", "tasks"),
    "submissions": ("submission", "submissions"),
    "documents": ("document", "documents"),
}


def projection_statuses(path: str | os.PathLike[str]) -> dict[str, ProjectionStatus]:
    """Each user projection the store holds, as ``storage.projections.status()`` reports it,
    without the program that defines it (``durable-log projections``); read-only."""

    env = Environment(path, readonly=True)
    try:
        served, builds, head = userstate.stored(env)
        now = time.time()
        return {
            name: userstate.report(
                served.get(name),
                builds.get(name),
                head,
                served[name].version if name in served else None,
                now,
            )
            for name in sorted(set(served) | set(builds))
        }
    finally:
        env.close()


__all__ = [
    "CoreProjection",
    "Counts",
    "DatabasePages",
    "Footprint",
    "LeaseHolder",
    "Projections",
    "Replication",
    "Shipping",
    "Stats",
    "Tree",
    "UserBuild",
    "UserProjection",
    "footprint",
    "format_footprint",
    "format_stats",
    "lease_of",
    "projection_statuses",
    "refuse_foreign_files",
    "require_store",
    "stats",
    "stored_projections",
]
