"""The word index and ``search``: what a query finds is what the store holds at the point asked;
the index is a projection of the log (folded in chunks or all at once, repacked or not, it holds
the same postings), and the command line prints it."""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit.search import SearchResults, catch_up, search
from pi_durable_lmdb.projections import search_index
from pi_durable_lmdb.projections.search_index import SearchIndex, words
from pi_durable_lmdb.storage import LmdbStorage

CONVERSATION, NOTES = 1, 2


def _entry(id: int, role: str, text: str) -> dict[str, Any]:
    return {
        "type": "entry",
        "value": {
            "id": id,
            "conversationId": CONVERSATION,
            "kind": "message",
            "model": [{"role": role, "content": text}],
        },
    }


def _task(id: int, kind: str, status: str, outcome: str | None = None) -> dict[str, Any]:
    state: dict[str, Any] = {"status": status}
    if outcome is not None:
        state["outcome"] = {"status": outcome, "result": None}
    return {
        "type": "task",
        "value": {
            "id": id,
            "conversationId": CONVERSATION,
            "kind": kind,
            "version": 1,
            "input": {},
            "background": False,
            "abortRequested": False,
            "state": state,
        },
    }


def _delta(text: str) -> dict[str, Any]:
    return {
        "type": "document.change",
        "id": NOTES,
        "content": {"kind": "delta", "version": 1, "ops": [["s", ["text"], text]]},
    }


BATCHES: list[list[dict[str, Any]]] = [
    [
        {"type": "conversation", "value": {"id": CONVERSATION}},
        {
            "type": "document.create",
            "record": {
                "id": NOTES,
                "kind": "notes",
                "scope": {"kind": "conversation", "conversationId": CONVERSATION},
            },
            "content": {"kind": "base", "version": 1, "value": {"text": "an empty page"}},
        },
    ],
    [
        _entry(10, "user", "Why did the Deploy fail on Tuesday?"),
        _task(11, "triage", "pending"),
    ],  # seq 2
    [
        _entry(12, "assistant", "The deploy failed because the disk was full."),
        _task(11, "triage", "running"),
    ],  # seq 3
    [_delta("the disk was full on tuesday")],  # seq 4
    [
        _entry(13, "tool", "df: disk 100% full"),
        _task(11, "triage", "terminal", "completed"),
    ],  # seq 5
    [_delta("fixed: the disk has room now")],  # seq 6
]


async def _build(path: Path, batches: list[list[dict[str, Any]]] = BATCHES) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    try:
        for batch in batches:
            await storage.commit(batch, CTX)
    finally:
        await storage.close()


async def _search(
    path: Path, text: str, as_of: int | None = None, before: int | None = None, limit: int = 50
) -> SearchResults:
    index = SearchIndex(path, create=True)
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        catch_up(path, index)
        reader = storage if as_of is None else await storage.as_of(as_of)
        return await search(index, storage, reader, text, as_of, before, limit)
    finally:
        await storage.close()
        index.close()


def test_words_are_letters_and_digits_lower_cased() -> None:
    assert words("Why did the Deploy fail? df: 100% — Ünïcode_ok") == [
        "why",
        "did",
        "the",
        "deploy",
        "fail",
        "df",
        "100",
        "ünïcode_ok",
    ]


def test_entries_are_found_by_every_word_newest_first_with_time_and_role(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path))
    found = asyncio.run(_search(path, "DEPLOY"))
    assert [(hit.id, hit.seq, hit.roles) for hit in found.entries] == [
        (12, 3, ["assistant"]),
        (10, 2, ["user"]),
    ]
    assert all(hit.committedAt > 0 and hit.conversationId == CONVERSATION for hit in found.entries)
    assert [hit.id for hit in asyncio.run(_search(path, "deploy disk")).entries] == [12]
    assert [hit.id for hit in asyncio.run(_search(path, "disk full")).entries] == [13, 12]
    assert asyncio.run(_search(path, "deploy nowhere")).entries == []
    assert asyncio.run(_search(path, "   ")).entries == []


def test_as_of_finds_only_what_the_store_held_then(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path))
    assert [hit.id for hit in asyncio.run(_search(path, "disk", as_of=2)).entries] == []
    assert [hit.id for hit in asyncio.run(_search(path, "disk", as_of=3)).entries] == [12]
    tasks = asyncio.run(_search(path, "triage running", as_of=3)).tasks
    assert [(task.id, task.status) for task in tasks] == [(11, "running")]
    assert asyncio.run(_search(path, "triage running")).tasks == []  # it has finished since
    assert [
        (task.id, task.status) for task in asyncio.run(_search(path, "triage completed")).tasks
    ] == [(11, "terminal")]


def test_documents_are_found_in_the_version_in_force_or_an_earlier_one(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path))
    now = asyncio.run(_search(path, "room")).documents
    assert [(doc.id, doc.seq, doc.current) for doc in now] == [(NOTES, 6, True)]
    earlier = asyncio.run(_search(path, "tuesday")).documents  # in version 2 only
    assert [(doc.id, doc.seq, doc.current) for doc in earlier] == [(NOTES, 4, False)]
    then = asyncio.run(_search(path, "tuesday", as_of=5)).documents
    assert [(doc.id, doc.seq, doc.current) for doc in then] == [(NOTES, 4, True)]
    assert asyncio.run(_search(path, "tuesday", as_of=3)).documents == []


def test_entries_page_by_sequence(tmp_path: Path) -> None:
    path = tmp_path / "store"
    batches = BATCHES[:1] + [[_entry(100 + n, "user", f"page word{n}")] for n in range(7)]
    asyncio.run(_build(path, batches))
    seen: list[int] = []
    before = None
    for _ in range(10):
        found = asyncio.run(_search(path, "page", before=before, limit=3))
        seen += [hit.id for hit in found.entries]
        before = found.moreEntriesBefore
        if before is None:
            break
    assert seen == [106, 105, 104, 103, 102, 101, 100]


def test_the_index_follows_the_log_and_is_rebuilt_for_another_store(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path, BATCHES[:3]))
    assert [hit.id for hit in asyncio.run(_search(path, "disk")).entries] == [12]
    asyncio.run(_build(path, BATCHES[3:]))
    assert [hit.id for hit in asyncio.run(_search(path, "disk")).entries] == [
        13,
        12,
    ]  # folded forward
    other = tmp_path / "other"
    asyncio.run(_build(other, BATCHES[:2]))
    shutil.rmtree(other / search_index.INDEX_DIR, ignore_errors=True)
    shutil.copytree(
        path / search_index.INDEX_DIR, other / search_index.INDEX_DIR
    )  # another store's index
    assert asyncio.run(_search(other, "disk")).entries == []
    assert [hit.id for hit in asyncio.run(_search(other, "deploy")).entries] == [10]


def _postings(path: Path) -> list[tuple[bytes, bytes]]:
    index = SearchIndex(path)
    try:
        with index.env.begin() as txn:
            return (
                list(txn.cursor(index.postings).iternext())
                + [(b"task", key + value) for key, value in txn.cursor(index.tasks).iternext()]
                + [(b"value", key + value) for key, value in txn.cursor(index.values).iternext()]
            )
    finally:
        index.close()


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(1, 5), st.randoms(use_true_random=False))
def test_folded_in_chunks_or_at_once_repacked_or_not_the_postings_are_the_same(
    tmp_path: Path, chunk: int, rng: random.Random
) -> None:
    vocabulary = ["alpha", "beta", "gamma", "delta", "Ünï", "42"]
    batches = [BATCHES[0] + [SESSION_CREATED]]  # a current-only document: its value is kept
    for n in range(12):
        text = " ".join(rng.choice(vocabulary) for _ in range(4))
        batch = [
            _entry(200 + n, rng.choice(["user", "assistant"]), text),
            _task(300 + n % 3, rng.choice(vocabulary), rng.choice(["pending", "running"])),
        ]
        if n % 3 == 0:
            batch.append(_delta(text))
        if n % 2 == 0:
            batch += _session_change(text)
        batches.append(batch)
    root = tmp_path / f"run{rng.random()}"
    whole, chunked = root / "whole", root / "chunked"
    asyncio.run(_build(whole, batches))
    shutil.copytree(whole, chunked, ignore=shutil.ignore_patterns(search_index.INDEX_DIR))
    index = SearchIndex(whole, create=True)
    catch_up(whole, index)
    index.compact()
    index.close()
    old = search_index.CHUNK
    search_index.CHUNK = chunk  # type: ignore[misc]
    try:
        import pi_durable_lmdb.audit.search as searching

        searching.CHUNK = chunk  # type: ignore[misc]
        index = SearchIndex(chunked, create=True)
        catch_up(chunked, index)
        index.close()
    finally:
        search_index.CHUNK = old  # type: ignore[misc]
        searching.CHUNK = old  # type: ignore[misc]
    assert _postings(whole) == _postings(chunked)
    shutil.rmtree(root)


def test_the_command_line_builds_the_index_once_and_prints_results(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pi_durable_lmdb.cli", "search", str(path), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    first = run("deploy", "--json")
    assert (
        first.returncode == 0
        and "building the word index" in first.stderr
        and "bytes" in first.stderr
    )
    assert [hit["id"] for hit in json.loads(first.stdout)["entries"]] == [12, 10]
    again = run("disk", "--as-of", "3")
    assert again.returncode == 0 and again.stderr == ""
    assert (
        "entry 12  conversation 1  seq 3" in again.stdout
        and "assistant: The deploy failed" in again.stdout
    )
    assert "entry 13" not in again.stdout
    assert run("").returncode == 2 and "TEXT is empty" in run("").stderr
    late = run("disk", "--as-of", "99")
    assert late.returncode == 2 and "the log's head is 6" in late.stderr
    assert (path / search_index.INDEX_DIR / "data.mdb").is_file()


def test_a_damaged_index_header_is_named_and_deleting_the_index_mends_it(tmp_path: Path) -> None:
    import lmdb

    path = tmp_path / "store"
    asyncio.run(_build(path))
    asyncio.run(_search(path, "disk"))
    env = lmdb.open(str(path / search_index.INDEX_DIR), max_dbs=8, subdir=True)
    with env.begin(write=True) as txn:
        txn.put(b"header", b"\xc1 not msgpack", db=env.open_db(b"meta", txn=txn))
    env.close()
    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "search", str(path), "disk"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        done.returncode == 2
        and "unreadable header; delete it" in done.stderr
        and "Traceback" not in done.stderr
    )
    shutil.rmtree(path / search_index.INDEX_DIR)
    assert [hit.id for hit in asyncio.run(_search(path, "disk")).entries] == [13, 12]


def test_json_results_keep_lone_surrogates_as_escapes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path, BATCHES[:1] + [[_entry(50, "user", "lone\udc00 surrogate here")]]))
    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "search", str(path), "surrogate", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["entries"][0]["text"] == "lone\udc00 surrogate here"
    plain = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "search", str(path), "surrogate"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode == 0 and "lone\\udc00 surrogate" in plain.stdout


SESSION_NOTES = 50


def _session_change(text: str) -> list[dict[str, Any]]:
    ops = [["s", ["text"], text]]
    content = {"kind": "delta", "version": 1, "ops": ops}
    return [{"type": "document.change", "id": SESSION_NOTES, "content": content}]


SESSION_CREATED = {
    "type": "document.create",
    "record": {"id": SESSION_NOTES, "kind": "notes", "scope": {"kind": "session"}},
    "content": {"kind": "base", "version": 1, "value": {"text": "alpha"}},
}


def test_a_current_only_document_s_past_is_not_searched(tmp_path: Path) -> None:
    """A session's document keeps no past values: reading one is refused with the contract's
    ``StorageRequestError``, which the index (folding a change it holds no value for) and the
    search (checking the earlier version a word was in) take as "nothing there"."""

    path = tmp_path / "store"
    asyncio.run(_build(path, [[SESSION_CREATED], _session_change("alpha bravo")]))
    assert [doc.id for doc in asyncio.run(_search(path, "alpha")).documents] == [SESSION_NOTES]
    asyncio.run(_build(path, [_session_change("charlie")]))  # folded by a fresh index object
    assert asyncio.run(_search(path, "alpha")).documents == []


def test_a_current_only_document_changed_after_the_index_reopens_is_found(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path, [[SESSION_CREATED], _session_change("alpha bravo")]))
    assert [doc.id for doc in asyncio.run(_search(path, "alpha")).documents] == [SESSION_NOTES]
    asyncio.run(_build(path, [_session_change("charlie")]))  # folded by a reopened index
    assert [doc.id for doc in asyncio.run(_search(path, "charlie")).documents] == [SESSION_NOTES]
    assert asyncio.run(_search(path, "charlie", as_of=2)).documents == []  # not yet said there
    asyncio.run(
        _build(
            path,
            [_session_change("delta echo"), [{"type": "document.retire", "id": SESSION_NOTES}]],
        )
    )
    assert asyncio.run(_search(path, "echo")).documents == []
    kept = _postings(path)
    shutil.rmtree(path / search_index.INDEX_DIR)  # folded again from the log: the same index
    assert asyncio.run(_search(path, "echo")).documents == []
    assert _postings(path) == kept
    assert [value for value in kept if value[0] == b"value"] == []  # a retired one is not kept


def test_a_copy_of_a_current_only_document_is_found_by_its_words(tmp_path: Path) -> None:
    """A copy of a current-only document is refused at its point too: the index folds it from
    the source's value it keeps."""

    path = tmp_path / "store"
    source = {
        "type": "document.create",
        "record": {
            "id": 60,
            "kind": "notes",
            "scope": {"kind": "conversation", "conversationId": CONVERSATION},
            "history": "latest",
        },
        "content": {"kind": "base", "version": 1, "value": {"text": "foxtrot"}},
    }
    asyncio.run(_build(path, [[{"type": "conversation", "value": {"id": CONVERSATION}}, source]]))
    assert [doc.id for doc in asyncio.run(_search(path, "foxtrot")).documents] == [60]
    copy = {
        "type": "document.copy",
        "record": {
            **source["record"],
            "id": 61,
            "scope": {"kind": "conversation", "conversationId": CONVERSATION + 1},
        },
        "source": {"id": 60, "at": "current"},
    }
    asyncio.run(_build(path, [[{"type": "conversation", "value": {"id": CONVERSATION + 1}}, copy]]))
    assert sorted(doc.id for doc in asyncio.run(_search(path, "foxtrot")).documents) == [60, 61]


# ── the Unicode database words are split by ───────────────────────────────────


def _write_header(path: Path, **fields: Any) -> None:
    """Rewrite the index's header as another program would have written it."""

    import lmdb
    import msgspec

    env = lmdb.open(str(path / search_index.INDEX_DIR), max_dbs=8, subdir=True)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            header = msgspec.msgpack.decode(txn.get(b"header", db=meta))
            header.update(fields)
            txn.put(b"header", msgspec.msgpack.encode(header), db=meta)
            txn.drop(env.open_db(b"postings", txn=txn), delete=False)  # its words: none of ours
    finally:
        env.close()


OTHER_UNICODE = "14.0.0" if search_index.UNICODE != "14.0.0" else "15.1.0"


def test_an_index_whose_words_another_python_split_is_folded_again(tmp_path: Path) -> None:
    path = tmp_path / "store"
    asyncio.run(_build(path))
    assert [hit.id for hit in asyncio.run(_search(path, "disk")).entries] == [13, 12]
    _write_header(path, unicode=OTHER_UNICODE)
    assert [hit.id for hit in asyncio.run(_search(path, "disk")).entries] == [13, 12]
    index = SearchIndex(path)
    try:
        header = index.header()
        assert header is not None and header.unicode == search_index.UNICODE
    finally:
        index.close()
    _write_header(path, unicode=None)  # an index written before the header named its Unicode
    assert [hit.id for hit in asyncio.run(_search(path, "disk")).entries] == [13, 12]


def test_an_index_of_another_python_not_folded_again_is_refused_not_read(tmp_path: Path) -> None:
    """A process that answers without catching up (it cannot write the index) says why."""

    from pi_durable_lmdb.errors import SearchIndexError

    path = tmp_path / "store"
    asyncio.run(_build(path))
    asyncio.run(_search(path, "disk"))
    _write_header(path, unicode=OTHER_UNICODE)

    async def answer() -> SearchResults:
        index = SearchIndex(path)
        storage = await LmdbStorage.open(path, readonly=True)
        try:
            return await search(index, storage, storage, "disk", None)
        finally:
            await storage.close()
            index.close()

    with pytest.raises(SearchIndexError) as refused:
        asyncio.run(answer())
    said = str(refused.value)
    assert f"split by Unicode {OTHER_UNICODE}" in said and search_index.UNICODE in said, said
    assert "durable-log search" in said


# characters of Unicode 14.0, 15.0 and 15.1 (a Cyrillic modifier letter, a CJK Extension I
# ideograph...), between letters, so a split differs by which of them an interpreter knows
PROBE = "a\u0870b x\U0001e030y \U0002ebf0z \u31efw Straße ΣΑΣ"


@pytest.mark.parametrize("version", ["3.11.7", "3.12.1", "3.13.0"])
def test_interpreters_split_words_alike_exactly_when_their_unicode_is_the_same(
    version: str,
) -> None:
    """What the header records is what decides the split: run another installed Python on the
    index's own pattern; its words differ from ours only if its Unicode database does."""

    python = Path("/root/.pyenv/versions") / version / "bin" / "python3"
    if not python.exists():
        pytest.skip(f"Python {version} is not installed")
    pattern = r"\w+"  # the index's split, as ``words`` makes it here:
    assert words(PROBE) == [w[: search_index.MAX_WORD] for w in re.findall(pattern, PROBE.lower())]
    program = (
        "import json, re, sys, unicodedata\n"
        "pattern, text, cut = json.loads(sys.stdin.read())\n"
        "print(json.dumps([unicodedata.unidata_version,"
        " [w[:cut] for w in re.findall(pattern, text.lower())]]))\n"
    )
    done = subprocess.run(
        [str(python), "-c", program],
        input=json.dumps([pattern, PROBE, search_index.MAX_WORD]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    their_unicode, their_words = json.loads(done.stdout)
    ours = words(PROBE)
    if their_unicode == search_index.UNICODE:
        assert their_words == ours
    else:
        assert their_words != ours, "a probe character of a newer Unicode version was missed"
