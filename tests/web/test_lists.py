"""The lists an auditor finds things in, over plain HTTP on a real ``serve``: conversations by
newest activity with counts, tasks with status facets, documents by kind and scope, a long
document's versions in windows; and the pieces they are drawn from (the JSON diff, the links)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage
from pi_durable_lmdb.web import links
from pi_durable_lmdb.web.jsondiff import changes
from pi_durable_lmdb.web.lists import VERSIONS, version_window

from tests.support.served import get, index_state, serve

LONG = 3
"""The document with many versions."""


async def _build(path: Path) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit(
            [
                {"type": "conversation", "value": {"id": 1}},
                {"type": "conversation", "value": {"id": 2}},
                {
                    "type": "document.create",
                    "record": {
                        "id": LONG,
                        "kind": "log",
                        "scope": {"kind": "conversation", "conversationId": 1},
                    },
                    "content": {"kind": "base", "version": 1, "value": {"text": ""}},
                },
                {
                    "type": "document.create",
                    "record": {"id": 4, "kind": "settings", "scope": {"kind": "session"}},
                    "content": {"kind": "base", "version": 1, "value": {"turns": 0}},
                },
            ],
            CTX,
        )
        for n in range(95):
            await storage.commit(
                [
                    {
                        "type": "document.change",
                        "id": LONG,
                        "content": {
                            "kind": "delta",
                            "version": 1,
                            "ops": [["a", ["text"], f" line {n}"]],
                        },
                    }
                ],
                CTX,
            )
        for n in range(3):  # conversation 2 is active last, with 3 entries; 1 has 1
            await storage.commit(
                [
                    {
                        "type": "entry",
                        "value": {
                            "id": 10 + n,
                            "conversationId": 2,
                            "kind": "message",
                            "model": [{"role": "user", "content": "hi"}],
                        },
                    }
                ],
                CTX,
            )
        await storage.commit(
            [
                {
                    "type": "entry",
                    "value": {
                        "id": 20,
                        "conversationId": 1,
                        "kind": "message",
                        "model": [{"role": "user", "content": "x"}],
                    },
                }
            ],
            CTX,
        )
        await storage.commit(
            [
                {
                    "type": "entry",
                    "value": {
                        "id": 21,
                        "conversationId": 2,
                        "kind": "message",
                        "model": [{"role": "user", "content": "y"}],
                    },
                }
            ],
            CTX,
        )
        for id, kind, status in [
            (30, "answer", "pending"),
            (31, "answer", "running"),
            (32, "review", "pending"),
            (33, "answer", "terminal"),
        ]:
            await storage.commit(
                [
                    {
                        "type": "task",
                        "value": {
                            "id": id,
                            "conversationId": 1,
                            "kind": kind,
                            "version": 1,
                            "input": {},
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
    path = tmp_path_factory.mktemp("lists") / "store"
    asyncio.run(_build(path))
    with serve(path) as running:
        running.path = path
        yield running


def _rows(body: str, attribute: str) -> list[int]:
    return [int(id) for id in re.findall(rf'<tr {attribute}="(\d+)"', body)]


def test_conversations_by_newest_activity_with_counts_once_indexed(served: Any) -> None:
    index_state(served.url, lambda state: state["ready"])  # serve builds the index itself
    body = get(served.url + "/conversations")[1]
    assert _rows(body, "data-conversation") == [2, 1]
    counts = re.findall(r'<td class="n">(\d+)</td>', body)
    assert counts == ["4", "1"]
    assert (
        "data-conversation" not in get(served.url + "/conversations?after=0")[1]
    )  # by id on asking
    assert (
        "data-conversation" not in get(served.url + "/conversations?as_of=3")[1]
    )  # a past point: by id


def test_tasks_have_a_facet_per_status_and_filter_by_kind(served: Any) -> None:
    body = get(served.url + "/tasks")[1]
    facets = dict(re.findall(r'data-status="(\w+)"[^>]*>\w+ <b>(\d+)</b>', body))
    assert facets == {
        "pending": "2",
        "running": "1",
        "waiting": "0",
        "sleeping": "0",
        "completing": "0",
        "terminal": "1",
    }
    assert _rows(get(served.url + "/tasks?status=pending")[1], "data-task") == [30, 32]
    assert _rows(get(served.url + "/tasks?status=pending&kind=answer")[1], "data-task") == [30]
    assert _rows(get(served.url + "/tasks?as_of=3")[1], "data-task") == []
    status, body, _ = get(served.url + "/tasks?status=done")
    assert status == 400 and "status=&#39;done&#39;" in body


def test_documents_filter_by_kind_and_scope(served: Any) -> None:
    def shown(query: str) -> list[int]:
        return [
            int(id)
            for id in re.findall(
                r'<a href="/documents/(\d+)', get(served.url + "/documents?" + query)[1]
            )
        ]

    assert shown("") == [LONG, 4]
    assert shown("kind=settings") == [4]
    assert shown("scope=conversation:1") == [LONG]
    assert shown("scope=conversation:2") == []
    assert shown("scope=session&kind=log") == []
    assert get(served.url + "/documents?scope=conversation:one")[0] == 400


def test_a_long_documents_versions_are_listed_in_windows(served: Any) -> None:
    body = get(served.url + f"/documents/{LONG}")[1]
    listed = [int(n) for n in re.findall(r">version (\d+)</a>", body)]
    assert listed == list(range(96, 96 - VERSIONS, -1)) and "96 versions in all" in body
    older = re.search(r'id="versions-older" href="\?([^"]+)"', body).group(1)  # type: ignore[union-attr]
    body = get(served.url + f"/documents/{LONG}?" + older.replace("&amp;", "&"))[1]
    assert [int(n) for n in re.findall(r">version (\d+)</a>", body)] == list(
        range(56, 56 - VERSIONS, -1)
    )
    assert 'id="versions-newer"' in body


def test_the_window_holds_the_picked_version() -> None:
    versions = [{"number": n} for n in range(1, 1442)]
    shown, newer, older = version_window(versions, versions[99], None)
    assert (
        versions[99] in shown and len(shown) == VERSIONS and newer is not None and older is not None
    )
    shown, newer, older = version_window(versions, versions[-1], None)
    assert shown[0]["number"] == 1441 and newer is None and older == 1441 - VERSIONS
    shown, newer, older = version_window(versions[:3], None, None)
    assert [v["number"] for v in shown] == [3, 2, 1] and newer is None and older is None


def test_a_diff_names_each_changed_member_and_never_a_comma() -> None:
    before = {"answers": ["a"], "summary": "1 question answered", "gone": True}
    after = {"answers": ["a", "b"], "summary": "2 questions answered", "new": {"x": 1}}
    assert changes(before, after) == [
        ("+", '+ /answers/1: "b"'),
        ("-", '- /summary: "1 question answered"'),
        ("+", '+ /summary: "2 questions answered"'),
        ("-", "- /gone: true"),
        ("+", '+ /new: {"x":1}'),
    ]
    assert changes(["a", "c"], ["a", "b", "c"]) == [
        ("+", '+ /1: "b"')
    ]  # an insertion, not a cascade
    assert changes({"a/b": 1}, {"a/b": 2}) == [("-", "- /a~1b: 1"), ("+", "+ /a~1b: 2")]
    assert changes(1, True) == [("-", "- (the whole value): 1"), ("+", "+ (the whole value): true")]
    assert changes({"a": 1}, None) == []


def test_links_lead_where_each_record_lives() -> None:
    assert links.entry(5, 2, None) == "/conversations/2#entry-5"
    assert links.entry(5, 2, 9) == "/conversations/2?as_of=9#entry-5"
    assert (
        links.task(7, 2) == "/conversations/2#task-7" and links.task(7, None) == "/records/task/7"
    )
    assert links.scope({"kind": "conversation", "conversationId": 3}) == (
        "conversation 3",
        "/conversations/3",
    )
    assert links.scope({"kind": "session"}) is None
    assert [link.href for link in links.owner({"conversationId": 1, "taskId": 4})] == [
        "/conversations/1",
        "/conversations/1#task-4",
    ]
