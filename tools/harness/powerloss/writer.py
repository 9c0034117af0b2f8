"""The writer whose file operations are recorded: a real process committing through ``LmdbStorage``.

Usage (run by ``record.py`` under the recorder)::

    python -m tools.harness.powerloss.writer STORE MARKS --durability power|process --seed N --batches N [--workload group]

It creates STORE with a 64 KiB map (so the map grows several times under it) and a user projection,
and commits mixed batches (conversations, entries, task replacements, documents created, changed
and retired, forks copying documents), every id from ``mint_id()`` (with small id blocks, so the
reservation is written often; in ``power`` durability entries carry up to 1.5 KB of random
letters, which do not compress away, so journal segments fill between checkpoints). Halfway it rebuilds the projections (``storage.rebuild()``, folded
in small chunks, so the swap happens after several transactions), and it closes and reopens the
store every few batches. Each step is announced by one write to MARKS, a file outside the store that the
recorder logs in order with the store's writes:

``intent JSON``  the batch about to be committed
``ack SEQ``      ``commit`` returned SEQ for the last intent (written after it returned)
``mint ID``      ``mint_id()`` returned ID
``phase TEXT``   open, opened (the store exists: its first open returned), rebuild, reopen,
                 close, closed

``--workload longdocs`` commits ``longdocs.LongDocs`` batches instead (documents many chunks
long: agent turns, every other op, bases, copies from past points) the same way.

``--workload group`` commits from several callers at once (tasks on two event loops, in two
threads) so that group commit puts several callers' batches in one transaction and one sync, and
cancels some callers while they wait (``task.cancel()``, ``asyncio.wait_for`` timing out). Its
marks carry the caller's tag: ``intent@TAG JSON``, ``ack@TAG SEQ``, ``cancel@TAG`` (a cancelled
caller's batch may or may not be in the log, whole; never in part).

``--workload erase`` is the single caller's workload with an erasure two thirds in: the store
reopened without the user projection, one conversation erased with its forks
(``erase_conversation``), then reopened with it. Its marks: ``erase-intent JSON`` (the erasure
record's sequence and, by record, the positions of the writes that go, as ``plan_erasure``
reads the log before) and ``erased SEQ`` once it returned.

``--workload trim`` is the single caller's workload, without the user projection (a trim is
refused beside one), with the log trimmed to its head two thirds in and again before the last
batch (``LmdbStorage.trim``; the point rounded down to a whole tile of the log's tree, so the
second trim moves it on once the log holds two tiles more). Its marks: ``trim-intent JSON`` (the
sequence asked and the point the trim reaches) and ``trimmed POINT`` once it returned.

``--workload documents`` is the single caller's workload with documents grown like transcripts
(a few kilobytes and a counter per change): long values kept as head rows, snapshots,
and the map growing under them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import string
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.harness.powerloss.workload import EntryCounts, canonical, engine_tools

TEXTS = ["", "a", "héllo", "\ud800", "日本", "x" * 300]
_NOISE = string.ascii_letters + string.digits


class Marks:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def say(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())


class Workload:
    KINDS = ["entry", "entry", "entry", "task", "create", "change", "retire", "fork"]

    def __init__(
        self,
        storage: Any,
        marks: Marks,
        rng: random.Random,
        kinds: list[str] | None = None,
        *,
        noise: bool = False,
        long: bool = False,
    ) -> None:
        self.storage = storage
        self.long = long
        """Documents' changes append a few kilobytes and set a counter (a transcript):
        values pass a chunk within a few changes and are kept as head rows."""
        self.marks = marks
        self.rng = rng
        self.kinds = kinds or self.KINDS
        self.noise = noise
        self.conversations: list[int] = []
        self.entries: dict[int, list[int]] = {}
        self.tasks: dict[int, int] = {}
        self.documents: dict[int, dict[str, Any]] = {}  # live id -> {record, version}

    async def mint(self) -> int:
        id = await self.storage.mint_id()
        self.marks.say(f"mint {id}")
        return id

    async def commit(self, writes: list[dict[str, Any]]) -> int:
        self.marks.say("intent " + canonical(writes))
        seq = await self.storage.commit(writes, CTX)
        self.marks.say(f"ack {seq}")
        self.apply(writes)
        return seq

    def apply(self, writes: list[dict[str, Any]]) -> None:
        for write in writes:
            kind = write["type"]
            if kind == "conversation":
                self.conversations.append(write["value"]["id"])
            elif kind == "entry":
                self.entries.setdefault(write["value"]["conversationId"], []).append(
                    write["value"]["id"]
                )
            elif kind == "task":
                self.tasks[write["value"]["id"]] = write["value"]["conversationId"]
            elif kind in ("document.create", "document.copy"):
                version = (
                    write["content"]["version"]
                    if kind == "document.create"
                    else self.documents[write["source"]["id"]]["version"]
                )
                self.documents[write["record"]["id"]] = {
                    "record": write["record"],
                    "version": version,
                }
            elif kind == "document.change":
                self.documents[write["id"]]["version"] = write["content"]["version"]
            elif kind == "document.retire":
                del self.documents[write["id"]]

    async def batch(self) -> list[dict[str, Any]]:
        rng = self.rng
        if not self.conversations or rng.random() < 0.05:
            return [{"type": "conversation", "value": {"id": await self.mint()}}]
        writes: list[dict[str, Any]] = []
        touched: set[int] = set()
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(self.kinds)
            writes.extend(await getattr(self, "_" + kind)(touched, writes))
        return writes

    def pad(self, size: int) -> str:
        """``size`` characters: random letters with ``noise`` (the log stores records compressed: a
        power writer's journal must still fill its segments), else one letter repeated."""

        if self.noise:
            return "".join(self.rng.choices(_NOISE, k=size))
        return "p" * size

    async def _entry(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        rng = self.rng
        value = {
            "id": await self.mint(),
            "conversationId": rng.choice(self.conversations),
            "kind": rng.choice(["message", "tool"]),
            "data": {
                "text": rng.choice(TEXTS),
                "n": rng.choice([0, -7, 2**70 + 1, 1.5]),
                "pad": self.pad(rng.randint(0, 1500)),
            },
        }
        return [{"type": "entry", "value": value}]

    async def _task(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        rng = self.rng
        earlier = {w["value"]["id"] for w in writes if w["type"] == "task"}
        choices = [id for id in self.tasks if id not in earlier]
        if choices and rng.random() < 0.6:
            id = rng.choice(choices)
            conversation = self.tasks[id]
        else:
            id, conversation = await self.mint(), rng.choice(self.conversations)
        state = {
            "status": rng.choice(["pending", "running", "terminal"]),
            "step": rng.randint(0, 99),
        }
        return [
            {
                "type": "task",
                "value": {
                    "id": id,
                    "conversationId": conversation,
                    "kind": "agent",
                    "version": 1,
                    "input": {"prompt": rng.choice(TEXTS)},
                    "state": state,
                    "background": False,
                    "abortRequested": False,
                },
            }
        ]

    async def _create(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        id = await self.mint()
        touched.add(id)
        record = {
            "id": id,
            "kind": "notes",
            "scope": {
                "kind": "conversation",
                "conversationId": self.rng.choice(self.conversations),
            },
            "key": f"k{id}",
            "history": self.rng.choice(["rewindable", "latest"]),
            "fork": "current",
        }
        return [
            {
                "type": "document.create",
                "record": record,
                "content": {"kind": "base", "version": 1, "value": {"text": "v", "items": [1]}},
            }
        ]

    async def _change(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        live = [id for id in self.documents if id not in touched]
        if not live:
            return await self._create(touched, writes)
        id = self.rng.choice(live)
        touched.add(id)
        version = self.documents[id]["version"]
        ops: list[Any] = [["a", ["text"], self.rng.choice(TEXTS[1:])]]
        if self.long:
            ops = [
                ["a", ["text"], self.pad(self.rng.randint(1500, 4000))],
                ["s", ["n"], len(writes)],
            ]
        content = {"kind": "delta", "version": version, "ops": ops}
        return [{"type": "document.change", "id": id, "content": content}]

    async def _retire(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        live = [id for id in self.documents if id not in touched]
        if len(live) < 3:
            return await self._change(touched, writes)
        id = self.rng.choice(live)
        touched.add(id)
        return [{"type": "document.retire", "id": id}]

    async def _fork(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        parent = self.rng.choice(self.conversations)
        fork = await self.mint()
        out: list[dict[str, Any]] = [
            {
                "type": "conversation",
                "value": {
                    "id": fork,
                    "parent": {
                        "conversationId": parent,
                        "at": self.rng.choice(self.entries.get(parent) or [1]),
                    },
                },
            }
        ]
        sources = [
            id
            for id in self.documents
            if id not in touched
            and self.documents[id]["record"]["scope"]["conversationId"] == parent
        ]
        for source in sources[:1]:
            touched.add(source)
            record = dict(self.documents[source]["record"])
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


def journal_options(args: argparse.Namespace) -> dict[str, Any]:
    """A power writer's journal, small so the recording holds segment changes, recycled segments
    and checkpoints (on their own thread, as by default) every few commits: the smallest segment
    (4 KiB of frames) fills in a few commits of the workload's incompressible entries, before
    the store is reopened, and between checkpoints (``recycle-early`` needs that to bite). Once
    ``data.mdb`` passes 384 KiB, late in a recording, new segments are 16 KiB and the free 8 KiB
    ones are deleted; the commit bound between checkpoints adapts to the free pages (a small
    ``pinned_pages``: 1 to 4 commits).
    ``--fault`` plants one of ``log.journal._faults`` in this process."""

    if args.durability != "power":
        return {}
    from pi_durable_lmdb.log import journal

    for fault in set(args.fault) - {"split-trim"}:  # the trim's own, not the journal's
        journal._faults.add(fault)
    journal.SEGMENT_SHARE = 24  # so the journal's segments grow late in a recording (see above)
    return {
        "journal": journal.JournalOptions(
            segment_min=2 * journal.HEADER_SIZE,
            segment_size=4 * journal.HEADER_SIZE,
            checkpoint_commits=4,
            checkpoint_bytes=16384,
            pinned_pages=8,
        )
    }


async def run(args: argparse.Namespace) -> None:
    from pi_durable_lmdb.projections import rebuild
    from pi_durable_lmdb.storage import LmdbStorage, lmdb_storage

    lmdb_storage.ID_BLOCK = 16  # type: ignore[misc]  # reservations written often
    rebuild.FOLD_CHUNK = 8  # type: ignore[misc]  # a rebuild spans several transactions
    marks = Marks(args.marks)
    rng = random.Random(args.seed)

    trim = args.workload == "trim"

    async def open_store() -> Any:
        return await LmdbStorage.open(
            args.store,
            durability=args.durability,
            map_size=64 * 1024,
            projections=[] if trim else [EntryCounts()],
            **journal_options(args),
        )

    marks.say("phase open")
    storage = await open_store()
    marks.say("phase opened")
    long = args.workload == "documents"
    kinds = ["entry", "task", "create", "retire", "fork", *["change"] * 8] if long else None
    if args.workload == "longdocs":
        from tools.harness.powerloss.longdocs import LongDocs

        work: Workload = LongDocs(storage, marks, rng, noise=args.durability == "power")
    else:
        work = Workload(storage, marks, rng, kinds, noise=args.durability == "power", long=long)
    for number in range(args.batches):
        if number == args.batches // 3:
            marks.say("phase rebuild")
            await storage.rebuild()
        if number and number % args.reopen_every == 0:
            marks.say("phase reopen")
            await storage.close()
            storage = await open_store()
            work.storage = storage
        if args.workload == "erase" and number == 2 * args.batches // 3:
            marks.say("phase erase")
            await storage.close()
            plain = await LmdbStorage.open(
                args.store, durability=args.durability, map_size=64 * 1024, **journal_options(args)
            )
            await erase_one(plain, work, marks)
            await plain.close()
            storage = await open_store()
            work.storage = storage
        if trim and number in (2 * args.batches // 3, args.batches - 1):
            marks.say("phase trim")
            await trim_to_head(storage, marks, "split-trim" in args.fault)
        await work.commit(await work.batch())
        if number % 7 == 0:
            await asyncio.sleep(0)  # let the user projection fold behind the commits
    await storage.projections.wait(storage.log.head())
    marks.say("phase close")
    await storage.close()
    marks.say("phase closed")


async def erase_one(storage: Any, work: Workload, marks: Marks) -> None:
    """Erase one of the workload's conversations, with its forks (the first the erasure takes),
    and forget what went from the workload's model."""

    import json

    from pi_durable.errors import StorageRequestError
    from pi_durable_lmdb.log.records import decode_record_builtins
    from pi_durable_lmdb.storage.erase import plan_erasure

    for conversation in work.rng.sample(work.conversations, len(work.conversations)):
        try:
            plan = plan_erasure(
                lambda: storage.log.read(decode=decode_record_builtins), conversation, True
            )
        except (ValueError, StorageRequestError):
            continue
        seq = storage.log.head() + 1
        erased = {str(number): positions for number, positions in plan.erased.items()}
        marks.say("erase-intent " + json.dumps({"seq": seq, "erased": erased}))
        report = await storage.erase_conversation(
            conversation, reason="power cut test", with_forks=True
        )
        assert report.seq == seq, (report, seq)
        marks.say(f"erased {seq}")
        gone = set(plan.conversations)
        work.conversations = [c for c in work.conversations if c not in gone]
        work.entries = {c: ids for c, ids in work.entries.items() if c not in gone}
        work.tasks = {id: c for id, c in work.tasks.items() if c not in gone}
        work.documents = {
            id: doc
            for id, doc in work.documents.items()
            if doc["record"]["scope"]["conversationId"] not in gone
        }
        return
    raise AssertionError("no conversation of the workload could be erased")


async def trim_to_head(storage: Any, marks: Marks, split: bool = False) -> None:
    """Trim the log to its head: the records before the last whole tile of the log's tree
    (``TILE`` records) the head is past leave the store, folded into its base. Marks the point
    the trim reaches when it moves the point on.

    ``split`` plants a fault: the base is written in the trim's transaction and the records
    before the point are dropped in a later one, so some crash states hold both (the explorer
    must then fail)."""

    import json

    from pi_durable_lmdb.log.tree import TILE

    head = storage.log.head()
    point = (head - 1) // TILE * TILE + 1
    if point <= max(storage.log.trimmed_before(), 1):
        return
    marks.say("trim-intent " + json.dumps({"before": head, "point": point}))
    if split:
        log = storage.log
        drop_before = log.drop_before
        log.drop_before = lambda txn, point: 0  # type: ignore[method-assign]
    try:
        report = await storage.trim(head)
    finally:
        if split:
            log.drop_before = drop_before  # type: ignore[method-assign]
            storage._env.write(lambda txn: drop_before(txn, point))
    assert report.point == point, (report, point)
    marks.say(f"trimmed {point}")


GROUP_KINDS = ["entry", "entry", "entry", "newtask", "fork"]
"""Batches that stay valid in any order (documents' versions would make concurrent changes clash)."""


class GroupCaller(Workload):
    """One concurrent caller's batches; conversations referenced only once acknowledged."""

    def __init__(
        self, storage: Any, marks: Marks, rng: random.Random, tag: str, *, noise: bool = False
    ) -> None:
        super().__init__(storage, marks, rng, GROUP_KINDS, noise=noise)
        self.tag = tag
        self.number = 0

    async def _newtask(self, touched: set[int], writes: list[Any]) -> list[dict[str, Any]]:
        state = {"status": "pending", "step": self.rng.randint(0, 99)}
        return [
            {
                "type": "task",
                "value": {
                    "id": await self.mint(),
                    "conversationId": self.rng.choice(self.conversations),
                    "kind": "agent",
                    "version": 1,
                    "input": {"prompt": self.rng.choice(TEXTS)},
                    "state": state,
                    "background": False,
                    "abortRequested": False,
                },
            }
        ]

    async def step(self) -> None:
        """Commit one batch: plainly, under a short ``wait_for``, or in a task cancelled after a
        few turns of the loop (the caller may be cancelled while its batch waits for its group)."""

        writes = await self.batch()
        tag = f"{self.tag}.{self.number}"
        self.number += 1
        self.marks.say(f"intent@{tag} " + canonical(writes))
        how = self.rng.random()
        try:
            if how < 0.7:
                seq = await self.storage.commit(writes, CTX)
            elif how < 0.85:
                seq = await asyncio.wait_for(
                    self.storage.commit(writes, CTX), self.rng.choice([0, 0.0002, 0.001, 0.003])
                )
            else:
                task = asyncio.ensure_future(self.storage.commit(writes, CTX))
                for _ in range(self.rng.randint(0, 3)):
                    await asyncio.sleep(0)
                task.cancel()
                seq = await task
        except (TimeoutError, asyncio.CancelledError):
            self.marks.say(f"cancel@{tag}")
            return
        self.marks.say(f"ack@{tag} {seq}")
        self.apply(writes)


async def _callers(
    storage: Any, marks: Marks, seed: str, loop_tag: str, count: int, steps: int, noise: bool
) -> None:
    callers = [
        GroupCaller(
            storage, marks, random.Random(f"{seed}:{loop_tag}:{n}"), f"{loop_tag}{n}", noise=noise
        )
        for n in range(count)
    ]

    async def run(caller: GroupCaller) -> None:
        for _ in range(steps):
            await caller.step()

    await asyncio.gather(*(run(caller) for caller in callers))


async def run_group(args: argparse.Namespace) -> None:
    """Rounds of concurrent callers on one store: three tasks on this loop and three on a second
    loop in another thread; a rebuild runs beside the callers in the second round; the store is
    closed and reopened between rounds."""

    import threading

    from pi_durable_lmdb.projections import rebuild
    from pi_durable_lmdb.storage import LmdbStorage, lmdb_storage

    lmdb_storage.ID_BLOCK = 16  # type: ignore[misc]
    rebuild.FOLD_CHUNK = 8  # type: ignore[misc]
    marks = Marks(args.marks)

    async def open_store() -> Any:
        return await LmdbStorage.open(
            args.store,
            durability=args.durability,
            map_size=64 * 1024,
            projections=[EntryCounts()],
            **journal_options(args),
        )

    marks.say("phase open")
    storage = await open_store()
    marks.say("phase opened")
    noise = args.durability == "power"
    steps = 3
    rounds = max(1, args.batches // (6 * steps))
    for number in range(rounds):
        if number:
            marks.say("phase reopen")
            await storage.close()
            storage = await open_store()
        failure: list[BaseException] = []

        def other_thread(storage: Any = storage, number: int = number) -> None:
            try:
                asyncio.run(
                    _callers(
                        storage, marks, f"{args.seed}:{number}", f"r{number}b", 3, steps, noise
                    )
                )
            except BaseException as error:
                failure.append(error)

        thread = threading.Thread(target=other_thread)
        thread.start()
        work = [_callers(storage, marks, f"{args.seed}:{number}", f"r{number}a", 3, steps, noise)]
        if number == 1:
            marks.say("phase rebuild")
            work.append(storage.rebuild())
        await asyncio.gather(*work)
        await asyncio.to_thread(thread.join)
        if failure:
            raise failure[0]
    await storage.projections.wait(storage.log.head())
    marks.say("phase close")
    await storage.close()
    marks.say("phase closed")


COMMANDS = ("import", "restore", "backup", "backup-plain")


def export_digest(path: str) -> str:
    """What a store's log holds, commit times included: the digest of its export."""

    import hashlib

    _, export_lines, _ = engine_tools()
    digest = hashlib.blake2b(digest_size=16)
    for line in export_lines(path):
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


def run_command(args: argparse.Namespace) -> None:
    """Record one ``durable-log`` command building ``STORE/new`` from a source made outside STORE."""

    import shutil

    from pi_durable_lmdb.storage import LmdbStorage

    _, export_lines, durable_log = engine_tools()

    root = os.path.abspath(args.store)
    outside = root + "-outside"
    shutil.rmtree(outside, ignore_errors=True)
    os.makedirs(outside)
    os.makedirs(root, exist_ok=True)
    marks = Marks(args.marks)
    source = os.path.join(outside, "source")
    server = None
    try:
        options: dict[str, Any] = {}
        if args.workload == "restore":
            from tools.harness.powerloss.jetstream_server import JetStreamServer

            server = JetStreamServer(os.path.join(outside, "nats"))
            options = {"durability": "replicated", "nats": server.url, "stream": "POWERLOSS"}

        async def make_source() -> str:
            storage = await LmdbStorage.open(source, **options)
            try:
                work = Workload(storage, Marks(os.devnull), random.Random(args.seed))
                for _ in range(args.batches):
                    await work.commit(await work.batch())
                return str(storage.store_id)
            finally:
                await storage.close()

        store_id = asyncio.run(make_source())
        target = os.path.join(root, "new")
        if args.workload == "import":
            export = os.path.join(outside, "export.jsonl")
            with open(export, "w", encoding="utf-8") as file:
                for line in export_lines(source):
                    file.write(line + "\n")
            argv = ["import", export, target]
        elif args.workload == "restore":
            assert server is not None
            argv = [
                "restore",
                "--nats",
                server.url,
                "--stream",
                "POWERLOSS",
                "--store",
                store_id,
                target,
            ]
        else:
            argv = ["backup", source, target] + (["--compact"] if args.workload == "backup" else [])
        head = len(list(export_lines(source)))
        kept_id = "-" if args.workload == "import" else store_id  # an import makes a new store id
        marks.say(f"expect {export_digest(source)} {head} {kept_id}")
        marks.say("phase command")
        code = durable_log(argv)
        marks.say(f"done {code}")
        if code != 0:
            raise SystemExit(f"durable-log {' '.join(argv)} exited {code}")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(outside, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("marks")
    parser.add_argument("--durability", choices=["power", "process"], default="power")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument(
        "--reopen-every", type=int, default=8, help="close and reopen the store every N batches"
    )
    parser.add_argument(
        "--workload",
        choices=["single", "group", "documents", "longdocs", "erase", "trim", *COMMANDS],
        default="single",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        choices=["skip-journal-flush", "skip-pin", "recycle-early", "split-trim"],
        help="a planted fault of the power journal, or a trim made in two transactions "
        "(split-trim); the explorer must then fail",
    )
    args = parser.parse_args()
    if args.workload in COMMANDS:
        run_command(args)
    else:
        asyncio.run(run_group(args) if args.workload == "group" else run(args))


if __name__ == "__main__":
    main()
