"""pi_durable's own Session and Harness running on the backend under test.

* A plain ``Session`` (``pi_durable.create_session``) builds a realistic state: the root
  conversation, user and marker entries, a fork, task records through their lifecycle, submissions
  with a request ID, and documents in every scope and history/fork policy (with deltas, checkpoint
  bases, a family, a retirement). Its observable state must equal the same program's state on
  MemoryStorage, and after close + reopen on the same directory a new Session must read back the
  same state and keep working (a newer document definition migrates, new IDs are fresh).
* A ``Harness`` runs a task through its phases; the task goes to sleep, the Harness closes, and a
  Harness reopened on the same directory wakes the task and finishes it.
* A read that the backend rejects with a ``StorageRequestError`` fails only that read: the Session
  stays healthy and keeps committing.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pi_durable import (
    Harness,
    MemoryStorage,
    create_registry,
    create_session,
    define_doc,
    define_doc_family,
    define_task,
)
from pi_durable.context import BACKGROUND_CONTEXT
from pi_durable.entries import define_entry
from pi_durable.errors import SessionFailed, StorageRequestError
from pi_durable.harness.define import define_extension

from ..support.compare import canonical as _strict


def canonical(value: Any) -> Any:
    return _strict(value, tuples_as_arrays=True)


CTX = BACKGROUND_CONTEXT
NOW = 1_700_000_000_000


def fixed_clock() -> int:
    """The Session stamps task times from its clock; a fixed one makes two runs comparable."""

    return NOW


Note = define_entry("test.note")
Marker = define_entry("test.marker")
Step = define_entry("test.step")


def _never(value: Any, ops: Any, info: Any) -> bool:
    return False


def _every_second(value: Any, ops: Any, info: Any) -> bool:
    return info["deltasSinceBase"] >= 2


Settings = define_doc(
    kind="test.settings",
    version=1,
    scope="session",
    initial=lambda: {"theme": "plain", "count": 0},
    checkpoint_when=_never,
)
SettingsV2 = define_doc(
    kind="test.settings",
    version=2,
    scope="session",
    initial=lambda: {"theme": "plain", "count": 0, "migrated": True},
    migrate=lambda value, version: {**value, "migrated": True},
    checkpoint_when=_never,
)
Notes = define_doc(
    kind="test.notes",
    version=1,
    scope="conversation",
    history="rewindable",
    fork="asOf",
    initial=lambda: {"lines": []},
    checkpoint_when=_every_second,
)
Plan = define_doc(
    kind="test.plan",
    version=1,
    scope="conversation",
    history="rewindable",
    fork="current",
    initial=lambda: {"steps": []},
    checkpoint_when=_never,
)
Draft = define_doc(
    kind="test.draft",
    version=1,
    scope="conversation",
    history="rewindable",
    fork="initial",
    initial=lambda: {"text": ""},
    checkpoint_when=_never,
)
Status = define_doc(
    kind="test.status",
    version=1,
    scope="conversation",
    history="latest",
    fork="current",
    initial=lambda: {"state": "idle", "n": 0},
    checkpoint_when=_never,
)
Scratch = define_doc(
    kind="test.scratch",
    version=1,
    scope="conversation",
    history="latest",
    fork="initial",
    initial=lambda: {"items": []},
    checkpoint_when=_never,
)
Progress = define_doc(
    kind="test.progress",
    version=1,
    scope="task",
    initial=lambda: {"steps": []},
    checkpoint_when=_never,
)
Cache = define_doc_family(
    kind="test.cache",
    version=1,
    scope="session",
    initial=lambda seed: {"seed": seed, "hits": 0},
    checkpoint_when=_never,
)

CONVERSATION_DOCS = [Notes, Plan, Draft, Status, Scratch]
CACHE_KEYS = ["alpha", "ключ", "\ud800"]


def _inert_phase(task: Any, runtime: Any, context: Any) -> None:
    raise AssertionError("a plain Session never runs task phases")


Job = define_task(
    name="test.job",
    version=1,
    initial=lambda input: {"phase": "start", "input": input},
    phases={"start": _inert_phase},
    abort=lambda *args: None,
)


def assert_same(actual: Any, expected: Any, label: str) -> None:
    if canonical(actual) == canonical(expected):
        return
    if isinstance(actual, dict) and isinstance(expected, dict):
        for key in sorted(set(actual) | set(expected), key=repr):
            if canonical(actual.get(key)) != canonical(expected.get(key)):
                raise AssertionError(
                    f"{label}[{key!r}] differs:\n  ours     {actual.get(key)!r}\n  expected {expected.get(key)!r}"
                )
    raise AssertionError(f"{label} differs:\n  ours     {actual!r}\n  expected {expected!r}")


# ── The Session program ─────────────────────────────────────────────────────


async def build_state(session: Any) -> dict[str, Any]:
    """Commit a realistic history through the Session and return the IDs it produced."""

    async def first(tx: Any) -> dict[str, Any]:
        root = await tx.create_root_conversation()
        conversation = root["id"]
        hello = await tx.append_entry(
            conversation,
            {
                "kind": "pi.user",
                "model": [{"role": "user", "content": "héllo 😀 \ud800", "timestamp": 1}],
            },
        )
        task = await tx.create_task(
            Job,
            {"input": "ünïcode"},
            {"ownership": {"kind": "conversation"}, "conversationId": conversation},
        )
        submission = await tx.create_submission(
            {
                "conversationId": conversation,
                "requestId": "req-é",
                "type": "input",
                "status": "queued",
            }
        )
        (await tx.doc(Notes, conversation))["lines"].append("one")
        (await tx.doc(Plan, conversation))["steps"].append({"do": "plan"})
        (await tx.doc(Draft, conversation))["text"] = "draft"
        status = await tx.doc(Status, conversation)
        status["state"] = "busy"
        (await tx.doc(Scratch, conversation))["items"].append(1)
        settings = await tx.doc(Settings)
        settings["theme"] = "dark"
        for key in CACHE_KEYS:
            (await tx.doc(Cache, key, {"for": key}))["hits"] = 1
        return {
            "root": conversation,
            "hello": hello["id"],
            "task": task,
            "submission": submission["id"],
        }

    ids = await session.commit(first, CTX)

    async def second(tx: Any) -> dict[str, Any]:
        task = await tx.task(ids["task"])  # reads come before the first table write
        tx.set_task(
            {**task, "state": {"status": "running", "checkpoint": {"phase": "work", "n": 1}}}
        )
        tx.place_submission(ids["submission"], ids["hello"])
        (await tx.doc(Progress, ids["task"]))["steps"].append("work")
        notes = await tx.doc(Notes, ids["root"])
        notes["lines"].append("two")
        notes["lines"].append("three")
        (await tx.doc(Status, ids["root"]))["n"] = 2
        reply = await tx.append_entry(
            ids["root"],
            {"kind": "pi.user", "model": [{"role": "user", "content": "second", "timestamp": 2}]},
        )
        return {"reply": reply["id"]}

    ids.update(await session.commit(second, CTX))

    async def third(tx: Any) -> dict[str, Any]:
        marker = await tx.append_entry(
            Marker, ids["root"], {"data": {"summary": "∑"}, "head": "self"}
        )
        notes = await tx.doc(Notes, ids["root"])
        notes["lines"][0] = "ONE"
        (await tx.doc(Plan, ids["root"]))["steps"].append({"do": "more"})
        (await tx.doc(Settings))["count"] = 3
        return {"marker": marker["id"]}

    ids.update(await session.commit(third, CTX))

    async def fork(tx: Any) -> dict[str, Any]:
        child = await tx.fork_conversation(
            ids["root"], ids["reply"], {"ownership": {"kind": "ownerless"}}
        )
        (await tx.doc(Notes, child["id"]))["lines"].append("fork")
        (await tx.doc(Draft, child["id"]))["text"] = "fork draft"
        (await tx.doc(Scratch, child["id"]))["items"].append("fork")
        note = await tx.append_entry(Note, child["id"], {"data": {"in": "fork"}})
        return {"fork": child["id"], "fork_note": note["id"]}

    ids.update(await session.commit(fork, CTX))

    async def owned(tx: Any) -> dict[str, Any]:
        child_task = await tx.create_task(
            Job,
            {"child": True},
            {"ownership": {"kind": "conversation"}, "conversationId": ids["fork"]},
        )
        workspace = await tx.create_conversation(
            {"ownership": {"kind": "task", "taskId": ids["task"]}}
        )
        await tx.append_entry(Note, workspace["id"], {"data": {"owned": True}})
        (await tx.doc(Progress, ids["task"]))["steps"].append("spawned")
        return {"child_task": child_task, "workspace": workspace["id"]}

    ids.update(await session.commit(owned, CTX))

    async def settle(tx: Any) -> None:
        task = await tx.task(ids["task"])
        child = await tx.task(ids["child_task"])
        tx.set_task(
            {
                **child,
                "state": {"status": "sleeping", "checkpoint": {"phase": "nap"}, "until": 61_000},
            }
        )
        tx.set_task(
            {
                **task,
                "state": {
                    "status": "terminal",
                    "outcome": {"status": "completed", "result": {"ok": True}},
                },
            }
        )
        tx.settle_submission(ids["submission"], {"status": "done", "answer": ids["reply"]})
        await tx.retire_doc(Scratch, ids["root"])
        await tx.retire_doc(Cache, CACHE_KEYS[0])
        (await tx.doc(Notes, ids["fork"]))["lines"].append("after")

    await session.commit(settle, CTX)
    return ids


async def scan_all(scan: Any, query: dict[str, Any]) -> list[Any]:
    items: list[Any] = []
    cursor = None
    while True:
        page = await scan(query, 2, cursor, CTX)
        items.extend(page["items"])
        cursor = page.get("next")
        if cursor is None:
            return items


async def dump_state(session: Any, ids: dict[str, Any]) -> dict[str, Any]:
    """Everything the Session and its Storage can tell about the state ``build_state`` made."""

    storage = session.storage
    state: dict[str, Any] = {}
    conversations = await scan_all(storage.scan_conversations, {})
    state["conversations"] = conversations
    state["owned conversations"] = await scan_all(
        storage.scan_conversations, {"ownerTaskId": ids["task"]}
    )
    state["tasks"] = await scan_all(storage.scan_tasks, {"order": "descending"})
    state["sleeping tasks"] = await scan_all(storage.scan_tasks, {"status": "sleeping"})
    state["submissions"] = await scan_all(storage.scan_submissions, {})
    state["by request"] = await storage.submission_by_request(ids["root"], "req-é", CTX)
    for conversation in [record["id"] for record in conversations]:
        entries = await scan_all(
            storage.scan_entries, {"conversationId": conversation, "order": "ascending"}
        )
        state[f"entries {conversation}"] = entries
        state[f"head {conversation}"] = await storage.find_latest_head_marker(
            conversation, None, CTX
        )
        state[f"context {conversation}"] = await session.context(conversation, CTX)
        for token in CONVERSATION_DOCS:
            state[f"{token.definition.kind} {conversation}"] = await session.snapshot(
                token, conversation, CTX
            )
        for entry in entries:
            state[f"entry {conversation} {entry['id']}"] = await storage.entry(
                conversation, entry["id"], CTX
            )
            for token in (Notes, Plan, Draft):
                state[
                    f"{token.definition.kind} {conversation} as of {entry['id']}"
                ] = await session.snapshot_as_of(token, conversation, entry["id"], CTX)
        state[f"documents {conversation}"] = await scan_all(
            storage.scan_documents,
            {"scope": {"kind": "conversation", "conversationId": conversation}, "at": "current"},
        )
    state["settings"] = await session.snapshot(Settings, CTX)
    for key in CACHE_KEYS:
        state[f"cache {key!r}"] = await session.snapshot(Cache, key, CTX)
    state["session documents"] = await scan_all(
        storage.scan_documents, {"scope": {"kind": "session"}, "at": "current"}
    )
    state["progress"] = await scan_all(
        storage.scan_documents, {"scope": {"kind": "task", "taskId": ids["task"]}, "at": "current"}
    )
    # Every stored incarnation, current and at every commit that produced an entry.
    seqs = sorted(
        {
            lookup["commitSeq"]
            for key, lookup in state.items()
            if key.startswith("entry ") and lookup
        }
    )
    for document in state["session documents"] + state[f"documents {ids['root']}"]:
        state[f"document {document['id']}"] = await storage.document(document["id"], "current", CTX)
        if document.get("history") == "rewindable":
            for seq in seqs:
                state[f"document {document['id']} at {seq}"] = await storage.document(
                    document["id"], seq, CTX
                )
    return state


async def test_session_state_matches_memory_and_survives_reopen(
    tmp_path: Any, open_storage: Any, backend: str
) -> None:
    path = str(tmp_path / "store")

    reference = create_session(MemoryStorage(), now=fixed_clock)
    reference_ids = await build_state(reference)
    expected = await dump_state(reference, reference_ids)
    await reference.close(CTX)

    session = create_session(await open_storage(path), now=fixed_clock)
    ids = await build_state(session)
    assert ids == reference_ids, "the backend minted other IDs than MemoryStorage"
    before = await dump_state(session, ids)
    assert_same(before, expected, "state before close")
    minted_before = await session.storage.mint_id()
    await session.close(CTX)
    assert (await session.closed) == {"reason": "closed"}

    reopened = create_session(await open_storage(path), now=fixed_clock)
    after = await dump_state(reopened, ids)
    assert_same(after, expected, "state after reopen")

    # The reopened store keeps working: fresh IDs, new entries, deltas, and a migration to a
    # newer document version (a new base).
    async def more(tx: Any) -> dict[str, Any]:
        entry = await tx.append_entry(Note, ids["fork"], {"data": {"after": "reopen"}})
        (await tx.doc(Notes, ids["fork"]))["lines"].append("reopened")
        settings = await tx.doc(SettingsV2)
        settings["count"] = 4
        fresh = await tx.create_conversation({"ownership": {"kind": "ownerless"}})
        return {"entry": entry["id"], "conversation": fresh["id"]}

    new = await reopened.commit(more, CTX)
    known = list(ids.values())
    if backend != "sqlite":  # the sqlite stand-in persists its ID counter only with stored IDs
        known.append(minted_before)
    assert min(new.values()) > max(known)
    assert await reopened.snapshot(SettingsV2, CTX) == {
        "theme": "dark",
        "count": 4,
        "migrated": True,
    }
    notes = await reopened.snapshot(Notes, ids["fork"], CTX)
    assert notes == {"lines": ["one", "two", "three", "fork", "after", "reopened"]}
    lookup = await reopened.storage.entry(new["entry"], CTX)
    assert lookup is not None and lookup["entry"]["data"] == {"after": "reopen"}
    await reopened.close(CTX)

    # And once more from disk, after the new commit.
    final = create_session(await open_storage(path), now=fixed_clock)
    assert await final.snapshot(SettingsV2, CTX) == {"theme": "dark", "count": 4, "migrated": True}
    assert await final.snapshot(Notes, ids["fork"], CTX) == notes
    conversations = await scan_all(final.storage.scan_conversations, {})
    assert [record["id"] for record in conversations] == sorted(
        [record["id"] for record in expected["conversations"]] + [new["conversation"]]
    )
    await final.close(CTX)


# ── A Harness running a task across a reopen ────────────────────────────────


async def _step(task: Any, runtime: Any, context: Any) -> None:
    phase = task["state"]["checkpoint"]["phase"]

    async def change(tx: Any, current: Any) -> Any:
        (await tx.doc(Progress, current["id"]))["steps"].append(phase)
        (await tx.doc(Notes, runtime.conversation_id))["lines"].append(f"{current['id']}:{phase}")
        await tx.append_entry(
            Step, runtime.conversation_id, {"data": {"task": current["id"], "phase": phase}}
        )
        if phase == "start":
            return {
                "status": "sleeping",
                "checkpoint": {"phase": "wake"},
                "until": runtime.now() + 60_000,
            }
        if phase == "wake":
            return {"status": "running", "checkpoint": {"phase": "finish"}}
        return {"status": "terminal", "outcome": {"status": "completed", "result": {"phases": 3}}}

    await runtime.commit(change, context)


Sleeper = define_task(
    name="test.sleeper",
    version=1,
    initial=lambda input: {"phase": "start"},
    phases={"start": _step, "wake": _step, "finish": _step},
    abort=lambda *args: None,
)


async def test_harness_task_sleeps_across_reopen(tmp_path: Any, open_storage: Any) -> None:
    path = str(tmp_path / "store")
    clock = [1_700_000_000_000]
    registry = create_registry()
    registry.install(define_extension(name="test", tasks=[Sleeper]))
    options = {"registry": registry, "now": lambda: clock[0]}

    harness = await Harness.open(await open_storage(path), options, CTX)
    root = await harness.root(CTX)

    async def start(tx: Any) -> Any:
        return await tx.create_task(
            Sleeper, {}, {"ownership": {"kind": "conversation"}, "conversationId": root.id}
        )

    task_id = await harness.commit(start, CTX)
    harness.resume()
    for _ in range(500):
        task = await harness.get_task(task_id, CTX)
        if task is not None and task["state"]["status"] == "sleeping":
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError(f"the task never went to sleep: {task!r}")
    before = await scan_all(
        harness.storage.scan_entries, {"conversationId": root.id, "order": "ascending"}
    )
    await harness.close(CTX)

    clock[0] += 120_000
    reopened = await Harness.open(await open_storage(path), options, CTX)
    stored = await reopened.get_task(task_id, CTX)
    assert stored is not None and stored["state"] == task["state"]
    assert (
        await scan_all(
            reopened.storage.scan_entries, {"conversationId": root.id, "order": "ascending"}
        )
        == before
    )
    reopened.resume()
    settled = await asyncio.wait_for(reopened.wait_for_task(task_id, CTX), 30)
    assert settled["state"] == {
        "status": "terminal",
        "outcome": {"status": "completed", "result": {"phases": 3}},
    }
    assert await reopened.snapshot(Notes, root.id, CTX) == {
        "lines": [f"{task_id}:start", f"{task_id}:wake", f"{task_id}:finish"]
    }
    steps = await scan_all(
        reopened.storage.scan_entries, {"conversationId": root.id, "order": "ascending"}
    )
    assert [entry["data"]["phase"] for entry in steps if entry["kind"] == Step.kind] == [
        "start",
        "wake",
        "finish",
    ]
    await reopened.close(CTX)


# ── StorageRequestError fails only the read ─────────────────────────────────


async def test_storage_request_error_fails_only_the_read(
    tmp_path: Any, open_storage: Any, backend: str
) -> None:
    storage = await open_storage(str(tmp_path / "store"))
    session = create_session(storage)

    async def setup(tx: Any) -> Any:
        root = await tx.create_root_conversation()
        await tx.append_entry(Note, root["id"], {"data": {"n": 1}})
        (await tx.doc(Notes, root["id"]))["lines"].append("kept")
        return root["id"]

    root = await session.commit(setup, CTX)
    unknown = 999_999

    async def expect_request_error(read: Any, words: str) -> None:
        try:
            await read
        except StorageRequestError as error:
            assert words in str(error), str(error)
            if backend == "lmdb":
                from pi_durable_lmdb.storage import StorageRequestError as LmdbStorageRequestError

                assert isinstance(error, LmdbStorageRequestError)
        else:
            raise AssertionError(f"expected a StorageRequestError mentioning {words!r}")
        assert session.failure is None, f"the Session failed: {session.failure!r}"

    guarded = session.storage
    await expect_request_error(
        guarded.scan_entries({"conversationId": unknown}, 10, None, CTX), "Unknown conversation"
    )
    await expect_request_error(guarded.entry(unknown, 1, CTX), "Unknown conversation")
    await expect_request_error(
        guarded.find_latest_head_marker(unknown, None, CTX), "Unknown conversation"
    )
    await expect_request_error(
        guarded.scan_tasks({}, 10, {"after": "nope"}, CTX), "Invalid storage cursor"
    )
    await expect_request_error(
        guarded.scan_conversations({"order": "sideways"}, 10, None, CTX), "Invalid scan order"
    )
    await expect_request_error(session.context(unknown, CTX), "Unknown conversation")

    # Inside a transaction the rejected read fails that commit, not the Session.
    async def reads_unknown(tx: Any) -> None:
        await tx.scan_entries({"conversationId": unknown}, 10)

    await expect_request_error(session.commit(reads_unknown, CTX), "Unknown conversation")

    # Historical content of a current-only document is an invalid request too.
    async def status(tx: Any) -> None:
        (await tx.doc(Status, root))["n"] = 1

    await session.commit(status, CTX)
    record = await guarded.find_document(
        {"kind": Status.definition.kind, "scope": {"kind": "conversation", "conversationId": root}},
        "current",
        CTX,
    )
    assert record is not None
    await expect_request_error(
        guarded.document(record["id"], record["createdAt"], CTX),
        "does not retain historical content",
    )

    async def more(tx: Any) -> Any:
        (await tx.doc(Notes, root))["lines"].append("still working")
        return (await tx.append_entry(Note, root, {"data": {"n": 2}}))["id"]

    entry = await session.commit(more, CTX)
    assert await session.snapshot(Notes, root, CTX) == {"lines": ["kept", "still working"]}
    assert (await guarded.entry(entry, CTX))["entry"]["data"] == {"n": 2}
    assert session.failure is None
    await session.close(CTX)
    assert (await session.closed) == {"reason": "closed"}


class _BrokenConversationReads:
    """Delegates to a storage, except that ``conversation()`` raises an ordinary error."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    async def conversation(self, id: Any, context: Any) -> Any:
        raise OSError("disk on fire")


async def test_other_read_errors_still_fail_the_session(tmp_path: Any, open_storage: Any) -> None:
    """The contrast: a read error that is not a StorageRequestError is fatal, as the protocol says."""

    storage = await open_storage(str(tmp_path / "store"))
    session = create_session(_BrokenConversationReads(storage))
    await session.commit(lambda tx: tx.create_root_conversation(), CTX)
    try:
        await session.storage.conversation(1, CTX)
    except OSError:
        pass
    else:
        raise AssertionError("the broken read did not raise")
    assert isinstance(session.failure, OSError)
    try:
        await session.commit(lambda tx: tx.conversation(1), CTX)
    except SessionFailed:
        pass
    else:
        raise AssertionError("a failed Session kept committing")
    end = await session.closed
    assert end["reason"] == "failed"
    # The failed Session closed the backend; it reopens with the committed root.
    reopened = await open_storage(str(tmp_path / "store"))
    assert await reopened.conversation(1, CTX) == {"id": 1}
    await reopened.close(CTX)
