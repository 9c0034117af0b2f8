"""``durable-log serve`` in a real browser: a real store, ``serve`` as a real process on a free
loopback port, Debian's headless Chromium driven by Playwright (its own browsers are never
downloaded). Without Chromium the browser tests skip, except in CI (``CI`` set), where they fail.

``PI_DURABLE_SCREENSHOTS=1`` saves the main pages (of the test store) to build/screenshots/, to
look at; the README's screenshots are taken on a demo store by ``tools/screenshots.py``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.served import (
    HOSTILE_KIND,
    HUGE,
    build_store,
    chromium,
    commit_entry,
    get,
    serve,
    value_at,
)
from tests.support.unreadable import WORD, build_unreadable

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "build" / "screenshots"
IN_CI = bool(os.environ.get("CI"))


def _browser_or_skip() -> tuple[Any, str]:
    executable = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = (
        "Chromium (apt-get install chromium)"
        if executable is None
        else "the playwright package (the [test] extra)"
    )
    if executable is None or sync_playwright is None:
        if IN_CI:
            pytest.fail(f"the browser tests need {missing}, and CI must run them")
        pytest.skip(f"the browser tests need {missing}; install it to run them")
    return sync_playwright, executable


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("web") / "store"
    return {"path": path, **build_store(path)}


@pytest.fixture(scope="module")
def server(store: dict[str, Any]) -> Iterator[Any]:
    with serve(store["path"]) as served:
        yield served


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright, executable = _browser_or_skip()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


class Page:
    """A fresh page that records every console error, failed page script and failed request."""

    def __init__(self, browser: Any, base: str) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": 1200, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on(
            "console", lambda message: message.type == "error" and self.errors.append(message.text)
        )
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("requestfailed", self._failed)

    def _failed(self, request: Any) -> None:
        if "/log/events" in request.url and "ERR_ABORTED" in str(request.failure):
            return  # the live log's stream, closed by leaving the page
        self.errors.append(f"{request.url}: {request.failure}")

    def open(self, path: str) -> Any:
        response = self.page.goto(self.base + path)
        assert response is not None and response.status == 200, (path, response and response.status)
        return response

    def shot(self, name: str) -> None:
        if os.environ.get("PI_DURABLE_SCREENSHOTS") == "1":
            SHOTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=False)

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def page(browser: Any, server: Any) -> Iterator[Page]:
    opened = Page(browser, server.url)
    try:
        yield opened
    finally:
        opened.close()


def test_every_page_loads_without_console_errors(page: Page, store: dict[str, Any]) -> None:
    paths = [
        ("/", "overview"),
        ("/conversations", None),
        (f"/conversations/{store['root']}", "conversation"),
        (f"/conversations/{store['fork']}", None),
        ("/documents", None),
        (f"/documents/{store['notes']}", "document"),
        (f"/log?conversation={store['root']}&kind=entry&since=2000-01-01", None),
        (f"/conversations/{store['root']}?as_of=5", None),
        ("/log", "log"),
    ]
    for path, shot in paths:
        page.open(path)
        assert page.page.locator("h1").count() == 1, path
        if shot:
            page.shot(shot)
    assert page.errors == []
    assert page.page.locator(
        "#live"
    ).is_visible()  # the live log's script ran and its stream opened
    assert "down" not in (page.page.locator("#live").get_attribute("class") or "")


def test_the_overview_shows_each_projection_as_stats_does(
    page: Page, store: dict[str, Any]
) -> None:
    page.open("/")
    info = json.loads(_cli("stats", str(store["path"]), "--json"))
    rows = {
        row[0]: row
        for row in page.page.locator("#projections tr").evaluate_all(
            "rows => rows.slice(1).map(row => Array.from(row.cells, cell => cell.innerText))"
        )
    }
    head = info["headSeq"]
    assert page.page.locator("#head-seq").inner_text() == str(head)
    assert rows["core"][1:3] == [
        str(info["projections"]["core"]["foldedSeq"]),
        str(head - info["projections"]["core"]["foldedSeq"]),
    ]
    for name, user in info["projections"]["user"].items():
        assert rows[name][1:3] == [str(user["foldedSeq"]), str(head - user["foldedSeq"])]
    assert rows["exploding"][3] == "stopped at 7: RuntimeError: <script>window.pwned=4</script>"
    assert set(rows) == {"core", "exploding", "task_outcomes"}
    assert page.page.evaluate("typeof window.pwned") == "undefined"
    health = json.loads(get(page.base + "/healthz")[1])
    assert health["status"] == "ok" and health["warnings"] == [
        "projection exploding stopped at sequence 7: RuntimeError: <script>window.pwned=4</script>"
    ]
    assert page.errors == []


def test_the_overview_shows_the_last_verify(page: Page, store: dict[str, Any]) -> None:
    """``durable-log verify`` keeps its outcome beside the store; the overview shows it."""

    assert "the projections match the log" in _cli("verify", str(store["path"]))
    head = json.loads(_cli("stats", str(store["path"]), "--json"))["headSeq"]
    page.open("/")
    shown = page.page.locator("#verified").inner_text()
    assert f"at log sequence {head}: sound" in shown, shown
    assert "the projections match the log" in page.page.locator("#verified + pre").inner_text()
    assert page.errors == []


def test_the_entry_tree_shows_the_fork_under_the_entry_it_was_made_after(
    page: Page, store: dict[str, Any]
) -> None:
    page.open(f"/conversations/{store['root']}")
    point = page.page.locator(f"#tree li#entry-{store['fork_point']}")
    fork = point.locator(f":scope > .fork[data-fork='{store['fork']}']")
    assert fork.count() == 1
    assert (
        fork.locator(f"li#entry-{store['forked_entry']}").count() == 1
    )  # the fork's own entry, nested
    assert "a question on the fork" in fork.inner_text()
    assert page.page.locator("#tree > ol > li.entry").count() > 10  # the root's line, drawn in full
    page.page.locator(f".fork[data-fork='{store['fork']}'] > a").click()
    page.page.wait_for_url(re.compile(rf"/conversations/{store['fork']}$"))
    inherited = page.page.locator("li.entry.inherited")
    assert (
        inherited.count() >= 1 and f"conversation {store['root']}" in inherited.first.inner_text()
    )
    assert page.errors == []


def test_the_history_control_changes_the_documents_shown_value(
    page: Page, store: dict[str, Any]
) -> None:
    notes, path = store["notes"], store["path"]

    def shown() -> Any:
        return json.loads(page.page.locator("#value").inner_text())

    page.open(f"/documents/{notes}")
    assert (
        shown() == value_at(path, notes, store["head"])
        and shown()["summary"] == "6 questions answered"
    )
    seqs = [
        int(seq)
        for seq in page.page.locator("#versions a").evaluate_all(
            "links => links.map(a => a.dataset.seq)"
        )
    ]
    assert len(seqs) == 6 and seqs == sorted(seqs, reverse=True)
    page.page.locator(f"#versions a[data-seq='{seqs[-2]}']").click()  # the second version
    page.page.wait_for_url(re.compile(rf"as_of={seqs[-2]}$"))
    assert (
        shown() == value_at(path, notes, seqs[-2]) and shown()["summary"] == "2 questions answered"
    )
    assert page.page.locator("#diff .dadd").all_inner_texts() == [
        f"+ /answers/1: {json.dumps(shown()['answers'][1])}",
        '+ /summary: "2 questions answered"',
    ]
    assert page.page.locator("#diff .ddel").all_inner_texts() == [
        '- /summary: "1 question answered"'
    ]  # no line for a comma
    page.page.locator(
        "#history-back"
    ).click()  # back a change: the first version, where it was written
    page.page.wait_for_url(re.compile(rf"as_of={seqs[-1]}$"))
    assert page.page.locator("#history-back").count() == 0  # none before: it did not exist yet
    assert (
        shown() == value_at(path, notes, seqs[-1]) and shown()["summary"] == "1 question answered"
    )
    page.page.locator("#as-of-input").fill("")
    page.page.locator("#history button").click()  # back to now
    page.page.wait_for_url(re.compile(rf"/documents/{notes}\?as_of=$"))
    assert shown()["summary"] == "6 questions answered"
    assert page.errors == []


def test_a_commit_made_after_the_log_opened_appears_without_a_reload(
    page: Page, store: dict[str, Any]
) -> None:
    page.open("/log")
    page.page.wait_for_function(
        "document.getElementById('live') && !document.getElementById('live').classList.contains('down')"
    )
    time.sleep(0.6)  # the stream is open: the commit below is after the page's head
    seq = commit_entry(
        store["path"], store["root"], HOSTILE_KIND, "committed while the log was open"
    )
    row = page.page.locator(f"#batches tr[data-seq='{seq}']")
    row.wait_for(timeout=5000)
    assert (
        "<img src=x onerror=window.pwned=3>\\ud800" in row.inner_text()
    )  # the agent's kind, drawn as text
    assert page.page.locator("#batches tr").first.get_attribute("data-seq") == str(
        seq
    )  # newest first
    assert page.page.evaluate("typeof window.pwned") == "undefined"
    page.open(f"/conversations/{store['root']}")  # the view's store handle sees the new commit too
    assert page.page.locator("li.entry .kind", has_text="onerror=window.pwned=3").count() == 1
    assert page.errors == []


def test_hostile_strings_are_shown_as_text_and_never_run(page: Page, store: dict[str, Any]) -> None:
    page.open(f"/conversations/{store['root']}")
    entry = page.page.locator(f"li#entry-{store['hostile_entry']}")
    assert "<script>window.pwned=1</script>" in entry.locator(".says").inner_text()
    assert page.page.locator("main img, main script").count() == 0
    marks = entry.locator(".says .ctl").all_inner_texts()
    assert {"\\x07", "\\u202e", "\\u200b", "\\udc00"} <= set(
        marks
    )  # invisible characters made visible
    huge = page.page.locator(f"li#entry-{store['huge_entry']}")
    huge.locator("summary").click()
    assert "more characters not shown" in huge.inner_text() and "THE-END" not in huge.inner_text()
    huge.locator("a", has_text="see all").click()
    page.page.wait_for_url(re.compile(rf"/records/entry/{store['huge_entry']}$"))
    assert json.loads(page.page.locator("body").inner_text())["entry"]["data"]["text"] == HUGE
    for path in (
        "/log",
        f"/log?conversation={store['root']}",
        "/documents",
        f"/records/entry/{store['hostile_entry']}",
    ):
        page.open(path)
        assert page.page.evaluate("typeof window.pwned") == "undefined", path
    assert page.errors == []


# ── plain HTTP: no browser needed ─────────────────────────────────────────────


def test_every_request_must_carry_the_token(store: dict[str, Any]) -> None:
    with serve(store["path"], "--token", "s3cret") as served:
        assert get(served.url + "/?token=wrong")[0] == 401
        assert get(served.url + "/log", {"Authorization": "Bearer wrong"})[0] == 401
        assert get(served.url + "/metrics")[0] == 401
        assert get(served.url + "/healthz", {"Authorization": "Bearer s3cret"})[0] == 200
        assert get(served.url + "/metrics", {"Cookie": "durable_log_token=s3cret"})[0] == 200


def test_a_token_in_the_address_becomes_a_cookie_and_leaves_the_address(
    store: dict[str, Any],
) -> None:
    with serve(store["path"], "--token", "s3cret") as served:
        status, headers = _unfollowed(served.url + "/log?kind=entry&token=s3cret&kind=task")
        assert status == 303 and headers["Location"] == "/log?kind=entry&kind=task"
        assert (
            "durable_log_token=s3cret" in headers["Set-Cookie"]
            and "HttpOnly" in headers["Set-Cookie"]
        )
        assert (
            get(served.url + headers["Location"], {"Cookie": "durable_log_token=s3cret"})[0] == 200
        )
        assert _unfollowed(served.url + "/log?token=wrong")[0] == 401


def test_healthz_answers_a_probe_without_the_token_and_says_only_whether_the_store_reads(
    store: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store["path"], copy)
    with serve(copy, "--token", "s3cret") as served:
        status, body, _ = get(served.url + "/healthz")
        assert status == 200 and json.loads(body) == {"status": "ok"}
        full = json.loads(get(served.url + "/healthz", {"Authorization": "Bearer s3cret"})[1])
        assert full["status"] == "ok" and "headSeq" in full and "warnings" in full
        copy.rename(tmp_path / "moved")
        status, body, _ = get(served.url + "/healthz")
        assert status == 503 and json.loads(body) == {"status": "unavailable"}  # no path, no reason


def _unfollowed(url: str) -> tuple[int, dict[str, str]]:
    """A GET whose redirect is not followed: its status and headers."""

    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        connection.request("GET", parts.path + ("?" + parts.query if parts.query else ""))
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        connection.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::", "example.com"])
def test_a_non_loopback_address_without_a_token_is_refused(
    store: dict[str, Any], host: str
) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pi_durable_lmdb.cli",
            "serve",
            str(store["path"]),
            "--host",
            host,
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert "not a loopback address" in done.stderr and "--token" in done.stderr


def test_health_metrics_and_nothing_that_writes(server: Any, store: dict[str, Any]) -> None:
    status, body, _ = get(server.url + "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body, headers = get(server.url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    head = int(re.search(r"^pi_durable_lmdb_log_head_seq (\d+)", body, re.M).group(1))  # type: ignore[union-attr]
    assert head >= store["head"]
    assert 'pi_durable_lmdb_projection_lag_records{projection="core"} 0.0' in body
    for method in ("POST", "PUT", "DELETE"):
        assert get(server.url + "/log", method=method)[0] == 405
    assert get(server.url + "/", {"Host": "attacker.example"})[0] == 403  # DNS rebinding
    status, body, headers = get(server.url + "/log/1")
    assert (
        status == 200
        and json.loads(body)["seq"] == 1
        and "script-src 'self'" in headers["Content-Security-Policy"]
    )


def test_healthz_says_503_and_why_when_the_store_is_gone(
    store: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(store["path"], copy)
    with serve(copy) as served:
        assert get(served.url + "/healthz")[0] == 200
        copy.rename(tmp_path / "moved")
        status, body, _ = get(served.url + "/healthz")
        assert status == 503, body
        found = json.loads(body)
        assert found["status"] == "unavailable" and str(copy) in found["reason"]


def _cli(*args: str) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    "query, tail_args",
    [
        ("", []),
        ("conversation=22", ["--conversation", "22"]),
        (
            "kind=document.change&kind=conversation",
            ["--type", "document.change", "--type", "conversation"],
        ),
        ("conversation=1&kind=task", ["--conversation", "1", "--type", "task"]),
        ("until=2000-01-01", ["--until", "2000-01-01"]),
        ("since=2000-01-01&kind=entry", ["--since", "2000-01-01", "--type", "entry"]),
    ],
)
def test_the_log_page_keeps_what_tail_keeps(
    server: Any, store: dict[str, Any], query: str, tail_args: list[str]
) -> None:
    status, body, _ = get(f"{server.url}/log?{query}")
    assert status == 200
    shown = [int(seq) for seq in re.findall(r'<tr data-seq="(\d+)"', body)]
    lines = _cli("tail", str(store["path"]), "--json", "--limit", "100", *tail_args).splitlines()
    assert shown == [json.loads(line)["seq"] for line in reversed(lines)]  # newest first


def test_records_are_the_json_show_prints_now_and_as_of_a_sequence_or_a_time(
    server: Any, store: dict[str, Any]
) -> None:
    path, notes = str(store["path"]), store["notes"]
    for kind, id, as_of in [
        ("document", notes, None),
        ("document", notes, 5),
        ("entry", store["hostile_entry"], None),
        ("conversation", store["fork"], None),
    ]:
        suffix = "" if as_of is None else f"?as_of={as_of}"
        status, body, _ = get(f"{server.url}/records/{kind}/{id}{suffix}")
        assert status == 200, body
        printed = _cli(
            "show",
            path,
            kind,
            str(id),
            "--json",
            *([] if as_of is None else ["--as-of", str(as_of)]),
        )
        assert json.loads(body) == json.loads(printed)
    at_five = json.loads(get(f"{server.url}/log/5")[1])["committedAt"]
    when = (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at_five / 1000)) + f".{at_five % 1000:03d}Z"
    )
    by_time = get(f"{server.url}/documents/{notes}?as_of={when}")[1]
    by_seq = get(f"{server.url}/documents/{notes}?as_of=5")[1]
    assert re.search(r'<pre id="value">(.*?)</pre>', by_time, re.S).group(1) == re.search(
        r'<pre id="value">(.*?)</pre>', by_seq, re.S
    ).group(1)  # type: ignore[union-attr]
    assert get(f"{server.url}/documents/{notes}?as_of=999999")[0] == 400
    assert get(f"{server.url}/documents/{notes}?as_of=yesterday-ish")[0] == 400
    assert get(f"{server.url}/records/entry/999999")[0] == 404


def test_a_document_that_cannot_be_read_is_shown_so(browser: Any, tmp_path: Path) -> None:
    """A document whose committed change cannot apply: its page names the error and the change
    (its ops shown), links the version before (whose value shows), and search lists it."""

    path = tmp_path / "store"
    built: list[dict[str, Any]] = []  # on a thread: Playwright's sync API keeps a loop on this one
    thread = threading.Thread(target=lambda: built.append(asyncio.run(build_unreadable(path))))
    thread.start()
    thread.join(120)
    made = built[0]
    assert _cli("search", str(path), WORD)  # the word index the search page reads
    with serve(path) as served:
        opened = Page(browser, served.url)
        try:
            opened.open(f"/documents/{made['history']}")
            said = opened.page.locator("#unreadable")
            assert said.is_visible()
            text = said.inner_text()
            assert f"document {made['history']} cannot be read" in text, text
            assert f"log sequence {made['bad']}" in text and "PathError" in text, text
            assert "nope" in opened.page.locator("#failing-ops").inner_text()
            opened.page.locator(f"#versions a[data-seq='{made['good']}']").click()
            opened.page.wait_for_url(re.compile(rf"as_of={made['good']}"))
            assert WORD + " plan" in opened.page.locator("#value").inner_text()
            assert opened.page.locator("#unreadable").count() == 0
            opened.open(f"/search?q={WORD}")
            listed = opened.page.locator(f"li[data-document='{made['session']}'] .unreadable")
            assert f"log sequence {made['bad']}" in listed.inner_text()
            assert opened.errors == []
        finally:
            opened.close()
