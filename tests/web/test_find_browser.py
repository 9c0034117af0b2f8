"""The auditor's day in a real browser (Debian's headless Chromium through Playwright, ``serve`` as
a real process on a real store): find an entry by a word, follow it to its conversation, go back
in time from there; follow the ids of the log; read the overview's pictures; watch the live log
stay bounded while its head moves. ``serve`` builds the word index itself (its progress page is
tested in ``test_search_index``)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from tests.support.served import get, index_state
from tests.web.test_serve_browser import Page, browser, page, server, store  # noqa: F401 (the same fixtures)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_find_an_entry_by_a_word_follow_it_and_go_back_in_time(
    page: Page, store: dict[str, Any]
) -> None:
    index_state(page.base, lambda state: state["ready"])  # serve built it: the CLI only reads it
    built = _cli("search", str(store["path"]), "killed", "--json")
    assert built.returncode == 0, built.stderr
    expected = json.loads(built.stdout)["entries"]
    assert [hit["roles"] for hit in expected] == [["assistant"], ["user"]]
    page.open("/")
    page.page.locator("#find-q").fill("Killed")
    page.page.locator("#find-q").press("Enter")
    page.page.wait_for_url(re.compile(r"/search\?q=Killed$"))
    hits = page.page.locator("#entry-hits li")
    assert hits.count() == 2
    assert hits.nth(0).locator("mark").all_inner_texts() == ["killed"]
    assert hits.nth(1).locator(".role").inner_text().lower() == "user"
    asked = expected[1]  # the user's question
    hits.nth(1).locator("a.hit").click()
    page.page.wait_for_url(
        re.compile(rf"/conversations/{asked['conversationId']}#entry-{asked['id']}$")
    )
    entry = page.page.locator(f"#entry-{asked['id']}")
    assert entry.is_visible() and entry.locator(".role-user").count() == 1
    assert "Z" in entry.locator(".etime").inner_text()
    written_at = int((entry.locator(".etime").get_attribute("href") or "").rsplit("/", 1)[-1])
    assert written_at == asked["seq"]
    assert (
        page.page.evaluate("getComputedStyle(document.querySelector(':target')).backgroundColor")
        != "rgba(0, 0, 0, 0)"
    )

    page.page.locator("#as-of-input").fill(str(written_at - 1))  # just before it was written
    page.page.locator("#history button").click()
    page.page.wait_for_url(re.compile(rf"as_of={written_at - 1}"))
    assert page.page.locator(f"#entry-{asked['id']}").count() == 0
    page.page.locator("#history-forward").click()  # one step on: there it is
    page.page.wait_for_url(re.compile(rf"as_of={written_at}"))
    assert page.page.locator(f"#entry-{asked['id']}").count() == 1

    page.page.locator("#find-q").fill("killed")  # a search from here is a search as of here
    page.page.locator("#find-q").press("Enter")
    page.page.wait_for_url(re.compile(rf"/search\?as_of={written_at}&q=killed$"))
    assert [
        int(id)
        for id in page.page.locator("#entry-hits li").evaluate_all(
            "items => items.map(li => li.dataset.entry)"
        )
    ] == [asked["id"]]
    page.page.locator("#history-back").click()
    page.page.wait_for_url(re.compile(rf"as_of={written_at - 1}"))
    assert page.page.locator("#entry-hits li[data-entry]").count() == 0
    assert page.errors == []


def test_documents_and_tasks_are_found_and_linked(page: Page, store: dict[str, Any]) -> None:
    index_state(page.base, lambda state: state["ready"])
    page.open("/search?q=answer+completed")
    task = page.page.locator("#task-hits li[data-task] a.hit").first
    href = task.get_attribute("href") or ""
    assert re.fullmatch(r"/conversations/\d+#task-\d+", href)
    task.click()
    page.page.wait_for_url(re.compile(re.escape(href) + "$"))
    assert page.page.locator(href[href.index("#") :]).is_visible()
    page.open("/search?q=writer+killed")
    document = page.page.locator("#document-hits li[data-document] a.hit").first
    document.click()
    page.page.wait_for_url(re.compile(r"/documents/\d+"))
    assert "writer is killed" in page.page.locator("#value").inner_text()
    scope = page.page.locator("#scope")
    assert re.fullmatch(r"/conversations/\d+", scope.get_attribute("href") or "")
    assert page.errors == []


def test_every_id_in_the_log_is_a_link_and_a_record_is_a_page(
    page: Page, store: dict[str, Any], server: Any
) -> None:
    page.open("/log")
    link = page.page.locator("#batches .links a", has_text=re.compile(r"^entry \d+$")).first
    entry_id = (link.inner_text()).split()[1]
    link.click()
    page.page.wait_for_url(re.compile(rf"/conversations/\d+#entry-{entry_id}$"))
    assert page.page.locator(f"#entry-{entry_id}").is_visible()
    page.open("/log/3")
    assert page.page.locator("h1").inner_text() == "Log record 3"
    texts = page.page.locator("#writes a").all_inner_texts()
    assert any(text.startswith("entry ") for text in texts) and any(
        text.startswith("task ") for text in texts
    )
    page.page.locator("#record-after").click()
    page.page.wait_for_url(re.compile(r"/log/4$"))
    as_json = json.loads(get(f"{server.url}/log/3", {"Accept": "application/json"})[1])
    assert (
        as_json["seq"] == 3
        and json.loads(get(f"{server.url}/log/3?format=json", {"Accept": "text/html"})[1])
        == as_json
    )
    status, body, headers = get(
        f"{server.url}/log/3", {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    )
    assert (
        status == 200 and headers["Content-Type"].startswith("text/html") and 'id="writes"' in body
    )
    assert page.errors == []


def test_the_overview_draws_commits_over_time_and_the_logs_growth(
    page: Page, store: dict[str, Any]
) -> None:
    page.open("/")
    bars = page.page.locator("#commits-chart rect.bar")
    assert bars.count() == 48
    counts = [
        int(re.match(r"([\d,]+) commits", title).group(1).replace(",", ""))
        for title in page.page.locator("#commits-chart rect.bar title").all_text_contents()  # type: ignore[union-attr]
    ]
    head = int(page.page.locator("#head-seq").inner_text())
    assert sum(counts) == head  # a small log is counted exactly
    points = (page.page.locator("#growth-chart polyline").get_attribute("points") or "").split()
    assert len(points) == head
    box = page.page.locator("#growth-chart").bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100  # Chromium drew it
    assert page.errors == []


def test_the_live_log_keeps_a_bounded_number_of_rows_and_shows_the_head(
    page: Page, store: dict[str, Any]
) -> None:
    page.open("/log")
    assert page.page.locator("#live").get_attribute("data-keep") == "200"
    page.page.evaluate("document.getElementById('live').setAttribute('data-keep', '4')")
    page.page.wait_for_timeout(700)  # the stream is open
    head = _commit_entries(store["path"], 6)
    page.page.locator("#log-head", has_text=re.compile(rf"^{head}$")).wait_for(timeout=10_000)
    page.page.locator(f"#batches tr:first-child[data-seq='{head}']").wait_for(timeout=10_000)
    assert page.page.locator("#batches tr").count() == 4
    older = page.page.locator("#older")
    assert older.is_visible() and (older.get_attribute("href") or "").endswith(f"before={head - 4}")
    assert page.errors == []


def _commit_entries(path: Path, count: int) -> int:
    found: list[int] = []

    async def run() -> None:
        storage = await LmdbStorage.open(path)
        session = create_session(storage)
        try:
            for n in range(count):

                async def write(tx: Any, n: int = n) -> None:
                    await tx.append_entry(
                        1, {"kind": "message", "model": [{"role": "user", "content": f"live {n}"}]}
                    )

                await session.commit(write, CTX)
            found.append(storage.log.head())
        finally:
            await session.close(CTX)
            await storage.close()

    thread = threading.Thread(target=lambda: asyncio.run(run()))
    thread.start()
    thread.join(60)
    return found[0]


def test_hostile_strings_found_or_linked_stay_text(page: Page, store: dict[str, Any]) -> None:
    index_state(page.base, lambda state: state["ready"])
    page.open("/search?q=pwned+onerror")
    hit = page.page.locator(f"#entry-hits li[data-entry='{store['hostile_entry']}'] .says")
    assert (
        "<script>window.pwned=1</script>" in hit.inner_text() and hit.locator("mark").count() >= 2
    )
    assert "\\u202e" in hit.inner_text()  # an invisible character shown as its escape
    seq = int(
        (
            page.page.locator(
                f"#entry-hits li[data-entry='{store['hostile_entry']}'] .when a"
            ).get_attribute("href")
            or ""
        ).rsplit("/", 1)[-1]
    )
    page.open(f"/log/{seq}")
    assert "window.pwned" in page.page.locator("#writes").inner_text()
    page.open(f"/conversations/{store['root']}#entry-{store['hostile_entry']}")
    assert page.page.evaluate("typeof window.pwned") == "undefined"
    assert page.errors == []
    status, body, _ = get(
        page.base + "/search?q=lone+pwned&format=json"
    )  # a lone surrogate in the text
    assert status == 200 and "\udc00" in json.loads(body)["entries"][0]["text"]
