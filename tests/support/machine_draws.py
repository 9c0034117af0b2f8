"""The drawing half of the state machine of ``tests/storage/test_state_machine.py``: value pools
that make collisions likely, plausible writes over the model of what committed, invalid batches
and ops, and the strict comparison's descriptions of outcomes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any, Final

from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT
from pi_durable.errors import StorageRequestError

from .compare import REFUSALS
from .machine_values import (
    BAD_OPS,
    DOC_KEYS,
    DOC_KINDS,
    ENTRY_KINDS,
    ID_POOL,
    KEYS,
    REQUEST_IDS,
    SUBMISSION_STATUSES,
    TASK_KINDS,
    TASK_STATUSES,
    json_objects,
    json_values,
    scalars,
    texts,
)

CTX = BACKGROUND_CONTEXT

# ── Comparison ──────────────────────────────────────────────────────────────


DESCRIBED: Final = 2000
"""Characters of a result a failure shows: a long document's value is cut in the middle."""


def _describe(outcome: tuple[str, Any]) -> str:
    kind, value = outcome
    if kind == "error":
        family = "StorageRequestError" if isinstance(value, StorageRequestError) else "other"
        return f"raised {type(value).__name__} ({family}): {value!s}"
    text = repr(value)
    if len(text) > DESCRIBED:
        cut = len(text) - DESCRIBED
        text = f"{text[: DESCRIBED // 2]} ...{cut} characters... {text[-DESCRIBED // 2 :]}"
    return f"returned {text}"


def _message_shape(error: BaseException) -> str:
    """An error's message with its numbers elided, to count kinds of rejections."""

    words = [
        ("N" if word.strip("'\",.:").lstrip("-").isdigit() else word) for word in str(error).split()
    ]
    return f"{type(error).__name__}: {' '.join(words)[:70]}"


def _tree_paths(
    value: Any, prefix: tuple[Any, ...] = (), depth: int = 0
) -> Iterator[tuple[list[Any], Any]]:
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


class MachineDraws:
    """Draws writes for ``StorageMachine`` (its model lives there; this half only reads it)."""

    ref: Any
    seqs: list[int]
    record_types: dict[int, str]
    conversations: list[int]
    entries: list[int]
    tasks: dict[int, dict[str, Any]]
    submissions: dict[int, dict[str, Any]]
    documents: dict[int, dict[str, Any]]
    minted: list[int]
    run: Callable[[Callable[[], Any]], Any]

    # ── model helpers ───────────────────────────────────────────────────

    def id_pool(self) -> list[int]:
        return ID_POOL + self.minted[-4:]

    def known_ids(self) -> list[int]:
        return sorted(set(self.id_pool()) | set(self.record_types))

    def draw_id(self, data: Any, batch: _Batch, label: str = "id") -> int:
        choice = data.draw(st.sampled_from(["fresh"] * 7 + ["any"]), label=f"{label} choice")
        if choice == "fresh":
            top = max([*self.record_types, *batch.ids, *self.minted, *ID_POOL])
            candidates = [
                i for i in self.id_pool() if i not in self.record_types and i not in batch.ids
            ]
            candidates += [top + 1, top + 2]
            value = data.draw(st.sampled_from(candidates), label=label)
        else:
            value = data.draw(st.sampled_from(self.known_ids()), label=label)
        batch.ids.add(value)
        return value

    def draw_conversation(
        self, data: Any, batch: _Batch | None = None, any_id: bool = False
    ) -> int:
        options = list(self.conversations)
        if batch is not None:
            options += [c for c in batch.conversations if c not in options]
        if any_id:
            options += [i for i in ID_POOL[:6] if i not in options]
        return data.draw(st.sampled_from(options), label="conversation")

    def draw_seq_point(self, data: Any) -> Any:
        last = self.seqs[-1] if self.seqs else 1
        return data.draw(st.sampled_from(["current", *range(1, last + 1), 0, last + 1]), label="at")

    def ref_value(self, id: int) -> Any:
        try:
            stored = self.run(lambda: self.ref.document(id, "current", CTX))
        except REFUSALS:
            return {}
        return {} if stored is None else stored["value"]

    # ── write drawing ───────────────────────────────────────────────────

    def draw_conversation_write(self, data: Any, batch: _Batch) -> dict[str, Any]:
        id = self.draw_id(data, batch, "conversation id")
        value: dict[str, Any] = {"id": id}
        if self.conversations and data.draw(st.booleans(), label="fork"):
            value["parent"] = {
                "conversationId": data.draw(st.sampled_from(self.conversations), label="parent"),
                "at": data.draw(
                    st.sampled_from(sorted(set(ID_POOL) | set(self.entries[-4:]))), label="at"
                ),
            }
        if data.draw(st.booleans(), label="owned"):
            value["owner"] = {
                "conversationId": self.draw_conversation(data, batch, any_id=True),
                "taskId": data.draw(
                    st.sampled_from(sorted(set(ID_POOL[:8]) | set(self.tasks))), label="owner task"
                ),
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
            st.lists(
                st.sampled_from(["data", "model", "head", "edits", "byTaskId"]),
                unique=True,
                max_size=3,
            ),
            label="entry fields",
        ):
            if field == "data":
                value["data"] = data.draw(json_values, label="data")
            elif field == "model":
                value["model"] = [
                    {
                        "role": data.draw(st.sampled_from(["user", "assistant"])),
                        "content": data.draw(texts),
                    }
                ]
            elif field == "head":
                value["head"] = data.draw(
                    st.sampled_from([id, *ID_POOL[:8], *self.entries[-3:]]), label="head"
                )
            elif field == "edits":
                target = data.draw(
                    st.sampled_from([*ID_POOL[:6], *self.entries[-3:]]), label="edit target"
                )
                if data.draw(st.booleans(), label="replace edit"):
                    value["edits"] = [
                        {
                            "target": target,
                            "action": "replace",
                            "messages": [{"role": "user", "content": data.draw(texts)}],
                        }
                    ]
                else:
                    value["edits"] = [{"target": target, "action": "omit"}]
            else:
                value["byTaskId"] = data.draw(
                    st.sampled_from(sorted(set(ID_POOL[:6]) | set(self.tasks))), label="by task"
                )
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
            st.sampled_from(["completed", "failed", "aborted", "orphaned", "faulted"]),
            label="outcome",
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
        value["state"].update(
            data.draw(
                st.dictionaries(st.sampled_from(KEYS), scalars, max_size=1), label="state extras"
            )
        )
        value["background"] = data.draw(st.booleans(), label="background")
        value["abortRequested"] = data.draw(st.booleans(), label="abortRequested")
        for field in data.draw(
            st.lists(
                st.sampled_from(
                    [
                        "owner",
                        "abortReason",
                        "abandonOnRestart",
                        "startedAt",
                        "endedAt",
                        "restarts",
                        "memos",
                        "\udc01",
                    ]
                ),
                unique=True,
                max_size=3,
            ),
            label="task fields",
        ):
            if field == "owner":
                value["owner"] = data.draw(
                    st.sampled_from(sorted(set(ID_POOL[:6]) | set(self.tasks))), label="owner"
                )
            elif field == "abortReason":
                value["abortReason"] = "restart"
            elif field == "\udc01":  # an odd key: the codec escapes the whole task object
                value[field] = data.draw(scalars, label="odd field")
            elif field == "abandonOnRestart":
                value["abandonOnRestart"] = True
            elif field == "memos":
                if value["state"]["status"] not in ("completing", "terminal"):
                    value["memos"] = data.draw(
                        st.dictionaries(st.sampled_from(KEYS), json_values, max_size=2),
                        label="memos",
                    )
            else:
                value[field] = data.draw(st.sampled_from([0, 1_700_000_000_000, 3]), label=field)
        return {"type": "task", "value": value}

    def draw_submission_write(
        self, data: Any, batch: _Batch, id: int | None = None
    ) -> dict[str, Any]:
        existing = [s for s in self.submissions if s not in batch.ids]
        value: dict[str, Any]
        if id is None and existing and data.draw(st.booleans(), label="replace submission"):
            id = data.draw(st.sampled_from(existing), label="submission id")
            batch.ids.add(id)
            previous = self.submissions[id]
            value = {
                "id": id,
                "conversationId": previous["conversationId"],
                "type": previous["type"],
            }
            request = data.draw(st.sampled_from(["keep", "change", "drop"]), label="request id")
            if request == "keep" and "requestId" in previous:
                value["requestId"] = previous["requestId"]
            elif request == "change":
                value["requestId"] = data.draw(st.sampled_from(REQUEST_IDS), label="requestId")
            if (
                data.draw(st.sampled_from(["same", "other"]), label="submission conversation")
                == "other"
            ):
                value["conversationId"] = self.draw_conversation(data, batch)
        else:
            if id is None:
                id = self.draw_id(data, batch, "submission id")
            # Mostly the root conversation and a request ID, so request IDs collide.
            conversations = [
                *self.conversations[:1],
                *self.conversations[:3],
                *batch.conversations[:1],
            ]
            value = {
                "id": id,
                "conversationId": data.draw(st.sampled_from(conversations), label="conversation"),
                "type": data.draw(st.sampled_from(["input", "write"]), label="submission type"),
            }
            if data.draw(st.sampled_from([True, True, False]), label="has request id"):
                value["requestId"] = data.draw(st.sampled_from(REQUEST_IDS), label="requestId")
        statuses = (
            SUBMISSION_STATUSES if value["type"] == "input" else ["queued", "done", "unanswered"]
        )
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
        kind = data.draw(
            st.sampled_from(["conversation", "session", "conversation", "task"]), label="scope"
        )
        if kind == "session":
            return {"kind": "session"}
        if kind == "conversation":
            options = [*self.conversations[:3], *(batch.conversations[:1] if batch else []), 2]
            return {
                "kind": "conversation",
                "conversationId": data.draw(st.sampled_from(options), label="conversation scope"),
            }
        options = [*sorted(self.tasks)[:2], 2]
        return {"kind": "task", "taskId": data.draw(st.sampled_from(options), label="task scope")}

    def draw_semantics(self, data: Any) -> dict[str, str]:
        history = data.draw(st.sampled_from(["rewindable", "latest"]), label="history")
        forks = (
            ["asOf", "current", "initial"] if history == "rewindable" else ["current", "initial"]
        )
        return {"history": history, "fork": data.draw(st.sampled_from(forks), label="fork")}

    def draw_document_create(
        self, data: Any, batch: _Batch, address: dict[str, Any] | None = None
    ) -> dict[str, Any]:
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

    def draw_document_copy(
        self, data: Any, batch: _Batch, source: int | None = None
    ) -> dict[str, Any]:
        if source is None:
            source = data.draw(st.sampled_from(sorted(self.documents)), label="copy source")
        source_record = (
            self.documents[source]["record"]
            if source in self.documents
            else {"kind": "notes", "scope": {"kind": "session"}}
        )
        id = self.draw_id(data, batch, "copy id")
        record: dict[str, Any] = {
            "id": id,
            "kind": source_record["kind"],
            "scope": {
                "kind": "conversation",
                "conversationId": self.draw_conversation(data, batch, any_id=True),
            },
        }
        if "key" in source_record:
            record["key"] = source_record["key"]
        if "history" in source_record:
            record["history"] = source_record["history"]
            record["fork"] = source_record["fork"]
        else:
            record.update(self.draw_semantics(data))
        mismatch = data.draw(
            st.sampled_from(["none", "none", "kind", "key", "fork"]), label="copy mismatch"
        )
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
                "at": "current"
                if data.draw(st.booleans(), label="copy current")
                else self.draw_seq_point(data),
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
                    key: Any = data.draw(
                        st.sampled_from(sorted(set(node) | {"a", "é"})), label="s key"
                    )
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
                return [
                    "m",
                    path,
                    data.draw(st.permutations(list(range(len(node)))), label="m permutation"),
                ]
        return data.draw(st.sampled_from(BAD_OPS), label="bad op")

    def draw_document_change(
        self, data: Any, batch: _Batch, id: int | None = None
    ) -> dict[str, Any]:
        if id is None:
            id = data.draw(st.sampled_from(sorted(self.documents)), label="changed document")
        batch.documents.add(id)
        version = self.documents[id]["version"] if id in self.documents else 1
        version = data.draw(st.sampled_from([version, version + 1, 1]), label="change version")
        if data.draw(st.sampled_from(["delta", "base"]), label="content kind") == "base":
            content: dict[str, Any] = {
                "kind": "base",
                "version": version,
                "value": data.draw(json_objects, label="value"),
            }
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
        self,
        data: Any,
        batch: _Batch,
        kinds: list[str],
        min_size: int,
        max_size: int,
        label: str = "writes",
    ) -> list[dict[str, Any]]:
        """A list of writes; each is one Hypothesis draw, so shrinking deletes whole writes."""

        return data.draw(
            st.lists(
                _drawn(lambda draw: self.draw_write(draw, batch, kinds)),
                min_size=min_size,
                max_size=max_size,
            ),
            label=label,
        )

    def draw_write(self, data: Any, batch: _Batch, kinds: list[str]) -> dict[str, Any]:
        if not self.documents:
            kinds = [
                k for k in kinds if k not in ("document.copy", "document.change", "document.retire")
            ]
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
            maker = data.draw(
                st.sampled_from(["entry", "conversation", "document"]), label="duplicate kind"
            )
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
            maker = data.draw(
                st.sampled_from(["task", "submission", "entry", "document"]), label="claiming kind"
            )
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
            unknown = [
                i
                for i in self.known_ids()
                if self.record_types.get(i) != "document" and i not in batch.documents
            ]
            id = data.draw(st.sampled_from(unknown), label="unknown document")
            if data.draw(st.booleans(), label="retire it"):
                return [{"type": "document.retire", "id": id}]
            return _change_of(id, data)
        if kind == "delta without base":
            write = self.draw_document_create(data, batch)
            write["content"] = {
                "kind": "delta",
                "version": write["content"]["version"],
                "ops": [["s", ["a"], 1]],
            }
            return [write]
        if kind == "two content commands":
            if self.documents and data.draw(st.booleans(), label="existing"):
                id = data.draw(st.sampled_from(sorted(self.documents)), label="document")
                return [
                    self.draw_document_change(data, batch, id),
                    self.draw_document_change(data, batch, id),
                ]
            create = self.draw_document_create(data, batch)
            return [create, _change_of(create["record"]["id"], data)[0]]
        if kind == "retired twice":
            if self.documents and data.draw(st.booleans(), label="existing"):
                id = data.draw(st.sampled_from(sorted(self.documents)), label="document")
                return [
                    {"type": "document.retire", "id": id},
                    {"type": "document.retire", "id": id},
                ]
            create = self.draw_document_create(data, batch)
            id = create["record"]["id"]
            return [
                create,
                {"type": "document.retire", "id": id},
                {"type": "document.retire", "id": id},
            ]
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
            self.documents[create["record"]["id"]] = {
                "record": create["record"],
                "retired": False,
                "version": 1,
                "points": [],
            }
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
                version = (self.documents[id]["version"] or 1) + data.draw(
                    st.sampled_from([1, -1, 5]), label="version step"
                )
                return [
                    {
                        "type": "document.change",
                        "id": id,
                        "content": {"kind": "delta", "version": version, "ops": []},
                    }
                ]
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
