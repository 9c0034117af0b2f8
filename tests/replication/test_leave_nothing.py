"""Operator commands that fail leave nothing they made behind, and clean up after their own
killed runs: ``replica`` with NATS down used to leave an empty store
directory; an ``import`` or ``restore`` killed midway left its hidden partial directory beside
NEWPATH forever, and later runs neither reused nor removed it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ..support.natsserver import NatsNode, free_port, nats_server  # noqa: F401  (fixture)

DURABLE_LOG = [sys.executable, "-m", "pi_durable_lmdb.cli"]


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DURABLE_LOG, *map(str, args)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_a_replica_that_cannot_reach_nats_or_its_stream_creates_nothing(
    tmp_path: Path, nats_server: NatsNode
) -> None:
    down = f"nats://127.0.0.1:{free_port()}"
    for nats, stream in ((down, "S"), (nats_server.url, "NOSUCH")):
        target = tmp_path / "replica"
        done = run("replica", target, "--nats", nats, "--stream", stream, "--store", "abc")
        assert done.returncode == 2, done.stderr
        assert not target.exists(), f"{nats} {stream}: left {sorted(os.listdir(target))}"
    assert sorted(os.listdir(tmp_path)) == ["nats"], "nothing but the test's own server"


HOLD = textwrap.dedent(
    """
    import asyncio, sys
    from pi_durable.context import BACKGROUND_CONTEXT as CTX
    from pi_durable_lmdb import LmdbStorage
    async def main():
        storage = await LmdbStorage.open(sys.argv[1], durability="process")
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        print("held", flush=True)
        sys.stdin.readline()
    asyncio.run(main())
    """
)


def test_a_later_import_removes_the_partials_of_killed_runs_and_keeps_live_ones(
    tmp_path: Path,
) -> None:
    source = tmp_path / "source.jsonl"
    source.write_text(
        '{"seq": 1, "committedAt": 1764000000000, "writes": [{"type": "conversation", "value": {"id": 1}}]}\n'
    )
    target = tmp_path / "new"
    stale = [
        tmp_path / ".new.import-partial-dead1",
        tmp_path / ".new.restore-partial-dead2",
        tmp_path / ".new.import-partial-empty",
    ]
    for partial in stale[:2]:  # what a killed run leaves: a store nobody holds
        made = subprocess.run(
            [sys.executable, "-c", HOLD, str(partial)],
            input="\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
    stale[2].mkdir()  # killed before its store was opened
    live = tmp_path / ".new.import-partial-live"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(live)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    other = tmp_path / ".other.import-partial-keep"  # another target's: not ours to judge
    other.mkdir()
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = run("import", source, target)
        assert done.returncode == 0, done.stderr
        assert (target / "data.mdb").is_file()
        left = sorted(os.listdir(tmp_path))
        assert left == sorted(
            [".new.import-partial-live", ".other.import-partial-keep", "new", "source.jsonl"]
        ), left
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(30)
