"""``durable-log projections``, as a monitor and an operator use it: the listing exits 1 when a
projection is failed; ``--follow`` says what happened to each build (served, given up, paused
with no writer, stopped), counts as the build does, and waits for a writer still starting up.
Real stores, a real writer process, the command as a real process."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.projections.user import Projection, Tables
from pi_durable_lmdb.storage import LmdbStorage

from tests.projections.test_user_builds import Counter, _store

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "pi_durable_lmdb.cli"]
BOUND = 120.0  # seconds: far beyond what any step takes, even on a loaded machine

WRITER = textwrap.dedent(
    """
    import asyncio, sys
    import pi_durable_lmdb.log.environment as environment
    from pi_durable_lmdb.log.storedir import take_writer_lock
    from pi_durable_lmdb.storage import LmdbStorage
    from tests.projections.test_user_builds import CounterV2
    path = sys.argv[1]
    held = take_writer_lock(path)  # a writer starting up: its lock taken, no build registered yet
    environment.take_writer_lock = lambda _path: held
    print("locked", flush=True)
    sys.stdin.readline()
    CounterV2.delay = 0.002
    async def main():
        storage = await LmdbStorage.open(path, durability="process", projections=[CounterV2()])
        try:
            await asyncio.wait_for(storage.projections.wait(storage.log.head()), 300)
        finally:
            await storage.close()
    asyncio.run(main())
    """
)


class Lines:
    """A stream's lines as they come, read on a thread of their own."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for line in stream:
                self._lines.put(line)
            self._lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def wait_for(self, wanted: Callable[[str], bool]) -> str:
        while True:
            line = self._lines.get(timeout=BOUND)
            assert line is not None, f"ended before the line wanted: {self.seen}"
            self.seen.append(line)
            if wanted(line):
                return line


def _follow(path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "projections", str(path), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _writer(path: Path) -> tuple[subprocess.Popen[str], Lines]:
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert writer.stdout is not None
    said = Lines(writer.stdout)
    said.wait_for(lambda line: line == "locked\n")
    return writer, said


@pytest.mark.slow
async def test_follow_started_with_the_writer_waits_for_its_build_and_sees_it_served(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    await _store(path, 1000, [Counter()])
    writer, _ = _writer(path)
    follow = _follow(path)
    try:
        assert follow.stderr is not None and follow.stdout is not None
        progress = Lines(follow.stderr)
        progress.wait_for(lambda line: "waiting while a writer" in line)
        assert writer.stdin is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
        shown = progress.wait_for(lambda line: "records/s, ETA" in line)
        assert shown.startswith("counter version 2: sequence ") and " of 1,000, " in shown, shown
        assert follow.wait(BOUND) == 0, progress.seen
        assert follow.stdout.read() == "counter: version 2 is served\n"
    finally:
        follow.kill()
        assert writer.wait(BOUND) == 0


async def test_follow_says_a_build_is_paused_without_a_writer_and_given_up_when_the_program_goes_back(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    await _store(path, 1000, [Counter()])
    writer, _ = _writer(path)
    assert writer.stdin is not None
    writer.stdin.write("go\n")
    writer.stdin.flush()
    follow = _follow(path)
    try:
        assert follow.stderr is not None and follow.stdout is not None
        progress = Lines(follow.stderr)
        shown = progress.wait_for(lambda line: "records/s, ETA" in line)
        folded = int(shown.split("sequence ")[1].split(" of")[0].replace(",", ""))
        writer.send_signal(signal.SIGKILL)
        writer.wait(BOUND)
        paused = progress.wait_for(lambda line: "paused" in line)
        assert "no writer has the store open" in paused and "records/s" not in paused, paused
        assert int(paused.split("sequence ")[1].split(" of")[0].replace(",", "")) >= folded
        storage = await LmdbStorage.open(path, durability="process", projections=[Counter()])
        await storage.close()  # the program went back to version 1: the build is given up
        assert follow.wait(BOUND) == 0, progress.seen
        out = follow.stdout.read()
        assert out == "counter: the build of version 2 was given up; version 1 is served\n", out
        assert "version 2 is served" not in "".join(progress.seen)
    finally:
        follow.kill()
        writer.kill()


def test_follow_with_nothing_built_and_no_writer_says_so(tmp_path: Path) -> None:
    import asyncio

    path = tmp_path / "store"
    asyncio.run(_store(path, 10, [Counter()]))
    done = subprocess.run(
        [*CLI, "projections", str(path), "--follow"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=BOUND,
    )
    assert done.returncode == 0, done.stderr
    assert "no projection is being built, and no writer has the store open" in done.stdout


class Breaks(Projection):
    """Stops at sequence 3."""

    name = "breaks"
    version = 1

    def fold(self, tables: Tables, commit: Commit) -> None:
        if commit.seq == 3:
            raise RuntimeError("no room for record 3")
        tables.put("main", commit.seq.to_bytes(8, "big"), b"")


def _listing(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "projections", str(path), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=BOUND,
    )


async def test_the_listing_exits_1_while_a_projection_is_failed(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process", projections=[Counter(), Breaks()])
    try:
        from tests.projections.test_user_builds import _commit_entries

        await _commit_entries(storage, 2, 6)
        await storage.projections.wait(storage.log.head(), "counter")
    finally:
        await storage.close()
    for extra in ((), ("--json",)):
        listed = _listing(path, *extra)
        assert listed.returncode == 1, listed
        assert "stopped at sequence 3" in listed.stdout or "--json" in extra
    assert json.loads(_listing(path, "--json").stdout)["breaks"]["state"] == "failed"
    dropped = subprocess.run(
        [*CLI, "projections", "drop", str(path), "breaks"], capture_output=True, text=True, cwd=ROOT
    )
    assert dropped.returncode == 0, dropped
    for extra in ((), ("--json",)):
        listed = _listing(path, *extra)
        assert listed.returncode == 0 and "counter" in listed.stdout, listed
