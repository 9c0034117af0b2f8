"""Model-based differential test: the backend under test against pi_durable's MemoryStorage.

A Hypothesis ``RuleBasedStateMachine`` sends every operation to both stores and compares every
result: return values must be equal under a strict structural comparison (``1``, ``1.0`` and
``True`` differ, ``-0.0`` differs from ``0.0``; object key order is ignored), and when the
reference raises, ours must raise too, from the same family (``StorageRequestError`` or any other
exception) with the reference's message contained in ours.

What it drives:

* all eight write kinds: conversations (roots, forks with ``parent``, owners), entries (data, model
  messages, context edits, ``byTaskId``, head markers), task records in every status (also
  ``sleeping``) and their replacement, submissions of both types in every status with request IDs
  that move, and documents (create / copy / change / retire) in session, conversation and task
  scope, ``latest`` and ``rewindable`` history, ``asOf`` / ``current`` / ``initial`` forks, base
  and delta contents using every op verb (``r s d a t p m``), version changes, and invalid ops;
* deliberately invalid batches, often with valid writes around them: duplicate IDs, an ID of
  another record type, unknown documents, a delta without a base, a second current incarnation,
  copies of changed/mismatched/unknown sources, non-JSON values, ...; after every rejection all
  records and secondary indexes of both stores are compared (``check_state``);
* every read method, walking pages to the end through (JSON round-tripped) cursors in both
  orders, plus malformed cursors and orders, unknown conversations, historical document points;
* strings with non-ASCII characters, astral characters and lone surrogates everywhere strings go;
* closing and reopening the backend on the same directory (MemoryStorage keeps its state);
* ``check_everything``: all records, indexes, point reads and every document at each of its
  revision points, as a rule of its own and after each reopen.

Invalid delta ops are stored as MemoryStorage stores them (it does not check ops when it commits);
reading such a document raises whatever ``pi_durable.delta.apply`` raises, and ours must match.

IDs come from a small pool so collisions happen. ``mint_id`` must return exactly MemoryStorage's
values until the first reopen; afterwards it must return an ID above every ID minted or stored
before (the sqlite stand-in only promises "above every stored ID", see ``STRICT_MINT``).

Relaxations (all documented where they happen): after ``close()`` only the word "closed" is
required, since the reference's message names its class; no others.

Environment knobs: ``PI_DURABLE_LMDB_MACHINE_EXAMPLES`` / ``PI_DURABLE_LMDB_MACHINE_STEPS``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pi_durable.context import BACKGROUND_CONTEXT
from pi_durable.errors import StorageRequestError
from pi_durable.storage.memory import MemoryStorage

from ..support.compare import canonical

CTX = BACKGROUND_CONTEXT
MAX_SAFE = 9_007_199_254_740_991

EXAMPLES = int(os.environ.get("PI_DURABLE_LMDB_MACHINE_EXAMPLES", "200"))
STEPS = int(os.environ.get("PI_DURABLE_LMDB_MACHINE_STEPS", "50"))

# ── Value pools ─────────────────────────────────────────────────────────────

ID_POOL = list(range(1, 17))
TEXTS = ["", "a", "zz", "é", "日本語", "😀x", "\ud800", "x\udfffy", "__proto__"]
KEYS = ["a", "b", "é", "\ud800", "__proto__", "n"]
INTS = [0, 1, -1, 42, 2**53 + 1, -(2**63), 2**63 - 1]
FLOATS = [0.5, -0.0, 1.0, 1e300, -2.5e-8]
ENTRY_KINDS = ["message", "marker", "ü", "\ud800"]
TASK_KINDS = ["test.task", "other", "ké", "\udc00"]
DOC_KINDS = ["notes", "cache", "\ud801k"]
DOC_KEYS = [None, "k1", "ключ", "\ud800"]
REQUEST_IDS = ["r1", "ré", "\ud800", "\ud801"]
TASK_STATUSES = ["pending", "running", "waiting", "sleeping", "completing", "terminal"]
SUBMISSION_STATUSES = ["queued", "placed", "done", "unanswered"]
ORDERS = [None, "ascending", "descending"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(INTS),
    st.sampled_from(FLOATS),
    st.sampled_from(TEXTS),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3),
    max_leaves=5,
)
json_objects = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3)
texts = st.sampled_from(TEXTS)

BAD_OPS: list[Any] = [
    ["s", [], 1],
    ["q", ["a"]],
    ["s", ["__proto__"], 1],
    ["d", ["missing", "deeper"]],
    ["m", [], [0, 0]],
    ["t", ["a"], -1],
    ["p", ["a"], -1, 0, []],
    "not-an-op",
    [],
    ["r"],
    ["s", ["a", -1], 1],
    ["a", ["a"], 5],
    ["a", ["a"], "x"],
    ["s", ["missing", "x"], 1],
    ["p", ["missing"], 0, 0, []],
    ["m", ["a"], [0]],
]

BAD_CURSORS: list[Any] = [
    {},
    {"after": "3"},
    {"after": 1.5},
    {"after": True},
    {"after": None},
    {"after": MAX_SAFE + 1},
    {"after": 3, "order": "sideways"},
    {"after": 0},
    {"after": -2},
    {"after": 3, "order": "ascending"},
    {"after": 3, "order": "descending"},
    {"after": 3, "order": None},
]


# ── Comparison ──────────────────────────────────────────────────────────────


def _describe(outcome: tuple[str, Any]) -> str:
    kind, value = outcome
    if kind == "error":
        family = "StorageRequestError" if isinstance(value, StorageRequestError) else "other"
        return f"raised {type(value).__name__} ({family}): {value!s}"
    return f"returned {value!r}"


def _message_shape(error: BaseException) -> str:
    """An error's message with its numbers elided, to count kinds of rejections."""

    words = [("N" if word.strip("'\",.:").lstrip("-").isdigit() else word) for word in str(error).split()]
    return f"{type(error).__name__}: {' '.join(words)[:70]}"


def _tree_paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> Iterator[tuple[list[Any], Any]]:
    yield list(prefix), value
    if depth >= 3:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _tree_paths(item, (*prefix, key), depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _tree_paths(item, (*prefix, index), depth + 1)


class _Draw:
    """Gives a composite strategy's ``draw`` the ``data.draw(strategy, label=...)`` shape."""

    def __init__(self, draw: Callable[..., Any]) -> None:
        self._draw = draw

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self._draw(strategy)


def _drawn(make: Callable[[_Draw], Any]) -> Any:
    """A strategy whose value ``make`` builds imperatively from its own draws."""

    @st.composite
    def strategy(draw: Callable[..., Any]) -> Any:
        return make(_Draw(draw))

    return strategy()


class _Batch:
    """What a batch under construction has already claimed."""

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.conversations: list[int] = []
        self.documents: set[int] = set()


# ── The machine ─────────────────────────────────────────────────────────────


class StorageMachine(RuleBasedStateMachine):
    OPEN: Callable[[str], Any]
    STRICT_MINT = True

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.path = tempfile.mkdtemp(prefix="pi-durable-lmdb-machine-")
        self.ref: Any = MemoryStorage()
        self.ours: Any = None
        self.ours_closed = False
        self.reopened = False
        # Model of what committed, to draw plausible (and colliding) writes.
        self.seqs: list[int] = []
        self.record_types: dict[int, str] = {}
        self.conversations: list[int] = []
        self.entries: list[int] = []
        self.tasks: dict[int, dict[str, Any]] = {}
        self.submissions: dict[int, dict[str, Any]] = {}
        self.documents: dict[int, dict[str, Any]] = {}
        self.minted: list[int] = []
        self.ours_minted_max = 0

    # ── plumbing ────────────────────────────────────────────────────────

    def run(self, make: Callable[[], Any]) -> Any:
        async def go() -> Any:
            return await make()

        return self.loop.run_until_complete(go())

    @staticmethod
    async def _call(store: Any, method: str, args: tuple[Any, ...], ctx: bool) -> tuple[str, Any]:
        call_args = copy.deepcopy(args)  # each store gets its own arguments
        if ctx:
            call_args = (*call_args, CTX)
        try:
            return ("ok", await getattr(store, method)(*call_args))
        except Exception as error:  # noqa: BLE001 - compared by the caller
            return ("error", error)

    def outcome(self, store: Any, method: str, args: tuple[Any, ...], ctx: bool) -> tuple[str, Any]:
        return self.run(lambda: self._call(store, method, args, ctx))

    def same_all(self, calls: list[tuple[str, str, tuple[Any, ...]]]) -> None:
        """Compare many independent reads, each store's in one event-loop turn (it is faster).

        A method named ``walk:scan_x`` walks that scan to its end (``args``: query, limit).
        """

        async def on(store: Any) -> list[Any]:
            results: list[Any] = []
            for _, method, args in calls:
                if method.startswith("walk:"):
                    results.append(await self._walk(store, method[5:], args[0], args[1], True))
                else:
                    results.append(await self._call(store, method, args, True))
            return results

        ref = self.run(lambda: on(self.ref))
        ours = self.run(lambda: on(self.ours))
        for (label, method, _), left, right in zip(calls, ref, ours, strict=True):
            if method.startswith("walk:"):
                self.compare_walks(label, method[5:], left, right)
            else:
                self.compare(f"{method}{label}", left, right)

    def compare(self, label: str, ref: tuple[str, Any], ours: tuple[str, Any]) -> None:
        if ref[0] == "ok" and ours[0] == "ok":
            if canonical(ref[1]) != canonical(ours[1]):
                raise AssertionError(
                    f"{label}: results differ\n  reference {_describe(ref)}\n  ours      {_describe(ours)}"
                )
            return
        if ref[0] == "error" and ours[0] == "error":
            ref_request = isinstance(ref[1], StorageRequestError)
            our_request = isinstance(ours[1], StorageRequestError)
            if ref_request != our_request or str(ref[1]) not in str(ours[1]):
                raise AssertionError(
                    f"{label}: errors differ\n  reference {_describe(ref)}\n  ours      {_describe(ours)}"
                ) from ours[1]
            return
        error = ours[1] if ours[0] == "error" else None
        raise AssertionError(
            f"{label}: outcomes differ\n  reference {_describe(ref)}\n  ours      {_describe(ours)}"
        ) from error

    def same(self, label: str, method: str, *args: Any, ctx: bool = True) -> tuple[str, Any]:
        ref = self.outcome(self.ref, method, args, ctx)
        ours = self.outcome(self.ours, method, args, ctx)
        self.compare(f"{method}{label}", ref, ours)
        return ref

    @staticmethod
    async def _walk(
        store: Any, method: str, query: dict[str, Any], limit: int, keep_order: bool
    ) -> list[tuple[str, Any]]:
        """Every page of one scan, following its (JSON round-tripped) cursors."""

        pages: list[tuple[str, Any]] = []
        cursor: Any = None
        for _ in range(200):
            outcome = await StorageMachine._call(store, method, (query, limit, cursor), True)
            pages.append(outcome)
            if outcome[0] != "ok" or not isinstance(outcome[1], dict) or outcome[1].get("next") is None:
                return pages
            cursor = json.loads(json.dumps(outcome[1]["next"]))
            if not keep_order:
                query = {key: value for key, value in query.items() if key != "order"}
        raise AssertionError(f"{method} {query!r}: more than 200 pages")

    def compare_walks(self, label: str, method: str, ref: list[Any], ours: list[Any]) -> None:
        for number, (left, right) in enumerate(zip(ref, ours)):
            self.compare(f"{method}{label} page {number}", left, right)
        if len(ref) != len(ours):
            raise AssertionError(f"{method}{label}: {len(ref)} pages in the reference, {len(ours)} in ours")

    def walk(self, label: str, method: str, query: dict[str, Any], limit: int, keep_order: bool = True) -> None:
        """Walk a scan to its end on both stores, comparing every page."""

        ref = self.run(lambda: self._walk(self.ref, method, query, limit, keep_order))
        ours = self.run(lambda: self._walk(self.ours, method, query, limit, keep_order))
        self.compare_walks(f" {label}", method, ref, ours)
        last = ref[-1]
        if last[0] != "ok":
            event(f"{method}: {_message_shape(last[1])}")
        else:
            event(f"{method}: {min(len(ref), 4)}{'+' if len(ref) >= 4 else ''} pages")

    def teardown(self) -> None:
        try:
            if self.ours is not None and not self.ours_closed:
                self.run(lambda: self.ours.close(CTX))
            self.run(lambda: self.ref.close(CTX))
        finally:
            self.loop.close()
            shutil.rmtree(self.path, ignore_errors=True)

    # ── model helpers ───────────────────────────────────────────────────

    def id_pool(self) -> list[int]:
        return ID_POOL + self.minted[-4:]

    def known_ids(self) -> list[int]:
        return sorted(set(self.id_pool()) | set(self.record_types))

    def draw_id(self, data: Any, batch: _Batch, label: str = "id") -> int:
        choice = data.draw(st.sampled_from(["fresh"] * 7 + ["any"]), label=f"{label} choice")
        if choice == "fresh":
            top = max([*self.record_types, *batch.ids, *self.minted, *ID_POOL])
            candidates = [i for i in self.id_pool() if i not in self.record_types and i not in batch.ids]
            candidates += [top + 1, top + 2]
            value = data.draw(st.sampled_from(candidates), label=label)
        else:
            value = data.draw(st.sampled_from(self.known_ids()), label=label)
        batch.ids.add(value)
        return value

    def draw_conversation(self, data: Any, batch: _Batch | None = None, any_id: bool = False) -> int:
        options = list(self.conversations)
        if batch is not None:
            options += [c for c in batch.conversations if c not in options]
        if any_id:
            options += [i for i in ID_POOL[:6] if i not in options]
        return data.draw(st.sampled_from(options), label="conversation")

    def draw_seq_point(self, data: Any) -> Any:
        last = self.seqs[-1] if self.seqs else 1
        return data.draw(
            st.sampled_from(["current", *range(1, last + 1), 0, last + 1]), label="at"
        )

    def ref_value(self, id: int) -> Any:
        try:
            stored = self.run(lambda: self.ref.document(id, "current", CTX))
        except Exception:  # noqa: BLE001 - a broken document: ops are drawn against {}
            return {}
        return {} if stored is None else stored["value"]

    def apply_model(self, writes: list[dict[str, Any]], seq: int) -> None:
        self.seqs.append(seq)
        for write in writes:
            kind = write["type"]
            if kind in ("conversation", "entry", "task", "submission"):
                value = write["value"]
                self.record_types[value["id"]] = kind
                if kind == "conversation" and value["id"] not in self.conversations:
                    self.conversations.append(value["id"])
                elif kind == "entry":
                    self.entries.append(value["id"])
                elif kind == "task":
                    self.tasks[value["id"]] = copy.deepcopy(value)
                elif kind == "submission":
                    self.submissions[value["id"]] = copy.deepcopy(value)
            elif kind in ("document.create", "document.copy"):
                record = write["record"]
                self.record_types[record["id"]] = "document"
                version = write["content"]["version"] if kind == "document.create" else None
                self.documents[record["id"]] = {
                    "record": copy.deepcopy(record),
                    "retired": False,
                    "version": version,
                    "points": [seq],
                }
            elif kind == "document.change":
                self.documents[write["id"]]["version"] = write["content"]["version"]
                self.documents[write["id"]]["points"].append(seq)
        for write in writes:
            if write["type"] == "document.retire":
                self.documents[write["id"]]["retired"] = True
                self.documents[write["id"]]["points"].append(seq)
        for id, document in self.documents.items():
            if document["version"] is None:  # a copy: its version is its source's
                try:
                    stored = self.run(lambda id=id: self.ref.document(id, "current", CTX))
                except Exception:  # noqa: BLE001
                    stored = None
                document["version"] = 1 if stored is None else stored["version"]

    def commit(self, label: str, writes: list[dict[str, Any]]) -> bool:
        ref = self.outcome(self.ref, "commit", (writes,), True)
        ours = self.outcome(self.ours, "commit", (writes,), True)
        self.compare(f"commit {label}", ref, ours)
        event(f"commit {label}: " + ("ok" if ref[0] == "ok" else _message_shape(ref[1])))
        if ref[0] == "ok":
            self.apply_model(writes, ref[1])
            return True
        # After a rejected commit both stores must still agree on every record.
        self.check_state()
        return False

    # ── write drawing ───────────────────────────────────────────────────

    def draw_conversation_write(self, data: Any, batch: _Batch) -> dict[str, Any]:
        id = self.draw_id(data, batch, "conversation id")
        value: dict[str, Any] = {"id": id}
        if self.conversations and data.draw(st.booleans(), label="fork"):
            value["parent"] = {
                "conversationId": data.draw(st.sampled_from(self.conversations), label="parent"),
                "at": data.draw(st.sampled_from(sorted(set(ID_POOL) | set(self.entries[-4:]))), label="at"),
            }
        if data.draw(st.booleans(), label="owned"):
            value["owner"] = {
                "conversationId": self.draw_conversation(data, batch, any_id=True),
                "taskId": data.draw(st.sampled_from(sorted(set(ID_POOL[:8]) | set(self.tasks))), label="owner task"),
            }
        batch.conversations.append(id)
        return {"type": "conversation", "value": value}

    def draw_entry_write(self, data: Any, batch: _Batch, id: int | None = None) -> dict[str, Any]:
        if id is None:
            id = self.draw_id(data, batch, "entry id")
        value: dict[str, Any] = {
            "id": id,
            "conversationId": self.draw_conversation(data, batch),
            "kind": data.draw(st.sampled_from(ENTRY_KINDS), label="entry kind"),
        }
        for field in data.draw(
            st.lists(st.sampled_from(["data", "model", "head", "edits", "byTaskId"]), unique=True, max_size=3),
            label="entry fields",
        ):
            if field == "data":
                value["data"] = data.draw(json_values, label="data")
            elif field == "model":
                value["model"] = [{"role": data.draw(st.sampled_from(["user", "assistant"])), "content": data.draw(texts)}]
            elif field == "head":
                value["head"] = data.draw(st.sampled_from([id, *ID_POOL[:8], *self.entries[-3:]]), label="head")
            elif field == "edits":
                target = data.draw(st.sampled_from([*ID_POOL[:6], *self.entries[-3:]]), label="edit target")
                if data.draw(st.booleans(), label="replace edit"):
                    value["edits"] = [{"target": target, "action": "replace", "messages": [{"role": "user", "content": data.draw(texts)}]}]
                else:
                    value["edits"] = [{"target": target, "action": "omit"}]
            else:
                value["byTaskId"] = data.draw(st.sampled_from(sorted(set(ID_POOL[:6]) | set(self.tasks))), label="by task")
        return {"type": "entry", "value": value}

    def draw_task_state(self, data: Any) -> dict[str, Any]:
        status = data.draw(st.sampled_from(TASK_STATUSES), label="task status")
        if status in ("pending", "running"):
            return {"status": status, "checkpoint": data.draw(json_values, label="checkpoint")}
        if status == "waiting":
            return {
                "status": status,
                "checkpoint": data.draw(json_values, label="checkpoint"),
                "on": data.draw(st.lists(st.sampled_from(ID_POOL[:8]), max_size=2), label="on"),
                "policy": data.draw(st.sampled_from(["failFast", "allSettled"]), label="policy"),
            }
        if status == "sleeping":
            return {
                "status": status,
                "checkpoint": data.draw(json_values, label="checkpoint"),
                "until": data.draw(st.sampled_from([61_000, 0, 2**40]), label="until"),
            }
        outcome_kind = data.draw(
            st.sampled_from(["completed", "failed", "aborted", "orphaned", "faulted"]), label="outcome"
        )
        outcome: dict[str, Any] = {"status": outcome_kind}
        if outcome_kind == "completed":
            outcome["result"] = data.draw(json_values, label="result")
        elif outcome_kind in ("failed", "faulted"):
            error: dict[str, Any] = {"message": data.draw(texts, label="message")}
            if data.draw(st.booleans(), label="error detail"):
                error["detail"] = data.draw(json_values, label="detail")
            outcome["error"] = error
            if outcome_kind == "failed" and data.draw(st.booleans(), label="partial result"):
                outcome["result"] = data.draw(json_values, label="result")
        elif outcome_kind == "aborted":
            if data.draw(st.booleans(), label="abort reason"):
                outcome["reason"] = data.draw(texts, label="reason")
        else:
            outcome["reason"] = data.draw(texts, label="reason")
        return {"status": status, "outcome": outcome}

    def draw_task_write(self, data: Any, batch: _Batch, id: int | None = None) -> dict[str, Any]:
        existing = [t for t in self.tasks if t not in batch.ids]
        if id is None and existing and data.draw(st.booleans(), label="replace task"):
            id = data.draw(st.sampled_from(existing), label="task id")
            batch.ids.add(id)
            previous = self.tasks[id]
            value = {
                key: previous[key] for key in ("id", "conversationId", "kind", "version", "input")
            }
        else:
            if id is None:
                id = self.draw_id(data, batch, "task id")
            value = {
                "id": id,
                "conversationId": self.draw_conversation(data, batch),
                "kind": data.draw(st.sampled_from(TASK_KINDS), label="task kind"),
                "version": data.draw(st.sampled_from([1, 2]), label="task version"),
                "input": data.draw(json_values, label="input"),
            }
        value["state"] = self.draw_task_state(data)
        value["state"].update(data.draw(st.dictionaries(st.sampled_from(KEYS), scalars, max_size=1), label="state extras"))
        value["background"] = data.draw(st.booleans(), label="background")
        value["abortRequested"] = data.draw(st.booleans(), label="abortRequested")
        for field in data.draw(
            st.lists(
                st.sampled_from(["owner", "abortReason", "abandonOnRestart", "startedAt", "endedAt", "restarts", "memos", "\udc01"]),
                unique=True,
                max_size=3,
            ),
            label="task fields",
        ):
            if field == "owner":
                value["owner"] = data.draw(st.sampled_from(sorted(set(ID_POOL[:6]) | set(self.tasks))), label="owner")
            elif field == "abortReason":
                value["abortReason"] = "restart"
            elif field == "\udc01":  # an odd key: the codec escapes the whole task object
                value[field] = data.draw(scalars, label="odd field")
            elif field == "abandonOnRestart":
                value["abandonOnRestart"] = True
            elif field == "memos":
                if value["state"]["status"] not in ("completing", "terminal"):
                    value["memos"] = data.draw(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=2), label="memos")
            else:
                value[field] = data.draw(st.sampled_from([0, 1_700_000_000_000, 3]), label=field)
        return {"type": "task", "value": value}

    def draw_submission_write(self, data: Any, batch: _Batch, id: int | None = None) -> dict[str, Any]:
        existing = [s for s in self.submissions if s not in batch.ids]
        value: dict[str, Any]
        if id is None and existing and data.draw(st.booleans(), label="replace submission"):
            id = data.draw(st.sampled_from(existing), label="submission id")
            batch.ids.add(id)
            previous = self.submissions[id]
            value = {"id": id, "conversationId": previous["conversationId"], "type": previous["type"]}
            request = data.draw(st.sampled_from(["keep", "change", "drop"]), label="request id")
            if request == "keep" and "requestId" in previous:
                value["requestId"] = previous["requestId"]
            elif request == "change":
                value["requestId"] = data.draw(st.sampled_from(REQUEST_IDS), label="requestId")
            if data.draw(st.sampled_from(["same", "other"]), label="submission conversation") == "other":
                value["conversationId"] = self.draw_conversation(data, batch)
        else:
            if id is None:
                id = self.draw_id(data, batch, "submission id")
            # Mostly the root conversation and a request ID, so request IDs collide.
            conversations = [*self.conversations[:1], *self.conversations[:3], *batch.conversations[:1]]
            value = {
                "id": id,
                "conversationId": data.draw(st.sampled_from(conversations), label="conversation"),
                "type": data.draw(st.sampled_from(["input", "write"]), label="submission type"),
            }
            if data.draw(st.sampled_from([True, True, False]), label="has request id"):
                value["requestId"] = data.draw(st.sampled_from(REQUEST_IDS), label="requestId")
        statuses = SUBMISSION_STATUSES if value["type"] == "input" else ["queued", "done", "unanswered"]
        status = data.draw(st.sampled_from(statuses), label="submission status")
        value["status"] = status
        entry_ids = sorted(set(ID_POOL[:8]) | set(self.entries[-3:]))
        if status == "placed":
            value["entry"] = data.draw(st.sampled_from(entry_ids), label="entry")
        elif status == "done":
            value["entry"] = data.draw(st.sampled_from(entry_ids), label="entry")
            if value["type"] == "input":
                value["answer"] = data.draw(st.sampled_from(entry_ids), label="answer")
        elif status == "unanswered":
            value["reason"] = data.draw(texts, label="reason")
            if data.draw(st.booleans(), label="detail"):
                value["detail"] = data.draw(json_values, label="detail")
            if value["type"] == "input" and data.draw(st.booleans(), label="unanswered entry"):
                value["entry"] = data.draw(st.sampled_from(entry_ids), label="entry")
        return {"type": "submission", "value": value}

    def draw_scope(self, data: Any, batch: _Batch) -> dict[str, Any]:
        kind = data.draw(st.sampled_from(["conversation", "session", "conversation", "task"]), label="scope")
        if kind == "session":
            return {"kind": "session"}
        if kind == "conversation":
            options = [*self.conversations[:3], *(batch.conversations[:1] if batch else []), 2]
            return {"kind": "conversation", "conversationId": data.draw(st.sampled_from(options), label="conversation scope")}
        options = [*sorted(self.tasks)[:2], 2]
        return {"kind": "task", "taskId": data.draw(st.sampled_from(options), label="task scope")}

    def draw_semantics(self, data: Any) -> dict[str, str]:
        history = data.draw(st.sampled_from(["rewindable", "latest"]), label="history")
        forks = ["asOf", "current", "initial"] if history == "rewindable" else ["current", "initial"]
        return {"history": history, "fork": data.draw(st.sampled_from(forks), label="fork")}

    def draw_document_create(self, data: Any, batch: _Batch, address: dict[str, Any] | None = None) -> dict[str, Any]:
        id = self.draw_id(data, batch, "document id")
        if address is None:
            record: dict[str, Any] = {
                "id": id,
                "kind": data.draw(st.sampled_from(DOC_KINDS), label="document kind"),
                "scope": self.draw_scope(data, batch),
            }
            key = data.draw(st.sampled_from(DOC_KEYS), label="document key")
            if key is not None:
                record["key"] = key
            if record["scope"]["kind"] == "conversation":
                record.update(self.draw_semantics(data))
        else:
            record = {**copy.deepcopy(address), "id": id}
        batch.documents.add(id)
        return {
            "type": "document.create",
            "record": record,
            "content": {
                "kind": "base",
                "version": data.draw(st.sampled_from([1, 2, 3]), label="version"),
                "value": data.draw(json_objects, label="value"),
            },
        }

    def draw_document_copy(self, data: Any, batch: _Batch, source: int | None = None) -> dict[str, Any]:
        if source is None:
            source = data.draw(st.sampled_from(sorted(self.documents)), label="copy source")
        source_record = self.documents[source]["record"] if source in self.documents else {"kind": "notes", "scope": {"kind": "session"}}
        id = self.draw_id(data, batch, "copy id")
        record: dict[str, Any] = {
            "id": id,
            "kind": source_record["kind"],
            "scope": {"kind": "conversation", "conversationId": self.draw_conversation(data, batch, any_id=True)},
        }
        if "key" in source_record:
            record["key"] = source_record["key"]
        if "history" in source_record:
            record["history"] = source_record["history"]
            record["fork"] = source_record["fork"]
        else:
            record.update(self.draw_semantics(data))
        mismatch = data.draw(st.sampled_from(["none", "none", "kind", "key", "fork"]), label="copy mismatch")
        if mismatch == "kind":
            record["kind"] = record["kind"] + "-other"
        elif mismatch == "key":
            record["key"] = "other-key"
        elif mismatch == "fork":
            record["fork"] = "current" if record["fork"] != "current" else "initial"
        batch.documents.add(id)
        return {
            "type": "document.copy",
            "record": record,
            "source": {
                "id": source,
                "at": "current" if data.draw(st.booleans(), label="copy current") else self.draw_seq_point(data),
            },
        }

    def draw_op(self, data: Any, value: Any) -> Any:
        nodes = list(_tree_paths(value))
        verb = data.draw(st.sampled_from(["s", "d", "a", "t", "p", "m", "r", "bad"]), label="op")
        if verb == "r":
            return ["r", data.draw(json_objects, label="replacement")]
        if verb == "s":
            containers = [(p, n) for p, n in nodes if isinstance(n, (dict, list))]
            if containers:
                path, node = data.draw(st.sampled_from(containers), label="s parent")
                if isinstance(node, dict):
                    key: Any = data.draw(st.sampled_from(sorted(set(node) | {"a", "é"})), label="s key")
                else:
                    key = data.draw(st.integers(0, len(node)), label="s index")
                return ["s", [*path, key], data.draw(json_values, label="s value")]
        elif verb == "d":
            if len(nodes) > 1:
                path, _ = data.draw(st.sampled_from(nodes[1:]), label="d path")
                return ["d", path]
        elif verb in ("a", "t"):
            strings = [p for p, n in nodes if isinstance(n, str) and p]
            if strings:
                path = data.draw(st.sampled_from(strings), label=f"{verb} path")
                if verb == "a":
                    return ["a", path, data.draw(texts, label="a text")]
                return ["t", path, data.draw(st.integers(0, 3), label="t count")]
        elif verb == "p":
            lists = [(p, n) for p, n in nodes if isinstance(n, list)]
            if lists:
                path, node = data.draw(st.sampled_from(lists), label="p path")
                return [
                    "p",
                    path,
                    data.draw(st.integers(0, len(node)), label="p index"),
                    data.draw(st.integers(0, 2), label="p remove"),
                    data.draw(st.lists(json_values, max_size=2), label="p items"),
                ]
        elif verb == "m":
            lists = [(p, n) for p, n in nodes if isinstance(n, list)]
            if lists:
                path, node = data.draw(st.sampled_from(lists), label="m path")
                return ["m", path, data.draw(st.permutations(list(range(len(node)))), label="m permutation")]
        return data.draw(st.sampled_from(BAD_OPS), label="bad op")

    def draw_document_change(self, data: Any, batch: _Batch, id: int | None = None) -> dict[str, Any]:
        if id is None:
            id = data.draw(st.sampled_from(sorted(self.documents)), label="changed document")
        batch.documents.add(id)
        version = self.documents[id]["version"] if id in self.documents else 1
        version = data.draw(st.sampled_from([version, version + 1, 1]), label="change version")
        if data.draw(st.sampled_from(["delta", "base"]), label="content kind") == "base":
            content: dict[str, Any] = {"kind": "base", "version": version, "value": data.draw(json_objects, label="value")}
        else:
            current = self.ref_value(id)
            ops = data.draw(
                st.lists(_drawn(lambda draw: self.draw_op(draw, current)), min_size=1, max_size=3),
                label="ops",
            )
            content = {"kind": "delta", "version": version, "ops": ops}
        return {"type": "document.change", "id": id, "content": content}

    def draw_document_retire(self, data: Any, batch: _Batch) -> dict[str, Any]:
        live = [d for d, doc in self.documents.items() if not doc["retired"]]
        id = data.draw(st.sampled_from(sorted(live or self.documents)), label="retired document")
        return {"type": "document.retire", "id": id}

    def draw_writes(
        self, data: Any, batch: _Batch, kinds: list[str], min_size: int, max_size: int, label: str = "writes"
    ) -> list[dict[str, Any]]:
        """A list of writes; each is one Hypothesis draw, so shrinking deletes whole writes."""

        return data.draw(
            st.lists(_drawn(lambda draw: self.draw_write(draw, batch, kinds)), min_size=min_size, max_size=max_size),
            label=label,
        )

    def draw_write(self, data: Any, batch: _Batch, kinds: list[str]) -> dict[str, Any]:
        if not self.documents:
            kinds = [k for k in kinds if k not in ("document.copy", "document.change", "document.retire")]
        kind = data.draw(st.sampled_from(kinds), label="write kind")
        if kind == "conversation":
            return self.draw_conversation_write(data, batch)
        if kind == "entry":
            return self.draw_entry_write(data, batch)
        if kind == "task":
            return self.draw_task_write(data, batch)
        if kind == "submission":
            return self.draw_submission_write(data, batch)
        if kind == "document.create":
            return self.draw_document_create(data, batch)
        if kind == "document.copy":
            return self.draw_document_copy(data, batch)
        if kind == "document.change":
            return self.draw_document_change(data, batch)
        return self.draw_document_retire(data, batch)

    # ── lifecycle ───────────────────────────────────────────────────────

    @initialize(data=st.data())
    def open_and_seed(self, data: Any) -> None:
        """Open the backend, create the root conversation and commit a few seed batches."""

        self.ours = self.run(lambda: type(self).OPEN(self.path))
        self.commit("root", [{"type": "conversation", "value": {"id": 1}}])
        kinds = ["conversation", "entry", "entry", "entry", "task", "submission", "document.create"]
        for _ in range(6):
            if not data.draw(st.booleans(), label="another seed batch"):
                break
            self.commit("seed", self.draw_writes(data, _Batch(), kinds, 1, 10, "seed writes"))

    # ── commit rules ────────────────────────────────────────────────────

    TABLE_KINDS = ["entry", "entry", "conversation", "task", "submission"]
    DOCUMENT_KINDS = ["document.create", "document.change", "document.copy", "document.retire"]

    @rule(data=st.data())
    def commit_table_writes(self, data: Any) -> None:
        batch = _Batch()
        writes = self.draw_writes(data, batch, self.TABLE_KINDS, 1, 6)
        self.commit("table writes", writes)

    @rule(data=st.data())
    def commit_document_writes(self, data: Any) -> None:
        batch = _Batch()
        writes = self.draw_writes(data, batch, self.DOCUMENT_KINDS + ["document.create"], 1, 3)
        self.commit("document writes", writes)

    @rule(data=st.data())
    def commit_mixed_writes(self, data: Any) -> None:
        batch = _Batch()
        writes = self.draw_writes(data, batch, self.TABLE_KINDS + self.DOCUMENT_KINDS, 1, 5)
        self.commit("mixed writes", writes)

    @precondition(lambda self: bool(self.documents))
    @rule(data=st.data())
    def commit_document_history(self, data: Any) -> None:
        """Up to four commits, each a delta (or a rebasing base) of one document: long histories."""

        live = sorted(d for d, doc in self.documents.items() if not doc["retired"]) or sorted(self.documents)
        rewindable = [d for d in live if self.documents[d]["record"].get("history") == "rewindable"]
        id = data.draw(st.sampled_from(rewindable + live), label="document")
        for index in range(4):
            if index > 0 and not data.draw(st.booleans(), label="another revision"):
                break
            change = data.draw(_drawn(lambda draw: self.draw_document_change(draw, _Batch(), id)), label="change")
            if not self.commit("document history", [change]):
                break

    @rule()
    def commit_nothing(self) -> None:
        self.commit("empty batch", [])

    @rule(data=st.data())
    def commit_invalid_batch(self, data: Any) -> None:
        batch = _Batch()
        before = self.draw_writes(data, batch, self.TABLE_KINDS + ["document.create"], 0, 2, "valid writes before")
        invalid = data.draw(_drawn(lambda draw: self.draw_invalid(draw, batch)), label="invalid writes")
        after = self.draw_writes(data, batch, self.TABLE_KINDS, 0, 1, "valid writes after")
        self.commit("invalid batch", before + invalid + after)

    def draw_invalid(self, data: Any, batch: _Batch) -> list[dict[str, Any]]:
        kind = data.draw(
            st.sampled_from(
                [
                    "duplicate id",
                    "two record types",
                    "id of another type",
                    "root again",
                    "unknown document",
                    "delta without base",
                    "two content commands",
                    "retired twice",
                    "second current incarnation",
                    "copy of changed source",
                    "copy of unknown source",
                    "change of retired document",
                    "version change without base",
                    "non-JSON value",
                ]
            ),
            label="invalid kind",
        )
        if kind == "duplicate id":
            first = self.draw_entry_write(data, batch)
            maker = data.draw(st.sampled_from(["entry", "conversation", "document"]), label="duplicate kind")
            id = first["value"]["id"]
            if maker == "entry":
                second = self.draw_entry_write(data, batch, id)
            elif maker == "conversation":
                second = {"type": "conversation", "value": {"id": id}}
            else:
                second = self.draw_document_create(data, batch)
                second["record"]["id"] = id
            return [first, second]
        if kind == "two record types":
            task = self.draw_task_write(data, batch)
            return [task, self.draw_submission_write(data, _Batch(), task["value"]["id"])]
        if kind == "id of another type":
            owned = [i for i, t in self.record_types.items()]
            id = data.draw(st.sampled_from(sorted(owned)), label="taken id")
            maker = data.draw(st.sampled_from(["task", "submission", "entry", "document"]), label="claiming kind")
            if maker == "task":
                return [self.draw_task_write(data, batch, id)]
            if maker == "submission":
                return [self.draw_submission_write(data, batch, id)]
            if maker == "entry":
                return [self.draw_entry_write(data, batch, id)]
            write = self.draw_document_create(data, batch)
            write["record"]["id"] = id
            return [write]
        if kind == "root again":
            return [{"type": "conversation", "value": {"id": 1}}]
        if kind == "unknown document":
            unknown = [i for i in self.known_ids() if self.record_types.get(i) != "document" and i not in batch.documents]
            id = data.draw(st.sampled_from(unknown), label="unknown document")
            if data.draw(st.booleans(), label="retire it"):
                return [{"type": "document.retire", "id": id}]
            return _change_of(id, data)
        if kind == "delta without base":
            write = self.draw_document_create(data, batch)
            write["content"] = {"kind": "delta", "version": write["content"]["version"], "ops": [["s", ["a"], 1]]}
            return [write]
        if kind == "two content commands":
            if self.documents and data.draw(st.booleans(), label="existing"):
                id = data.draw(st.sampled_from(sorted(self.documents)), label="document")
                return [self.draw_document_change(data, batch, id), self.draw_document_change(data, batch, id)]
            create = self.draw_document_create(data, batch)
            return [create, _change_of(create["record"]["id"], data)[0]]
        if kind == "retired twice":
            if self.documents and data.draw(st.booleans(), label="existing"):
                id = data.draw(st.sampled_from(sorted(self.documents)), label="document")
                return [{"type": "document.retire", "id": id}, {"type": "document.retire", "id": id}]
            create = self.draw_document_create(data, batch)
            id = create["record"]["id"]
            return [create, {"type": "document.retire", "id": id}, {"type": "document.retire", "id": id}]
        if kind == "second current incarnation":
            live = [doc["record"] for doc in self.documents.values() if not doc["retired"]]
            if live:
                record = data.draw(st.sampled_from(live), label="occupied address")
                address = {k: v for k, v in record.items() if k != "id"}
                return [self.draw_document_create(data, batch, address)]
            first = self.draw_document_create(data, batch)
            address = {k: v for k, v in first["record"].items() if k != "id"}
            return [first, self.draw_document_create(data, batch, address)]
        if kind == "copy of changed source":
            if self.documents:
                source = data.draw(st.sampled_from(sorted(self.documents)), label="source")
                copy_write = self.draw_document_copy(data, batch, source)
                change = data.draw(st.sampled_from(["change", "retire"]), label="source change")
                if change == "retire":
                    return [copy_write, {"type": "document.retire", "id": source}]
                return [self.draw_document_change(data, batch, source), copy_write]
            create = self.draw_document_create(data, batch)
            create["record"]["scope"] = {"kind": "conversation", "conversationId": 1}
            create["record"].update({"history": "rewindable", "fork": "asOf"})
            self.documents[create["record"]["id"]] = {"record": create["record"], "retired": False, "version": 1, "points": []}
            try:
                copy_write = self.draw_document_copy(data, batch, create["record"]["id"])
            finally:
                del self.documents[create["record"]["id"]]
            return [create, copy_write]
        if kind == "copy of unknown source":
            unknown = [i for i in self.known_ids() if self.record_types.get(i) != "document"]
            source = data.draw(st.sampled_from(unknown), label="unknown source")
            return [self.draw_document_copy(data, batch, source)]
        if kind == "change of retired document":
            retired = [d for d, doc in self.documents.items() if doc["retired"]]
            if retired:
                id = data.draw(st.sampled_from(sorted(retired)), label="retired document")
                if data.draw(st.booleans(), label="retire again"):
                    return [{"type": "document.retire", "id": id}]
                return [self.draw_document_change(data, batch, id)]
            create = self.draw_document_create(data, batch)
            id = create["record"]["id"]
            return [create, {"type": "document.retire", "id": id}]  # valid: an empty lifetime
        if kind == "version change without base":
            if self.documents:
                id = data.draw(st.sampled_from(sorted(self.documents)), label="document")
                version = (self.documents[id]["version"] or 1) + data.draw(st.sampled_from([1, -1, 5]), label="version step")
                return [{"type": "document.change", "id": id, "content": {"kind": "delta", "version": version, "ops": []}}]
            return [self.draw_document_create(data, batch)]
        # non-JSON value somewhere in an otherwise valid write
        poison = data.draw(
            st.sampled_from([float("nan"), float("inf"), ("tuple",), {1: "int key"}, {"set"}]),
            label="non-JSON value",
        )
        write = self.draw_write(data, batch, ["entry", "task", "document.create"])
        if write["type"] == "entry":
            write["value"]["data"] = {"bad": poison}
        elif write["type"] == "task":
            write["value"]["input"] = [poison]
        elif write["type"] == "document.create":
            write["content"]["value"] = {"bad": poison}
        return [write]

    # ── mint and reopen ─────────────────────────────────────────────────

    @rule()
    def mint_id(self) -> None:
        ref = self.outcome(self.ref, "mint_id", (), False)
        ours = self.outcome(self.ours, "mint_id", (), False)
        if not self.reopened or ref[0] == "error":
            # Exact until the first reopen; an exhausted ID space stays exhausted.
            self.compare("mint_id", ref, ours)
        else:
            if ours[0] == "error":
                raise AssertionError(f"mint_id after reopen {_describe(ours)}") from ours[1]
            value = ours[1]
            assert isinstance(value, int) and not isinstance(value, bool), f"mint_id returned {value!r}"
            floor = max([*self.record_types, 1])
            if self.STRICT_MINT:
                floor = max(floor, self.ours_minted_max)
            assert value > floor, f"mint_id after reopen returned {value}, not above {floor}"
            assert value <= MAX_SAFE
        if ours[0] == "ok":
            self.minted.append(ours[1])
            self.ours_minted_max = max(self.ours_minted_max, ours[1])

    @rule()
    def close_and_reopen(self) -> None:
        self.run(lambda: self.ours.close(CTX))
        self.ours_closed = True
        # Relaxation: only "closed" is required; the reference's message names its own class.
        for method, args, ctx in [
            ("conversation", (1,), True),
            ("commit", ([],), True),
            ("mint_id", (), False),
            ("scan_tasks", ({}, 10, None), True),
            ("document", (1, "current"), True),
        ]:
            outcome = self.outcome(self.ours, method, args, ctx)
            if outcome[0] != "error" or "closed" not in str(outcome[1]):
                raise AssertionError(f"{method}() after close {_describe(outcome)}")
        self.ours = self.run(lambda: type(self).OPEN(self.path))
        self.ours_closed = False
        self.reopened = True
        self.check_everything()

    # ── reads ───────────────────────────────────────────────────────────

    def check_tables(self) -> list[tuple[str, str, tuple[Any, ...]]]:
        """Reads that together show every record: the check after each rejected commit."""

        calls: list[tuple[str, str, tuple[Any, ...]]] = [(" (all)", "scan_conversations", ({}, 10_000, None))]
        for order in ("ascending", "descending"):
            calls.append((f" (all, {order})", "scan_tasks", ({"order": order}, 10_000, None)))
            calls.append((f" (all, {order})", "scan_submissions", ({"order": order}, 10_000, None)))
        # Secondary indexes: statuses, kinds, owners, request IDs.
        for status in TASK_STATUSES:
            calls.append((f" ({status})", "scan_tasks", ({"status": status}, 10_000, None)))
        for kind in TASK_KINDS:
            calls.append((f" ({kind!r})", "scan_tasks", ({"kind": kind}, 10_000, None)))
        for status in SUBMISSION_STATUSES:
            calls.append((f" ({status})", "scan_submissions", ({"status": status}, 10_000, None)))
        for task in sorted({*self.tasks, 1, 2}):
            calls.append((f" (owner task {task})", "scan_conversations", ({"ownerTaskId": task}, 10_000, None)))
        conversations = sorted(set(self.conversations) | {2})
        for conversation in conversations:
            calls.append((f" (owner {conversation})", "scan_conversations", ({"ownerConversationId": conversation}, 10_000, None)))
            for request in REQUEST_IDS:
                calls.append((f"({conversation}, {request!r})", "submission_by_request", (conversation, request)))
            for order in ("ascending", "descending"):
                query = {"conversationId": conversation, "order": order}
                calls.append((f" ({conversation}, {order})", "scan_entries", (query, 10_000, None)))
        scopes = {json.dumps(doc["record"]["scope"], sort_keys=True) for doc in self.documents.values()}
        scopes.add(json.dumps({"kind": "session"}))
        for scope in sorted(scopes):
            calls.append((f" ({scope})", "scan_documents", ({"scope": json.loads(scope), "at": "current"}, 10_000, None)))
            for kind in DOC_KINDS:
                query = {"scope": json.loads(scope), "at": "current", "kind": kind}
                calls.append((f" ({scope}, {kind!r})", "scan_documents", (query, 10_000, None)))
        for id in sorted(self.documents):
            calls.append((f"({id}, current)", "document", (id, "current")))
        return calls

    def check_state(self) -> None:
        self.same_all(self.check_tables())

    @rule()
    def check_everything(self) -> None:
        """Compare the complete observable state of both stores, point reads included."""

        calls = self.check_tables()
        conversations = sorted(set(self.conversations) | {2})
        for conversation in conversations:
            calls.append((f"({conversation})", "conversation", (conversation,)))
            calls.append((f"({conversation}, None)", "find_latest_head_marker", (conversation, None)))
        for id in self.known_ids():
            calls.append((f"({id})", "entry", (id,)))
            calls.append((f"({id})", "task", (id,)))
            calls.append((f"({id})", "submission", (id,)))
            if id not in self.documents:
                calls.append((f"({id}, current)", "document", (id, "current")))
        for conversation in conversations:
            for order in ("ascending", "descending"):
                query = {"conversationId": conversation, "order": order}
                calls.append((f" {query!r} limit 2", "walk:scan_entries", (query, 2)))
        for order in ("ascending", "descending"):
            calls.append((f" {{'order': {order!r}}} limit 2", "walk:scan_conversations", ({"order": order}, 2)))
        for id, document in sorted(self.documents.items()):
            record = document["record"]
            address = {k: v for k, v in record.items() if k in ("kind", "scope", "key")}
            calls.append((f"({address!r}, current)", "find_document", (address, "current")))
            # Each revision point of the document, and the commit before its first.
            points = sorted({*document["points"][-4:], max(document["points"][0] - 1, 1)})
            for at in points:
                calls.append((f"({id}, {at})", "document", (id, at)))
                calls.append((f"({address!r}, {at})", "find_document", (address, at)))
        self.same_all(calls)

    @rule(data=st.data())
    def read_conversations(self, data: Any) -> None:
        id = data.draw(st.sampled_from(self.known_ids()), label="id")
        self.same(f"({id})", "conversation", id)
        query: dict[str, Any] = {}
        owners = sorted(set(ID_POOL[:4]) | set(self.conversations))
        tasks = sorted(set(ID_POOL[:8]) | set(self.tasks))
        shape = data.draw(st.sampled_from(["all", "owner conversation", "owner task", "both"]), label="query")
        if shape in ("owner conversation", "both"):
            query["ownerConversationId"] = data.draw(st.sampled_from(owners), label="owner conversation")
        if shape in ("owner task", "both"):
            query["ownerTaskId"] = data.draw(st.sampled_from(tasks), label="owner task")
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(f" {query!r} limit {limit}", "scan_conversations", query, limit, data.draw(st.booleans(), label="keep order"))

    @rule(data=st.data())
    def read_entries(self, data: Any) -> None:
        ids = sorted(set(self.known_ids()) | set(self.entries))
        conversations = [*self.conversations, *self.conversations, 9]
        id = data.draw(st.sampled_from([*ids, MAX_SAFE]), label="entry id")
        conversation = data.draw(st.sampled_from(conversations), label="conversation")
        self.same(f"({id})", "entry", id)
        visible_id = data.draw(st.sampled_from([*ids, "7", 1.5, True]), label="visible entry id")
        self.same(f"({conversation}, {visible_id!r})", "entry", conversation, visible_id)
        cutoff = data.draw(st.sampled_from([None, *ids]), label="at or before")
        self.same(f"({conversation}, {cutoff})", "find_latest_head_marker", conversation, cutoff)
        query: dict[str, Any] = {"conversationId": conversation}
        for bound in data.draw(st.lists(st.sampled_from(["minEntryId", "maxEntryId"]), unique=True, max_size=2), label="bounds"):
            query[bound] = data.draw(st.sampled_from(ids), label=bound)
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(f" {query!r} limit {limit}", "scan_entries", query, limit, data.draw(st.booleans(), label="keep order"))

    @rule(data=st.data())
    def read_tasks(self, data: Any) -> None:
        id = data.draw(st.sampled_from(self.known_ids()), label="id")
        self.same(f"({id})", "task", id)
        query: dict[str, Any] = {}
        for field in data.draw(
            st.lists(st.sampled_from(["conversationId", "kind", "status", "abortRequested", "background"]), unique=True, max_size=2),
            label="filters",
        ):
            if field == "conversationId":
                query[field] = data.draw(st.sampled_from(sorted(set(self.conversations) | {1, 2})), label=field)
            elif field == "kind":
                query[field] = data.draw(st.sampled_from(TASK_KINDS), label=field)
            elif field == "status":
                query[field] = data.draw(st.sampled_from(TASK_STATUSES), label=field)
            else:
                query[field] = data.draw(st.booleans(), label=field)
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(f" {query!r} limit {limit}", "scan_tasks", query, limit, data.draw(st.booleans(), label="keep order"))

    @rule(data=st.data())
    def read_submissions(self, data: Any) -> None:
        id = data.draw(st.sampled_from(self.known_ids()), label="id")
        self.same(f"({id})", "submission", id)
        conversation = data.draw(st.sampled_from(sorted(set(self.conversations) | {1, 2})), label="conversation")
        request = data.draw(st.sampled_from(REQUEST_IDS), label="request")
        self.same(f"({conversation}, {request!r})", "submission_by_request", conversation, request)
        query: dict[str, Any] = {}
        if data.draw(st.booleans(), label="by conversation"):
            query["conversationId"] = conversation
        if data.draw(st.booleans(), label="by status"):
            query["status"] = data.draw(st.sampled_from(SUBMISSION_STATUSES), label="status")
        order = data.draw(st.sampled_from(ORDERS), label="order")
        if order is not None:
            query["order"] = order
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(f" {query!r} limit {limit}", "scan_submissions", query, limit, data.draw(st.booleans(), label="keep order"))

    @rule(data=st.data())
    def read_documents(self, data: Any) -> None:
        ids = sorted(set(self.known_ids()) | set(self.documents))
        id = data.draw(st.sampled_from(ids), label="document id")
        at = self.draw_seq_point(data)
        self.same(f"({id}, {at})", "document", id, at)
        if self.documents and data.draw(st.booleans(), label="known address"):
            record = self.documents[data.draw(st.sampled_from(sorted(self.documents)), label="address of")]["record"]
            address = {k: v for k, v in record.items() if k in ("kind", "scope", "key")}
        else:
            address = {
                "kind": data.draw(st.sampled_from(DOC_KINDS), label="kind"),
                "scope": self.draw_scope(data, _Batch()),
            }
            key = data.draw(st.sampled_from(DOC_KEYS), label="key")
            if key is not None:
                address["key"] = key
        at = self.draw_seq_point(data)
        self.same(f"({address!r}, {at})", "find_document", address, at)
        query: dict[str, Any] = {"scope": address["scope"], "at": self.draw_seq_point(data)}
        if data.draw(st.booleans(), label="by kind"):
            query["kind"] = address["kind"]
        limit = data.draw(st.integers(1, 2), label="limit")
        self.walk(f" {query!r} limit {limit}", "scan_documents", query, limit)

    @rule(data=st.data())
    def read_with_invalid_cursor_or_order(self, data: Any) -> None:
        method = data.draw(
            st.sampled_from(["scan_conversations", "scan_entries", "scan_tasks", "scan_submissions", "scan_documents"]),
            label="scan",
        )
        if method == "scan_entries":
            query: dict[str, Any] = {"conversationId": self.draw_conversation(data, any_id=True)}
        elif method == "scan_documents":
            query = {"scope": {"kind": "session"}, "at": "current"}
        else:
            query = {}
        order = data.draw(st.sampled_from([None, "ascending", "descending", "sideways", ""]), label="order")
        if order is not None:
            query["order"] = order
        cursor = data.draw(st.sampled_from([None, *BAD_CURSORS]), label="cursor")
        self.same(f" {query!r} cursor {cursor!r}", method, query, 2, cursor)


SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=STEPS,
    deadline=None,
    report_multiple_bugs=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def _change_of(id: int, data: Any) -> list[dict[str, Any]]:
    """A plausible change of a document that may not exist."""

    content = data.draw(
        st.sampled_from(
            [
                {"kind": "delta", "version": 1, "ops": [["s", ["a"], 1]]},
                {"kind": "base", "version": 1, "value": {"a": 1}},
            ]
        ),
        label="content",
    )
    return [{"type": "document.change", "id": id, "content": content}]


@pytest.mark.slow
def test_backend_matches_memory_storage(open_storage: Any, backend: str) -> None:
    class Machine(StorageMachine):
        OPEN = staticmethod(open_storage)
        # The sqlite stand-in persists its ID counter only with stored IDs.
        STRICT_MINT = backend != "sqlite"

    run_state_machine_as_test(Machine, settings=SETTINGS)
