"""A real store for the web view's tests, and ``durable-log serve`` on it as a real process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from pi_durable import create_session
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import Projection
from pi_durable_lmdb.cli.demo import run_workload
from pi_durable_lmdb.errors import ProjectionFailed
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.projections.user import Tables
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from examples.task_outcomes import TaskOutcomes

T = TypeVar("T")

HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
HOSTILE_KIND = "<img src=x onerror=window.pwned=3>\ud800"
INVISIBLE = "bell\x07 rtl\u202e zero-width\u200b lone\udc00 end"
HUGE = "x" * 20_000 + "THE-END"


class Exploding(Projection):
    """A user projection that fails at sequence 7 with an agent-like hostile message."""

    name = "exploding"
    version = 1

    def fold(self, tables: Tables, commit: Commit) -> None:
        if commit.seq == 7:
            raise RuntimeError("<script>window.pwned=4</script>")
        tables.put("main", commit.seq.to_bytes(8, "big"), b"")


def _run(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """``asyncio.run`` on a thread of its own: Playwright's sync API keeps a loop on this one."""

    found: list[T] = []
    failed: list[BaseException] = []

    def target() -> None:
        try:
            found.append(asyncio.run(work()))
        except BaseException as error:  # noqa: BLE001 - re-raised on the test's thread
            failed.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(60)
    if failed:
        raise failed[0]
    return found[0]


def build_store(path: Path) -> dict[str, Any]:
    """The demo's workload (a root conversation with a fork, a ``notes`` document changed every
    turn), then an entry on the fork and untrusted strings in the root."""

    made = _run(lambda: run_workload(str(path)))

    async def more() -> dict[str, Any]:
        storage = await LmdbStorage.open(path, projections=[TaskOutcomes(), Exploding()])
        session = create_session(storage)
        try:

            async def write(tx: Any) -> dict[str, Any]:
                forked = await tx.append_entry(
                    made.fork,
                    {
                        "kind": "message",
                        "model": [{"role": "user", "content": "a question on the fork"}],
                    },
                )
                hostile = await tx.append_entry(
                    made.root,
                    {
                        "kind": "message",
                        "model": [{"role": "user", "content": HOSTILE + " " + INVISIBLE}],
                    },
                )
                huge = await tx.append_entry(made.root, {"kind": "note", "data": {"text": HUGE}})
                return {
                    "forked_entry": forked["id"],
                    "hostile_entry": hostile["id"],
                    "huge_entry": huge["id"],
                }

            written = dict(await session.commit(write, CTX))
            await storage.projections.wait(storage.log.head(), "task_outcomes")
            try:
                await storage.projections.wait(storage.log.head())
            except ProjectionFailed:
                pass  # exploding stopped at sequence 7, as meant
            return written
        finally:
            await session.close(CTX)
            await storage.close()

    point = _run(lambda: _fork_point(path, made.fork))
    return {**msgspec.to_builtins(made), **_run(more), "fork_point": point}


async def _fork_point(path: Path, fork: int) -> int:
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        record = await storage.conversation(fork, CTX)
        assert record is not None and "parent" in record
        return int(record["parent"]["at"])
    finally:
        await storage.close()


def value_at(path: Path, document: int, seq: int) -> Any:
    """A document's value as the store's own ``as_of`` reads it (what the page must show)."""

    async def run() -> Any:
        storage = await LmdbStorage.open(path, readonly=True)
        try:
            found = await (await storage.as_of(seq)).document(document, "current", CTX)
            return None if found is None else found["value"]
        finally:
            await storage.close()

    return _run(run)


def commit_entry(path: Path, conversation: int, kind: str, text: str) -> int:
    """One more commit (from this process, the store's writer while the view reads it); its sequence."""

    async def run() -> int:
        storage = await LmdbStorage.open(path)
        session = create_session(storage)
        try:

            async def write(tx: Any) -> None:
                await tx.append_entry(
                    conversation, {"kind": kind, "model": [{"role": "user", "content": text}]}
                )

            await session.commit(write, CTX)
            return storage.log.head()
        finally:
            await session.close(CTX)
            await storage.close()

    return _run(run)


class Served:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process, self.url = process, url
        self.stderr: list[str] = []


@contextmanager
def serve(path: Path, *extra: str, run_as: tuple[str, ...] = ()) -> Iterator[Served]:
    """``durable-log serve PATH --port 0`` as a process (``run_as``: the command it runs under,
    such as ``setpriv`` to run it as another user); its URL read from what it prints."""

    process = subprocess.Popen(
        [
            *run_as,
            sys.executable,
            *("-m", "pi_durable_lmdb.cli", "serve", str(path), "--port", "0", *extra),
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    try:
        line = process.stderr.readline()
        found = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
        assert found, (
            f"serve did not start: {line}{process.stderr.read() if process.poll() is not None else ''}"
        )
        served = Served(process, found.group(1))
        threading.Thread(
            target=lambda: served.stderr.extend(process.stderr or []), daemon=True
        ).start()
        yield served
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def get(
    url: str, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def store_files(path: Path) -> dict[str, str]:
    """The store's own files (its word index and lock file aside) by their content's hash: what
    a read-only view must never change."""

    return {
        str(file.relative_to(path)): hashlib.sha256(file.read_bytes()).hexdigest()
        for file in sorted(path.rglob("*"))
        if file.is_file()
        and not any(part.startswith("search.index") for part in file.parts)  # and its staging
        and file.name != "lock.mdb"
    }


def index_state(url: str, until: Callable[[dict[str, Any]], bool], bound: float = 60.0) -> Any:
    """``/search/index.json`` once ``until`` holds of it (asked every tenth of a second; the bound
    only keeps a broken server from hanging the test, nothing is timed)."""

    deadline = time.monotonic() + bound
    while True:
        status, body, _ = get(url + "/search/index.json")
        assert status == 200, body
        state = json.loads(body)
        if until(state):
            return state
        assert time.monotonic() < deadline, f"the word index never got there: {state}"
        time.sleep(0.1)


def chromium() -> str | None:
    for candidate in (
        os.environ.get("PI_DURABLE_CHROMIUM"),
        "/usr/bin/chromium",
        "/usr/bin/chromium-browser",
    ):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None
