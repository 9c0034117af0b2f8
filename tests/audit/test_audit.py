"""The ``durable-log`` command against real stores, in real processes: verify (healthy and damaged
stores), stats, export/import and the import from a pi-durable SQLite store (``tail`` is in
``test_tail.py``, sharing the helpers here). No mocks: every store is a directory on disk, every command
is the installed console script run as a subprocess.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.log.records import FORMAT_VERSION
from pi_durable_lmdb.storage import LmdbStorage

ROOT = Path(__file__).resolve().parents[2]
CHILD = str(ROOT / "tests" / "support" / "audit_writer_child.py")
ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
}

_script = Path(sys.executable).parent / "durable-log"
DURABLE_LOG = [str(_script)] if _script.exists() else [sys.executable, "-m", "pi_durable_lmdb.cli"]

_spec = importlib.util.spec_from_file_location("audit_writer_child", CHILD)
assert _spec is not None and _spec.loader is not None
child = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(child)
batch, conversation_of = child.batch, child.conversation_of

BUILT = 60
"""Batches in the shared store: batch(n) is committed at sequence n + 1."""


# ── helpers ───────────────────────────────────────────────────────────────────


def cli(
    *args: str, input: bytes | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*DURABLE_LOG, *map(str, args)], input=input, capture_output=True, env=ENV, timeout=timeout
    )


def cli_ok(*args: str, input: bytes | None = None) -> bytes:
    done = cli(*args, input=input)
    assert done.returncode == 0, (args, done.returncode, done.stderr.decode(errors="replace"))
    return done.stdout


def write_store(path: Path, start: int, count: int, delay: float = 0.0) -> int:
    """Commit batch(start) .. batch(start + count - 1) from a writer process; its head after."""

    done = subprocess.run(
        [
            sys.executable,
            CHILD,
            str(path),
            "--start",
            str(start),
            "--count",
            str(count),
            "--delay",
            str(delay),
        ],
        capture_output=True,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    last = done.stdout.decode().split()
    assert last[-2] == "done"
    return int(last[-1])


def json_lines(output: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.decode("ascii").splitlines()]


def expected(
    keep: Any = lambda write: True, first: int = 1, last: int = BUILT
) -> list[tuple[int, list[Any]]]:
    """(seq, kept writes) of the batches from ``first`` to ``last`` holding a kept write."""

    out = []
    for seq in range(first, last + 1):
        writes = [write for write in batch(seq - 1) if keep(write)]
        if writes:
            out.append((seq, writes))
    return out


def seqs_and_writes(lines: list[dict[str, Any]]) -> list[tuple[int, list[Any]]]:
    return [(line["seq"], line["writes"]) for line in lines]


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc/PID/stat."""

    with open(f"/proc/{pid}/stat") as stat:
        text = stat.read()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_files(pid: int) -> list[str]:
    names = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            names.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    return names


class Proc:
    """A subprocess whose stdout lines (bytes) are collected by a thread, readable with timeouts."""

    def __init__(self, args: list[str]) -> None:
        self.popen = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
        self.lines: queue.Queue[bytes | None] = queue.Queue()
        self.stderr = b""
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_stderr, daemon=True).start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_stderr(self) -> None:
        assert self.popen.stderr is not None
        self.stderr = self.popen.stderr.read()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def line(self, timeout: float = 15) -> bytes:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s from {self.popen.args}") from None
        if line is None:
            self.popen.wait(5)
            raise AssertionError(
                f"{self.popen.args} ended ({self.popen.returncode}): {self.stderr.decode(errors='replace')}"
            )
        return line

    def json_until(self, last_seq: int, timeout: float = 15) -> list[dict[str, Any]]:
        """JSON lines up to and including the one of sequence ``last_seq``."""

        deadline = time.monotonic() + timeout
        out: list[dict[str, Any]] = []
        while not out or out[-1]["seq"] < last_seq:
            out.append(
                json.loads(self.line(max(0.01, deadline - time.monotonic())).decode("ascii"))
            )
        return out

    def quiet(self, seconds: float) -> list[bytes]:
        """Lines printed within ``seconds`` (expected: none)."""

        out = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            out.append(line)
        return out

    def terminate(self, timeout: float = 10) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of BUILT batches written by a writer process; tests only read it."""

    path = tmp_path_factory.mktemp("audit") / "store"
    assert write_store(path, 0, BUILT) == BUILT
    return path


@pytest.fixture
def scratch_copy(built: Path, tmp_path: Path) -> Path:
    """A private copy of the built store (for tests that damage or extend it)."""

    copy = tmp_path / "copy"
    shutil.copytree(built, copy)
    return copy


# ── verify ────────────────────────────────────────────────────────────────────


def test_verify_passes_on_a_healthy_store(built: Path) -> None:
    done = cli("verify", built)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.decode()
    assert re.search(
        rf"verified {BUILT} log records \(checksums and order\) and \d+ projection keys in \d+ tables",
        summary,
    ), summary
    assert "the projections match the log" in summary


def _flip(path: Path, db_name: bytes | None, pick: Any) -> bytes:
    """Flip bytes in one value of one database, opening the LMDB environment directly."""

    env = lmdb.open(str(path), max_dbs=256)
    try:
        if db_name is None:
            with env.begin() as txn:
                names = [bytes(key) for key, _ in txn.cursor()]
            db_name = next(
                name for name in names if re.fullmatch(rb"p\d+\.entries\.by_conversation", name)
            )
        db = env.open_db(db_name, create=False)
        with env.begin(write=True, db=db) as txn:
            key, value = pick(txn)
            damaged = bytearray(value)
            for offset in (len(damaged) // 2, len(damaged) - 2):
                damaged[offset] ^= 0x5A
            txn.put(key, bytes(damaged))
    finally:
        env.close()
    return db_name


@pytest.mark.slow
def test_verify_names_a_damaged_log_record(scratch_copy: Path) -> None:
    damaged_seq = 37
    key = damaged_seq.to_bytes(8, "big")
    _flip(scratch_copy, b"log", lambda txn: (key, txn.get(key)))
    done = cli("verify", scratch_copy)
    assert done.returncode == 1, "damage found: exit 1"
    output = (done.stdout + done.stderr).decode()
    assert re.search(rf"\b{damaged_seq}\b", output), output
    # Every reading command refuses the damaged record too, naming it, instead of printing garbage.
    for command in (
        ["tail", scratch_copy, "--json", "--from", "1"],
        ["export", scratch_copy],
        ["tail", scratch_copy, "--limit", "30"],
    ):
        failed = cli(*command)
        assert failed.returncode == 1, (command, failed.stderr)
        assert re.search(rf"\b{damaged_seq}\b", failed.stderr.decode()), failed.stderr
        assert len(failed.stdout.splitlines()) <= damaged_seq - 1


def test_verify_names_a_damaged_projection(scratch_copy: Path) -> None:
    def some_entry(txn: lmdb.Transaction) -> tuple[bytes, bytes]:
        cursor = txn.cursor()
        assert cursor.first()
        for _ in range(5):
            cursor.next()
        return cursor.key(), cursor.value()

    name = _flip(scratch_copy, None, some_entry)
    done = cli("verify", scratch_copy)
    assert done.returncode == 1, (done.stdout, done.stderr)
    output = (done.stdout + done.stderr).decode()
    table = name.decode().split(".", 1)[
        1
    ]  # "entries.by_conversation" of "p0.entries.by_conversation"
    assert re.search(rf"\b{re.escape(table)}\b", output), output
    # In words: which entry of which conversation, not key bytes.
    assert re.search(
        r"entry \d+ of conversation \d+ holds a value the log does not produce", output
    ), output
    assert "1 difference" in output, output


# ── stats ─────────────────────────────────────────────────────────────────────


def test_stats(built: Path) -> None:
    info = json.loads(cli_ok("stats", built, "--json"))
    assert info["headSeq"] == BUILT and info["records"] == BUILT
    assert info["formatVersion"] == FORMAT_VERSION
    assert info["fileBytes"] == os.path.getsize(built / "data.mdb")
    assert (
        0 < info["logBytes"] < info["fileBytes"] and 0 < info["projectionBytes"] < info["fileBytes"]
    )
    assert info["firstCommittedAt"] <= info["lastCommittedAt"]
    submissions = sum(1 for n in range(1, BUILT) if n % 11 == 0)
    assert info["counts"] == {
        "conversations": 3,
        "entries": BUILT - 1,
        "tasks": 2,
        "submissions": submissions,
        "documents": 2,
    }
    assert info["liveDocuments"] == 2
    assert info["projections"]["core"]["foldedSeq"] == BUILT

    text = cli_ok("stats", built).decode()
    assert re.search(rf"^head sequence +{BUILT}$", text, re.M), text
    assert re.search(rf"^log records +{BUILT}$", text, re.M), text
    assert re.search(rf"^format version +{FORMAT_VERSION}$", text, re.M), text
    assert re.search(r"^file size +[\d.]+ (B|KiB|MiB|GiB)$", text, re.M), text
    assert (
        f"3 conversations, {BUILT - 1} entries, 2 tasks, {submissions} submissions, 2 documents"
        in text
    )


# ── export and import ─────────────────────────────────────────────────────────


async def _pages(storage: Any, method: str, query: dict[str, Any], limit: int = 7) -> list[Any]:
    pages, cursor = [], None
    while True:
        page = await getattr(storage, method)(query, limit, cursor, CTX)
        pages.append(page)
        cursor = page.get("next")
        if cursor is None:
            return pages


async def _reads(storage: Any, history: bool) -> dict[str, Any]:
    """Reads of every record type of the workload; ``history``: also reads at past points."""

    out: dict[str, Any] = {}
    for id in (1, 2, 3):
        out[f"conversation {id}"] = await storage.conversation(id, CTX)
        out[f"head marker {id}"] = await storage.find_latest_head_marker(id, None, CTX)
        for order in ("ascending", "descending"):
            out[f"entries {id} {order}"] = await _pages(
                storage, "scan_entries", {"conversationId": id, "order": order}
            )
    out["conversations"] = await _pages(storage, "scan_conversations", {})
    for id in (1001, 1007, 1030, 1059):
        out[f"entry {id}"] = await storage.entry(id, CTX)
    for id in (10, 11):
        out[f"task {id}"] = await storage.task(id, CTX)
    for query in ({}, {"order": "descending"}, {"status": "running"}, {"background": True}):
        out[f"tasks {query}"] = await _pages(storage, "scan_tasks", query, 1)
    for id in (5011, 5033, 5055):
        out[f"submission {id}"] = await storage.submission(id, CTX)
    out["submissions"] = await _pages(storage, "scan_submissions", {"status": "queued"}, 2)
    for id in (20, 21):
        out[f"document {id}"] = await storage.document(id, "current", CTX)
    addresses = [
        {"kind": "notes", "scope": {"kind": "conversation", "conversationId": 1}},
        {"kind": "settings", "key": "main", "scope": {"kind": "session"}},
    ]
    for address in addresses:
        out[f"find {address}"] = await storage.find_document(address, "current", CTX)
    if history:
        for at in (1, 7, 30, 55):
            out[f"document 20 at {at}"] = await storage.document(20, at, CTX)
            out[f"find notes at {at}"] = await storage.find_document(addresses[0], at, CTX)
    return out


@pytest.mark.slow
async def test_export_then_import_gives_an_identical_store(built: Path, tmp_path: Path) -> None:
    exported = cli_ok("export", built)
    assert [line["seq"] for line in json_lines(exported)] == list(range(1, BUILT + 1))
    dump = tmp_path / "f.jsonl"
    dump.write_bytes(exported)

    new = tmp_path / "new"
    report = cli_ok("import", dump, new).decode()
    assert f"imported {BUILT} commits" in report and "renumbered" not in report
    assert cli("verify", new).returncode == 0
    assert cli_ok("export", new) == exported
    assert cli_ok("export", new, "--from", "20", "--to", "25") == b"".join(
        exported.splitlines(True)[19:25]
    )

    # From stdin, too.
    piped = tmp_path / "piped"
    cli_ok("import", "-", piped, input=exported)
    assert cli_ok("export", piped) == exported

    original, copy = await LmdbStorage.open(built), await LmdbStorage.open(new)
    try:
        want = await _reads(original, history=True)
        assert want["entry 1007"]["entry"]["data"]["text"].endswith("\ud800")
        assert want["document 20"]["value"]["turn"] == 55
        assert await _reads(copy, history=True) == want
    finally:
        await original.close()
        await copy.close()

    # A store that already holds commits is never imported into.
    refused = cli("import", dump, new)
    assert refused.returncode != 0
    assert b"not empty" in refused.stderr, refused.stderr
    assert json.loads(cli_ok("stats", new, "--json"))["headSeq"] == BUILT


async def test_import_from_a_pi_durable_sqlite_store(tmp_path: Path) -> None:
    from pi_durable.storage.sqlite.posix import open_posix_sqlite_storage

    file = tmp_path / "durable.sqlite"
    source = await open_posix_sqlite_storage(str(file))
    try:
        for n in range(BUILT):
            await source.commit(batch(n), CTX)
        # Two conversations' entries in one commit, a fork owned by a task, a finished task, a
        # task-scoped document and a retired one.
        await source.commit(
            [
                {"type": "entry", "value": {"id": 2001, "conversationId": 1, "kind": "note"}},
                {
                    "type": "entry",
                    "value": {"id": 2002, "conversationId": 2, "kind": "note", "head": 2002},
                },
            ],
            CTX,
        )
        await source.commit(
            [
                {
                    "type": "conversation",
                    "value": {
                        "id": 4,
                        "parent": {"conversationId": 1, "at": 1030},
                        "owner": {"conversationId": 1, "taskId": 10},
                    },
                }
            ],
            CTX,
        )
        await source.commit(
            [{"type": "entry", "value": {"id": 2003, "conversationId": 4, "kind": "message"}}], CTX
        )
        done = dict(batch(0)[3]["value"])  # task 10, finished
        done["state"] = {
            "status": "terminal",
            "outcome": {"status": "completed", "result": {"ok": True}},
        }
        await source.commit([{"type": "task", "value": done}], CTX)
        await source.commit(
            [
                {
                    "type": "document.create",
                    "record": {
                        "id": 30,
                        "kind": "scratch",
                        "scope": {"kind": "task", "taskId": 11},
                    },
                    "content": {"kind": "base", "version": 2, "value": {"x": "\ud800"}},
                },
                {
                    "type": "document.create",
                    "record": {"id": 31, "kind": "gone", "scope": {"kind": "session"}},
                    "content": {"kind": "base", "version": 1, "value": {}},
                },
            ],
            CTX,
        )
        await source.commit([{"type": "document.retire", "id": 31}], CTX)
    finally:
        await source.close(CTX)

    new = tmp_path / "new"
    report = cli_ok("import", "--from-pi-durable", file, new).decode()
    assert "not carried over" in report and "document history" in report, report
    assert "commit sequences" in report, report
    assert cli("verify", new).returncode == 0

    source = await open_posix_sqlite_storage(str(file))
    target = await LmdbStorage.open(new)
    try:
        want, got = await _reads(source, history=False), await _reads(target, history=False)
        for key in list(want):
            if key.startswith("entry "):
                # commitSeq is the new store's own numbering (stated as not carried over).
                assert got[key]["entry"] == want[key]["entry"], key
                want[key], got[key] = want[key]["entry"], got[key]["entry"]
            elif key.startswith("document "):
                # Each document starts afresh at its current value: no deltas since base,
                # createdAt from the new numbering.
                assert (
                    got[key]["version"] == want[key]["version"]
                    and got[key]["value"] == want[key]["value"]
                ), key
                assert got[key]["deltasSinceBase"] == 0
                want[key], got[key] = (
                    _without_created(want[key]["record"]),
                    _without_created(got[key]["record"]),
                )
            elif key.startswith("find "):
                want[key], got[key] = _without_created(want[key]), _without_created(got[key])
        assert got == want

        for id in (4,):
            assert await target.conversation(id, CTX) == await source.conversation(id, CTX)
            for order in ("ascending", "descending"):
                query = {"conversationId": id, "order": order}
                assert await _pages(target, "scan_entries", query) == await _pages(
                    source, "scan_entries", query
                )
        assert await target.task(10, CTX) == await source.task(10, CTX)
        for query in ({}, {"status": "terminal"}, {"conversationId": 2}):
            assert await _pages(target, "scan_tasks", query) == await _pages(
                source, "scan_tasks", query
            )
        for id in (30, 31):
            want_doc, got_doc = (
                await source.document(id, "current", CTX),
                await target.document(id, "current", CTX),
            )
            assert (got_doc is None) == (want_doc is None) and (
                got_doc is None or got_doc["value"] == want_doc["value"]
            )
        task_address = {"kind": "scratch", "scope": {"kind": "task", "taskId": 11}}
        assert _without_created(
            await target.find_document(task_address, "current", CTX)
        ) == _without_created(await source.find_document(task_address, "current", CTX))
        assert (
            await target.find_document(
                {"kind": "gone", "scope": {"kind": "session"}}, "current", CTX
            )
            is None
        )

        # Entries keep their original commit grouping and order.
        pairs = []
        for id in [*range(1001, 1001 + BUILT - 1), 2001, 2002, 2003]:
            pairs.append(
                (
                    (await source.entry(id, CTX))["commitSeq"],
                    (await target.entry(id, CTX))["commitSeq"],
                )
            )
        pairs.sort()
        assert all(
            a[1] < b[1] if a[0] < b[0] else a[1] == b[1] for a, b in itertools.pairwise(pairs)
        )
    finally:
        await target.close()
        await source.close(CTX)


def _without_created(record: Any) -> Any:
    return None if record is None else {k: v for k, v in record.items() if k != "createdAt"}
