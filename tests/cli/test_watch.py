from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.cli.watch import watch
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from tests.support.audit_writer_child import batch


async def test_watch_prints_the_commits_made_between_two_reads(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    try:
        await storage.commit(batch(0), CTX)
        out = io.StringIO()
        thread = threading.Thread(target=watch, args=(path, out, 1.0, 1))
        thread.start()
        for n in range(1, 5):
            await storage.commit(batch(n), CTX)
        thread.join(10)
    finally:
        await storage.close()
    line = out.getvalue().strip()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  head 5 .*", line), line
    assert "commits/s" in line and "fold lag" in line


def test_stats_watch_on_a_missing_store_exits_nonzero(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "stats", "--watch", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert "No store at" in done.stderr
