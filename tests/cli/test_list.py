"""``durable-log list``: records of a kind filtered by dotted fields, now and as of an earlier
point. Served through an index (tasks and submissions by status, entries by conversation,
conversations by owner) or a scan, which give the same records; filters compare as JSON when the
value parses as JSON, strictly (``1`` is not ``true``); table, JSON Lines and CSV output; bad
input exits 2 with a message naming what exists, and writes nothing."""

from __future__ import annotations

import asyncio
import csv
import hashlib
import io
import json
import random
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.audit.listing import LIST_KINDS, list_records, parse_where, record_fields

from tests.support.cli_call import call
from tests.support.demo_store import make_demo

TASK_IDS = range(100, 110)
DATA: list[Any] = [1, "1", True, None, {"n": 1}, [1], 1.5, "x" * 100, "two\nlines"]


def _task(id: int, status: str, turn: int) -> dict[str, Any]:
    if status == "terminal":
        state: dict[str, Any] = {
            "status": status,
            "outcome": {"status": "completed", "result": turn},
        }
    else:
        state = {"status": status, "checkpoint": {"turn": turn}}
    return {
        "type": "task",
        "value": {
            "id": id,
            "conversationId": 1 + id % 3,
            "kind": "agent" if id % 2 else "tool",
            "version": 1,
            "input": {"n": id},
            "state": state,
            "background": id % 4 == 0,
            "abortRequested": False,
        },
    }


async def _build(path: Path) -> int:
    """A store of conversations (a fork, an owned one), entries whose data takes every JSON
    shape, tasks whose status changes over time, submissions and documents; its head then."""

    draw = random.Random(7)
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": n}} for n in (1, 2, 3)], CTX)
        await storage.commit([_task(id, "pending", 0) for id in TASK_IDS], CTX)
        entry = 200
        for turn in range(40):
            conversation = 1 + turn % 3
            writes: list[dict[str, Any]] = [
                {
                    "type": "entry",
                    "value": {
                        "id": entry,
                        "conversationId": conversation,
                        "kind": draw.choice(["m", "n"]),
                        "data": DATA[turn % len(DATA)],
                    },
                }
            ]
            entry += 1
            if turn == 10:
                writes.append(
                    {
                        "type": "conversation",
                        "value": {"id": 4, "parent": {"conversationId": 1, "at": 200}},
                    }
                )
                writes.append(
                    {
                        "type": "conversation",
                        "value": {"id": 5, "owner": {"conversationId": 2, "taskId": 101}},
                    }
                )
            if turn >= 11 and turn % 5 == 0:
                writes.append(
                    {
                        "type": "entry",
                        "value": {"id": 1000 + turn, "conversationId": 4, "kind": "m"},
                    }
                )
            task = draw.choice(TASK_IDS)
            writes.append(_task(task, draw.choice(["running", "terminal", "pending"]), turn))
            if turn % 7 == 0:
                writes.append(
                    {
                        "type": "submission",
                        "value": {
                            "id": 3000 + turn,
                            "conversationId": conversation,
                            "type": "input",
                            "status": "queued",
                        },
                    }
                )
            await storage.commit(writes, CTX)
        return storage.log.head()
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("list") / "store"
    return path, asyncio.run(_build(path))


def _list(
    path: Path, kind: str, where: list[str], use_index: bool = True, **options: Any
) -> list[Any]:
    async def run() -> list[Any]:
        filters = [parse_where(kind, text) for text in where]
        return [
            record
            async for record in list_records(path, kind, filters, use_index=use_index, **options)
        ]

    return asyncio.run(run())


def _by_hand(records: list[Any], field: str, value: Any) -> list[Any]:
    def at(record: Any) -> Any:
        for name in field.split("."):
            if not isinstance(record, dict) or name not in record:
                return KeyError
            record = record[name]
        return record

    return [r for r in records if type(at(r)) is type(value) and at(r) == value]


FILTERS: list[tuple[str, list[str]]] = [
    ("tasks", ["state.status=running"]),
    ("tasks", ["state.status=terminal", "kind=agent"]),
    ("tasks", ["state.status=pending", "background=true"]),
    ("tasks", ["state.status=nosuch"]),
    ("tasks", ["conversationId=2"]),
    ("submissions", ["status=queued"]),
    ("submissions", ["status=placed"]),
    ("entries", ["conversationId=4"]),
    ("entries", ["conversationId=1", "kind=n"]),
    ("entries", ["conversationId=99"]),
    ("entries", ["data=1"]),
    ("conversations", ["owner.taskId=101"]),
    ("conversations", ["owner.conversationId=2"]),
    ("conversations", ["parent.conversationId=1"]),
    ("documents", ["kind=notes"]),
]


@pytest.mark.parametrize(("kind", "where"), FILTERS)
def test_an_index_and_a_scan_give_the_same_records(
    store: tuple[Path, int], kind: str, where: list[str]
) -> None:
    path, head = store
    for as_of in (None, head // 2, 3):
        indexed = _list(path, kind, where, as_of=as_of)
        scanned = _list(path, kind, where, use_index=False, as_of=as_of)
        assert indexed == scanned, (kind, where, as_of)
        expected = _list(path, kind, [], as_of=as_of)
        for text in where:
            field = text.partition("=")[0]
            expected = _by_hand(expected, field, parse_where(kind, text).value)
        assert indexed == expected, (kind, where, as_of)
        assert _list(path, kind, where, limit=2, as_of=as_of) == expected[:2]


def test_what_each_kind_lists(store: tuple[Path, int]) -> None:
    path, head = store
    entries = _list(path, "entries", [])
    assert len(entries) == 40 + 5 and len({e["id"] for e in entries}) == len(entries), (
        "each entry once"
    )
    assert [e["id"] for e in _list(path, "entries", ["conversationId=4"])] == [
        1015,
        1020,
        1025,
        1030,
        1035,
    ]
    assert {c["id"] for c in _list(path, "conversations", [])} == {1, 2, 3, 4, 5}
    assert [c["id"] for c in _list(path, "conversations", ["owner.taskId=101"])] == [5]
    assert len(_list(path, "tasks", [])) == len(TASK_IDS)
    statuses = {t["id"]: t["state"]["status"] for t in _list(path, "tasks", [])}
    then = {t["id"]: t["state"]["status"] for t in _list(path, "tasks", [], as_of=2)}
    assert set(then.values()) == {"pending"} and then != statuses, "as of a point: the tasks then"
    assert _list(path, "tasks", [], as_of=head) == _list(path, "tasks", [])


def test_values_compare_as_json_else_as_strings_strictly(store: tuple[Path, int]) -> None:
    path, _ = store

    def data(value: str) -> list[Any]:
        return [e["data"] for e in _list(path, "entries", [f"data={value}"])]

    assert data("1") and all(type(d) is int and d == 1 for d in data("1")), "1 is not true, nor 1.0"
    assert data('"1"') and set(data('"1"')) == {"1"}
    assert data("true") and set(data("true")) == {True}
    assert data("null") and set(data("null")) == {None}
    assert data('{"n": 1}') == [{"n": 1}] * len(data('{"n": 1}')) and data('{"n":1}')
    assert data("[1]") and data("[true]") == []
    assert data("1.5") and data("two") == [], "not JSON: the string itself"
    assert [e["kind"] for e in _list(path, "entries", ["kind=m"])] == ["m"] * len(
        _list(path, "entries", ["kind=m"])
    )
    assert _list(path, "entries", ["data.n=1"]) == _list(path, "entries", ['data={"n":1}'])


def test_the_formats(capsys: pytest.CaptureFixture[str], store: tuple[Path, int]) -> None:
    path, _ = store
    code, out, err = call(
        capsys, "list", path, "entries", "--where", "conversationId=1", "--format", "json"
    )
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == _list(
        path, "entries", ["conversationId=1"]
    )
    code, out, err = call(capsys, "list", path, "tasks", "--format", "csv", "--limit", "3")
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == record_fields("tasks") and len(rows) == 4
    first = dict(zip(rows[0], rows[1], strict=True))
    task = _list(path, "tasks", [], limit=1)[0]
    assert json.loads(first["state"]) == task["state"] and first["kind"] == task["kind"]
    assert first["background"] in ("true", "false") and first["owner"] == ""
    code, out, err = call(
        capsys, "list", path, "entries", "--columns", "id,conversationId,kind,data"
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["id", "conversationId", "kind", "data"]
    assert all(len(line) < 120 for line in lines), "long values are cut"
    assert any(line.endswith("x" * 39 + "…") for line in lines)
    assert any(line.endswith("two\\nlines") for line in lines), "one line per record"
    width = len(lines[1].split()[0])
    ids = [line[:width] for line in lines[2:]]
    assert all(cell[-1].isdigit() for cell in ids) and " 200" in ids, "numbers right-aligned"
    kinds = [line.split()[2] for line in lines[2:]]
    assert set(kinds) == {"m", "n"}
    code, out, _ = call(capsys, "list", path, "tasks", "--where", "input.n=104")
    assert out.splitlines()[0].split()[-1] == "input.n" and len(out.splitlines()) == 3
    code, out, _ = call(capsys, "list", path, "tasks", "--as-of", "2000-01-01", "--format", "json")
    assert code == 0 and out == "", "as of a time before the first commit: no tasks yet"
    code, out, _ = call(capsys, "list", path, "tasks", "--as-of", "9999-01-01", "--format", "json")
    assert [json.loads(line) for line in out.splitlines()] == _list(path, "tasks", [])
    code, out, _ = call(capsys, "list", path, "tasks", "--where", "state.status=nosuch")
    assert code == 0 and len(out.splitlines()) == 2, "no records: the header alone"


def _digest(path: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.iterdir())
        if p.name != "lock.mdb"
    }


def test_bad_input_is_exit_2_with_a_message_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], store: tuple[Path, int], tmp_path: Path
) -> None:
    path, head = store
    before = _digest(path)
    cases: list[tuple[tuple[object, ...], str]] = [
        (("tusks",), "'tusks' is not a kind of record: conversation, entry, task, submission"),
        (
            ("tasks", "--where", "state.stat=x"),
            "unknown field 'state.stat' of state; its fields: status, checkpoint",
        ),
        (
            ("tasks", "--where", "nosuch=1"),
            "unknown field 'nosuch' of tasks; its fields: id, conversationId, kind",
        ),
        (
            ("entries", "--where", "kind.x=1"),
            "field 'kind.x': kind is a plain value, it has no fields",
        ),
        (("entries", "--where", "kind"), "--where 'kind' is not FIELD=VALUE"),
        (("entries", "--where", "=1"), "is not FIELD=VALUE"),
        (("entries", "--limit", "-1"), "argument --limit"),
        (("entries", "--as-of", "soon"), "argument --as-of"),
        (("entries", "--as-of", str(head + 1)), f"from 0 to {head}"),
        (("entries", "--format", "xml"), "invalid choice: 'xml'"),
    ]
    for args, says in cases:
        code, out, err = call(capsys, "list", path, *args)
        assert code == 2 and out == "" and says in err, (args, code, out, err)
    code, out, err = call(capsys, "list", tmp_path / "none", "tasks")
    assert code == 2 and out == "" and not (tmp_path / "none").exists(), err
    assert _digest(path) == before
    assert set(LIST_KINDS) == {"conversations", "entries", "tasks", "submissions", "documents"}


def test_a_table_holds_cells_not_values(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A table waits for every row to size its columns; it keeps each row as its cut cells, so
    listing 3,000 entries of 10 KB holds a page of entries and some hundred bytes a row, not
    every entry."""

    import tracemalloc

    path = tmp_path / "big"

    async def build() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for first in range(0, 3000, 100):
                writes = [
                    {
                        "type": "entry",
                        "value": {
                            "id": 10 + n,
                            "conversationId": 1,
                            "kind": "m",
                            "data": {"text": f"{n} " + "y" * 10_000},
                        },
                    }
                    for n in range(first, first + 100)
                ]
                await storage.commit(writes, CTX)
        finally:
            await storage.close()

    asyncio.run(build())
    tracemalloc.start()
    try:
        code, out, err = call(capsys, "list", path, "entries")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 0, err
    assert len(out.splitlines()) == 3002
    assert peak < 15_000_000, f"peak {peak:,} bytes (the entries themselves take 30 MB)"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("demo")
    make_demo(directory)
    return directory / "demo-store"


def test_a_table_reads_as_a_person_scans_it(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries show what their messages say, cut at the terminal's width; the columns no record
    fills are left out; times are ISO 8601 as every command prints them."""

    monkeypatch.setenv("COLUMNS", "72")
    code, out, err = call(capsys, "list", demo, "entries")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["id", "conversationId", "kind", "text"], (
        "head, byTaskId, data: empty"
    )
    assert "user: What does the durable log store?" in out
    assert all(len(line) <= 72 for line in lines) and any(line.endswith("…") for line in lines)
    code, out, err = call(capsys, "list", demo, "tasks")
    header, _, first, *_ = out.splitlines()
    assert header.split()[-1] == "endedAt" and "startedAt" not in header
    ended = first.split()[-1]
    assert ended.startswith("20") and ended.endswith("Z") and "T" in ended, first


def test_columns_are_chosen_and_either_spelling_of_a_kind_lists_the_same(
    demo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = call(
        capsys, "list", demo, "task", "--columns", "id,endedAt,state.outcome.status,owner"
    )
    assert code == 0, err
    assert out.splitlines()[0].split() == ["id", "endedAt", "state.outcome.status", "owner"]
    assert "completed" in out
    assert (
        call(capsys, "list", demo, "tasks", "--json")[1]
        == (call(capsys, "list", demo, "task", "--format", "json")[1])
    )
    code, out, _ = call(capsys, "list", demo, "entry", "--columns", "id,text", "--format", "csv")
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["id", "text"] and rows[1][1].startswith("user: ")
    code, out, _ = call(capsys, "list", demo, "submissions")
    assert out.splitlines()[0].split()[:3] == ["id", "conversationId", "type"], "no rows: all"
