"""Ctrl-C to every long-running command, as a real process on a real store big enough that it
is still working when the signal comes (known from its own output, never from a sleep): one line
on stderr, exit 130, no traceback, stopped within a bound load cannot cross, nothing partial
left, and the store as it was (it verifies, with the same head)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

pytestmark = pytest.mark.slow

CLI = [sys.executable, "-m", "pi_durable_lmdb.cli"]
STOPS_WITHIN = 30.0  # seconds from SIGINT to exit: far beyond the second or two it takes
COMMITS, PER_COMMIT = 6_000, 20
INTERRUPTED = "durable-log: interrupted"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("interrupt") / "store"

    async def build() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
            for n in range(COMMITS):
                await storage.commit(
                    [
                        {
                            "type": "entry",
                            "value": {
                                "id": 2 + n * PER_COMMIT + k,
                                "conversationId": 1,
                                "kind": "message",
                                "model": [{"role": "user", "content": f"writer killed {n} {k}"}],
                            },
                        }
                        for k in range(PER_COMMIT)
                    ],
                    CTX,
                )
        finally:
            await storage.close()

    asyncio.run(build())
    return path


def _head(path: Path) -> int:
    done = subprocess.run([*CLI, "stats", str(path), "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import json

    return int(json.loads(done.stdout)["headSeq"])


def _as_it_was(path: Path) -> None:
    done = subprocess.run([*CLI, "verify", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _head(path) == COMMITS + 1


class Child:
    """A command as a process, its stderr read as it comes (progress lines end in ``\\r``)."""

    def __init__(self, args: list[str], **popen: object) -> None:
        self.process = subprocess.Popen(
            [*CLI, *args],
            stderr=subprocess.PIPE,
            **popen,  # type: ignore[call-overload]
        )
        self.err = b""
        self._changed = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stderr is not None
        while chunk := os.read(self.process.stderr.fileno(), 65536):
            with self._changed:
                self.err += chunk
                self._changed.notify_all()
        with self._changed:
            self.err += b"\0"  # the end
            self._changed.notify_all()

    def wait_for(self, wanted: bytes) -> None:
        with self._changed:
            found = self._changed.wait_for(lambda: wanted in self.err or b"\0" in self.err, 120)
            assert found and wanted in self.err, self.err

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(STOPS_WITHIN)

    def said(self, progress: tuple[str, ...] = ()) -> list[str]:
        """What stderr says apart from progress lines (those starting with ``progress``)."""

        with self._changed:
            self._changed.wait_for(lambda: b"\0" in self.err, 60)
            text = self.err.rstrip(b"\0").decode()
        lines = [line.strip() for line in text.replace("\r", "\n").split("\n")]
        return [line for line in lines if line and not line.startswith(progress)]


def _interrupted(child: Child, progress: tuple[str, ...] = ()) -> None:
    assert child.interrupt() == 130, child.err
    said = child.said(progress)
    assert "Traceback" not in child.err.decode() and said == [INTERRUPTED], child.err.decode()


def test_verify(store: Path, tmp_path: Path) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    child = Child(
        ["verify", str(store), "--progress"],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    child.wait_for(b"verify: ")
    _interrupted(child, ("verify: ",))
    assert os.listdir(scratch) == [], "its scratch projections are removed"
    _as_it_was(store)


def test_export(store: Path) -> None:
    """Export blocks writing to a reader that stopped reading: still working, deterministically."""

    child = Child(["export", str(store)], stdout=subprocess.PIPE)
    stdout = child.process.stdout
    assert stdout is not None
    assert stdout.readline().startswith(b'{"seq":1,')  # then nothing more is read: it blocks
    child.process.send_signal(signal.SIGINT)
    rest = threading.Thread(target=stdout.read, daemon=True)
    rest.start()  # what it had written before the signal, drained so that it can end
    assert child.process.wait(STOPS_WITHIN) == 130
    assert "Traceback" not in child.err.decode() and child.said() == [INTERRUPTED]


def test_import_leaves_no_new_store(store: Path, tmp_path: Path) -> None:
    """Import from stdin, fed until it shows progress, then left waiting for more."""

    lines = subprocess.run(
        [*CLI, "export", str(store)], capture_output=True, check=True
    ).stdout.splitlines(keepends=True)
    target = tmp_path / "imported"
    child = Child(
        ["import", "-", str(target), "--progress"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    stdin = child.process.stdin
    assert stdin is not None
    seen = threading.Event()

    def feed() -> None:
        for line in lines[: len(lines) // 2]:
            if seen.is_set():
                return
            stdin.write(line)
            stdin.flush()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    child.wait_for(b"import: ")
    seen.set()
    feeder.join(STOPS_WITHIN)
    _interrupted(child, ("import: ",))
    stdin.close()
    assert os.listdir(tmp_path) == [], "neither NEWPATH nor a partial store beside it"


def test_search_leaves_no_half_built_index(store: Path) -> None:
    child = Child(["search", str(store), "writer", "killed"], stdout=subprocess.DEVNULL)
    child.wait_for(b"building the word index")
    _interrupted(child, ("durable-log: building the word index",))
    assert not [name for name in os.listdir(store) if name.startswith("search.index")]
    _as_it_was(store)


@pytest.mark.parametrize("command", ["rebuild", "compact"])
def test_a_writer_command_leaves_the_store_as_it_was(
    store: Path, tmp_path: Path, command: str
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    before = sorted(os.listdir(copy) + ["journal"])  # a writer's open makes its journal
    child = Child([command, str(copy), "--progress"], stdout=subprocess.DEVNULL)
    child.wait_for(f"{command}: ".encode())
    code = child.interrupt()
    said = child.said((f"{command}: ",))
    assert "Traceback" not in child.err.decode()
    if command == "compact" and code == 0:  # LMDB's copy cannot be stopped: it may end first
        assert said == [], said
    else:
        assert code == 130 and said == [INTERRUPTED], (code, said)
    assert sorted({*os.listdir(copy), "journal"}) == before, "no copy or partial table beside"
    _as_it_was(copy)


def _maps(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return maps.read()
    except OSError:
        return ""


def _until(condition: Callable[[], bool]) -> None:
    import time

    for _ in range(12_000):  # polled every 10 ms: two minutes at most
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("never happened")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc/PID/maps")
def test_a_starting_serve(store: Path) -> None:
    """Interrupted once it is loading the web view (aiohttp mapped): starting, or just started."""

    child = Child(["serve", str(store), "--port", "0"], stdout=subprocess.DEVNULL)
    _until(lambda: "/aiohttp/" in _maps(child.process.pid) or child.process.poll() is not None)
    code = child.interrupt()
    said = child.said()
    assert "Traceback" not in child.err.decode()
    if code == 0:  # it was serving already: Ctrl-C stops it as it always did
        assert len(said) == 1 and said[0].startswith("durable-log: serving"), said
    else:
        assert code == 130 and said == [INTERRUPTED], (code, said)
