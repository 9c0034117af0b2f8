"""Every command that reads a source, given each kind of thing that is not the source it wants
(nothing, an empty file, another program's SQLite database or LMDB environment, an empty
directory, a dangling symlink) or a symlink to a store: it refuses with exit 2 and a message, or
does its job, and never a traceback; the source's bytes and mtimes are unchanged, and nothing
is made beside it.

``lock.mdb`` of an LMDB environment is left out of the comparison: every LMDB reader records
itself in a slot of that file (it is LMDB's reader table, not data)."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
from pathlib import Path

import lmdb
import pytest
from pi_durable_lmdb import cli as cli_module

from tests.support.cli_call import call

NATS = ["--nats", "nats://127.0.0.1:1", "--stream", "S"]
"""No NATS server answers there: promote refuses a source before it asks."""

COMMANDS: dict[str, list[str]] = {
    "stats": ["stats", "SRC"],
    "stats --watch": ["stats", "SRC", "--watch"],
    "show": ["show", "SRC", "conversation", "1"],
    "tail": ["tail", "SRC"],
    "verify": ["verify", "SRC"],
    "export": ["export", "SRC"],
    "import": ["import", "SRC", "NEW"],
    "import --from-pi-durable": ["import", "--from-pi-durable", "SRC", "NEW"],
    "backup": ["backup", "SRC", "NEW"],
    "rebuild": ["rebuild", "SRC"],
    "compact": ["compact", "SRC"],
    "erase": ["erase", "SRC", "--conversation", "1", "--reason", "asked"],
    "trim": ["trim", "SRC", "--before", "17"],
    "promote": ["promote", "SRC", *NATS],
    "serve": ["serve", "SRC", "--port", "0"],
    "demo": ["demo", "SRC"],
    "search": ["search", "SRC", "word"],
    "checkpoint": ["checkpoint", "SRC", "--key", "KEY"],
    "prove": ["prove", "SRC", "1"],
    "projections": ["projections", "SRC"],
    "snapshot": ["snapshot", "SRC", *NATS],
    "list": ["list", "SRC", "tasks"],
    "verify-proof": ["verify-proof", "SRC", "--checkpoint", "SRC", "--vkey", "SRC"],
}
NOT_A_SOURCE = {
    "keygen": "reads no store; writes a new key file, never over an existing one",
    "restore": "reads a NATS stream; its PATH is the new store it builds",
    "replica": "reads a NATS stream; its PATH is the replica it keeps (made when missing)",
}
KINDS = [
    "missing",
    "empty file",
    "foreign SQLite",
    "foreign LMDB",
    "directory",
    "dangling symlink",
    "symlink to a store",
]

DOES_ITS_JOB = {
    ("demo", "missing"): "demo makes its store",
    ("demo", "directory"): "demo makes its store in an empty directory",
    **{
        (name, "symlink to a store"): "reads the store"
        for name in (
            "stats",
            "show",
            "tail",
            "verify",
            "export",
            "backup",
            "search",
            "checkpoint",
            "prove",
            "projections",
            "list",
        )
    },
}
"""Where the command succeeds (exit 0), the source still unchanged."""
SKIPPED = {
    **{
        (name, "symlink to a store"): "writes the store: its job"
        for name in ("rebuild", "compact", "erase", "trim", "demo")
    },
    ("promote", "symlink to a store"): "would ask a NATS server",
    ("snapshot", "symlink to a store"): "would ask a NATS server",
    ("serve", "symlink to a store"): "would serve until stopped",
    ("stats --watch", "symlink to a store"): "would watch until stopped",
}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pi_durable_lmdb.cli.demo import run_workload

    path = tmp_path_factory.mktemp("kinds") / "store"
    asyncio.run(run_workload(str(path)))
    return path


def _make(kind: str, root: Path, store: Path) -> Path:
    source = root / "source"
    if kind == "empty file":
        source.write_bytes(b"")
    elif kind == "foreign SQLite":
        with sqlite3.connect(source) as db:
            db.execute("CREATE TABLE notes (body TEXT)")
            db.execute("INSERT INTO notes VALUES ('another program''s data')")
        db.close()
    elif kind == "foreign LMDB":
        env = lmdb.open(str(source), max_dbs=2)
        with env.begin(write=True) as txn:
            txn.put(b"k", b"another program's value", db=env.open_db(b"other", txn=txn))
        env.close()
    elif kind == "directory":
        source.mkdir()
    elif kind == "dangling symlink":
        source.symlink_to(root / "nowhere")
    elif kind == "symlink to a store":
        shutil.copytree(store, root / "store")
        source.symlink_to(root / "store")
    return source


def _snapshot(root: Path) -> dict[str, tuple[int | None, bytes | str | None]]:
    """Every path under ``root``: its mtime (files) and bytes, or a symlink's target."""

    found: dict[str, tuple[int | None, bytes | str | None]] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            if name == "lock.mdb":
                continue
            if os.path.islink(path):
                found[os.path.relpath(path, root)] = (None, os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as data:
                    found[os.path.relpath(path, root)] = (os.stat(path).st_mtime_ns, data.read())
            else:
                found[os.path.relpath(path, root)] = (None, None)
    return found


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A signing key for ``checkpoint`` (outside every case's directory)."""

    from pi_durable_lmdb.tlog import note

    path = tmp_path_factory.mktemp("key") / "auditor.key"
    path.write_text(note.generate_signer("auditor").text() + "\n")
    return path


def test_the_matrix_covers_every_command() -> None:
    parser = cli_module._parser()
    names = set(
        next(
            action for action in parser._actions if hasattr(action, "choices") and action.choices
        ).choices
    )
    assert names == {args[0] for args in COMMANDS.values()} | set(NOT_A_SOURCE), names


CASES = [(name, kind) for name in COMMANDS for kind in KINDS]


@pytest.mark.parametrize("name, kind", CASES, ids=[f"{name}-{kind}" for name, kind in CASES])
def test_a_command_given_each_kind_of_source_refuses_or_works_and_never_writes_it(
    store: Path, key: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, kind: str
) -> None:
    if (name, kind) in SKIPPED:
        pytest.skip(SKIPPED[name, kind])
    source = _make(kind, tmp_path, store)
    before = _snapshot(tmp_path)
    args = [
        {"SRC": str(source), "NEW": str(tmp_path / "new"), "KEY": str(key)}.get(arg, arg)
        for arg in COMMANDS[name]
    ]
    code, _, err = call(capsys, *args)
    assert "Traceback" not in err, err
    after = _snapshot(tmp_path)
    made = {path for path in after if path not in before}
    if (name, kind) in DOES_ITS_JOB:
        assert code == 0, (code, err)
        if name == "verify":
            made.discard("store/last-verify.json")  # what verify found, kept beside the store
        if (
            name == "search"
        ):  # the word index, a projection the first search builds in the store's directory
            made -= {"store/search.index", "store/search.index/data.mdb"}
        if name in ("import", "backup"):
            made = {path for path in made if path != "new" and not path.startswith("new/")}
        if name == "demo":
            made = {path for path in made if path != "source" and not path.startswith("source/")}
            before = {
                path: value for path, value in before.items() if not path.startswith("source/")
            }
            after = {path: value for path, value in after.items() if not path.startswith("source/")}
    else:
        assert code == 2, (code, err)
        assert err.startswith("durable-log") or "error:" in err, err
    assert made == set(), f"made beside the source: {sorted(made)}"
    changed = sorted(path for path in before if before[path] != after.get(path))
    assert changed == [], f"changed: {changed}"


@pytest.mark.parametrize("kind", ["foreign SQLite", "empty file"])
def test_import_from_pi_durable_leaves_a_file_that_is_not_its_store_byte_for_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    source = _make(kind, tmp_path, tmp_path)
    data, stat = source.read_bytes(), source.stat()
    code, out, err = call(capsys, "import", "--from-pi-durable", source, tmp_path / "new")
    assert code == 2 and out == "" and "not a pi-durable store" in err, (code, err)
    assert source.read_bytes() == data and source.stat().st_mtime_ns == stat.st_mtime_ns
    assert sorted(os.listdir(tmp_path)) == ["source"], "no store, no copy, no -journal or -wal file"
    if kind == "foreign SQLite":
        with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as db:
            assert [
                row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ] == ["notes"]
        db.close()


@pytest.mark.parametrize("command", [["demo", "SRC"], ["replica", "SRC", *NATS, "--store", "abc"]])
def test_a_command_that_makes_its_store_refuses_another_programs_lmdb_files_unwritten(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """``demo`` and ``replica`` open (or make) a store at PATH as its writer: another program's
    LMDB environment there is refused first, never written into."""

    source = _make("foreign LMDB", tmp_path, store)
    before = _snapshot(tmp_path)
    code, _, err = call(capsys, *[str(source) if arg == "SRC" else arg for arg in command])
    assert code == 2 and "not a pi-durable-lmdb store" in err and "Traceback" not in err, (
        code,
        err,
    )
    assert _snapshot(tmp_path) == before
