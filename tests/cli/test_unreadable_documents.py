"""A store holding documents whose committed change cannot apply (``["a", ["nope"], "x"]``: the
contract accepts it; reading the document then raises ``PathError``, as ``MemoryStorage`` does).

Every command of ``durable-log`` and every page of ``durable-log serve`` over such a store answers
as usual (no exit 3, no 5xx, no traceback); the ones that read the document say it cannot be read,
with the error and the log sequence of the change it fails at; ``verify`` says what it found."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from pi_durable_lmdb import cli as cli_module
from pi_durable_lmdb.web.app import make_app

from tests.support.cli_call import call
from tests.support.served import get, serve
from tests.support.unreadable import WORD, build_unreadable


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("unreadable") / "store"
    return path, asyncio.run(build_unreadable(path))


@pytest.fixture
def store(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of the built store per test: some commands change theirs (rebuild, compact, demo)."""

    path, made = built
    copy = tmp_path / "store"
    shutil.copytree(path, copy, ignore=shutil.ignore_patterns("search.index"))
    return copy, made


def _says_unreadable(text: str, made: dict[str, Any], id: int) -> None:
    assert f"document {id} cannot be read" in text, text
    assert f"log sequence {made['bad']}" in text, text
    assert "PathError: unresolvable path: ['nope']" in text, text


NATS = ["--nats", "nats://127.0.0.1:1", "--stream", "S"]

# name: (arguments, the exit code wanted); STORE, NEW, KEY and the ids are filled in
COMMANDS: dict[str, tuple[list[str], int]] = {
    "stats": (["stats", "STORE", "--json"], 0),
    "show a conversation": (["show", "STORE", "conversation", "ROOT"], 0),
    "show the document": (["show", "STORE", "document", "HISTORY", "--json"], 0),
    "show the current-only document": (["show", "STORE", "document", "SESSION", "--json"], 0),
    "show every other failure": (["show", "STORE", "document", "SESSION", "--json"], 0),
    "show the document before its failing change": (
        ["show", "STORE", "document", "HISTORY", "--as-of", "GOOD", "--json"],
        0,
    ),
    "tail": (["tail", "STORE", "--json"], 0),
    "verify": (["verify", "STORE"], 0),
    "search": (["search", "STORE", WORD], 0),
    "search --json": (["search", "STORE", WORD, "--json"], 0),
    "list documents": (["list", "STORE", "documents", "--format", "json"], 0),
    "export": (["export", "STORE"], 0),
    "import": (["import", "EXPORT", "NEW"], 0),
    "backup": (["backup", "STORE", "NEW"], 0),
    "rebuild": (["rebuild", "STORE"], 0),
    "compact": (["compact", "STORE"], 0),
    "demo": (["demo", "STORE"], 0),
    "keygen": (["keygen", "witness", "--out", "KEY"], 0),
    "checkpoint": (["checkpoint", "STORE", "--key", "KEY"], 0),
    "prove": (["prove", "STORE", "BAD"], 0),
    "projections": (["projections", "STORE"], 0),
    "list documents as a table": (["list", "STORE", "documents"], 0),
    "promote": (["promote", "STORE", *NATS], 2),  # no NATS server answers: a refusal
    "snapshot": (["snapshot", "STORE", *NATS], 2),
}
WAIT_FOR_NATS = {"promote", "snapshot"}
"""Commands that wait out their connection timeout for the server that never answers (slow)."""
ELSEWHERE = {
    "import --from-pi-durable": "test_a_pi_durable_source_holding_one_imports_the_rest",
    "serve": "test_every_page_of_the_web_view_answers",
    "restore": "reads a NATS stream only; its PATH is the store it builds",
    "replica": "reads a NATS stream only; its PATH is the replica it keeps",
    "verify-proof": "reads a proof and a signed checkpoint only, no store",
    "erase": "rewrites the store: tests/cli/test_erase.py and tests/storage/test_erase.py",
    "trim": "rewrites the store: tests/cli/test_trim.py and tests/storage/test_trim.py",
}


def test_every_command_is_covered() -> None:
    parser = cli_module._parser()
    names = {
        name
        for action in parser._subparsers._group_actions  # type: ignore[union-attr]
        for name in action.choices
    }
    covered = {args[0] for args, _ in COMMANDS.values()} | {n.split()[0] for n in ELSEWHERE}
    assert names == covered


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.slow) if name in WAIT_FOR_NATS else name
        for name in COMMANDS
    ],
)
def test_every_command_answers_as_usual(
    name: str,
    store: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path, made = store
    args, wanted = COMMANDS[name]
    key = tmp_path / "witness.key"
    if "checkpoint" in args:
        assert call(capsys, "keygen", "witness", "--out", key)[0] == 0
    if "EXPORT" in args:
        code, out, _ = call(capsys, "export", path)
        assert code == 0
        (tmp_path / "export.jsonl").write_text(out)
    names = {
        "STORE": path,
        "NEW": tmp_path / "new",
        "KEY": key,
        "EXPORT": tmp_path / "export.jsonl",
        "ROOT": made["root"],
        "HISTORY": made["history"],
        "SESSION": made["session"],
        "GOOD": made["good"],
        "BAD": made["bad"],
    }
    code, out, err = call(capsys, *(names.get(arg, arg) for arg in args))
    assert code == wanted and "Traceback" not in err, (code, out[-2000:], err[-2000:])
    if name in ("show the document", "show the current-only document"):
        id = made["history" if name == "show the document" else "session"]
        shown = json.loads(out)
        assert shown["record"]["id"] == id
        assert shown["unreadable"] == {
            "id": id,
            "error": "PathError: unresolvable path: ['nope']",
            "seq": made["bad"],
            "version": 1,
        }
        _says_unreadable(err, made, id)
    if name == "show every other failure":
        for id, error in made["others"].items():
            code, out, err = call(capsys, "show", path, "document", id, "--json")
            assert code == 0 and json.loads(out)["unreadable"]["seq"] == made["bad"], err
            assert json.loads(out)["unreadable"]["error"].startswith(error), out
    if name == "show the document before its failing change":
        assert json.loads(out)["value"] == {"text": WORD + " plan", "n": 1}
    if name in ("verify", "search"):
        _says_unreadable(out, made, made["history"])
        _says_unreadable(out, made, made["session"])
    if name == "verify":
        assert f"{2 + len(made['others'])} live documents cannot be read" in out, out
        for id, error in made["others"].items():
            assert f"document {id} cannot be read: replaying it fails at its change of log " in out
            assert f"sequence {made['bad']} ({error}" in out, out
    if name == "search --json":
        found = {hit["id"]: hit for hit in json.loads(out)["documents"]}
        assert found[made["history"]]["unreadable"]["seq"] == made["bad"]
        assert found[made["session"]]["unreadable"]["seq"] == made["bad"]
    if name == "list documents":  # records, not values: the unreadable ones are listed too
        listed = {json.loads(line)["id"] for line in out.splitlines()}
        assert {made["history"], made["session"], *made["others"]} <= listed, out
    if name == "import":  # the new store holds the same change, and fails as the old one
        code, out, err = call(
            capsys, "show", tmp_path / "new", "document", made["history"], "--json"
        )
        assert code == 0 and json.loads(out)["unreadable"]["seq"] == made["bad"], err


def _pages(made: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    """Each route's path on this store, and what its answer must hold."""

    history, session, bad, good = made["history"], made["session"], made["bad"], made["good"]
    said = [f"document {history} cannot be read", f"log sequence {bad}", "PathError"]
    return {
        "/": ("/", []),
        "/healthz": ("/healthz", []),
        "/favicon.ico": ("/favicon.ico", []),
        "/static": ("/static/style.css", []),
        "/metrics": ("/metrics", []),
        "/conversations": ("/conversations", []),
        "/conversations/{id}": (f"/conversations/{made['root']}", []),
        "/documents": ("/documents", []),
        "/tasks": ("/tasks", []),
        "/documents/{id}": (f"/documents/{history}", [*said, "failing-ops", "nope"]),
        "/documents/{id} (current-only)": (
            f"/documents/{session}",
            [f"document {session} cannot be read", f"log sequence {bad}"],
        ),
        "/documents/{id} at its failing change": (f"/documents/{history}?as_of={bad}", said),
        "/documents/{id} before it": (f"/documents/{history}?as_of={good}", ["quagga plan"]),
        "/search": (f"/search?q={WORD}", said),
        "/search (JSON)": (f"/search?q={WORD}&format=json", ['"unreadable"', f'"seq":{bad}']),
        "/log": ("/log", []),
        "/log/{seq}": (f"/log/{bad}", []),
        "/audit": ("/audit", []),
        "/records/{kind}/{id}": (f"/records/document/{history}", ['"unreadable"']),
        "/records/{kind}/{id} (current-only)": (f"/records/document/{session}", ['"unreadable"']),
        "/index.json": ("/index.json", []),
        "/search.json": (f"/search.json?q={WORD}", ['"unreadable"']),
        "/search/index.json": ("/search/index.json", []),
        "/documents/{id}.json": (f"/documents/{history}.json", ["nope"]),
        "/conversations/{id}.json": (f"/conversations/{made['root']}.json", []),
        "/log/{seq}.json": (f"/log/{bad}.json", []),
        **{
            f"/{kind}.{suffix}": (f"/{kind}.{suffix}", [])
            for kind in ("conversations", "documents", "tasks", "log")
            for suffix in ("json", "csv")
        },
        **{
            f"/{kind}/{{id}}{suffix}": (f"/{kind}/1{suffix}", [])
            for kind in ("tasks", "entries", "submissions")
            for suffix in ("", ".json")
        },
    }


def test_every_page_of_the_web_view_answers(
    store: tuple[Path, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, made = store
    pages = _pages(made)
    routes = {
        resource.canonical
        for resource in make_app(str(path)).router.resources()
        if resource.canonical != "/log/events"
    }
    assert routes == {name.split(" ")[0] for name in pages}
    assert call(capsys, "search", path, WORD)[0] == 0  # the page searches the index it finds
    with serve(path) as served:
        for _ in range(2):  # twice: a failing page would have dropped the shared read handle
            for name, (address, wanted) in pages.items():
                status, body, _ = get(served.url + address)
                assert status < 500, (name, status, body[-2000:])
                missing = [text for text in wanted if text not in body]
                assert not missing, (name, missing, body[-3000:])
        for id, error in made["others"].items():  # each other way a change fails
            for address in (f"/documents/{id}", f"/records/document/{id}"):
                status, body, _ = get(served.url + address)
                assert status == 200 and error.split(":")[0] in body, (address, body[-2000:])
            assert f"document {id} cannot be read" in get(served.url + f"/documents/{id}")[1]
        events: list[bytes] = []

        def first_event() -> None:
            with urllib.request.urlopen(served.url + "/log/events?after=0", timeout=60) as stream:
                for line in stream:
                    if line.startswith(b"id: "):
                        events.append(line)
                        return

        reader = threading.Thread(target=first_event)
        reader.start()
        reader.join(60)
        assert events == [b"id: 1\n"]
    assert not [line for line in served.stderr if "Traceback" in line], served.stderr
