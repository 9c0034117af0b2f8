"""Hardening: each finding of an adversarial review, and the family it stands for.

* document addresses and scopes are identified by the reference's text of them;
* readers across a rebuild, reads after ``close()``, a ``wait`` pending at ``close()``;
* a truncated ``data.mdb`` is named at open, never read past its end;
* refusals a caller keeps do not keep read transactions (LMDB's reader table) with them.

``docs/reliability.md`` lists each finding with its test.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.errors import StoreClosedError
from pi_durable_lmdb.log import Environment, TruncatedStoreError, WriterLockedError
from pi_durable_lmdb.log.storedir import check_not_truncated
from pi_durable_lmdb.storage import LmdbStorage

from ..support.compare import outcome

ENTRY = [{"type": "conversation", "value": {"id": 1}}]


# ── 3. document addresses and scopes: the reference's text of them ─────────

KEYS = ["😀", "\ud83d\ude00", "\ud83d", "\ude00", "é", "e\u0301", None, "k"]
"""Keys whose texts collide in the reference (a pair and its character) or must not (a lone
half, a combining sequence, an absent key)."""


def _create(id: int, key: Any, scope: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    record: dict[str, Any] = {"id": id, "kind": "notes", "scope": scope or {"kind": "session"}}
    if key is not None:
        record["key"] = key
    return [
        {
            "type": "document.create",
            "record": record,
            "content": {"kind": "base", "version": 1, "value": {"n": id}},
        }
    ]


async def _address_story(store: Any) -> list[Any]:
    """Creates, retires and lookups over colliding addresses; every outcome, errors included."""

    out: list[Any] = [
        await outcome(store.commit([{"type": "conversation", "value": {"id": 1}}], CTX))
    ]
    for index, key in enumerate(KEYS):
        out.append(await outcome(store.commit(_create(10 + index, key), CTX)))
    out.append(await outcome(store.commit([{"type": "document.retire", "id": 10}], CTX)))
    out.append(await outcome(store.commit(_create(30, "\ud83d\ude00"), CTX)))
    out.append(await outcome(store.commit(_create(31, "x", {"kind": "task", "taskId": 5}), CTX)))
    out.append(
        await outcome(
            store.commit(_create(32, "x", {"kind": "conversation", "conversationId": 1}), CTX)
        )
    )
    for key in KEYS:
        address: dict[str, Any] = {"kind": "notes", "scope": {"kind": "session"}}
        if key is not None:
            address["key"] = key
        for at in ("current", 2, 3, 10, 11):
            out.append(await outcome(store.find_document(address, at, CTX)))
    for scope in (
        {"kind": "conversation", "conversationId": 1},
        {"kind": "conversation", "conversationId": "1"},
        {"kind": "conversation", "conversationId": True},
        {"kind": "task", "taskId": 5},
        {"kind": "task", "taskId": "5"},
        {"kind": "other", "taskId": 5},
    ):
        out.append(
            await outcome(store.scan_documents({"scope": scope, "at": "current"}, 10, None, CTX))
        )
        out.append(
            await outcome(
                store.find_document({"kind": "notes", "scope": scope, "key": "x"}, "current", CTX)
            )
        )
    return out


async def test_document_addresses_are_the_reference_s_text_of_them(tmp_path: Path) -> None:
    expected = await _address_story(MemoryStorage())
    storage = await LmdbStorage.open(tmp_path / "s", durability="process")
    try:
        assert await _address_story(storage) == expected
        # "😀" then "\ud83d\ude00": one address, so the second live create was refused
        assert expected[1][0] == "ok" and expected[2][0] == "error"
        head = storage.log.head()
        views = [await storage.as_of(seq) for seq in range(head + 1)]
        memory = MemoryStorage()
        await _address_story(memory)
        session = {"kind": "notes", "scope": {"kind": "session"}}
        for seq, view in enumerate(views):  # a view sees the address as the live store did then
            found = await view.find_document({**session, "key": "\ud83d\ude00"}, "current", CTX)
            assert (None if found is None else found["id"]) == (
                None if seq < 2 or seq == 9 else 10 if seq < 9 else 30
            )
            found = await view.find_document({**session, "key": "😀"}, "current", CTX)
            assert (None if found is None else found["id"]) == (
                None if seq < 2 or seq == 9 else 10 if seq < 9 else 30
            )
        await storage.rebuild()
        again = [
            await outcome(
                storage.find_document(
                    {"kind": "notes", "scope": {"kind": "session"}, "key": key}, "current", CTX
                )
            )
            for key in KEYS
        ]
        want = [
            await outcome(
                memory.find_document(
                    {"kind": "notes", "scope": {"kind": "session"}, "key": key}, "current", CTX
                )
            )
            for key in KEYS
        ]
        assert again == want
    finally:
        await storage.close()
    assert verify(str(tmp_path / "s")) is None


# ── 4. every public method after close() ───────────────────────────────────

STORAGE_CALLS: list[tuple[str, Any]] = [
    ("conversation", lambda s: s.conversation(1, CTX)),
    ("scan_conversations", lambda s: s.scan_conversations({}, 5, None, CTX)),
    ("entry", lambda s: s.entry(2, CTX)),
    ("entry through", lambda s: s.entry(1, 2, CTX)),
    ("find_latest_head_marker", lambda s: s.find_latest_head_marker(1, None, CTX)),
    ("scan_entries", lambda s: s.scan_entries({"conversationId": 1}, 5, None, CTX)),
    ("task", lambda s: s.task(3, CTX)),
    ("scan_tasks", lambda s: s.scan_tasks({}, 5, None, CTX)),
    ("submission", lambda s: s.submission(4, CTX)),
    ("scan_submissions", lambda s: s.scan_submissions({}, 5, None, CTX)),
    ("submission_by_request", lambda s: s.submission_by_request(1, "r", CTX)),
    (
        "find_document",
        lambda s: s.find_document(
            {"kind": "notes", "scope": {"kind": "session"}, "key": "😀"}, "current", CTX
        ),
    ),
    ("document", lambda s: s.document(5, "current", CTX)),
    (
        "scan_documents",
        lambda s: s.scan_documents({"scope": {"kind": "session"}, "at": "current"}, 5, None, CTX),
    ),
]
"""Every read of the contract, each over a record ``_FILL`` writes."""

_FILL = [
    {"type": "conversation", "value": {"id": 1}},
    {"type": "entry", "value": {"id": 2, "conversationId": 1, "kind": "message", "head": 2}},
    {
        "type": "task",
        "value": {
            "id": 3,
            "conversationId": 1,
            "kind": "k",
            "version": 1,
            "input": None,
            "state": {"status": "pending"},
            "background": False,
            "abortRequested": False,
        },
    },
    {
        "type": "submission",
        "value": {"id": 4, "conversationId": 1, "status": "queued", "requestId": "r"},
    },
    *_create(5, "😀"),
]


async def _filled_store(path: Path, commits: int = 1, projections: Any = ()) -> LmdbStorage:
    storage = await LmdbStorage.open(path, durability="process", projections=projections)
    reference = MemoryStorage()
    reference.prepare_commit(_FILL)  # the fill is a batch the reference takes
    await storage.commit(_FILL, CTX)
    for index in range(commits - 1):
        await storage.commit(
            [{"type": "entry", "value": {"id": 100 + index, "conversationId": 1, "kind": "m"}}], CTX
        )
    return storage


async def test_every_public_method_after_close_refuses_by_name(tmp_path: Path) -> None:
    storage = await _filled_store(tmp_path / "s", projections=[_Slow()])
    await storage.projections.wait(1)
    view = await storage.as_of(1)
    for name, call in STORAGE_CALLS:  # they all answer while open
        assert (await outcome(call(storage)))[0] == "ok", name
        assert (await outcome(call(view)))[0] == "ok", name
    await storage.close()
    calls: list[tuple[str, Any]] = [
        (name, lambda c=call: c(storage)) for name, call in STORAGE_CALLS
    ]
    calls += [(f"view {name}", lambda c=call: c(view)) for name, call in STORAGE_CALLS]
    calls += [
        ("commit", lambda: storage.commit(ENTRY, CTX)),
        ("mint_id", lambda: storage.mint_id()),
        ("as_of", lambda: storage.as_of(1)),
        ("rebuild", lambda: storage.rebuild()),
        ("log.head", lambda: storage.log.head()),
        ("log.first", lambda: storage.log.first()),
        ("log.count", lambda: storage.log.count()),
        ("log.get", lambda: storage.log.get(1)),
        ("log.read", lambda: list(storage.log.read(1))),
        ("log.take", lambda: storage.log.take(1, None, 5)),
        ("log.raw_chunk", lambda: storage.log.raw_chunk(1, None)),
        ("log.follow", lambda: storage.log.follow(1).__anext__()),
        ("projections.read", lambda: storage.projections.read("slow").__enter__()),
        ("projections.wait", lambda: storage.projections.wait(1)),
    ]
    for name, call in calls:
        with pytest.raises(StoreClosedError) as caught:
            result = call()
            if asyncio.iscoroutine(result) or hasattr(result, "__await__"):
                await result
        assert "closed" in str(caught.value), (name, str(caught.value))
    assert (await outcome(storage.close()))[0] == "ok"  # closing twice is fine


async def test_a_running_follow_ends_with_a_clear_error_at_close(tmp_path: Path) -> None:
    storage = await _filled_store(tmp_path / "s")
    seen: list[int] = []

    async def follow() -> None:
        async for commit in storage.log.follow(1):
            seen.append(commit.seq)

    task = asyncio.ensure_future(follow())
    for _ in range(100):
        await asyncio.sleep(0.01)
        if seen:
            break
    await storage.close()
    with pytest.raises(RuntimeError, match="closed") as caught:
        await asyncio.wait_for(task, 5)
    assert not isinstance(caught.value, lmdb.Error)
    assert seen == [1]


# ── 5. a projections.wait pending at close() ────────────────────────────────


class _Slow:
    """A user projection: a row per commit."""

    name = "slow"
    version = 1
    databases = ("main",)

    def fold(self, tables: Any, commit: Any) -> None:
        tables.put("main", commit.seq.to_bytes(8, "big"), b"")


async def test_close_ends_a_pending_projection_wait_and_the_worker_stays_stopped(
    tmp_path: Path,
) -> None:
    loop = asyncio.get_running_loop()
    unretrieved: list[Any] = []
    loop.set_exception_handler(lambda loop, context: unretrieved.append(context))
    storage = await _filled_store(tmp_path / "s", commits=1, projections=[_Slow()])
    for index in range(50):
        await storage.commit(
            [{"type": "entry", "value": {"id": 10_000 + index, "conversationId": 1, "kind": "m"}}],
            CTX,
        )
    waiter = asyncio.ensure_future(
        storage.projections.wait(storage.log.head() + 1)
    )  # a commit never made
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await storage.close()
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(waiter, 5)
    storage.projections.kick()  # must not start a worker on the closed environment
    with pytest.raises(RuntimeError, match="closed"):
        await storage.projections.wait(1)
    await asyncio.sleep(0.05)
    import gc

    gc.collect()
    await asyncio.sleep(0)
    assert unretrieved == []
    assert storage.projections._worker is None or not storage.projections._worker.is_alive()
    loop.set_exception_handler(None)


# ── 6. readers across a rebuild ─────────────────────────────────────────────

CLI = str(Path(sys.executable).parent / "durable-log")


async def _answers(store: Any) -> list[Any]:
    return [await outcome(call(store)) for _, call in STORAGE_CALLS]


async def test_a_read_only_store_follows_a_rebuild_run_by_another_process(tmp_path: Path) -> None:
    path = tmp_path / "s"
    storage = await _filled_store(path, commits=400)
    await storage.close()
    reader = await LmdbStorage.open(path, readonly=True)
    try:
        view = await reader.as_of(1)
        before, before_view = await _answers(reader), await _answers(view)
        assert all(answer[0] == "ok" for answer in before)
        for _ in range(2):  # twice: the second swap drops the generation the first one made
            process = await asyncio.create_subprocess_exec(
                CLI,
                "rebuild",
                str(path),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            during = []
            while process.returncode is None:  # reads while it runs see whole generations
                during.append(await _answers(reader))
                try:
                    await asyncio.wait_for(process.wait(), 0.01)
                except TimeoutError:
                    pass
            _out, err = await process.communicate()
            assert process.returncode == 0, err.decode()
            for answers in during:
                assert answers == before, [(a, b) for a, b in zip(answers, before) if a != b]
            assert await _answers(reader) == before
            assert await _answers(view) == before_view
            assert [c.seq for c in reader.log.read(1)] == list(range(1, 401))
    finally:
        await reader.close()


async def test_an_as_of_view_taken_before_a_rebuild_reads_after_it(tmp_path: Path) -> None:
    storage = await _filled_store(tmp_path / "s", commits=30)
    try:
        views = [await storage.as_of(seq) for seq in (0, 1, 15, 30)]
        before = [await _answers(view) for view in views]
        await storage.rebuild()
        assert [await _answers(view) for view in views] == before
        await storage.rebuild()
        assert [await _answers(view) for view in views] == before
    finally:
        await storage.close()


async def test_a_read_only_handle_in_the_writer_s_process_follows_its_rebuild(
    tmp_path: Path,
) -> None:
    storage = await _filled_store(tmp_path / "s", commits=30)
    reader = await LmdbStorage.open(tmp_path / "s", readonly=True)
    try:
        before = await _answers(reader)
        await storage.rebuild()
        assert await _answers(reader) == before
        await storage.commit([{"type": "conversation", "value": {"id": 77}}], CTX)
        assert await reader.conversation(77, CTX) == {"id": 77}
    finally:
        await reader.close()
        await storage.close()


# ── 7. a truncated data.mdb ─────────────────────────────────────────────────


async def _entry_count(store: Any) -> int:
    page = await store.scan_entries({"conversationId": 1}, 100_000, None, CTX)
    return len(page["items"])


_PROBE = (
    "import asyncio, sys\n"
    "from pi_durable.context import BACKGROUND_CONTEXT as CTX\n"
    "from pi_durable_lmdb import LmdbStorage\n"
    "async def main(path):\n"
    "    store = await LmdbStorage.open(path, readonly=True)\n"
    "    page = await store.scan_entries({'conversationId': 1}, 100_000, None, CTX)\n"
    "    print(len(page['items']))\n"
    "    await store.close()\n"
    "asyncio.run(main(sys.argv[1]))"
)


async def _probe(path: Path) -> tuple[bool, bytes, bytes]:
    """Open and read the store in a child (on a regression, SIGBUS kills it, not pytest)."""

    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PROBE,
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    assert child.returncode in (0, 1), (child.returncode, err[-300:])
    return child.returncode == 0, out, err


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["one page", "half", "into the meta pages", "one byte"])
async def test_a_truncated_data_file_is_named_at_open_and_never_read(
    tmp_path: Path, cut: str
) -> None:
    path = tmp_path / "s"
    storage = await _filled_store(path, commits=300)
    entries = await _entry_count(storage)
    info, page = storage._env.env.info(), storage._env.env.stat()["psize"]
    await storage.close()
    data = path / "data.mdb"
    size = (info["last_pgno"] + 1) * page  # what LMDB uses: a process writer allocates more
    assert size <= data.stat().st_size
    if cut == "one page":
        # The last pages may be free (written once, freed by a later commit): a cut of those is
        # no damage, the store opens and reads everything. Cut one more page until one in use goes.
        for pages in range(1, 257):
            keep = size - pages * page
            with open(data, "r+b") as handle:
                handle.truncate(keep)
            opened, out, err = await _probe(path)
            if opened:
                assert int(out) == entries, (pages, out, err[-300:])
                continue
            assert b"TruncatedStoreError" in err, (pages, err[-300:])
            break
        else:
            raise AssertionError("no cut of up to 256 pages reached a page in use")
    else:
        keep = {"half": size // 2, "into the meta pages": page + 100, "one byte": 1}[cut]
        with open(data, "r+b") as handle:
            handle.truncate(keep)
    for readonly in (True, False):  # first in a child: on a regression, SIGBUS kills it, not pytest
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import asyncio, sys\nfrom pi_durable_lmdb import LmdbStorage\n"
            f"asyncio.run(LmdbStorage.open({str(path)!r}, readonly={readonly}))",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await child.communicate()
        assert child.returncode == 1 and b"TruncatedStoreError" in err, (
            readonly,
            child.returncode,
            err[-300:],
        )
        with pytest.raises(TruncatedStoreError, match="truncated") as caught:
            await LmdbStorage.open(path, readonly=readonly)
        assert str(data) in str(caught.value)
    assert data.stat().st_size == keep  # the writer's open did not touch it
    for command in (["stats", str(path)], ["verify", str(path)], ["tail", str(path)]):
        process = await asyncio.create_subprocess_exec(
            CLI, *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await process.communicate()
        assert process.returncode not in (0, -7), (command, process.returncode)  # -7: SIGBUS
        assert b"truncated" in err + out, (command, err)


# ── 8. the writer lock names its holder ─────────────────────────────────────


def test_writer_locked_names_the_process_holding_the_lock_now(tmp_path: Path) -> None:
    import subprocess

    path = tmp_path / "s"
    env = Environment(path)
    env.close()
    with open(path / "writer.lock", "r+b") as handle:  # the pid an earlier writer left behind
        handle.write(f"{4_000_000:<20}".encode())
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(path / 'writer.lock')!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(WriterLockedError) as caught:
            Environment(path)
        assert f"by process {holder.pid}" in str(caught.value)
        assert "4000000" not in str(caught.value)
    finally:
        holder.communicate(b"", timeout=10)


async def test_verify_and_stats_while_another_process_rebuilds(tmp_path: Path) -> None:
    from pi_durable_lmdb.audit import stats

    path = tmp_path / "s"
    storage = await _filled_store(path, commits=1500)
    await storage.close()
    expected = stats(path).counts
    for _ in range(2):
        process = await asyncio.create_subprocess_exec(
            CLI,
            "rebuild",
            str(path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        runs = 0
        while process.returncode is None or runs < 2:
            assert verify(path) is None
            assert stats(path).counts == expected
            runs += 1
            try:
                await asyncio.wait_for(process.wait(), 0.001)
            except TimeoutError:
                pass
        _, err = await process.communicate()
        assert process.returncode == 0, err.decode()


@pytest.mark.parametrize("moment", ["after the header is read", "after the tables are opened"])
async def test_a_read_only_open_follows_a_rebuild_that_lands_while_it_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """A rebuild in another process swaps generations and drops the old one. Landing between a
    read-only open's header read and its tables, or between its tables and its level check, the
    open follows it to the new generation instead of naming a database that is gone."""

    from pi_durable_lmdb.audit import stats
    from pi_durable_lmdb.projections import rebuild

    path = tmp_path / "s"
    storage = await _filled_store(path, commits=40)
    await storage.close()
    expected = stats(path).counts
    landed: list[int] = []

    def rebuild_elsewhere() -> None:
        if not landed:
            landed.append(1)
            done = subprocess.run([CLI, "rebuild", str(path)], capture_output=True, timeout=120)
            assert done.returncode == 0, done.stderr.decode()

    if moment == "after the header is read":
        real_header = rebuild.read_header

        def header_then_rebuild(env: Environment) -> Any:
            found = real_header(env)
            if env.readonly:
                rebuild_elsewhere()
            return found

        monkeypatch.setattr(rebuild, "read_header", header_then_rebuild)
    else:
        real_model = rebuild.ReadModel

        def model_then_rebuild(env: Environment, *args: Any) -> Any:
            model = real_model(env, *args)
            if env.readonly:
                rebuild_elsewhere()
            return model

        monkeypatch.setattr(rebuild, "ReadModel", model_then_rebuild)
    assert verify(path) is None
    assert landed, "the rebuild landed during the open"
    assert stats(path).counts == expected


async def test_stats_reads_its_core_projection_from_one_snapshot_while_a_rebuild_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``stats`` reads the core projection's counts and state in one read transaction; a rebuild
    in another process that drops that generation while ``stats`` goes on (here: as it reads the
    shipping marker) changes nothing in what it reports."""

    import importlib

    stats_module = importlib.import_module("pi_durable_lmdb.audit.stats")  # not the function
    path = tmp_path / "s"
    storage = await _filled_store(path, commits=40)
    await storage.close()
    before = stats_module.stats(path)
    real = stats_module.stopped_reason
    landed: list[int] = []

    def rebuild_meanwhile(at: str) -> Any:
        if not landed:
            landed.append(1)
            done = subprocess.run([CLI, "rebuild", str(path)], capture_output=True, timeout=120)
            assert done.returncode == 0, done.stderr.decode()
        return real(at)

    monkeypatch.setattr(stats_module, "stopped_reason", rebuild_meanwhile)
    during = stats_module.stats(path)
    assert landed, "the rebuild landed while stats read"
    assert during.counts == before.counts
    assert during.projections.core.folded_seq == before.projections.core.folded_seq


# ── 9. the log's own reads with arguments of every kind ─────────────────────


@pytest.mark.parametrize("seq", [-1, 0, 2, 2**63, 2**64, 2**64 + 1, -(2**70)], ids=repr)
async def test_log_reads_with_any_integer_find_no_record_rather_than_fail(
    tmp_path: Path, seq: int
) -> None:
    storage = await _filled_store(tmp_path / "s")
    try:
        log = storage.log
        assert log.get(seq) is None
        assert list(log.read(seq)) == ([] if seq > 1 else [log.get(1)])
        assert list(log.read(1, seq)) == ([log.get(1)] if seq >= 1 else [])
        assert log.take(seq, None, 5) == ([] if seq > 1 else [log.get(1)])
        assert log.take(1, None, seq) == ([log.get(1)] if seq >= 1 else [])
        assert log.raw_chunk(1, None, seq) == (log.raw_chunk(1, None) if seq >= 1 else [])
    finally:
        await storage.close()


@pytest.mark.parametrize("value", [True, 1.0, "1", None, b"\x01", [1]], ids=repr)
async def test_log_reads_refuse_a_sequence_that_is_not_an_int_by_name(
    tmp_path: Path, value: Any
) -> None:
    storage = await _filled_store(tmp_path / "s")
    try:
        log = storage.log
        calls = [
            lambda: log.take(value, None, 5),
            lambda: list(log.read(value)),
            lambda: log.take(1, None, value),
        ]
        if value is not None:  # None is "no upper bound" for ``last``
            calls += [lambda: log.get(value), lambda: list(log.read(1, value))]
        for call in calls:
            with pytest.raises(TypeError, match="must be a log sequence"):
                call()
        with pytest.raises(TypeError, match="must be a log sequence"):
            await log.follow(value).__anext__()
    finally:
        await storage.close()


# ── 10. user projections: definitions the store could not read back ────────


def _definition(**fields: Any) -> Any:
    base = {
        "name": "p",
        "version": 1,
        "databases": ("main",),
        "fold": lambda self, tables, commit: None,
    }
    base.update(fields)
    return type("Defined", (), base)()


BAD_DEFINITIONS = {
    "version str": {"version": "1"},
    "version bool": {"version": True},
    "version float": {"version": 1.0},
    "version past 64 bits": {"version": 2**64},
    "version below 64 bits": {"version": -(2**63) - 1},
    "name int": {"name": 7},
    "name empty": {"name": ""},
    "name with a lone surrogate": {"name": "\ud800"},
    "name too long": {"name": "n" * 600},
    "databases a str": {"databases": "main"},
    "databases empty": {"databases": ()},
    "database name int": {"databases": (1,)},
    "database names repeated": {"databases": ("a", "a")},
}


@pytest.mark.parametrize("fields", BAD_DEFINITIONS.values(), ids=BAD_DEFINITIONS.keys())
async def test_a_projection_definition_the_store_could_not_read_back_is_refused(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    with pytest.raises((TypeError, ValueError), match="Projection"):
        await LmdbStorage.open(
            tmp_path / "s", durability="process", projections=[_definition(**fields)]
        )
    storage = await LmdbStorage.open(
        tmp_path / "s", durability="process"
    )  # nothing unreadable was left
    await storage.close()


async def test_projections_whose_databases_would_share_a_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="collide"):
        await LmdbStorage.open(
            tmp_path / "s",
            projections=[
                _definition(name="a.b", databases=("c",)),
                _definition(name="a", databases=("b.c",)),
            ],
        )


async def test_a_fold_error_whose_message_holds_a_lone_surrogate_is_recorded(
    tmp_path: Path,
) -> None:
    from pi_durable_lmdb.projections.user import ProjectionFailed

    def fold(self: Any, tables: Any, commit: Any) -> None:
        raise ValueError("bad \ud800 value")

    class Utf8Handler(logging.Handler):  # what a UTF-8 log file does with each line
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[bytes] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(self.format(record).encode("utf-8"))  # strict, as a file would be

        def handleError(self, record: logging.LogRecord) -> None:
            raise AssertionError(f"a log line could not be written: {record.msg!r}")

    handler = Utf8Handler()
    logging.getLogger("pi_durable_lmdb").addHandler(handler)
    try:
        storage = await _filled_store(
            tmp_path / "s", projections=[_definition(name="bad", fold=fold)]
        )
        try:
            with pytest.raises(ProjectionFailed, match="ValueError"):
                await asyncio.wait_for(storage.projections.wait(1), 10)
        finally:
            await storage.close()
    finally:
        logging.getLogger("pi_durable_lmdb").removeHandler(handler)
    assert any(
        b"stopped at record 1" in line and b"bad \\ud800 value" in line and b"Traceback" in line
        for line in handler.lines
    ), handler.lines
    storage = await LmdbStorage.open(
        tmp_path / "s", projections=[_definition(name="bad", fold=fold)]
    )
    try:
        status = storage.projections.status()["bad"]
        assert status.failed_seq == 1 and "ValueError: bad" in (status.error or "")
    finally:
        await storage.close()


def _store_with_a_free_tail(path: Path) -> None:
    """A store whose highest pages are free: a database of ~75 pages filled, then dropped (its
    pages go to the free list), then small commits (which take lower free pages)."""

    import lmdb

    env = lmdb.open(str(path), map_size=1 << 26, max_dbs=4)
    keep = env.open_db(b"keep")
    with env.begin(write=True) as txn:
        for i in range(20):
            txn.put(b"k%03d" % i, b"v" * 100, db=keep)
    bulk = env.open_db(b"bulk")
    with env.begin(write=True) as txn:
        for i in range(300):
            txn.put(b"%08d" % i, b"x" * 900, db=bulk)
    with env.begin(write=True) as txn:
        txn.drop(bulk, delete=True)
    for i in range(3):  # the free list's own page moves down into the freed ones
        with env.begin(write=True) as txn:
            txn.put(b"last%d" % i, b"v", db=keep)
    last = env.info()["last_pgno"]
    env.close()
    assert (path / "data.mdb").stat().st_size == (last + 1) * 4096 and last > 80, last


def test_a_file_whose_missing_last_pages_are_all_free_opens(tmp_path: Path) -> None:
    """LMDB does not write a page it allocated and freed in one transaction: when such pages are
    the highest, the newest meta names a last page past the end of the file and nothing lives
    there. The crash harness met it after a kill during a rebuild (a healthy store 205 pages
    short, all on the free list) and the open refused it as truncated; this test raised
    TruncatedStoreError before. A file cut into pages in use is still refused."""

    path = tmp_path / "s"
    path.mkdir()
    _store_with_a_free_tail(path)
    data = path / "data.mdb"
    size = data.stat().st_size
    with open(data, "r+b") as handle:
        handle.truncate(size - 10 * 4096)  # ten of the dropped database's pages
    check_not_truncated(str(path))
    reader = subprocess.run(  # LMDB reads every page it can reach (in a child: SIGBUS would kill it)
        [
            sys.executable,
            "-c",
            "import lmdb, sys\nenv = lmdb.open(sys.argv[1], readonly=True, max_dbs=4, lock=False)\n"
            "db = env.open_db(b'keep')\nwith env.begin(db=db) as txn:\n    print(sum(1 for _ in txn.cursor()))",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reader.returncode == 0 and reader.stdout.strip() == "23", reader
    with open(data, "r+b") as handle:
        handle.truncate(4 * 4096)  # the keep database's pages and the free list's go too
    with pytest.raises(TruncatedStoreError, match="truncated"):
        check_not_truncated(str(path))


class _KilledWriting(Exception):
    """Stands for the writer's death at the moment its marker's bytes were about to go out."""


@pytest.mark.parametrize("marker", ["process", "power"])
def test_a_writer_dying_while_it_rewrites_its_marker_leaves_the_old_one_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: str
) -> None:
    """An open rewrites the ``*.unsynced`` marker of a writer killed earlier on this boot. Written
    in place, a death between the truncation and the write left it empty, and the next open
    refused the store as damaged by an OS crash (``StoreDamagedError``) though the machine never
    stopped; the crash harness met it (a kill during an open). The marker is replaced whole."""

    from pi_durable_lmdb.log import storedir

    path = str(tmp_path)
    if marker == "process":
        storedir.mark_unsynced(path)
    else:
        storedir.mark_power(path, 0x1234)

    def dies(fd: int, data: bytes) -> int:
        raise _KilledWriting

    monkeypatch.setattr(storedir.os, "write", dies)
    with pytest.raises(_KilledWriting):
        if marker == "process":
            storedir.mark_unsynced(path)
        else:
            storedir.mark_power(path, 0x5678)
    monkeypatch.undo()
    if marker == "process":
        storedir.refuse_after_crash(path)  # same boot: not refused
    else:
        assert storedir.read_power_marker(path) == (storedir.boot_id() or b"unknown", 0x1234)
    assert sorted(os.listdir(path)) == [f"{marker}.unsynced"]  # no staged copy left behind


async def test_refusals_a_caller_keeps_leave_the_reader_table_free(tmp_path: Path) -> None:
    """py-lmdb keeps an ended read transaction's slot in the reader table (126 per store) while
    the object lives, and a refusal's traceback held the frames holding it: 300 kept refusals,
    of the store's reads and of a view's, once left no slot for any other read."""

    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        view = await storage.as_of(1)
        refusals = await asyncio.gather(
            *(
                reader.scan_entries({"conversationId": 1000 + n}, 2, None, CTX)
                for n in range(150)
                for reader in (storage, view)
            ),
            return_exceptions=True,
        )
        assert all("Unknown conversation" in str(refusal) for refusal in refusals)
        assert await storage.conversation(1, CTX) == {"id": 1}
        assert await view.conversation(1, CTX) == {"id": 1}
        assert refusals[0].__traceback__ is not None  # still says where it was raised
    finally:
        await storage.close()
