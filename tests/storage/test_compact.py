"""``compact``: it gives back the pages a rebuild left free with every read unchanged, refuses a
store another process or this one has open, and leaves a good store wherever it is killed."""

from __future__ import annotations

# ── compact ───────────────────────────────────────────────────────────────────
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pi_durable_lmdb.errors import WriterLockedError
from pi_durable_lmdb.log import Environment
from pi_durable_lmdb.log.compact import StoreInUseError, compact
from pi_durable_lmdb.log.storedir import COMPACTING

from tests.storage.test_footprint import export_text, reads_of, write_turns
from tests.support.cli_call import call

SRC_ROOT = str(Path(__file__).resolve().parents[2])


def digest(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def child(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=SRC_ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def rebuilt_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Path, int, str, dict[str, Any]]:
    """A store of 300 turns whose projections were rebuilt (so a projections' worth of its file is
    free pages): its path, its size before the rebuild, its export and its reads."""

    path = tmp_path / "store"
    write_turns(path, 300)
    size = os.path.getsize(path / "data.mdb")
    assert call(capsys, "rebuild", path)[0] == 0
    return path, size, export_text(path, capsys), reads_of(path)


def test_compact_gives_back_what_a_rebuild_left_free_and_every_read_stays(
    rebuilt_store: tuple[Path, int, str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, before_rebuild, exported, reads = rebuilt_store
    grown = os.path.getsize(path / "data.mdb")
    assert grown > before_rebuild * 1.5
    code, out, err = call(capsys, "compact", path)
    assert code == 0, err
    assert "compacted" in out
    after = os.path.getsize(path / "data.mdb")
    assert after <= before_rebuild
    info = json.loads(call(capsys, "stats", path, "--json")[1])
    assert info["footprint"]["freePages"] == 0
    assert call(capsys, "verify", path)[0] == 0
    assert export_text(path, capsys) == exported
    assert reads_of(path) == reads
    assert not (path / COMPACTING).exists()
    write_turns(path, 50, start=301)  # a writer carries on in the compacted file
    assert call(capsys, "verify", path)[0] == 0
    more = reads_of(path)
    assert len(more["entries"]["items"]) == 350 and more["task"]["memos"]["turns"] == 350


WRITER = """
import asyncio, sys
from pi_durable_lmdb import LmdbStorage
async def main():
    storage = await LmdbStorage.open(sys.argv[1], durability="process")
    print("open", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await storage.close()
asyncio.run(main())
"""

READER = """
import sys
from pi_durable_lmdb.log import Environment
env = Environment(sys.argv[1], readonly=True)
with env.read() as txn:
    pass
print("open", flush=True)
sys.stdin.readline()
env.close()
"""


@pytest.mark.parametrize("holder", [WRITER, READER], ids=["writer", "reader"])
def test_compact_refuses_a_store_another_process_has_open(
    rebuilt_store: tuple[Path, int, str, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    holder: str,
) -> None:
    path = rebuilt_store[0]
    before = digest(path / "data.mdb")
    process = child(holder, str(path))
    try:
        assert process.stdout is not None and process.stdout.readline() == "open\n"
        with pytest.raises((WriterLockedError, StoreInUseError)) as refused:
            compact(path)
        assert str(process.pid) in str(refused.value)
        code, _, err = call(capsys, "compact", path)
        assert code == 2 and str(process.pid) in err
        assert digest(path / "data.mdb") == before and not (path / COMPACTING).exists()
    finally:
        assert process.stdin is not None
        process.communicate("\n", timeout=30)
    assert process.returncode == 0
    compact(path)  # closed everywhere now
    assert digest(path / "data.mdb") != before


def test_compact_refuses_a_store_this_process_has_open(
    rebuilt_store: tuple[Path, int, str, dict[str, Any]],
) -> None:
    path = rebuilt_store[0]
    env = Environment(path, readonly=True)
    try:
        with pytest.raises(StoreInUseError, match="in this process"):
            compact(path)
    finally:
        env.close()


CRASHING = """
import os, signal, sys
from pi_durable_lmdb.log import compact as module
stage = sys.argv[2]
def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
def before(name, target):
    original = getattr(target, name)
    def wrapped(*args, **kwargs):
        die()
    setattr(target, name, wrapped)
def after(name, target):
    original = getattr(target, name)
    def wrapped(*args, **kwargs):
        original(*args, **kwargs)
        die()
    setattr(target, name, wrapped)
{"copy": lambda: after("_copy", module), "fsync": lambda: before("_fsync", module),
 "rename": lambda: before("rename", os), "renamed": lambda: after("rename", os),
 "clear": lambda: before("clear_unsynced", module)}[stage]()
module.compact(sys.argv[1])
"""


@pytest.mark.parametrize("stage", ["copy", "fsync", "rename", "renamed", "clear"])
def test_a_compact_killed_at_any_step_leaves_a_good_store(
    rebuilt_store: tuple[Path, int, str, dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
    stage: str,
) -> None:
    path, _, exported, reads = rebuilt_store
    before = digest(path / "data.mdb")
    process = child(CRASHING, str(path), stage)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL
    if stage in ("copy", "fsync", "rename"):
        assert digest(path / "data.mdb") == before  # untouched until the rename
        assert (path / COMPACTING).exists()
    assert call(capsys, "verify", path)[0] == 0
    assert export_text(path, capsys) == exported
    assert reads_of(path) == reads  # a writer's open: it removes the leftover copy
    assert not (path / COMPACTING).exists()
    compact(path)
    assert export_text(path, capsys) == exported


def test_a_compact_killed_at_random_moments_leaves_a_good_store(
    rebuilt_store: tuple[Path, int, str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, exported, _ = rebuilt_store
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
        process = child(
            "import sys; from pi_durable_lmdb.log.compact import compact; compact(sys.argv[1])",
            str(path),
        )
        time.sleep(delay)
        process.kill()
        process.communicate(timeout=60)
        code, out, err = call(capsys, "export", path)
        assert code == 0, err
        assert out == exported
    assert call(capsys, "compact", path)[0] == 0
    assert call(capsys, "verify", path)[0] == 0
    assert export_text(path, capsys) == exported


@pytest.mark.parametrize("at", ["the copy's clean-up", "the copy"])
def test_a_ctrl_c_during_compact_leaves_no_copy_beside_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    """Ctrl-C lands as a ``KeyboardInterrupt`` wherever the main thread is: here in the removal of
    the staging copy after the swap, or in the copy itself. Either way the interrupt reaches the
    caller and nothing is left beside the store, which reads as before."""

    import shutil

    from pi_durable_lmdb.log import compact as compact_module
    from pi_durable_lmdb.log import storedir

    path = tmp_path / "store"
    write_turns(path, 40)
    reads = reads_of(path)
    removals = 0
    real_rmtree = shutil.rmtree

    def interrupted_rmtree(target: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal removals
        removals += 1
        if removals == 1:  # the first removal of the copy: the signal lands midway
            real_rmtree(os.path.join(target, "data.mdb"), ignore_errors=True)
            raise KeyboardInterrupt
        real_rmtree(target, *args, **kwargs)

    def interrupted_copy(*args: Any) -> Any:
        raise KeyboardInterrupt

    if at == "the copy":
        monkeypatch.setattr(compact_module, "_copy", interrupted_copy)
    else:
        monkeypatch.setattr(storedir.shutil, "rmtree", interrupted_rmtree)
    with pytest.raises(KeyboardInterrupt):
        compact(path)
    assert not (path / COMPACTING).exists()
    monkeypatch.undo()
    assert reads_of(path) == reads
