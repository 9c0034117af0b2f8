"""``serve`` keeps the store's word index itself, as a real process on real stores: a store never
searched is indexed in the background (the search page and ``/search/index.json`` say how far it
has got meanwhile), new records are folded in as they are committed, and ``/search.json``
answers as ``durable-log search --json`` does; the store's own files are never written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pi_durable_lmdb.projections.search_index import SearchIndex

from tests.support.served import commit_entry, get, index_state, serve, store_files
from tests.web.test_serve_browser import Page, browser  # noqa: F401 (the same fixture)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def _demo(path: Path) -> int:
    """The demo's store at ``path``; its log's head."""

    _cli("demo", str(path))
    return int(json.loads(_cli("stats", str(path), "--json").stdout)["headSeq"])


def _cli_search(path: Path, *words: str) -> Any:
    return json.loads(_cli("search", str(path), *words, "--json").stdout)


class _Held:
    """The word index's writer lock held by this process: ``serve``'s build waits on it (as it
    would on a ``durable-log search`` building the same index), so its progress can be read."""

    def __init__(self, path: Path) -> None:
        self.index = SearchIndex(path, create=True)
        self.txn: Any = self.index.env.begin(write=True)

    def release(self) -> None:
        if self.txn is not None:
            self.txn.abort()
            self.txn = None
            self.index.close()


def test_serve_indexes_a_store_never_searched_and_answers_as_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "store"
    head = _demo(path)
    assert not (path / "search.index").exists()
    before = store_files(path)
    with serve(path) as served:
        state = index_state(served.url, lambda state: state["ready"])
        assert state == {"ready": True, "folded": head, "head": head, "error": None}
        status, body, _ = get(served.url + "/search.json?q=writer+killed")
        assert status == 200
        found = json.loads(body)
        assert found == _cli_search(path, "writer killed") and found["entries"]
        html = get(served.url + "/search?q=writer+killed")[1]
        assert 'id="building"' not in html and 'id="entry-hits"' in html
        assert 'href="/search.json?q=writer+killed"' in html

        assert store_files(path) == before, "building the index wrote only the index"
        seq = commit_entry(path, 1, "message", "a zebra crossing")  # the store's writer, elsewhere
        before = store_files(path)
        state = index_state(served.url, lambda state: state["folded"] == seq)  # no search asked
        assert state["ready"] and state["head"] == seq
        zebra = json.loads(get(served.url + "/search.json?q=zebra")[1])
        assert [hit["seq"] for hit in zebra["entries"]] == [seq]
        assert store_files(path) == before, "the view writes only its index"


def test_while_the_index_is_built_the_search_page_shows_progress(tmp_path: Path) -> None:
    path = tmp_path / "store"
    head = _demo(path)
    held = _Held(path)
    try:
        with serve(path) as served:
            state = index_state(served.url, lambda state: state["head"] == head)
            assert state == {"ready": False, "folded": 0, "head": head, "error": None}
            status, body, headers = get(served.url + "/search.json?q=killed")
            assert status == 503 and headers["Retry-After"] == "2"
            refused = json.loads(body)
            assert refused["index"] == state and f"0 of {head}" in refused["error"]
            status, body, _ = get(served.url + "/search?q=killed")
            assert status == 200 and 'id="building"' in body
            assert '<meta http-equiv="refresh" content="2">' in body
            assert f'<progress id="index-progress" max="{head}" value="0">' in body
            body = get(served.url + "/conversations")[1]  # by id meanwhile, not by activity
            assert "data-conversation" not in body and "conversation 1</a>" in body
            held.release()  # the build goes on
            index_state(served.url, lambda state: state["ready"])
            assert json.loads(get(served.url + "/search.json?q=killed")[1]) == _cli_search(
                path, "killed"
            )
            assert 'id="building"' not in get(served.url + "/search?q=killed")[1]
    finally:
        held.release()


BAD = [
    ("/search.json", "give ?q=WORDS"),
    ("/search.json?q=a&as_of=x", "as_of: "),
    ("/search.json?q=a&before=%C2%B2", "before: "),
    ("/search.json?q=a&as_of=99999", "as_of: 99999 is after the log's head"),
]


def test_bad_input_to_the_search_data_is_a_400_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    _demo(path)
    with serve(path) as served:
        index_state(served.url, lambda state: state["ready"])
        before = store_files(path)
        for url, named in BAD:
            status, body, headers = get(served.url + url)
            assert status == 400 and headers["Content-Type"].startswith("application/json"), url
            assert named in json.loads(body)["error"], (url, body)
        status, body, _ = get(served.url + "/search?q=a&as_of=x")
        assert status == 400 and "as_of: " in body and "<html" in body
        assert store_files(path) == before


@pytest.mark.slow
def test_the_search_page_shows_progress_then_results_in_a_browser(
    browser: Any,
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    head = _demo(path)
    held = _Held(path)
    try:
        with serve(path) as served:
            index_state(served.url, lambda state: state["head"] == head)
            page = Page(browser, served.url)
            try:
                page.open("/search?q=killed")
                assert page.page.locator("#index-progress").get_attribute("max") == str(head)
                assert "reloads itself" in page.page.locator("#building").inner_text()
                assert page.page.locator("#entry-hits").count() == 0
                held.release()  # the build goes on; the page reloads itself into the results
                page.page.locator("#entry-hits li[data-entry]").first.wait_for(timeout=60_000)
                assert page.page.locator("#building").count() == 0
                hits = page.page.locator("#entry-hits li mark").all_inner_texts()
                assert hits and all(re.fullmatch("(?i)killed", hit) for hit in hits)
                assert page.errors == []
            finally:
                page.close()
    finally:
        held.release()


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_a_lists_data_link_in_a_browser_gives_the_rows_shown(
    browser: Any,
    tmp_path: Path,
    suffix: str,
) -> None:
    path = tmp_path / "store"
    _demo(path)
    with serve(path) as served:
        page = Page(browser, served.url)
        try:
            page.open("/tasks?status=terminal")
            shown = page.page.locator("#tasks tr[data-task]").evaluate_all(
                "rows => rows.map(row => Number(row.dataset.task))"
            )
            link = page.page.locator(f"#as-{suffix[1:]}")
            assert link.get_attribute("href") == f"/tasks{suffix}?status=terminal"
            status, body, _ = get(served.url + (link.get_attribute("href") or ""))
            assert status == 200
            if suffix == ".json":
                assert [row["id"] for row in json.loads(body)["rows"]] == shown
            else:
                assert [int(line.split(",")[0]) for line in body.splitlines()[1:]] == shown
            assert shown and page.errors == []
        finally:
            page.close()


def test_a_reader_who_may_not_write_beside_the_store_is_served_and_told_why(
    tmp_path: Path,
) -> None:
    """An auditor with the documented access (reads the store, writes only its lock file) gets
    every page; the search page says why there is no word index instead of failing."""

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run serve as another user")
    as_nobody = (setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups")
    imports = subprocess.run(
        [*as_nobody, sys.executable, "-c", "import pi_durable_lmdb.web.app"], capture_output=True
    )
    if imports.returncode != 0:
        pytest.skip("nobody cannot run this interpreter or import the package from here")
    root = Path(tempfile.mkdtemp(prefix="durable-log-reader-"))
    try:
        os.chmod(root, 0o755)
        path = root / "store"
        _demo(path)
        os.chmod(path, 0o755)
        os.chmod(path / "data.mdb", 0o644)
        os.chmod(path / "lock.mdb", 0o666)
        with serve(path, run_as=as_nobody) as served:
            state = index_state(served.url, lambda state: state["error"] is not None)
            assert not state["ready"] and "Permission" in state["error"], state
            assert "search.index" in state["error"]
            status, body, _ = get(served.url + "/search?q=killed")
            assert status == 200 and 'id="index-error"' in body
            assert get(served.url + "/conversations")[0] == 200
            assert get(served.url + "/tasks.json")[0] == 200
        assert not (path / "search.index").exists()
    finally:
        shutil.rmtree(root)
