"""Every link of the web view answers: a crawl of the demo store's pages, now and at every point
of its history, follows each same-origin address a page holds and fails on any 4xx or 5xx,
naming the page that linked to it. The history control links only to points at which the thing
on show existed, and each kind of record answers at its own path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urljoin, urlsplit

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage
from pi_durable_lmdb.web import steps
from pi_durable_lmdb.web.app import make_app

from tests.support.served import build_store

pytestmark = pytest.mark.filterwarnings("error::aiohttp.web.NotAppKeyWarning")
"""The app keeps nothing under a plain string key (aiohttp warns of each such key once)."""

MAX_REQUESTS = 4000
"""The crawl's bound: the demo store's pages at all its points take about 1,500."""
NOT_FOLLOWED = ("/log/events", "/static/")
"""The live log's stream never ends; the static files are the app's own."""


class _Hrefs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value is not None:
                self.found.append(value)


def _links(page: str, body: str) -> list[str]:
    """The same-origin addresses ``body`` (the page at ``page``) links to, without fragments."""

    parser = _Hrefs()
    parser.feed(body)
    found = []
    for href in parser.found:
        target = urlsplit(urljoin("http://view" + page, href))
        if target.netloc != "view" or target.path.startswith(NOT_FOLLOWED):
            continue
        found.append(target.path + (f"?{target.query}" if target.query else ""))
    return found


def _same_page(address: str) -> str:
    """An address with its empty parameters left out, the rest in order: two links that differ
    only so are the same page, requested once."""

    parts = urlsplit(address)
    kept = sorted((key, value) for key, value in parse_qsl(parts.query) if value)
    return parts.path + ("?" + urlencode(kept) if kept else "")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("links") / "store"
    return path, build_store(path)


@pytest.fixture
async def client(store: tuple[Path, dict[str, Any]]) -> AsyncIterator[ClientSession]:
    server = TestServer(make_app(str(store[0])), host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession(str(server.make_url(""))) as session:
            yield session
    finally:
        await server.close()


async def _head(path: Path) -> int:
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        return storage.log.head()
    finally:
        await storage.close()


@pytest.mark.slow  # about 1,450 requests (about 5 s)
async def test_every_link_of_every_page_at_every_point_answers(
    store: tuple[Path, dict[str, Any]], client: ClientSession
) -> None:
    head = await _head(store[0])
    starts = ["/", "/conversations", "/documents", "/tasks", "/log", "/audit", "/search?q=writer"]
    queue = [(start, "(start)") for start in starts]
    queue += [
        (f"{start}{'&' if '?' in start else '?'}as_of={seq}", "(start)")
        for seq in range(head + 1)
        for start in starts
        if start != "/log"
    ]
    seen = {_same_page(address) for address, _ in queue}
    failures: list[str] = []
    requests = 0
    while queue and requests < MAX_REQUESTS:
        address, linked_from = queue.pop(0)
        requests += 1
        async with client.get(address, allow_redirects=True) as response:
            body = await response.text()
            if response.status >= 400:
                failures.append(f"{address} -> {response.status} (linked from {linked_from})")
                continue
            if "text/html" not in response.headers.get("Content-Type", ""):
                continue
        for target in _links(address, body):
            if _same_page(target) not in seen:
                seen.add(_same_page(target))
                queue.append((target, address))
    assert not failures, "\n".join(failures)
    print(f"{requests} requests")
    assert not queue, f"the crawl stopped at {MAX_REQUESTS} requests with {len(queue)} to go"


async def _walk(client: ClientSession, address: str, link_id: str) -> list[int]:
    """The points a page's ``link_id`` link leads through, followed until it is gone: each page
    on the way must answer."""

    points = []
    next: str | None = address
    while next is not None:
        async with client.get(next) as response:
            assert response.status == 200, (next, await response.text())
            body = await response.text()
        found = parse_qs(urlsplit(next).query).get("as_of")
        points.append(int(found[0]) if found else -1)
        next = _link(next, body, link_id)
    return points


def _link(page: str, body: str, link_id: str) -> str | None:
    """The address of the link with id ``link_id`` on ``body`` (the page at ``page``)."""

    class Finder(HTMLParser):
        found: str | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            values = dict(attrs)
            if values.get("id") == link_id and values.get("href"):
                self.found = values["href"]

    parser = Finder()
    parser.feed(body)
    if parser.found is None:
        return None
    target = urlsplit(urljoin("http://view" + page, parser.found))
    return target.path + "?" + target.query


async def _changes(path: Path, seen: str) -> list[int]:
    """The points at which ``/conversations/N`` or ``/documents/N`` (``seen``) changed, read
    through the store's own ``as_of`` views: its JSON at each point, kept where it differs."""

    storage = await LmdbStorage.open(path, readonly=True)
    try:
        kind, id = seen.strip("/").split("/")
        points, last = [], None
        for seq in range(storage.log.head() + 1):
            view = await storage.as_of(seq)
            if kind == "conversations":
                found: Any = await view.conversation(int(id), CTX)
                if found is not None:
                    entries = await view.scan_entries(
                        {"conversationId": int(id)}, 10_000, None, CTX
                    )
                    tasks = await view.scan_tasks({"conversationId": int(id)}, 10_000, None, CTX)
                    forks = await view.scan_conversations({}, 10_000, None, CTX)
                    found = [found, entries["items"], tasks["items"]] + [
                        fork
                        for fork in forks["items"]
                        if fork.get("parent", {}).get("conversationId") == int(id)
                    ]
            else:
                found = await view.document(int(id), "current", CTX)
            if found is not None and found != last:
                points.append(seq)
            last = found
        return points
    finally:
        await storage.close()


@pytest.mark.parametrize("seen", ["/conversations/1", "/conversations/22", "/documents/5"])
@pytest.mark.parametrize("scan", [steps.SCAN, 2])
async def test_the_history_control_steps_through_the_points_a_record_changed(
    store: tuple[Path, dict[str, Any]],
    client: ClientSession,
    seen: str,
    scan: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Back from now, a record's page steps to each earlier point at which it changed and stops
    at its creation; forward from its creation, through the same points. With a scan of the log
    shorter than the record's life, every step still lands where the record existed."""

    monkeypatch.setattr(steps, "SCAN", scan)
    changes = await _changes(store[0], seen)
    back = await _walk(client, seen, "history-back")
    forward = await _walk(client, f"{seen}?as_of={changes[0]}", "history-forward")
    if scan >= len(changes) * 2:
        assert back[1:] == changes[-2::-1], back  # now is the last change; then each one before
        assert forward == changes, forward
    assert back[-1] >= changes[0] and forward[0] == changes[0]
    assert back[1:] == sorted(set(back[1:]), reverse=True) and forward == sorted(set(forward))


@pytest.mark.parametrize(
    "address, landed",
    [
        ("/tasks/3", "/conversations/1"),
        ("/tasks/3?as_of=3", "/conversations/1?as_of=3"),
        ("/tasks/3.json", "/records/task/3"),
        ("/entries/4098", "/conversations/22"),
        ("/entries/2.json?as_of=2", "/records/entry/2?as_of=2"),
    ],
)
async def test_each_kind_answers_at_its_own_path(
    client: ClientSession, address: str, landed: str
) -> None:
    async with client.get(address, allow_redirects=False) as response:
        assert response.status == 303
        location = response.headers["Location"]
    assert location.split("#")[0] == landed
    async with client.get(location) as response:
        assert response.status == 200


@pytest.mark.parametrize(
    "address, said",
    [
        ("/tasks/999", "No task 999."),
        ("/entries/4098?as_of=14", "No entry 4098 as of log sequence 14."),
        ("/submissions/1", "No submission 1."),
    ],
)
async def test_a_record_not_there_at_its_own_path_is_a_404_naming_it(
    client: ClientSession, address: str, said: str
) -> None:
    async with client.get(address) as response:
        assert response.status == 404 and said in await response.text()


async def test_a_submission_leads_to_its_row_on_its_conversations_page(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        submission = {"id": 2, "conversationId": 1, "type": "input", "status": "queued"}
        await storage.commit([{"type": "submission", "value": submission}], CTX)
    finally:
        await storage.close()
    server = TestServer(make_app(str(path)), host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession(str(server.make_url(""))) as session:
            async with session.get("/submissions/2", allow_redirects=False) as response:
                assert response.status == 303
                assert response.headers["Location"] == "/conversations/1#submission-2"
            async with session.get("/submissions/2") as response:
                assert response.status == 200 and 'id="submission-2"' in await response.text()
            async with session.get("/submissions/2.json") as response:
                assert response.status == 200 and (await response.json())["status"] == "queued"
            async with session.get("/submissions/2?as_of=1") as response:
                assert response.status == 404
                assert "No submission 2 as of log sequence 1." in await response.text()
    finally:
        await server.close()
