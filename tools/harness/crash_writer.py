"""Subprocess roles for ``tools/harness/crash_harness.py`` (and ``tests/storage/test_reliability.py``): a writer
that is SIGKILLed at random moments, and a checker that opens the store afterwards in a fresh
process.

Usage::

    python -m tools.harness.crash_writer write STORE --seed N [--durability D] [--bump-schema] [--fold-chunk N] [--map-size B] [--pad N] [--agents N]
    python -m tools.harness.crash_writer check STORE --ledger IN.json --result OUT.json

``write`` opens ``LmdbStorage`` on STORE and commits mixed batches until it is killed: entries,
task replacements, document create / change (delta and base) / retire, and forks that copy
documents into the new conversation. Every id comes from ``await storage.mint_id()``. It derives
what exists (conversations, entries, tasks, live documents and their versions) from the log
itself, so any number of killed rounds can follow each other on one store. It prints, one line
each, flushed at once:

``opening``              right before ``LmdbStorage.open``
``progress F H``         a rebuild or catch-up folded F of H records (``--bump-schema`` adds 1
                         to ``projections.tables.SCHEMA_VERSION`` first, so open rebuilds)
``opened HEAD``          open returned
``ready``                the writer knows what exists and starts committing
``mint ID``              ``mint_id()`` returned ID (printed before the id is used)
``intent JSON``          the batch about to be committed (strict JSON, ``ensure_ascii``)
``ack SEQ``              ``await commit(intent)`` returned SEQ: the batch is acknowledged
``intent#K JSON``, ``ack#K SEQ``  the same from agent K of ``--agents N`` concurrent agents (group
                         commits): each agent keeps a world of its own (the conversations the
                         log holds, the tasks and documents it made), so agents never conflict
``grow OLD NEW``         the environment grew its map (``--map-size`` starts it tiny, ``--pad``
                         makes entries bigger)

``check`` is the fresh process that judges a round; see ``check()``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import random
import sys
import traceback
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

TEXTS = ["", "a", "héllo", "\ud800", "\ud83d\ude00", "日本", "x" * 60]
STATUSES = ["pending", "running", "waiting", "sleeping", "completing", "terminal"]


def canonical(writes: Any) -> str:
    """One comparable string for a batch: sorted keys, ASCII (lone surrogates escaped)."""

    return json.dumps(writes, sort_keys=True, ensure_ascii=True, separators=(",", ":"))


def digest(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ── the writer ────────────────────────────────────────────────────────────────


class World:
    """What the log says exists, kept up to date as batches are committed."""

    def __init__(self) -> None:
        self.conversations: list[int] = []
        self.entries: dict[int, list[int]] = {}
        self.tasks: dict[int, int] = {}  # task id -> conversation id
        self.documents: dict[int, dict[str, Any]] = {}  # live document id -> {record, version}

    def apply(self, writes: list[dict[str, Any]]) -> None:
        for write in writes:
            kind = write["type"]
            if kind == "conversation":
                self.conversations.append(write["value"]["id"])
            elif kind == "entry":
                value = write["value"]
                self.entries.setdefault(value["conversationId"], []).append(value["id"])
            elif kind == "task":
                self.tasks[write["value"]["id"]] = write["value"]["conversationId"]
            elif kind == "document.create":
                self.documents[write["record"]["id"]] = {
                    "record": write["record"],
                    "version": write["content"]["version"],
                }
            elif kind == "document.copy":
                source = self.documents[write["source"]["id"]]
                self.documents[write["record"]["id"]] = {
                    "record": write["record"],
                    "version": source["version"],
                }
            elif kind == "document.change":
                self.documents[write["id"]]["version"] = write["content"]["version"]
            elif kind == "document.retire":
                del self.documents[write["id"]]


class Writer:
    def __init__(self, storage: Any, world: World, rng: random.Random, pad: int = 0) -> None:
        self.pad = pad
        self.storage = storage
        self.world = world
        self.rng = rng

    async def mint(self) -> int:
        id = await self.storage.mint_id()
        _say(f"mint {id}")
        return id

    async def batch(self) -> list[dict[str, Any]]:
        world, rng = self.world, self.rng
        writes: list[dict[str, Any]] = []
        if not world.conversations:
            return [{"type": "conversation", "value": {"id": await self.mint()}}]
        touched: set[int] = set()  # documents already commanded in this batch
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(
                [
                    "entry",
                    "entry",
                    "entry",
                    "task",
                    "task",
                    "create",
                    "change",
                    "change",
                    "retire",
                    "fork",
                ]
            )
            write = await getattr(self, "_" + kind)(touched, writes)
            if write:
                writes.extend(write)
        if not writes:
            writes = await self._entry(touched, writes)
        return writes

    async def _entry(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        rng = self.rng
        conversation = rng.choice(self.world.conversations)
        value: dict[str, Any] = {
            "id": await self.mint(),
            "conversationId": conversation,
            "kind": rng.choice(["message", "tool", "\ud800"]),
            "data": {"text": rng.choice(TEXTS), "n": rng.choice([0, -7, 2**70 + 1, 1.5])},
        }
        if rng.random() < 0.2:
            value["head"] = value["id"]
        if self.pad:
            value["pad"] = "p" * rng.randint(self.pad // 2, self.pad)
        return [{"type": "entry", "value": value}]

    async def _task(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        rng, world = self.rng, self.world
        earlier = {w["value"]["id"] for w in writes if w["type"] == "task"}
        choices = [id for id in world.tasks if id not in earlier]
        if choices and rng.random() < 0.7:
            id = rng.choice(choices)  # a replacement of an existing task
            conversation = world.tasks[id]
        else:
            id = await self.mint()
            conversation = rng.choice(world.conversations)
        return [
            {
                "type": "task",
                "value": {
                    "id": id,
                    "conversationId": conversation,
                    "kind": rng.choice(["agent", "tool"]),
                    "version": 1,
                    "input": {"prompt": rng.choice(TEXTS)},
                    "state": {"status": rng.choice(STATUSES), "step": rng.randint(0, 99)},
                    "background": rng.random() < 0.5,
                    "abortRequested": rng.random() < 0.1,
                },
            }
        ]

    async def _create(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        rng = self.rng
        id = await self.mint()
        touched.add(id)
        record = {
            "id": id,
            "kind": rng.choice(["notes", "plan"]),
            "scope": {
                "kind": "conversation",
                "conversationId": rng.choice(self.world.conversations),
            },
            "key": f"k{id}",
            "history": rng.choice(["rewindable", "latest"]),
            "fork": "current",
        }
        value = {"text": rng.choice(TEXTS), "items": [1, 2, 3]}
        return [
            {
                "type": "document.create",
                "record": record,
                "content": {"kind": "base", "version": 1, "value": value},
            }
        ]

    def _live(self, touched: set[int]) -> list[int]:
        return [id for id in self.world.documents if id not in touched]

    async def _change(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        live = self._live(touched)
        if not live:
            return await self._create(touched, writes)
        rng = self.rng
        id = rng.choice(live)
        touched.add(id)
        version = self.world.documents[id]["version"]
        if rng.random() < 0.25:
            content = {
                "kind": "base",
                "version": version + rng.choice([0, 1]),
                "value": {"text": "reset", "items": []},
            }
        else:
            ops = [
                rng.choice(
                    [["a", ["text"], rng.choice(TEXTS[1:])], ["s", ["n"], rng.randint(0, 9)]]
                )
            ]
            content = {"kind": "delta", "version": version, "ops": ops}
        return [{"type": "document.change", "id": id, "content": content}]

    async def _retire(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        live = self._live(touched)
        if len(live) < 4:  # keep a few documents around to change and copy
            return await self._change(touched, writes)
        id = self.rng.choice(live)
        touched.add(id)
        return [{"type": "document.retire", "id": id}]

    async def _fork(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        """A fork of a conversation, with copies of up to two of its live documents."""

        rng, world = self.rng, self.world
        parent = rng.choice(world.conversations)
        entries = world.entries.get(parent) or [1]
        fork = await self.mint()
        out: list[dict[str, Any]] = [
            {
                "type": "conversation",
                "value": {
                    "id": fork,
                    "parent": {"conversationId": parent, "at": rng.choice(entries)},
                },
            }
        ]
        sources = [
            id
            for id in self._live(touched)
            if world.documents[id]["record"]["scope"]["conversationId"] == parent
        ]
        for source in rng.sample(sources, min(len(sources), rng.randint(0, 2))):
            touched.add(source)
            record = dict(world.documents[source]["record"])
            record["id"] = await self.mint()
            record["scope"] = {"kind": "conversation", "conversationId": fork}
            touched.add(record["id"])
            out.append(
                {
                    "type": "document.copy",
                    "record": record,
                    "source": {"id": source, "at": "current"},
                }
            )
        return out


WORLD_WINDOW = 2000
"""Records the writer replays to learn what exists: the recent past is enough to write valid
batches, and a window keeps a round's start-up short however long the log has grown."""


def world_from_log(storage: Any) -> World:
    """What the last ``WORLD_WINDOW`` records created and left alive (documents created earlier
    are left alone: unknown to this writer, they are never changed by it)."""

    from pi_durable_lmdb.log import write_to_builtins

    world = World()
    for commit in storage.log.read(max(1, storage.log.head() - WORLD_WINDOW + 1)):
        writes = [write_to_builtins(write) for write in commit.writes]
        known = [
            write
            for write in writes
            if write["type"] not in ("document.change", "document.retire")
            or write["id"] in world.documents
        ]
        world.apply(
            [
                w
                for w in known
                if w["type"] != "document.copy" or w["source"]["id"] in world.documents
            ]
        )
    return world


async def write(args: argparse.Namespace) -> int:
    from pi_durable_lmdb.log import environment
    from pi_durable_lmdb.projections import rebuild, tables
    from pi_durable_lmdb.storage import LmdbStorage

    if args.bump_schema:
        tables.SCHEMA_VERSION = tables.SCHEMA_VERSION + 1  # type: ignore[misc]  # open rebuilds
    if args.fold_chunk is not None:
        rebuild.FOLD_CHUNK = args.fold_chunk  # type: ignore[misc]
    grow = environment.Environment.grow

    def announced_grow(self: Any, *args: Any) -> None:
        before = self.env.info()["map_size"]
        _say(f"grow {before} {before * 2}")
        grow(self, *args)

    environment.Environment.grow = announced_grow  # type: ignore[method-assign]
    rng = random.Random(args.seed)
    _say("opening")
    storage = await LmdbStorage.open(
        args.store,
        durability=args.durability,
        map_size=args.map_size,
        progress=lambda folded, head: _say(f"progress {folded} {head}"),
    )
    _say(f"opened {storage.log.head()}")
    world = world_from_log(storage)
    if args.agents:
        worlds = [World() for _ in range(args.agents)]
        for own in worlds:
            own.conversations = list(world.conversations)
            own.entries = {id: list(entries) for id, entries in world.entries.items()}
        writers = [Writer(storage, own, random.Random(rng.random()), args.pad) for own in worlds]
    else:
        writers = [Writer(storage, world, rng, args.pad)]
    _say("ready")

    async def agent(tag: str, writer: Writer) -> None:
        count = 0
        while args.count is None or count < args.count:
            writes = await writer.batch()
            _say(f"intent{tag} " + canonical(writes))
            seq = await storage.commit(writes, CTX)
            _say(f"ack{tag} {seq}")
            writer.world.apply(writes)
            count += 1

    tags = [f"#{k}" for k in range(len(writers))] if args.agents else [""]
    await asyncio.gather(*(agent(tag, writer) for tag, writer in zip(tags, writers)))
    await storage.close()
    _say("closed")
    return 0


# ── the checker ───────────────────────────────────────────────────────────────


def _has_header(store: str, acked: dict[int, str]) -> bool:
    """Whether the store has its header; a store without one must have acknowledged nothing."""

    from pi_durable_lmdb.errors import StoreFormatError
    from pi_durable_lmdb.log import Environment

    try:
        Environment(store, readonly=True).close()
    except StoreFormatError:
        if acked:
            raise
        return False
    return True


async def check(args: argparse.Namespace) -> int:
    """Judge the store after a killed round; write a JSON result (``problems`` empty when sound).

    The ledger holds what earlier checks established (``digests``: every sequence up to
    ``checked_head`` and a digest of its stored record bytes), what the killed writer
    acknowledged since (``acked``: sequence -> canonical batch), the batch it was committing when
    killed (``pending``: it may or may not be in the log, but whole if it is) and the highest id
    any process was handed by ``mint_id`` (``minted_max``).
    """

    from pi_durable_lmdb.audit import verify
    from pi_durable_lmdb.log import Environment, write_to_builtins
    from pi_durable_lmdb.projections.rebuild import ProjectionsBehind, read_header
    from pi_durable_lmdb.storage import LmdbStorage

    with open(args.ledger, encoding="utf-8") as file:
        ledger = json.load(file)
    digests: dict[int, str] = {int(seq): value for seq, value in ledger["digests"].items()}
    acked: dict[int, str] = {int(seq): value for seq, value in ledger["acked"].items()}
    pending: list[str] = list(ledger["pending"])
    checked_head: int = ledger["checked_head"]
    minted_max: int = ledger["minted_max"]
    problems: list[str] = []
    result: dict[str, Any] = {"problems": problems}

    # 1. The store as the kill left it, before any writer touches it (a first open killed
    # between making data.mdb and writing the header leaves no store yet: nothing was acked).
    if os.path.exists(os.path.join(args.store, "data.mdb")) and _has_header(args.store, acked):
        env = Environment(args.store, readonly=True)
        try:
            header = read_header(env)
            result["building"] = None if header is None else header.building
            result["schema_before"] = None if header is None else header.schema_version
        finally:
            env.close()
        try:
            difference = verify(args.store)
            result["verify_before"] = None if difference is None else str(difference)
        except ProjectionsBehind as error:  # a completed rebuild into another schema
            result["verify_before"] = f"skipped: {error}"
    else:
        result["building"] = None
        result["verify_before"] = "skipped: no store yet"

    # 2. Open for writing (rebuilding or catching up as needed) and compare the log.
    rebuilt: list[int] = []
    storage = await LmdbStorage.open(
        args.store, progress=lambda folded, head: rebuilt.append(folded)
    )
    try:
        result["rebuild_progress_calls"] = len(rebuilt)
        head = storage.log.head()
        result["head"] = head
        seen: dict[int, str] = {}
        next_seq = 1
        while True:
            rows = storage.log.raw_chunk(next_seq, head)
            if not rows:
                break
            for seq, raw in rows:
                seen[seq] = digest(raw)
            next_seq = rows[-1][0] + 1
        if len(seen) != head or sorted(seen) != list(
            range(1, head + 1)
        ):  # a damaged head may be ~2**63
            gaps = list(
                itertools.islice((seq for seq in range(1, head + 1) if seq not in seen), 10)
            )
            problems.append(f"log sequences are not 1..{head}: missing {gaps}")
        for seq, expected in digests.items():
            if seq not in seen:
                problems.append(f"LOST: sequence {seq}, present at an earlier check, is gone")
            elif seen[seq] != expected:
                problems.append(f"CHANGED: the stored record {seq} differs from an earlier check")
        for seq in acked:
            if seq not in seen:
                problems.append(
                    f"LOST: acknowledged sequence {seq} is not in the log (head {head})"
                )
        adopted: dict[int, str] = {}
        matched: dict[int, str] = {}
        for seq in range(checked_head + 1, head + 1):
            commit = storage.log.get(seq)  # verifies the checksum
            if commit is None:
                continue
            found = canonical([write_to_builtins(write) for write in commit.writes])
            if seq in acked:
                if found != acked[seq]:
                    problems.append(
                        f"PARTIAL/WRONG: sequence {seq} holds {found[:200]}, the writer committed {acked[seq][:200]}"
                    )
                else:
                    matched[seq] = found
            elif found in pending:
                pending.remove(found)  # committed, killed before it could say so: whole, kept
                adopted[seq] = matched[seq] = found
            else:
                problems.append(
                    f"UNEXPECTED: sequence {seq} holds a batch nobody committed: {found[:200]}"
                )
        result["adopted"] = {str(seq): value for seq, value in adopted.items()}
        # Reads through the Storage API agree: each new entry is served with its commit sequence.
        entries_checked = 0
        for seq, batch in matched.items():
            for write in json.loads(batch):
                if write["type"] != "entry":
                    continue
                got = await storage.entry(write["value"]["id"])
                entries_checked += 1
                if (
                    got is None
                    or got["commitSeq"] != seq
                    or canonical(got["entry"]) != canonical(write["value"])
                ):
                    problems.append(
                        f"READ: entry {write['value']['id']} of sequence {seq} reads back as {str(got)[:200]}"
                    )
        result["entries_checked"] = entries_checked

        # 3. Ids: a fresh mint is above every stored id and every id handed out before.
        with storage._env.read() as txn:
            stored_max = storage._model.max_record_id(txn)
        minted = await storage.mint_id()
        result["minted"] = minted
        if minted <= max(minted_max, stored_max):
            problems.append(
                f"MINT: mint_id() returned {minted}, not above minted {minted_max} / stored {stored_max}"
            )

        # 4. New commits get larger sequences.
        last_minted = await storage.mint_id()
        batch = [
            {"type": "conversation", "value": {"id": minted}},
            {
                "type": "entry",
                "value": {"id": last_minted, "conversationId": minted, "kind": "check"},
            },
        ]
        seq = await storage.commit(batch, CTX)
        if seq != head + 1:
            problems.append(f"SEQUENCE: a new commit got {seq} after head {head}")
        result["check_seq"] = seq
        result["check_batch"] = canonical(batch)
        result["minted_after"] = last_minted
        raw = storage.log.raw_chunk(seq, seq)[0][1]
        result["digests"] = {str(s): d for s, d in seen.items() if s > checked_head}
        result["digests"][str(seq)] = digest(raw)
    finally:
        await storage.close()

    # 5. The projections match a fresh fold of the log.
    difference = verify(args.store)
    result["verify_after"] = None if difference is None else str(difference)
    if difference is not None:
        problems.append(f"VERIFY: {difference}")
    with open(args.result, "w", encoding="utf-8") as file:
        json.dump(result, file)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["write", "check"])
    parser.add_argument("store")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--durability", default="power", choices=["power", "process"])
    parser.add_argument(
        "--bump-schema",
        action="store_true",
        help="add 1 to projections.tables.SCHEMA_VERSION before opening",
    )
    parser.add_argument(
        "--fold-chunk",
        type=int,
        help="records per rebuild transaction (projections.rebuild.FOLD_CHUNK)",
    )
    parser.add_argument("--map-size", type=int, default=1 << 30)
    parser.add_argument("--pad", type=int, default=0, help="bytes of padding text in each entry")
    parser.add_argument(
        "--count",
        type=int,
        help="commit this many batches (per agent), then close (default: until killed)",
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=0,
        help="commit from this many concurrent agents (group commits)",
    )
    parser.add_argument("--ledger")
    parser.add_argument("--result")
    args = parser.parse_args()
    try:
        return asyncio.run(write(args) if args.role == "write" else check(args))
    except Exception:
        _say("error " + json.dumps(traceback.format_exc()))
        return 1


if __name__ == "__main__":
    sys.exit(main())
