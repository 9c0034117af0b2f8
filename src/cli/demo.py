"""``durable-log demo``: a small agent host on an embedded store, then a look at what it wrote.

The workload runs through a real pi-durable ``Session`` on a store opened the way the README shows
(``open_lmdb_storage`` with the default ``power`` durability), exactly as a host would use it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import msgspec

from ..audit.stats import format_stats, refuse_foreign_files, stats
from ..audit.tail import Tail, summarize
from ..storage.lmdb_storage import LmdbStorage
from .common import add_command

QUESTIONS = [
    "What does the durable log store?",
    "How are projections rebuilt?",
    "Can an auditor follow the log live?",
    "What happens when a writer is killed?",
    "How fast is a commit?",
    "How do I read the store as it was?",
]


def _definitions() -> tuple[Any, Any, Any]:
    from pi_durable import define_doc
    from pi_durable.tasks import define_task

    notes = define_doc(
        kind="notes",
        version=1,
        scope="conversation",
        history="rewindable",
        fork="asOf",
        initial=lambda: {"answers": [], "summary": ""},
        checkpoint_when=lambda value, ops, info: False,
    )
    settings = define_doc(
        kind="settings",
        version=1,
        scope="session",
        initial=lambda: {"model": "demo-1", "turns": 0},
        checkpoint_when=lambda value, ops, info: False,
    )

    async def run(task: Any, runtime: Any, context: Any) -> None:
        """The demo settles tasks itself; a Harness would run this phase."""

    answer = define_task(
        name="answer",
        version=1,
        initial=lambda input: {"phase": "run"},
        phases={"run": run},
        abort=lambda *a: None,
    )
    return notes, settings, answer


class DemoRun(msgspec.Struct, frozen=True):
    """What one run of the demo's workload wrote and read back: the root and fork conversation
    ids, the commits it made and the seconds they took, the answers the root's notes, the fork's
    copy and the notes three commits in hold, the entries the fork sees, the log's head, the
    notes document's id and the sequence of that first turn."""

    root: int
    fork: int
    commits: int
    elapsed: float
    root_answers: int
    fork_answers: int
    fork_entries: int
    past_answers: int | None
    head: int
    notes: int
    first_turn: int


async def run_workload(path: str) -> DemoRun:
    """Conversations, turns with entries, tasks and document updates, a fork, a reopen."""

    from pi_durable import create_session
    from pi_durable.context import BACKGROUND_CONTEXT as ctx

    notes, settings, answer = _definitions()
    storage = await LmdbStorage.open(path)  # the README's way: the default, power durability
    session = create_session(storage)
    started = time.perf_counter()
    commits_before = storage.log.head()

    async def setup(tx: Any) -> Any:
        root = await tx.conversation(1)
        return root if root is not None else await tx.create_root_conversation()

    root = await session.commit(setup, ctx)
    fork_point = None
    for number, question in enumerate(QUESTIONS):

        async def ask(tx: Any, question: str = question) -> tuple[Any, int]:
            entry = await tx.append_entry(
                root["id"], {"kind": "message", "model": [{"role": "user", "content": question}]}
            )
            task = await tx.create_task(
                answer,
                {"question": question},
                {"ownership": {"kind": "conversation"}, "conversationId": root["id"]},
            )
            return entry, task

        entry, task_id = await session.commit(ask, ctx)
        fork_point = fork_point or entry["id"]

        async def reply(
            tx: Any, question: str = question, task_id: int = task_id, number: int = number
        ) -> None:
            text = f"Answer {number + 1}: see the README section on '{question[:-1].lower()}'."
            task = await tx.task(task_id)  # a transaction reads before it writes
            await tx.append_entry(
                root["id"], {"kind": "message", "model": [{"role": "assistant", "content": text}]}
            )
            tx.set_task(
                {
                    **task,
                    "state": {
                        "status": "terminal",
                        "outcome": {"status": "completed", "result": text},
                    },
                }
            )
            doc = await tx.doc(notes, root["id"])
            doc.answers.append(text)
            doc.summary = f"{_count(number + 1, 'question', 'questions')} answered"
            config = await tx.doc(settings)
            config.turns = config.turns + 1

        await session.commit(reply, ctx)

    async def branch(tx: Any) -> Any:
        return await tx.fork_conversation(
            root["id"], fork_point, {"ownership": {"kind": "ownerless"}}
        )

    fork = await session.commit(branch, ctx)
    await session.close(ctx)
    await storage.close()
    elapsed = time.perf_counter() - started

    storage = await LmdbStorage.open(path, readonly=True)
    session = create_session(storage)
    try:
        root_notes = await session.snapshot(notes, root["id"], ctx)
        fork_notes = await session.snapshot(notes, fork["id"], ctx)
        page = await storage.scan_entries({"conversationId": fork["id"]}, 50, None, ctx)
        head = storage.log.head()
        first_turn = await storage.as_of(commits_before + 3)
        found = await storage.find_document(
            {"kind": "notes", "scope": {"kind": "conversation", "conversationId": root["id"]}},
            "current",
            ctx,
        )
        assert found is not None, "the demo wrote the root's notes"
        notes_id = found["id"]
        past = await first_turn.document(notes_id, "current", ctx)
    finally:
        await session.close(ctx)
        await storage.close()
    return DemoRun(
        root=root["id"],
        fork=fork["id"],
        commits=head - commits_before,
        elapsed=elapsed,
        root_answers=_items(root_notes, "answers"),
        fork_answers=_items(fork_notes, "answers"),
        fork_entries=len(page["items"]),
        past_answers=None if past is None else _items(past["value"], "answers"),
        head=head,
        notes=notes_id,
        first_turn=commits_before + 3,
    )


def _count(n: int | None, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "demo",
        "run a small agent host on a store, then show what it wrote",
        example="durable-log demo",
    )
    sub.add_argument(
        "path", nargs="?", metavar="PATH", help="the store's directory (default: ./demo-store)"
    )
    sub.set_defaults(run=lambda args: main(args.path))


def main(path: str | None) -> int:
    path = path or "demo-store"
    refuse_foreign_files(
        path
    )  # runs again on a store of its own, never into another program's files
    print(f"Running a small agent host on the embedded store at {os.path.abspath(path)} ...\n")
    result = asyncio.run(run_workload(path))
    print(
        f"Wrote {_count(result.commits, 'commit', 'commits')} in {result.elapsed * 1000:.0f} ms through a pi-durable Session\n"
        f"(durability 'power', the default: each commit synced to disk before it returns):\n"
        f"  - conversation {result.root}: {len(QUESTIONS)} questions and answers (entries), one task per\n"
        f"    question created and settled, a rewindable 'notes' document updated every turn\n"
        f"    ({result.root_answers} answers now) and a session-wide 'settings' document;\n"
        f"  - conversation {result.fork}: a fork after the first question; through its parent it "
        f"sees {_count(result.fork_entries, 'entry', 'entries')},\n"
        f"    and its copy of 'notes' was taken as of the fork point ({result.fork_answers} answers);\n"
        f"  - the Session was closed and the store reopened: everything above was read back from disk;\n"
        f"  - as_of(): three commits into this run, the notes held {_count(result.past_answers, 'answer', 'answers')}.\n"
    )
    print("durable-log stats:\n")
    print(format_stats(stats(path)))
    print("\ndurable-log tail (the last batches):\n")
    tail = Tail(path)
    try:

        async def show() -> None:
            async for commit, writes in tail.commits(max(1, tail.head() - 4)):
                print(summarize(commit, writes))

        asyncio.run(show())
    finally:
        tail.close()
    print(
        f"\nTry next (run the demo again to add to the same store):\n"
        f"  durable-log tail {path} --follow          # watch commits live, from another terminal\n"
        f"  durable-log tail {path} --from 1 --json --type document.change\n"
        f"  durable-log verify {path}                 # re-fold the log and compare every projection\n"
        f"  durable-log show {path} document {result.notes} --as-of {result.first_turn}"
        f"   # the notes as they were, by sequence or time\n"
        f"  durable-log export {path} > log.jsonl && durable-log import log.jsonl copy-store\n"
        f"  durable-log rebuild {path}                # rebuild projections beside the live ones\n"
        f"  durable-log search {path} 'writer killed' # find entries, documents, tasks by their words\n"
        f"  durable-log list {path} entries           # the messages as a table (tasks, documents, ...)\n"
        f"  durable-log serve {path}                  # the web view (the [web] extra)\n"
    )
    return 0


def _items(value: Any, key: str) -> int:
    """How many items the list at ``value[key]`` holds (0 for no value)."""

    return len(value[key]) if value else 0


__all__ = [
    "QUESTIONS",
    "DemoRun",
    "main",
    "register",
    "run_workload",
]
