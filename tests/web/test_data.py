"""Every page as data, over plain HTTP on a real ``serve``: each list page's path plus ``.json``
(its rows and the next page's address) and ``.csv`` (a header and a line per row), each record
page's plus ``.json``; the same filters, paging and refusals as the HTML page, nothing written."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage
from pi_durable_lmdb.web import data, views

from tests.support.served import get, index_state, serve, store_files

TASKS = 250
"""More than a page (``lists.PAGE``) of tasks: the JSON's ``next`` link is followed."""


async def _build(path: Path) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit(
            [
                {"type": "conversation", "value": {"id": 1}},
                {
                    "type": "document.create",
                    "record": {"id": 2, "kind": "notes", "scope": {"kind": "session"}},
                    "content": {"kind": "base", "version": 1, "value": {"text": 'a, "b"\nc'}},
                },
                {
                    "type": "entry",
                    "value": {
                        "id": 3,
                        "conversationId": 1,
                        "kind": "message",
                        "model": [{"role": "user", "content": "hello"}],
                    },
                },
            ],
            CTX,
        )
        for id in range(100, 100 + TASKS):
            status = "pending" if id % 3 else "terminal"
            await storage.commit(
                [
                    {
                        "type": "task",
                        "value": {
                            "id": id,
                            "conversationId": 1,
                            "kind": "answer" if id % 2 else "review",
                            "version": 1,
                            "input": {"n": id, "text": '=1+1, "quoted"'},
                            "background": False,
                            "abortRequested": False,
                            "state": {"status": status},
                        },
                    }
                ],
                CTX,
            )
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    path = tmp_path_factory.mktemp("data") / "store"
    asyncio.run(_build(path))
    with serve(path) as running:
        running.path = path
        index_state(running.url, lambda state: state["ready"])  # the view's one write, done
        yield running


def _json(served: Any, path: str) -> Any:
    status, body, headers = get(served.url + path)
    assert status == 200, (path, status, body[:300])
    assert headers["Content-Type"].startswith("application/json")
    return json.loads(body)


def _html_tasks(served: Any, query: str) -> list[int]:
    body = get(served.url + "/tasks?" + query)[1]
    return [int(id) for id in re.findall(r'<tr data-task="(\d+)"', body)]


def test_a_list_as_json_pages_by_its_next_link_with_the_same_filters(served: Any) -> None:
    seen: list[int] = []
    address: str | None = "/tasks.json?status=pending"
    pages = 0
    while address is not None:
        page = _json(served, address)
        seen += [row["id"] for row in page["rows"]]
        assert all(row["state"]["status"] == "pending" for row in page["rows"])
        address = page["next"]
        pages += 1
        assert pages < 10
        if address is not None:
            assert address.startswith("/tasks.json?") and "status=pending" in address
    expected = [id for id in range(100, 100 + TASKS) if id % 3]
    assert seen == expected and pages == 2
    first = _json(served, "/tasks.json?status=pending")
    assert [row["id"] for row in first["rows"]] == _html_tasks(served, "status=pending")
    assert len(first["rows"]) == views.PAGE and first["head"] == 1 + TASKS


def test_a_list_as_csv_has_a_header_and_a_line_per_row_nested_values_as_json(
    served: Any,
) -> None:
    status, body, headers = get(served.url + "/tasks.csv?kind=review&status=terminal")
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(body)))
    assert [int(row["id"]) for row in rows] == _html_tasks(served, "kind=review&status=terminal")
    assert rows and all(json.loads(row["state"]) == {"status": "terminal"} for row in rows)
    assert json.loads(rows[0]["input"])["text"] == '=1+1, "quoted"'
    assert rows[0]["background"] == "false" and rows[0]["kind"] == "review"
    documents = list(csv.DictReader(io.StringIO(get(served.url + "/documents.csv")[1])))
    assert [row["id"] for row in documents] == ["2"] and json.loads(documents[0]["scope"]) == {
        "kind": "session"
    }


def test_every_list_and_record_answers_as_data_and_as_of_a_point(served: Any) -> None:
    assert [row["id"] for row in _json(served, "/tasks.json?as_of=3")["rows"]] == [100, 101]
    assert _json(served, "/tasks.json?as_of=3")["asOf"] == 3
    assert [row["id"] for row in _json(served, "/conversations.json?after=0")["rows"]] == [1]
    assert [row["id"] for row in _json(served, "/documents.json?kind=notes")["rows"]] == [2]
    assert _json(served, "/documents.json?kind=other")["rows"] == []
    log = _json(served, "/log.json")
    assert [row["seq"] for row in log["rows"]] == list(range(1 + TASKS, 1 + TASKS - views.PAGE, -1))
    older = _json(served, log["next"])
    assert older["rows"][0]["seq"] == 1 + TASKS - views.PAGE and "before=" in older["next"]
    assert [row["seq"] for row in _json(served, "/log.json?kind=entry")["rows"]] == [1]
    assert get(served.url + "/log.csv")[1].startswith("seq,when,summary,links\r\n")
    conversation = _json(served, "/conversations/1.json")
    assert conversation["record"] == {"id": 1} and conversation["nodes"][0]["entry"]["id"] == 3
    assert len(conversation["tasks"]) == TASKS
    document = _json(served, "/documents/2.json")
    assert document["shown"]["value"] == {"text": 'a, "b"\nc'} and document["at"] == 1 + TASKS
    assert _json(served, "/documents/2.json?as_of=1")["at"] == 1
    assert _json(served, "/log/1.json")["seq"] == 1
    assert _json(served, "/index.json")["headSeq"] == 1 + TASKS
    body = get(served.url + "/tasks?status=pending")[1]  # the HTML page links to its data
    assert 'href="/tasks.json?status=pending"' in body and 'id="as-csv"' in body
    body = get(served.url + "/log?kind=entry&kind=task&token=")[1]  # every kind, never a token
    assert 'href="/log.csv?kind=entry&amp;kind=task"' in body
    assert 'href="/index.json?as_of=2"' in get(served.url + "/?as_of=2")[1]


def test_the_overview_honours_as_of(served: Any) -> None:
    point = _json(served, "/index.json?as_of=3")
    assert point["asOf"] == 3 and point["head"] == 1 + TASKS and point["committedAt"] > 0
    assert (point["conversations"], point["tasks"], point["documents"]) == (1, 2, 1)
    assert point["capped"] == []
    status, body, _ = get(served.url + "/?as_of=3")
    assert status == 200 and 'id="point"' in body and 'id="as-of">3<' in body
    assert re.search(r'id="count-tasks">2<', body) and 'id="history-back"' in body
    status, body, _ = get(served.url + "/?as_of=tomorrow")
    assert status == 400 and "as_of: " in body
    now = get(served.url + "/")[1]
    assert 'id="point"' not in now and f'id="head-seq">{1 + TASKS}<' in now


BAD = [
    ("/tasks.json?status=done", "status="),
    ("/tasks.json?after=-1", "after: "),
    ("/conversations.json?as_of=%D9%A3", "as_of: "),
    ("/documents.json?scope=conversation:one", "scope="),
    ("/log.json?kind=bogus", "kind: "),
    ("/log.json?before=%C2%B2", "before: "),
    ("/conversations/1.json?before=x", "before: "),
    ("/documents/2.json?as_of=99999", "as_of: "),
    ("/index.json?as_of=tomorrow", "as_of: "),
]


@pytest.mark.parametrize("path, named", BAD, ids=[path for path, _ in BAD])
def test_bad_input_to_a_data_page_is_a_400_naming_it_and_writes_nothing(
    served: Any, path: str, named: str
) -> None:
    before = store_files(served.path)
    status, body, headers = get(served.url + path)
    assert status == 400 and headers["Content-Type"].startswith("application/json"), body
    assert named in json.loads(body)["error"]
    csv_path = path.replace(".json", ".csv", 1)
    if csv_path.split("?")[0] in ("/tasks.csv", "/conversations.csv", "/documents.csv", "/log.csv"):
        # a list: its CSV refuses the same way, as text
        status, body, headers = get(served.url + csv_path)
        assert status == 400 and headers["Content-Type"].startswith("text/plain")
        assert named in body
    assert store_files(served.path) == before


def test_a_missing_record_as_data_is_a_404_in_json(served: Any) -> None:
    for path, message in [
        ("/conversations/9.json", "No conversation 9."),
        ("/documents/9.json", "No document 9."),
    ]:
        status, body, _ = get(served.url + path)
        assert status == 404 and json.loads(body) == {"error": message}
    assert get(served.url + "/tasks/1.json")[0] == 404
    assert get(served.url + "/conversations/1.csv")[0] == 404  # a record page has JSON only


def test_the_csv_table_keeps_every_key_and_every_string_as_written() -> None:
    rows = [
        {"id": 1, "text": 'a,"b"\r\nc', "nested": {"x": [1, None]}},
        {"id": 2, "extra": True, "text": "lone \udc00", "nested": None},
        "a bare value",
    ]
    lines = list(csv.reader(io.StringIO(data.table(rows), newline="")))
    assert lines[0] == ["id", "text", "nested", "extra", "value"]
    assert lines[1] == ["1", 'a,"b"\r\nc', '{"x":[1,null]}', "", ""]
    assert lines[2] == ["2", "lone \udc00", "", "true", ""]
    assert lines[3] == ["", "", "", "", "a bare value"]
