"""What a store holds and how far each part of it stands (``durable-log stats``), read-only."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

import lmdb

from ..errors import JournalReplayPending, ProjectionsBehind
from ..log import Environment, WriteLog
from ..log.environment import MAIN_DB, PageStats
from ..log.writelog import LOG_DB
from ..log.records import FORMAT_VERSION
from ..log.stream.position import stored_position
from ..log.stream.shipper import stopped_reason
from ..projections import tables as t
from ..projections.rebuild import begin_following, folded_seq, open_core, projection_state
from ..projections import userstate
from ..projections.userstate import ProjectionStatus

from .tail import open_stream
from .words import format_bytes, plural


async def lease_of(nats: str | Sequence[str], stream: str, store: str | None) -> dict[str, Any] | None:
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
        return {
            "holder": current.holder,
            "epoch": current.epoch,
            "ttl": current.ttl,
            "revision": revision,
            "expires": f"within {current.ttl} s of its holder's last renewal",
        }
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


def stats(path: str | os.PathLike[str]) -> dict[str, Any]:
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
            counts = {
                "conversations": txn.stat(model.db[t.CONVERSATIONS])["entries"],
                "entries": txn.stat(model.db[t.ENTRIES_BY_CONVERSATION])["entries"],
                "tasks": txn.stat(model.db[t.TASKS])["entries"],
                "submissions": txn.stat(model.db[t.SUBMISSIONS])["entries"],
                "documents": txn.stat(model.db[t.DOCUMENTS])["entries"],
            }
            live_documents = txn.stat(model.db[t.DOCUMENT_CURRENT])["entries"]
            state = projection_state(txn, model)
            position = _stored_position(txn, env)
        served, builds, _ = userstate.stored(env)
        users = {name: userstate.report(served.get(name), builds.get(name), head, None) for name in set(served) | set(builds)}
        shipping_stopped = stopped_reason(env.path)
        tree = _tree(env, log, head)
        return {
            "path": env.path,
            "storeId": env.store_id,
            "formatVersion": FORMAT_VERSION,
            "headSeq": head,
            "records": count,
            "firstCommittedAt": None if first_commit is None else first_commit.committed_at,
            "lastCommittedAt": None if last_commit is None else last_commit.committed_at,
            "fileBytes": pages.file_bytes,
            "logBytes": sizes.get("log", 0),
            "projectionBytes": sum(size for name, size in sizes.items() if name.startswith("p")),
            "footprint": footprint(pages),
            "counts": counts,
            "liveDocuments": live_documents,
            "tree": tree,
            "projections": {
                "core": {
                    "generation": model.generation,
                    "schemaVersion": None if state is None else state.schema_version,
                    "foldedSeq": None if state is None else folded_seq(env, log, model),
                },
                "user": {
                    name: {
                        "version": status.version,
                        "foldedSeq": status.folded_seq,
                        "failedSeq": status.failed_seq,
                        "error": status.error,
                        "building": None if status.building is None else {
                            "version": status.building.version,
                            "foldedSeq": status.building.folded_seq,
                            "rate": status.building.rate,
                            "failedSeq": status.building.failed_seq,
                            "error": status.building.error,
                        },
                    }
                    for name, status in sorted(users.items())
                },
            },
            **(
                {}
                if position is None
                else {
                    "replication": {
                        "stream": position.stream,
                        "streamSeq": position.stream_seq,
                        "seq": position.seq,
                        "epoch": position.epoch,
                    }
                }
            ),
            **({} if shipping_stopped is None else {"shipping": {"stopped": True, "reason": shipping_stopped}}),
        }
    finally:
        env.close()


def _tree(env: Environment, log: WriteLog, head: int) -> dict[str, Any]:
    """The log's Merkle tree (docs/audit.md): its size (every record), the leaves its stored tiles
    hold, and its root (``None`` when a store written before the tree is too far behind to hash
    from a read-only open)."""

    with env.read() as txn:
        stored = log.tree.size(txn)
    try:
        root: str | None = log.root(head).hex()
    except ProjectionsBehind:
        root = None
    return {"size": head, "storedLeaves": stored, "rootHash": root}


def footprint(pages: PageStats) -> dict[str, Any]:
    """Where the file's bytes go, for ``stats``: each database's pages, the free pages (counted
    by difference, see ``Environment.page_stats``) and the share of the file a compacting copy
    (``durable-log compact``) would give back."""

    log = pages.dbs.get(LOG_DB)
    return {
        "pageSize": pages.page_size,
        "usedPages": pages.used_pages,
        "pagesUpToLastUsed": pages.used_pages,
        "freePages": pages.free_pages,
        "freeBytes": pages.free_bytes,
        "freeShare": round(pages.free_bytes / pages.file_bytes, 4) if pages.file_bytes else 0.0,
        "logBytesPerRecord": round(log.bytes / log.entries, 1) if log is not None and log.entries else None,
        "databases": {
            name: {
                "entries": db.entries,
                "depth": db.depth,
                "branchPages": db.branch,
                "leafPages": db.leaf,
                "overflowPages": db.overflow,
                "bytes": db.bytes,
                "bytesPerEntry": round(db.bytes / db.entries, 1) if db.entries else None,
            }
            for name, db in sorted(pages.dbs.items())
        },
    }


def format_footprint(info: dict[str, Any]) -> list[str]:
    """The footprint section of ``format_stats``: databases holding pages, largest first."""

    foot = info["footprint"]
    per_record = foot["logBytesPerRecord"]
    lines = [
        f"free pages       {foot['freePages']:,} of the file's {foot['pagesUpToLastUsed']:,} pages up to its last used one "
        f"(freePages of pagesUpToLastUsed: held by no database, reused before the file grows); "
        f"{format_bytes(foot['freeBytes'])} free with the file's tail ({foot['freeShare']:.1%} of the file)",
        f"log per record   {'-' if per_record is None else format_bytes(int(per_record))}",
        f"{'database':<40} {'entries':>9} {'branch':>7} {'leaf':>7} {'overflow':>8} {'bytes':>10} {'B/entry':>8}",
    ]
    rows = [(name, db) for name, db in foot["databases"].items() if db["bytes"]]
    for name, db in sorted(rows, key=lambda row: -row[1]["bytes"]):
        each = "-" if db["bytesPerEntry"] is None else f"{db['bytesPerEntry']:,.0f}"
        lines.append(
            f"  {name:<38} {db['entries']:>9,} {db['branchPages']:>7,} {db['leafPages']:>7,} "
            f"{db['overflowPages']:>8,} {format_bytes(db['bytes']):>10} {each:>8}"
        )
    return lines


def _stored_position(txn: lmdb.Transaction[bytes], env: Environment) -> Any:
    import msgspec

    from ..errors import ReplicationError

    try:
        return stored_position(txn, env.db("meta"))
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ReplicationError(f"The replication position of the store at {env.path} is unreadable ({error})") from None


def format_stats(info: dict[str, Any]) -> str:
    def when(ms: int | None) -> str:
        return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))

    core = info["projections"]["core"]
    lines = [
        f"store            {info['path']}",
        f"store id         {info['storeId'] or '- (its next writer assigns one)'}",
        f"format version   {info['formatVersion']}",
        f"head sequence    {info['headSeq']}",
        f"log records      {info['records']:,}",
        f"first commit     {when(info['firstCommittedAt'])}",
        f"last commit      {when(info['lastCommittedAt'])}",
        f"file size        {format_bytes(info['fileBytes'])}",
        f"log size         {format_bytes(info['logBytes'])}",
        f"projection size  {format_bytes(info['projectionBytes'])}",
        *format_footprint(info),
        "records          "
        + ", ".join(plural(count, *_KINDS[name]) for name, count in info["counts"].items()),
        f"live documents   {info['liveDocuments']:,}",
        f"merkle tree      {plural(info['tree']['size'], 'record')}, root {info['tree']['rootHash'] or '- (open the store for writing once)'}",
        f"projections      core: schema {core['schemaVersion']}, folded to sequence {core['foldedSeq']}",
    ]
    for name, user in info["projections"].get("user", {}).items():
        state = f"version {user['version']}, folded to sequence {user['foldedSeq']}"
        if user["error"] is not None:
            state += f", stopped at sequence {user['failedSeq']}: {user['error']}"
        build = user.get("building")
        if build is not None:
            state += f"; building version {build['version']}, folded to sequence {build['foldedSeq']}"
            if build["error"] is not None:
                state += f", stopped at sequence {build['failedSeq']}: {build['error']}"
        lines.append(f"                 {name}: {state}")
    replication = info.get("replication")
    if replication is not None:
        lines.append(
            f"replication      stream {replication['stream']}: log sequence {replication['seq']} at stream message "
            f"{replication['streamSeq']}, writer epoch {replication['epoch']}"
        )
    if "shipping" in info:
        lines.append(f"shipping         STOPPED: {info['shipping']['reason']}")
    if "lease" in info:
        lease = info["lease"]
        lines.append(
            "writer lease     "
            + ("none (nobody writes the store now)" if lease is None else
               f"held by {lease['holder']}, epoch {lease['epoch']}, {lease['expires']}")
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
            name: userstate.report(served.get(name), builds.get(name), head, served[name].version if name in served else None, now)
            for name in sorted(set(served) | set(builds))
        }
    finally:
        env.close()
