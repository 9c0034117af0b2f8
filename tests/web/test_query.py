"""The web view's inputs: every query parameter (and number in a path) parsed one way, a bad one
a 400 naming it; one request's error never closes the handle other requests read through; a
conversation page reaches every entry; a live-log client's backlog never holds the server."""

from __future__ import annotations

import asyncio
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage
from pi_durable_lmdb.web import views
from pi_durable_lmdb.web.app import make_app
from pi_durable_lmdb.web.respond import STORE

from tests.support.audit_writer_child import batch
from tests.support.served import get, serve

HUGE = "7" * 5000
ENTRIES = 2500
"""More than a page (``views.ENTRY_CAP``) of entries in conversation 1."""


async def _build(path: Path, commits: int = 12) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        for n in range(commits):
            await storage.commit(batch(n), CTX)
    finally:
        await storage.close()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("query") / "store"
    asyncio.run(_build(path))
    return path


async def _started(path: Path, **routes: Any) -> tuple[TestServer, ClientSession, web.Application]:
    app = make_app(str(path))
    for route, handler in routes.items():
        app.router.add_get(f"/test/{route}", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, ClientSession(str(server.make_url(""))), app


BAD = [
    ("/conversations?after=%C2%B2", "after"),
    ("/conversations?after=-1", "after"),
    (f"/conversations?as_of={HUGE}", "as_of"),
    ("/conversations?as_of=%D9%A3", "as_of"),
    ("/documents?after=%D9%A3", "after"),
    ("/log?before=%C2%B2", "before"),
    (f"/log?before={HUGE}", "before"),
    ("/log?conversation=%D9%A3", "conversation"),
    ("/log?since=yesterday", "since"),
    ("/log?until=%D9%A2%D9%A0%D9%A2%D9%A6-01-01", "until"),
    ("/log?kind=bogus", "kind"),
    ("/log/events?after=%C2%B2", "after"),
    ("/conversations/1?before=%C2%B2", "before"),
    (f"/conversations/{HUGE}", "id"),
    (f"/documents/{HUGE}", "id"),
    (f"/log/{HUGE}", "seq"),
    (f"/records/task/{HUGE}", "id"),
    ("/records/task/10?as_of=%C2%B2", "as_of"),
]


@pytest.mark.parametrize("url, name", BAD, ids=[url[:60] for url, _ in BAD])
async def test_a_bad_parameter_is_a_400_naming_it_and_the_store_stays_open(
    store: Path, url: str, name: str
) -> None:
    server, client, app = await _started(store)
    try:
        async with client.get("/conversations") as warm:
            assert warm.status == 200
        handle = app[STORE]._storage
        async with client.get(url) as response:
            text = await response.text()
            assert response.status == 400, (response.status, text[:300])
            assert f"{name}: " in text, text[:500]
            assert len(text) < 20_000, "a huge value is not echoed whole"
        assert app[STORE]._storage is handle, "a bad request never closes the shared handle"
        async with client.get("/conversations") as again:
            assert again.status == 200
    finally:
        await client.close()
        await server.close()


async def test_one_requests_failure_never_closes_the_handle_another_is_reading(store: Path) -> None:
    """A request whose read fails (a 503) gives the shared handle up; requests still reading
    through it finish their reads on it, and it is closed when the last of them ends."""

    reading, failed = asyncio.Event(), asyncio.Event()

    async def slow_reader(request: web.Request) -> web.Response:
        storage = await request.app[STORE].storage()
        reading.set()
        await failed.wait()  # another request fails meanwhile
        found = await storage.conversation(1, CTX)  # the handle this request took is still open
        return web.Response(text=f"conversation {found['id']}")

    async def failing(request: web.Request) -> web.Response:
        await request.app[STORE].storage()
        raise OSError("the disk went away")

    server, client, app = await _started(
        store, slow=slow_reader, fail=failing
    )  # beside the view's own routes
    try:
        slow = asyncio.ensure_future(client.get("/test/slow"))
        await asyncio.wait_for(reading.wait(), 10)
        held = app[STORE]._storage
        assert held is not None
        async with client.get("/test/fail") as response:
            assert response.status == 503 and "the disk went away" in await response.text()
        assert app[STORE]._storage is None and not held.log.env.closed, (
            "retired, not closed under the reader"
        )
        failed.set()
        async with await asyncio.wait_for(slow, 10) as answer:
            assert answer.status == 200 and await answer.text() == "conversation 1"
        assert held.log.env.closed, "closed once its last reader ended"
        async with client.get("/conversations") as after:
            assert after.status == 200, (
                "the next request opens the store afresh",
                await after.text(),
            )
    finally:
        await client.close()
        await server.close()


def test_bad_and_good_requests_at_once_against_a_served_store(store: Path) -> None:
    """The reproduction: malformed numbers among ordinary requests, from several threads, against
    ``durable-log serve``: each bad one a 400, every good one a 200."""

    bad = ["/conversations?after=%C2%B2", f"/conversations?as_of={HUGE}", "/log?before=%C2%B2"]
    good = ["/conversations", "/conversations/1", "/documents", "/log", "/records/task/10"]
    answers: list[tuple[str, int]] = []

    with serve(store) as served:

        def hammer(paths: list[str]) -> None:
            for _ in range(8):
                for path in paths:
                    answers.append((path, get(served.url + path)[0]))

        threads = [
            threading.Thread(target=hammer, args=(paths,)) for paths in (bad, good, good, bad, good)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    assert len(answers) == 8 * (3 * len(good) + 2 * len(bad))
    assert {status for path, status in answers if path in bad} == {400}
    assert {status for path, status in answers if path in good} == {200}


# ── a long conversation ───────────────────────────────────────────────────────


@pytest.fixture(scope="module")
def long_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    async def build(path: Path) -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for start in range(2, ENTRIES + 2, 500):
                entries = [
                    {
                        "type": "entry",
                        "value": {
                            "id": id,
                            "conversationId": 1,
                            "kind": "message",
                            "data": {"n": f"entry-{id}"},
                        },
                    }
                    for id in range(start, min(start + 500, ENTRIES + 2))
                ]
                await storage.commit(entries, CTX)
        finally:
            await storage.close()

    path = tmp_path_factory.mktemp("long") / "store"
    asyncio.run(build(path))
    return path


def _shown(html: str) -> list[int]:
    return [int(n) for n in re.findall(r'data-entry="(\d+)"', html)]


def _links(html: str) -> dict[str, str]:
    return {
        rel: href.replace("&amp;", "&")
        for href, rel in re.findall(r'<a href="([^"]+)" rel="(\w+)">', html)
    }


async def test_a_conversation_page_pages_through_every_entry_and_reaches_the_newest(
    long_store: Path,
) -> None:
    server, client, _ = await _started(long_store)
    try:

        async def page(url: str) -> tuple[list[int], dict[str, str]]:
            async with client.get(url) as response:
                html = await response.text()
                assert response.status == 200, html[:300]
            return _shown(html), _links(html)

        first, links = await page("/conversations/1")
        assert first == list(range(2, 2 + views.ENTRY_CAP)), (
            "the first page: the oldest entries, oldest first"
        )
        assert set(links) == {"next", "last"}
        seen = list(first)
        while "next" in links:
            shown, links = await page(links["next"])
            seen += shown
        assert seen == list(range(2, ENTRIES + 2)), "newer pages reach every entry, once each"
        assert set(links) == {"first", "prev"}

        newest, links = await page((await page("/conversations/1"))[1]["last"])
        assert newest == list(range(ENTRIES + 2 - views.ENTRY_CAP, ENTRIES + 2)), (
            "the newest entries, on the last page"
        )
        assert set(links) == {"first", "prev"}
        back, links = await page(links["prev"])
        assert back == list(range(2, ENTRIES + 2 - views.ENTRY_CAP)) and set(links) == {
            "next",
            "last",
        }

        as_of, _ = await page("/conversations/1?as_of=3")  # a page as of an earlier point pages too
        assert as_of == list(range(2, 1002)), (
            "as of sequence 3: the entries of its first two batches"
        )
    finally:
        await client.close()
        await server.close()


# ── the live log's backlog ────────────────────────────────────────────────────

BACKLOG = 6000
"""Commits a client asks the live log to replay (``?after=0``)."""


@pytest.mark.slow
def test_a_long_backlog_replay_lets_other_requests_be_served_meanwhile(tmp_path: Path) -> None:
    """A client asks for the whole log, filtered to a conversation that only the last commit
    writes: the server reads and filters every commit before it sends anything, so the one event
    arrives when the replay ends. Requests made meanwhile are answered before it."""

    path = tmp_path / "store"

    async def build() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for id in range(3, BACKLOG + 1):
                await storage.commit(
                    [
                        {
                            "type": "entry",
                            "value": {"id": id, "conversationId": 1, "kind": "message"},
                        }
                    ],
                    CTX,
                )
            await storage.commit(
                [{"type": "conversation", "value": {"id": 2}}], CTX
            )  # sequence BACKLOG
        finally:
            await storage.close()

    asyncio.run(build())
    arrived: list[tuple[float, int]] = []
    opened = threading.Event()

    with serve(path) as served:

        def read_backlog() -> None:
            with urllib.request.urlopen(
                served.url + "/log/events?after=0&conversation=2", timeout=60
            ) as stream:
                opened.set()  # the headers: the replay starts now
                for raw in stream:
                    if raw.startswith(b"id: "):
                        arrived.append((time.monotonic(), int(raw[4:])))
                        return

        reader = threading.Thread(target=read_backlog)
        reader.start()
        assert opened.wait(60), "the live log answered"
        answered: list[float] = []
        while reader.is_alive() and len(answered) < 500:
            status, _, _ = get(served.url + "/favicon.ico")
            assert status == 204
            answered.append(time.monotonic())
        reader.join(60)
    assert [seq for _, seq in arrived] == [BACKLOG], "the one batch of conversation 2"
    done = arrived[0][0]
    assert sum(moment < done for moment in answered) >= 2, (
        "other requests were answered while the backlog was replayed"
    )
