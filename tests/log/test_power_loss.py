"""Simulated power loss (docs/reliability.md, "Power loss"): a write recorder built at test time,
crash states built from its recordings, and a bounded exploration of each durability mode.

``python -m tools.harness.power_loss --mode power|process --states N --seed S`` runs a long exploration.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.log.journal import HEADER_SIZE

from tools.harness.powerloss.check import sequences_problem
from tools.harness.powerloss.crash import (
    CREATE,
    FDATASYNC,
    FSYNC,
    MARK,
    MKDIR,
    MSYNC,
    RENAME,
    TRUNCATE,
    UNLINK,
    WRITE,
    Event,
    crash_state,
    marks,
    parse,
)
from tools.harness.powerloss.explore import UNSYNCED_FILE, explore
from tools.harness.powerloss.record import build_recorder, find_compiler, record

pytestmark = pytest.mark.powerloss

NO_COMPILER = "no C compiler (cc or gcc, or $CC): the power-loss recorder tools/harness/powerloss/recorder.c is built at test time (.ci/run installs gcc)"

STATES = 250
"""Crash states per mode in CI (about 15 to 30 s each on the test machine)."""
WORKLOAD_STATES = 100
"""Crash states per group / command workload in CI; ``python -m tools.harness.power_loss --states 1500`` runs long."""


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> str:
    if find_compiler() is None:
        pytest.skip(NO_COMPILER)
    return build_recorder(str(tmp_path_factory.mktemp("recorder")))


def _run_recorded(recorder: str, tmp_path: Path, code: str) -> list[Event]:
    store = tmp_path / "store"
    marks = tmp_path / "marks"
    marks.write_bytes(b"")
    recording = tmp_path / "recording"
    env = dict(
        os.environ,
        LD_PRELOAD=recorder,
        PL_RECORD=str(recording),
        PL_STORE=str(store),
        PL_MARKER=str(marks),
        PL_EXCLUDE="lock.mdb",
    )
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(store), str(marks)],
        env=env,
        check=True,
        timeout=60,
    )
    return parse(recording.read_bytes(), str(store))


def test_the_recorder_sees_every_kind_of_write_and_sync(recorder: str, tmp_path: Path) -> None:
    """Python's os calls reach libc through the dynamic linker too: each one is recorded in order,
    with its offset and bytes (a plain write at the descriptor's offset), and only under the store."""

    events = _run_recorded(
        recorder,
        tmp_path,
        """
        import os, sys
        store, marks = sys.argv[1], sys.argv[2]
        os.makedirs(store)
        fd = os.open(os.path.join(store, "a"), os.O_RDWR | os.O_CREAT, 0o600)
        os.write(fd, b"hello")
        os.pwrite(fd, b"XY", 100)
        os.lseek(fd, 10, os.SEEK_SET)
        os.writev(fd, [b"ab", b"cd"])
        os.pwritev(fd, [b"12", b"34"], 50)
        os.fdatasync(fd)
        os.ftruncate(fd, 60)
        os.fsync(fd)
        os.close(fd)
        synced = os.open(os.path.join(store, "b"), os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o600)
        os.pwrite(synced, b"meta", 4)
        os.close(synced)
        outside = os.open(os.path.join(os.path.dirname(store), "elsewhere"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(outside, b"not recorded")
        os.close(outside)
        lock = os.open(os.path.join(store, "lock.mdb"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(lock, b"excluded")
        os.close(lock)
        mark = os.open(marks, os.O_WRONLY | os.O_APPEND)
        os.write(mark, b"ack 1\\n")
        os.rename(os.path.join(store, "b"), os.path.join(store, "c"))
        os.unlink(os.path.join(store, "c"))
        directory = os.open(store, os.O_RDONLY)
        os.fsync(directory)
    """,
    )
    seen = [
        (
            event.kind,
            event.path,
            event.offset,
            event.data,
            event.synced or event.directory,
            event.target,
        )
        for event in events
        if event.kind != MKDIR
    ]
    assert seen == [
        (CREATE, "a", 0, b"", False, ""),
        (WRITE, "a", 0, b"hello", False, ""),
        (WRITE, "a", 100, b"XY", False, ""),
        (WRITE, "a", 10, b"abcd", False, ""),
        (WRITE, "a", 50, b"1234", False, ""),
        (FDATASYNC, "a", 0, b"", False, ""),
        (TRUNCATE, "a", 60, b"", False, ""),
        (FSYNC, "a", 0, b"", False, ""),
        (CREATE, "b", 0, b"", False, ""),
        (WRITE, "b", 4, b"meta", True, ""),
        (MARK, "", 0, b"ack 1\n", False, ""),
        (RENAME, "b", 0, b"", False, "c"),
        (UNLINK, "c", 0, b"", False, ""),
        (FSYNC, "", 0, b"", True, ""),  # True: of a directory
    ]


def test_the_recorder_catches_lmdb_inside_the_py_lmdb_extension(
    recorder: str, tmp_path: Path
) -> None:
    """py-lmdb links LMDB into its extension module; its pwrite/writev/fdatasync calls still go
    through libc's dynamic symbols. A synced commit: data pages, fdatasync, then the meta page
    through LMDB's O_DSYNC descriptor; an unsynced one: no sync until ``env.sync``."""

    events = _run_recorded(
        recorder,
        tmp_path,
        """
        import lmdb, sys
        for sync in (True, False):
            env = lmdb.open(sys.argv[1], map_size=1 << 20, sync=sync)
            with env.begin(write=True) as txn:
                for i in range(40):
                    txn.put(b"k%03d" % i, b"v" * 300)
            env.close()
        env = lmdb.open(sys.argv[1], map_size=1 << 20, sync=False)
        env.sync(True)
    """,
    )
    kinds = [(event.kind, event.path, event.synced) for event in events if event.kind != MKDIR]
    assert not any(path == "lock.mdb" for _, path, _ in kinds)
    assert not any(
        kind == MSYNC for kind, _, _ in kinds
    )  # no writemap: nothing written through the map
    assert (CREATE, "data.mdb", False) in kinds
    first_meta = kinds.index((WRITE, "data.mdb", True))  # the synced commit's meta page
    assert (FDATASYNC, "data.mdb", False) in kinds[:first_meta]
    rest = kinds[first_meta + 1 :]
    assert (WRITE, "data.mdb", False) in rest  # the unsynced commit wrote pages...
    assert (
        rest.count((FDATASYNC, "data.mdb", False))
        == 1
        == len([k for k in rest if k[0] == FDATASYNC])
    )  # ...synced once, by env.sync
    assert rest[-1] == (FDATASYNC, "data.mdb", False)
    meta = next(event for event in events if event.kind == WRITE and event.synced)
    assert meta.offset in (32, 4096 + 32) and len(meta.data) < 4096


def _replayed(events: list[Event], path: str) -> bytes:
    """The bytes of ``path`` once every recorded write and truncation of it has landed."""

    content = bytearray()
    for event in events:
        if event.path != path:
            continue
        if event.kind == TRUNCATE:
            del content[event.offset :]
            content.extend(bytes(event.offset - len(content)))
        elif event.kind == WRITE:
            end = event.offset + len(event.data)
            content.extend(bytes(max(0, end - len(content))))
            content[event.offset : end] = event.data
    return bytes(content)


def test_the_recorder_sees_writes_through_lmdb_s_writable_map(
    recorder: str, tmp_path: Path
) -> None:
    """With ``writemap`` LMDB stores pages through its map and calls nothing per write: the shim
    records the pages that changed when the map is synced (then the sync, as the file's
    ``fdatasync``) or unmapped (a close without a sync), so replaying the recording gives the
    file's bytes exactly, and the synced state is ordered before what was written after it."""

    events = _run_recorded(
        recorder,
        tmp_path,
        """
        import lmdb, os, sys
        store = sys.argv[1]
        env = lmdb.open(store, map_size=1 << 20, sync=False, writemap=True)
        with env.begin(write=True) as txn:
            for i in range(40):
                txn.put(b"k%03d" % i, b"v" * 300)
        env.sync(True)
        with env.begin(write=True) as txn:
            for i in range(40, 60):
                txn.put(b"k%03d" % i, os.urandom(300))
        env.set_mapsize(2 << 20)  # unmaps: what was stored and not synced is still written
        with env.begin(write=True) as txn:
            txn.put(b"last", b"w" * 5000)
        env.close()
    """,
    )
    kinds = [(event.kind, event.path) for event in events if event.kind != MKDIR]
    assert MSYNC not in [kind for kind, _ in kinds]  # each msync is named as its file's sync
    synced = kinds.index((FDATASYNC, "data.mdb"))
    assert (WRITE, "data.mdb") in kinds[:synced]  # the first commit's pages, before their sync
    assert (WRITE, "data.mdb") in kinds[synced + 1 :]  # the rest, unsynced
    assert kinds.count((FDATASYNC, "data.mdb")) == 1
    actual = (tmp_path / "store" / "data.mdb").read_bytes()
    assert len(actual) == 2 << 20
    assert _replayed(events, "data.mdb") == actual


def _event(
    index: int, kind: int, path: str = "f", offset: int = 0, data: bytes = b"", synced: bool = False
) -> Event:
    return Event(index, kind, path, offset, data, synced)


def test_the_checker_reads_a_damaged_log_head_without_taking_the_memory() -> None:
    """A planted fault's damaged log once had a head of ~2**63, and the checker listed 1..head: a
    checker process took 21 GB and the test machine's memory. The check now never builds
    anything as long as the head (before: ``MemoryError`` at once for this head)."""

    assert sequences_problem([1, 2, 3], 3) is None
    for seqs, head in (([1, 2, 3], 2**40), ([1, 2, 2**40], 3), ([1, 3, 4], 3), ([], 2**62)):
        assert (problem := sequences_problem(seqs, head)) is not None and f"1..{head}" in problem


def test_crash_states_keep_what_was_synced_and_choose_among_the_rest() -> None:
    events = [
        _event(0, CREATE, "f"),
        _event(1, WRITE, "f", 0, b"A" * 8192),
        _event(2, FDATASYNC, "f"),  # f's write durable; its directory entry is not
        _event(3, WRITE, "f", 4096, b"B" * 8192),  # two sectors pending (4096..12288)
        _event(4, CREATE, "g"),
        _event(5, WRITE, "g", 0, b"G" * 10, synced=True),  # durable by itself
        Event(6, FSYNC, "", directory=True),  # now both names are durable
        _event(7, WRITE, "f", 0, b"C" * 10),
    ]
    none = crash_state(events, 3, "none", 0)
    assert none.files == {}  # created, synced, but its name never reached the disk
    after_dir = crash_state(events, 7, "none", 0)
    assert after_dir.files == {"f": b"A" * 8192, "g": b"G" * 10}
    assert after_dir.pending == 1  # the write at #3
    everything = crash_state(events, 8, "prefix", 0)
    assert everything.pending == 2
    states = {
        crash_state(events, 8, variant, seed).files["f"]
        for variant in ("prefix", "subset", "torn")
        for seed in range(40)
    }
    whole = b"C" * 10 + b"A" * (4096 - 10) + b"B" * 8192
    assert whole in states and b"A" * 8192 in states
    torn = [s for s in states if len(s) == 12288 and s[4096:8192] == b"A" * 4096]
    assert torn, "a torn state keeps the second sector of the write at #3 without its first"
    for content in states:  # every state is made of whole sectors of the writes
        for sector in range(0, len(content), 4096):
            piece = content[sector : sector + 4096]
            assert (
                piece.strip(b"C").strip(b"A") == b""
                or piece.strip(b"B") == b""
                or piece.strip(b"A") == b""
            )


def test_power_mode_survives_every_crash_state(recorder: str) -> None:
    """Every commit acknowledged before the cut is there exactly, nothing partial, ids are never
    handed out twice, user projections catch up, and the store opens without repair. Failed
    before data.mdb's directory entry was synced (a power cut could drop the whole store)."""

    summary = explore("power", STATES, 11, recorder)
    assert summary.states == STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []


def test_process_mode_refuses_a_store_it_may_have_damaged(recorder: str) -> None:
    """A power cut while a process-mode writer had the store open leaves a state every open
    refuses (``StoreDamagedError``); any other state opens whole. Failed before the
    ``process.unsynced`` marker: stores that were not LMDB files any more, reused ids, LMDB
    reading pages that were never written (and crashing)."""

    summary = explore("process", STATES, 11, recorder)
    assert summary.states == STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []
    assert summary.outcomes.get("refused", 0) > 0 and summary.outcomes.get("ok", 0) > 0


def test_process_mode_fails_without_the_sync_of_its_map(recorder: str) -> None:
    """A ``process`` writer writes its pages through LMDB's map and syncs them once, at its close
    (``msync``, recorded as the file's ``fdatasync`` with the pages it wrote): left out of the
    recording, states after the close lose acknowledged commits. So the exploration above sees
    what a mapped writer stores, and can fail."""

    summary = explore("process", WORKLOAD_STATES, 3, recorder, drop="fdatasync:data.mdb")
    assert summary.failures, f"process without its map's sync: {summary.outcomes}"


def test_a_process_mode_store_killed_in_this_boot_opens_and_one_from_an_earlier_boot_is_refused(
    tmp_path: Path,
) -> None:
    from pi_durable_lmdb import LmdbStorage, StoreDamagedError

    store = tmp_path / "store"
    killed = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import asyncio, sys, time
from pi_durable_lmdb import LmdbStorage
async def main():
    storage = await LmdbStorage.open({str(store)!r}, durability="process")
    await storage.commit([{{"type": "conversation", "value": {{"id": await storage.mint_id()}}}}], None)
    print("ack", flush=True)
    time.sleep(60)
asyncio.run(main())
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert killed.stdout is not None and killed.stdout.readline().strip() == "ack"
        assert (store / UNSYNCED_FILE).exists()
    finally:
        killed.kill()  # SIGKILL: no sync, no close; the page cache keeps the commit
        killed.wait(timeout=30)
    assert (store / UNSYNCED_FILE).exists()
    code = f"""
import asyncio, sys
from pi_durable_lmdb import LmdbStorage
async def main():
    storage = await LmdbStorage.open({str(store)!r}, durability="process")
    print(storage.log.head())
    await storage.close()
asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    assert not (store / UNSYNCED_FILE).exists()  # a clean close removes it

    (store / UNSYNCED_FILE).write_bytes(
        b"00000000-0000-0000-0000-000000000000\n"
    )  # an earlier boot's
    for readonly in (False, True):
        with pytest.raises(StoreDamagedError) as caught:
            asyncio.run(LmdbStorage.open(store, readonly=readonly))
        assert "durability='process'" in str(caught.value) and str(store) in str(caught.value)
    cli = subprocess.run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "verify", str(store)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode != 0 and "machine stopped" in (cli.stdout + cli.stderr)


def test_a_failed_open_leaves_nothing_open_behind_it(tmp_path: Path) -> None:
    """A read-only open that refuses a half-made store used to keep its LMDB handle, so a writer
    open in the same process was refused with WriterLockedError (found by the crash checker)."""

    import lmdb
    from pi_durable_lmdb import LmdbStorage, StoreFormatError

    store = tmp_path / "store"
    lmdb.open(str(store), map_size=1 << 20).close()  # an LMDB file without our header
    with pytest.raises(StoreFormatError, match="no header"):
        asyncio.run(LmdbStorage.open(store, readonly=True))

    async def write() -> int:
        storage = await LmdbStorage.open(store)
        seq = await storage.commit(
            [{"type": "conversation", "value": {"id": await storage.mint_id()}}], CTX
        )
        await storage.close()
        return seq

    assert asyncio.run(write()) == 1


def test_the_tool_prints_its_summary_line(recorder: str, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.harness.power_loss",
            "--mode",
            "power",
            "--states",
            "12",
            "--seed",
            "5",
            "--batches",
            "6",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "power_loss: 12 states, 0 failures"


def test_the_recorder_drops_planted_syncs_and_records_directory_changes(
    recorder: str, tmp_path: Path
) -> None:
    """``PL_DROP`` leaves the matching syncs out of the recording (the planted faults the
    workloads must fail on) and keeps the others; mkdir and rmdir are directory changes."""

    store = tmp_path / "store"
    store.mkdir()
    marks_file = tmp_path / "marks"
    marks_file.write_bytes(b"")
    recording = tmp_path / "recording"
    code = """
        import os, sys
        store = sys.argv[1]
        os.mkdir(os.path.join(store, "d"))
        for name in ("d/a", "b"):
            fd = os.open(os.path.join(store, name), os.O_WRONLY | os.O_CREAT | os.O_DSYNC, 0o600)
            os.write(fd, b"x")
            os.fsync(fd)
            os.fdatasync(fd)
            os.close(fd)
        for path in (os.path.join(store, "d"), store):
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        os.unlink(os.path.join(store, "d", "a"))
        os.rmdir(os.path.join(store, "d"))
    """
    env = dict(
        os.environ,
        LD_PRELOAD=recorder,
        PL_RECORD=str(recording),
        PL_STORE=str(store),
        PL_MARKER=str(marks_file),
        PL_DROP="fsync:d/a,dsync:/b,dirsync:*store/d,fdatasync:nothing",
    )
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), str(store)], env=env, check=True, timeout=60
    )
    seen = [
        (event.kind, event.path, event.synced or event.directory)
        for event in parse(recording.read_bytes(), str(store))
    ]
    assert seen == [
        (MKDIR, "d", False),
        (CREATE, "d/a", False),
        (WRITE, "d/a", True),
        (FDATASYNC, "d/a", False),  # its fsync was dropped, its fdatasync kept
        (CREATE, "b", False),
        (WRITE, "b", False),  # O_DSYNC dropped: a plain write
        (FSYNC, "b", False),
        (FDATASYNC, "b", False),
        (FSYNC, "", True),  # the store directory's sync kept, d's dropped
        (UNLINK, "d/a", False),
        (UNLINK, "d", False),  # rmdir
    ]


def test_crash_states_move_a_directory_with_what_it_holds() -> None:
    """A new store built in a hidden directory and renamed into place: its files appear under
    the new name only with their directory; a name in a directory whose own name did not reach
    the disk is lost with it."""

    events = [
        _event(0, MKDIR, ".part"),
        _event(1, CREATE, ".part/data"),
        _event(2, WRITE, ".part/data", 0, b"D" * 100),
        _event(3, FSYNC, ".part/data"),
        Event(4, FSYNC, ".part", directory=True),  # .part/data's name durable; .part's own is not
        Event(5, RENAME, ".part", target="new"),
        Event(6, FSYNC, "", directory=True),  # now "new" is durable, with what .part held
        _event(7, MKDIR, "new/sub"),
        _event(8, CREATE, "new/sub/x"),
        Event(9, FSYNC, "new/sub", directory=True),  # x durable, in a directory whose name is not
    ]
    assert crash_state(events, 5, "none", 0).files == {}  # .part's name never reached the disk
    assert crash_state(events, 5, "none", 0).directories == ()
    renamed = crash_state(events, 7, "none", 0)
    assert renamed.files == {"new/data": b"D" * 100} and renamed.directories == ("new",)
    assert crash_state(events, 10, "none", 0).files == {"new/data": b"D" * 100}  # x lost with sub
    kept = {crash_state(events, 10, "prefix", seed).directories for seed in range(30)}
    assert ("new",) in kept and ("new", "new/sub") in kept
    assert all(
        crash_state(events, 10, "prefix", seed).files.get("new/sub/x", b"") == b""
        for seed in range(30)
    )
    unsynced = [
        _event(0, MKDIR, ".part"),
        _event(1, CREATE, ".part/data"),
        _event(2, WRITE, ".part/data", 0, b"D"),
        _event(3, FSYNC, ".part/data"),
        Event(4, RENAME, ".part", target="new"),
        Event(5, FSYNC, "", directory=True),
    ]
    assert (
        crash_state(unsynced, 6, "none", 0).files == {}
    )  # "new" is there, empty: data's name was never synced
    assert crash_state(unsynced, 6, "none", 0).directories == ("new",)


def test_group_commit_meets_the_power_cut(recorder: str, tmp_path: Path) -> None:
    """The group workload really groups: some journal flush covers several callers'
    acknowledgements, and some callers are cancelled while they wait."""

    events = record(recorder, "power", 11, 36, str(tmp_path), workload="group").events
    per_sync: list[int] = []
    acks = 0
    for event in events:
        if (
            event.kind == FDATASYNC
            and event.path.startswith("journal/")
            and event.path.endswith(".seg")
        ):
            per_sync.append(acks)
            acks = 0
        elif event.kind == MARK:
            acks += event.data.count(b"ack@")
    assert max(per_sync) >= 2, per_sync
    assert any(line.startswith("cancel@") for _, line in marks(events))


@pytest.mark.parametrize("mode", ["power", "process"])
def test_group_commit_survives_every_crash_state(recorder: str, mode: str) -> None:
    """Concurrent callers on two loops share transactions and syncs; every acknowledged batch
    survives, a cancelled caller's batch is there whole or not at all, ids are never reused."""

    summary = explore(mode, WORKLOAD_STATES, 11, recorder, batches=36, workload="group")
    assert summary.states == WORKLOAD_STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []


@pytest.mark.parametrize("mode", ["power", "process"])
def test_long_documents_read_back_in_every_crash_state(recorder: str, mode: str) -> None:
    """Documents grown past a chunk (head rows, the writer's cache, snapshots, a map that grows
    under them): every crash state reads back what was acknowledged."""

    summary = explore(mode, WORKLOAD_STATES, 5, recorder, batches=36, workload="documents")
    assert summary.states == WORKLOAD_STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []


@pytest.mark.parametrize("mode", ["power", "process"])
def test_long_documents_read_back_equal_in_every_crash_state(recorder: str, mode: str) -> None:
    """Documents many chunks long, changed by agent turns and every other op, rebased, copied
    from past points, across a rebuild, reopens and journal replays: in every crash state each
    document reads, at ``current`` and at every sequence of the log, as pi-durable's
    ``MemoryStorage`` reads it after the same batches (``powerloss.longdocs``)."""

    summary = explore(mode, WORKLOAD_STATES, 11, recorder, batches=40, workload="longdocs")
    assert summary.states == WORKLOAD_STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []
    assert summary.outcomes.get("ok", 0) > 0


def test_an_erasure_is_all_or_nothing_in_every_crash_state(recorder: str) -> None:
    """One conversation erased with its forks two thirds into the single caller's workload (the
    store reopened without its user projection for it): in every crash state the erasure record
    is there and every record it planned is a tombstone holding the acknowledged batch without
    the erased writes, or there is no erasure record and no tombstone; once ``erase_conversation``
    returned it is there; every acknowledged commit, before and after it, is kept."""

    summary = explore("power", WORKLOAD_STATES, 11, recorder, batches=24, workload="erase")
    assert summary.states == WORKLOAD_STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []
    assert summary.erasures.get("present", 0) > 0, summary.erasures


@pytest.mark.slow  # a recording and 100 crash states checked (about 7 s)
def test_a_trim_is_all_or_nothing_in_every_crash_state(recorder: str) -> None:
    """The log trimmed to its head two thirds into the single caller's workload and again before
    its last batch: in every crash state the log is untrimmed (records from 1, no base) or
    trimmed at an intended point (its base there, no record before it, a read before it
    refused); once ``trim`` returned it is there; every kind of record, now and as of kept
    points, lists as a fresh store lists after the acknowledged batches; every acknowledged
    commit, before and after the trims, is kept."""

    summary = explore("power", WORKLOAD_STATES, 11, recorder, batches=36, workload="trim")
    assert summary.states == WORKLOAD_STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []
    assert summary.trims.get("absent", 0) > 0, summary.trims
    assert summary.trims.get("2 of 2", 0) > 0, summary.trims


@pytest.mark.slow  # a recording and 100 crash states checked (about 7 s)
def test_a_trim_made_in_two_transactions_fails_the_exploration(recorder: str) -> None:
    """The trim's check can fail: a writer whose trim writes the base in one transaction and
    drops the records before the point in the next leaves crash states holding both."""

    summary = explore(
        "power", WORKLOAD_STATES, 11, recorder, batches=36, workload="trim", fault="split-trim"
    )
    assert any(
        problem.startswith("PARTIAL TRIM")
        for failure in summary.failures
        for problem in failure.problems
    ), summary.outcomes


PLANTED_FAULTS = [
    ("group", "fdatasync:store/data.mdb", 36),  # the checkpoints' data sync
    ("group", "fdatasync:*journal/0", 36),  # the group's journal frame flush
    ("single", "fdatasync:*journal/checkpoint", 30),  # the checkpoint record's flush
    ("trim", "fdatasync:*journal/checkpoint", 36),  # the checkpoints that make a trim durable
    ("longdocs", "fdatasync:*journal/0", 40),  # a long turn's journal frame flush
    ("import", "fdatasync:data.mdb", 12),  # the new store's sync before the rename
    ("import", "dirsync:/store", 12),  # the parent's sync after the rename
    ("restore", "fdatasync:data.mdb", 12),
    ("restore", "dirsync:/store", 12),
    ("backup", "fsync:data.mdb", 12),  # the copy's sync
    ("backup", "dirsync:*.partial-", 12),  # the copy's directory before the rename
]
"""Each workload's own syncs; left out of the recording, some states must fail (seed 11, 100
states: from 2 failed states for the directory syncs to 93 for the group's data sync)."""


@pytest.mark.parametrize("workload", ["import", "restore", "backup", "backup-plain"])
def test_a_command_leaves_its_new_store_absent_or_complete(recorder: str, workload: str) -> None:
    """``durable-log import / restore / backup [--compact]`` cut anywhere: NEWPATH is absent (only
    before the command returned) or the complete store. ``backup`` failed before it synced the
    copy's directory: a cut after it returned could leave DEST an empty directory."""

    summary = explore("power", WORKLOAD_STATES, 11, recorder, batches=12, workload=workload)
    assert summary.states == WORKLOAD_STATES
    assert [f"{failure.state}: {failure.problems[:3]}" for failure in summary.failures] == []
    assert summary.outcomes.get("complete", 0) > 0 and summary.outcomes.get("absent", 0) > 0


@pytest.mark.parametrize(("workload", "drop", "batches"), PLANTED_FAULTS)
def test_each_workload_fails_without_its_own_sync(
    recorder: str, workload: str, drop: str, batches: int
) -> None:
    """The explorations above can fail: with a sync each one relies on left out of the
    recording, some crash states lose acknowledged data or leave a partial store."""

    summary = explore(
        "power", WORKLOAD_STATES, 11, recorder, batches=batches, workload=workload, drop=drop
    )
    assert summary.failures, f"{workload} without {drop}: {summary.outcomes}"


JOURNAL_FAULTS = [
    ("skip-journal-flush", "single", 30, 100),
    ("skip-journal-flush", "group", 36, 100),
    ("skip-pin", "single", 30, 150),
    ("skip-pin", "group", 36, 150),
    ("recycle-early", "single", 30, 150),
    ("recycle-early", "group", 36, 150),
]
"""The power journal's planted faults (``log.journal._faults``), each in the recorded writer.
``recycle-early`` bites only when a segment fills between checkpoints: with records stored
deflated it found 0 of 300 until the power writer's entries carried incompressible
padding and its segments became the smallest allowed (150 states, seeds 11-13: 8, 19, 12
failing single; 12, 23, 16 group)."""


@pytest.mark.parametrize(("fault", "workload", "batches", "states"), JOURNAL_FAULTS)
def test_the_power_journal_fails_with_each_planted_fault(
    recorder: str, fault: str, workload: str, batches: int, states: int
) -> None:
    """The power explorations can fail: without the journal's flush, without the checkpoint's pin,
    or recycling a segment that still holds records the last checkpoint lacks, some crash states
    lose acknowledged commits or leave a damaged store."""

    outcomes = []
    for seed in (
        11,
        12,
        13,
    ):  # concurrent committers record differently each run: up to three recordings
        summary = explore(
            "power", states, seed, recorder, batches=batches, workload=workload, fault=fault
        )
        if summary.failures:
            return
        outcomes.append(summary.outcomes)
    raise AssertionError(
        f"{workload} with {fault}: no failing state in three recordings: {outcomes}"
    )


def test_a_power_commit_waits_for_one_flush_and_the_recording_holds_checkpoints_and_recycling(
    recorder: str, tmp_path: Path
) -> None:
    """Between a commit's intent and its acknowledgement the writer flushes one journal frame and
    nothing else on data.mdb's way (no O_DSYNC meta page); the recording the power explorations
    check holds checkpoints (data.mdb synced, checkpoint records flushed), recycled segments and
    commits that fill a segment and move to the next (without those ``recycle-early`` cannot bite).

    A transaction LMDB refuses at its commit for a full map (how full depends on which pages the
    checkpoint thread's pinned snapshot still holds, so on timing) is run again after the growth:
    its frame is unmade first (its header zeroed, one more flush), and the next attempt flushes
    its own frame."""

    events = record(recorder, "power", 11, 30, str(tmp_path)).events
    assert not any(event.kind == WRITE and event.synced for event in events)
    renames = [
        event for event in events if event.kind == RENAME and event.path.startswith("journal/")
    ]
    assert renames, "no journal segment was recycled"
    assert (
        sum(
            1
            for event in events
            if event.kind == FDATASYNC and event.path.startswith("journal/checkpoint")
        )
        >= 3
    )
    assert sum(1 for event in events if event.kind == FDATASYNC and event.path == "data.mdb") >= 3
    open_intent = False
    flushes: list[int] = []
    count = switches = unmade = 0
    framed_in: str | None = None  # the segment the last frame went to
    retried: list[tuple[int, int]] = []  # (flushes, frames unmade) of commits run again
    for event in events:
        segment = event.path.startswith("journal/") and event.path.endswith(".seg")
        if event.kind == WRITE and segment and event.data[:4] == _FRAME_MAGIC:
            if open_intent and framed_in is not None and event.path != framed_in:
                switches += 1  # a commit's frame in the next segment: the one before filled
            framed_in = event.path
        if event.kind == MARK:
            for line in event.data.decode().splitlines():
                if line.startswith("intent "):
                    open_intent, count, unmade = True, 0, 0
                elif line.startswith("ack ") and open_intent:
                    if unmade:
                        retried.append((count, unmade))
                    else:
                        flushes.append(count)
                    open_intent = False
        elif open_intent and event.kind == FDATASYNC and segment:
            count += 1
        elif (
            open_intent
            and event.kind == WRITE
            and segment
            and event.offset >= HEADER_SIZE
            and len(event.data) < HEADER_SIZE
            and not event.data.strip(b"\0")
        ):
            unmade += 1  # a frame's header zeroed: the transaction failed and runs again
    assert flushes and set(flushes) == {1}, flushes
    assert all(count == 2 * unmade + 1 for count, unmade in retried), retried
    assert len(retried) < len(flushes), (retried, len(flushes))
    assert switches, "no commit moved to a new journal segment (what recycle-early needs to bite)"


_FRAME_MAGIC = (0x504A4652).to_bytes(4, "big")
"""A journal frame's first bytes (``log.journal``)."""
