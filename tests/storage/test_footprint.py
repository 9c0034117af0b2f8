"""Where a store's bytes go: ``stats``' page breakdown, ``compact``, and old stores.

Every test works on real LMDB files written through ``LmdbStorage``; the page counts are checked
against an independent reading of the same file with py-lmdb itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import lmdb
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log import Environment
from pi_durable_lmdb.log.environment import MAIN_DB

from tests.support.cli_call import call
from tools.bench.workloads import ROOT, conversation, entry, task


def write_turns(path: Path, turns: int, start: int = 1) -> None:
    """``turns`` commits of the bench's ``commit_turn`` workload (an entry and the task record)."""

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            if start == 1:
                await storage.commit([conversation(ROOT)], CTX)
                await storage.commit([{"type": "task", "value": task(2, ROOT, 0, "pending")}], CTX)
            for n in range(start, start + turns):
                await storage.commit(
                    [
                        {"type": "entry", "value": entry(1000 + n, ROOT, n, 2)},
                        {
                            "type": "task",
                            "value": task(2, ROOT, n, "running" if n % 3 else "sleeping"),
                        },
                    ],
                    CTX,
                )
        finally:
            await storage.close()

    asyncio.run(run())


def raw_pages(path: Path) -> tuple[int, dict[str, int], int]:
    """(page size, pages per named database, last page number) read with py-lmdb directly."""

    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=256, subdir=True)
    try:
        pages: dict[str, int] = {}
        with env.begin() as txn:
            names = [bytes(key) for key, _ in txn.cursor()]
            for name in names:
                stat = txn.stat(env.open_db(name, txn=txn, create=False))
                pages[name.decode()] = (
                    stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
                )
        main = env.stat()
        pages[MAIN_DB] = main["branch_pages"] + main["leaf_pages"] + main["overflow_pages"]
        return main["psize"], pages, env.info()["last_pgno"]
    finally:
        env.close()


@pytest.mark.parametrize("turns", [0, 40, 400])
def test_the_page_breakdown_accounts_for_every_page_of_the_file(tmp_path: Path, turns: int) -> None:
    path = tmp_path / "store"
    write_turns(path, turns)
    env = Environment(path, readonly=True)
    try:
        stats = env.page_stats()
    finally:
        env.close()
    psize, pages, last = raw_pages(path)
    assert stats.page_size == psize
    assert {name: db.pages for name, db in stats.dbs.items()} == pages
    assert stats.used_pages == last + 1
    # two meta pages, every database's pages, the free ones: nothing more, nothing less
    assert 2 + sum(pages.values()) + stats.free_pages == stats.used_pages
    assert stats.file_bytes == os.path.getsize(path / "data.mdb")
    assert stats.free_bytes >= stats.free_pages * psize
    assert stats.dbs["log"].entries == turns + 2


def test_stats_json_reports_each_database_and_the_free_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    write_turns(path, 300)
    code, out, _ = call(capsys, "stats", path, "--json")
    assert code == 0
    info = json.loads(out)
    foot = info["footprint"]
    psize, pages, last = raw_pages(path)
    for name, count in pages.items():
        db = foot["databases"][name]
        assert db["branchPages"] + db["leafPages"] + db["overflowPages"] == count
        assert db["bytes"] == count * psize
    log = foot["databases"]["log"]
    assert log["entries"] == info["records"] == 302
    assert foot["logBytesPerRecord"] == round(log["bytes"] / 302, 1)
    assert foot["freeBytes"] == foot["freePages"] * psize + info["fileBytes"] - (last + 1) * psize
    assert foot["freeShare"] == round(foot["freeBytes"] / info["fileBytes"], 4)
    assert info["logBytes"] == log["bytes"]
    assert info["projectionBytes"] == sum(
        db["bytes"] for name, db in foot["databases"].items() if name.startswith("p")
    )
    code, text, _ = call(capsys, "stats", path)
    assert code == 0
    assert "free pages" in text and "log per record" in text
    assert "p0.entries.by_conversation" in text


def test_a_rebuild_shows_as_free_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A rebuild folds fresh projections beside the live ones and drops the old: their pages are
    free afterwards (the file does not shrink), and ``stats`` says so."""

    path = tmp_path / "store"
    write_turns(path, 300)
    before = json.loads(call(capsys, "stats", path, "--json")[1])
    assert call(capsys, "rebuild", path)[0] == 0
    after = json.loads(call(capsys, "stats", path, "--json")[1])
    assert after["fileBytes"] > before["fileBytes"]
    assert (
        after["footprint"]["freePages"] * after["footprint"]["pageSize"]
        >= before["projectionBytes"] // 2
    )
    assert after["footprint"]["freeShare"] > before["footprint"]["freeShare"]


def export_text(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = call(capsys, "export", path)
    assert code == 0, err
    return out


def reads_of(path: Path) -> dict[str, Any]:
    """Every read the contract offers on the turn workload's records, as JSON text."""

    async def run() -> dict[str, Any]:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            page = await storage.scan_entries({"conversationId": ROOT}, 10_000, None, CTX)
            return {
                "entries": page,
                "task": await storage.task(2, CTX),
                "conversation": await storage.conversation(ROOT, CTX),
            }
        finally:
            await storage.close()

    return asyncio.run(run())


# ── old stores keep working ───────────────────────────────────────────────────


from pi_durable.storage import MemoryStorage  # noqa: E402
from pi_durable_lmdb.projections import tables  # noqa: E402

from tests.fixtures import old_store  # noqa: E402
from tests.support.workload import snapshot  # noqa: E402
from tools.bench.concurrent import log_formats  # noqa: E402


def snapshots_of(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every read of the fixture's ids, from the store at ``path`` and from ``MemoryStorage``
    fed the fixture's batches."""

    async def run() -> tuple[dict[str, Any], dict[str, Any]]:
        work, _ = old_store.batches()
        memory = MemoryStorage()
        committed = await old_store.commit_all(memory, CTX)
        storage = await LmdbStorage.open(path, durability="process")
        try:
            assert storage.log.head() == committed
            return await snapshot(storage, work, committed), await snapshot(memory, work, committed)
        finally:
            await storage.close()

    return asyncio.run(run())


@pytest.mark.parametrize("written", sorted(old_store.ARCHIVES))
def test_a_store_of_an_old_format_opens_reads_verifies_exports_and_rebuilds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: int
) -> None:
    old_store.extract(tmp_path, old_store.ARCHIVES[written])
    path = tmp_path / "store"
    assert max(log_formats(str(path))) == written  # the fixture holds what it is named for
    exported = (tmp_path / "export.jsonl").read_text()
    # Its projections are of an older schema (6: written before snapshots were spaced by bytes):
    # a read-only check refuses them, naming both schemas; a read-only export reads the log.
    code, _, err = call(capsys, "verify", path)
    assert code == 2 and f"have schema 6, this program reads {tables.SCHEMA_VERSION}" in err, err
    assert export_text(path, capsys) == exported
    ours, reference = snapshots_of(path)  # opened for writing: the projections are rebuilt
    assert call(capsys, "verify", path)[0] == 0
    assert len(reference) > 3000 and ours == reference
    code, _out, err = call(capsys, "rebuild", path)
    assert code == 0, err
    assert call(capsys, "verify", path)[0] == 0
    assert export_text(path, capsys) == exported
    assert snapshots_of(path)[0] == reference

    new = [
        [{"type": "conversation", "value": {"id": 99_999}}],  # too short to compress: format 1
        [{"type": "entry", "value": entry(100_000, 99_999, 1, 99_999)}],  # format 3
    ]

    async def more() -> None:  # new records after the old ones: all read back
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for writes in new:
                await storage.commit(writes, CTX)
        finally:
            await storage.close()

    asyncio.run(more())
    assert log_formats(str(path)) == {1, written, 3}
    assert call(capsys, "verify", path)[0] == 0
    lines = export_text(path, capsys).splitlines(keepends=True)
    assert "".join(lines[:-2]) == exported
    assert [json.loads(line)["writes"] for line in lines[-2:]] == new


# ── compact ───────────────────────────────────────────────────────────────────


import hashlib  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

from pi_durable_lmdb.errors import WriterLockedError  # noqa: E402
from pi_durable_lmdb.log.compact import StoreInUseError, compact  # noqa: E402
from pi_durable_lmdb.log.storedir import COMPACTING  # noqa: E402

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


# ── log records: formats 1, 2 and 3 ──────────────────────────────────────────


import zlib  # noqa: E402

import msgspec  # noqa: E402
import zstandard  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pi_durable_lmdb.errors import CorruptProjectionError, CorruptRecordError  # noqa: E402
from pi_durable_lmdb.log import codec  # noqa: E402
from pi_durable_lmdb.log.deflate import PRESET  # noqa: E402
from pi_durable_lmdb.log.records import decode_record, encode_record, write_to_builtins  # noqa: E402

from tests.support.workload import Workload  # noqa: E402
from tools.bench.workloads import document_create, document_delta  # noqa: E402


def test_the_preset_dictionary_never_changes() -> None:
    """Records of formats 2 and 3 decompress with exactly these bytes: a change would make them unreadable."""

    assert (
        hashlib.sha256(PRESET).hexdigest()
        == "93d63131aebf9e3d4fd1d8bbe7856d2b93db1dec773678a2cec0ad8c2effd08c"
    )


def crc(committed_at: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(committed_at.to_bytes(8, "big", signed=True)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), batches=st.integers(1, 30), at=st.integers(-(2**63), 2**63 - 1))
def test_every_batch_reads_back_exactly_and_raw_records_stay_format_1(
    seed: int, batches: int, at: int
) -> None:
    work = Workload(seed)
    for _ in range(batches):
        writes = work.batch()
        try:
            payload = codec.encode(writes)
        except (ValueError, TypeError):
            continue
        stored = encode_record(payload, at)
        fields = msgspec.msgpack.decode(stored)
        if fields[0] == 1:  # kept as it was: byte for byte what the earlier format wrote
            assert stored == msgspec.msgpack.encode([1, at, crc(at, payload), payload])
        else:
            assert fields[0] == 3 and fields[4] == len(payload) and len(stored) < len(payload) + 16
        commit = decode_record(7, stored)
        reference = decode_record(7, msgspec.msgpack.encode([1, at, crc(at, payload), payload]))
        assert commit == reference and commit.committed_at == at
        assert codec.encode([write_to_builtins(write) for write in commit.writes]) == payload


def test_a_turn_record_is_compressed_to_fit_six_to_a_page() -> None:
    payload = codec.encode(
        [
            {"type": "entry", "value": entry(1234, ROOT, 57, 2)},
            {"type": "task", "value": task(2, ROOT, 57, "running")},
        ]
    )
    stored = encode_record(payload, 1_760_000_000_000)
    assert msgspec.msgpack.decode(stored)[0] == 3
    assert len(stored) + 18 <= (4096 - 16) // 6  # key, node header, pointer: six records a page
    delta = encode_record(codec.encode([document_delta(2)]), 1_760_000_000_000)
    assert len(delta) <= 64


def deflated_record(payload: bytes, size: int | None = None, at: int = 5) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, PRESET)
    deflated = compressor.compress(payload) + compressor.flush()
    return msgspec.msgpack.encode(
        [2, at, crc(at, deflated), deflated, len(payload) if size is None else size]
    )


def zstd_record(
    payload: bytes, size: int | None = None, at: int = 5, tail: bytes = b"", cut: int = 0
) -> bytes:
    dictionary = zstandard.ZstdCompressionDict(PRESET, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    frame = zstandard.ZstdCompressor(
        level=3, dict_data=dictionary, write_content_size=True
    ).compress(payload)
    frame = frame[: len(frame) - cut] + tail
    return msgspec.msgpack.encode(
        [3, at, crc(at, frame), frame, len(payload) if size is None else size]
    )


def forged_zstd_record(claim: int) -> bytes:
    """A format-3 record whose frame header and size field agree on ``claim`` bytes, with a valid
    checksum: a 13-byte frame (magic, a single-segment descriptor, the 8-byte content size)."""

    frame = b"\x28\xb5\x2f\xfd\xe0" + claim.to_bytes(8, "little")
    assert zstandard.frame_content_size(frame) == claim
    return msgspec.msgpack.encode([3, 5, crc(5, frame), frame, claim])


def test_a_batch_too_dense_for_a_zstd_frame_is_stored_deflated_and_reads_back() -> None:
    payload = codec.encode(
        [{"type": "entry", "value": {"id": 5, "conversationId": 1, "text": "a" * 500_000}}]
    )
    stored = encode_record(payload, 9)
    fields = msgspec.msgpack.decode(stored)
    assert fields[0] == 2 and len(stored) < len(payload) // 200
    assert (
        codec.encode([write_to_builtins(write) for write in decode_record(4, stored).writes])
        == payload
    )


def test_records_of_format_2_and_3_made_elsewhere_read() -> None:
    """Any deflate or zstd writer's records read (other levels, a dictionary id, a checksum in
    the frame): the format fixes the dictionary, not the compressor's settings."""

    payload = codec.encode([{"type": "entry", "value": entry(77, ROOT, 3, 2)}])
    expected = decode_record(1, msgspec.msgpack.encode([1, 5, crc(5, payload), payload]))
    assert decode_record(1, deflated_record(payload)) == expected
    assert decode_record(1, zstd_record(payload)) == expected


@pytest.mark.parametrize(
    "stored, reason",
    [
        (zstd_record(b"\x91\xa1x" * 40, size=119), "a zstd frame of 120 bytes, not 119"),
        (zstd_record(b"\x91\xa1x" * 40, size=121), "a zstd frame of 120 bytes, not 121"),
        (zstd_record(b"\x91\xa1x" * 40, size=0), "size 0"),
        (zstd_record(b"\x91\xa1x" * 40, tail=b"\x00"), "unused data"),
        (
            zstd_record(b"\x91\xa1x" * 400_000, size=100),
            "not 100",
        ),  # the frame says otherwise: refused unread
        (
            zstd_record(b"\x91\xa1x" * 40, cut=3),
            "did not decompress full frame",
        ),  # the frame cut short
        (
            zstd_record(b"\x91\xa1x" * 40, tail=zstandard.ZstdCompressor().compress(b"more")),
            "unused data",
        ),
        (
            zstd_record(b"x" * 2_000_000),
            "more than 256 times",
        ),  # a writer stores such a batch as format 2
        (forged_zstd_record(2**40), "claims"),
        (forged_zstd_record(2**63), "claims"),
        (deflated_record(b"\x91\xa1x" * 40, size=2**63), "cannot hold"),
        (msgspec.msgpack.encode([3, 5, crc(5, b"not zstd"), b"not zstd", 50]), "not a zstd frame"),
        (deflated_record(b"\x91\xa1x" * 40, size=119), "deflate"),
        (deflated_record(b"\x91\xa1x" * 40, size=121), "deflate"),
        (deflated_record(b"\x91\xa1x" * 40, size=0), "size 0"),
        (
            deflated_record(b"\x91\xa1x" * 400_000, size=100),
            "deflate",
        ),  # never inflates past the size
        (msgspec.msgpack.encode([2, 5, crc(5, b"not deflate"), b"not deflate", 50]), "deflate"),
        (msgspec.msgpack.encode([1, 5, crc(5, b"\x90"), b"\x90", 1]), "format 1 with size"),
        (msgspec.msgpack.encode([4, 5, crc(5, b"\x90"), b"\x90"]), "unsupported record format 4"),
    ],
)
def test_a_record_that_lies_about_its_deflated_writes_is_corrupt(
    stored: bytes, reason: str
) -> None:
    with pytest.raises(CorruptRecordError, match=reason):
        decode_record(9, stored)


def test_a_record_of_format_1_made_the_old_way_reads() -> None:
    payload = codec.encode([{"type": "conversation", "value": {"id": 5}}])
    commit = decode_record(3, msgspec.msgpack.encode([1, 77, crc(77, payload), payload]))
    assert commit.committed_at == 77 and write_to_builtins(commit.writes[0]) == {
        "type": "conversation",
        "value": {"id": 5},
    }


# ── history by reference to the log, packed snapshots ─────────────────────────


def test_as_of_reads_of_a_task_rewritten_every_commit_come_back_from_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "store"
    write_turns(path, 60)

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            for seq in range(2, 63):
                view = await storage.as_of(seq)
                n = seq - 2
                expected = task(
                    2, ROOT, n, "pending" if n == 0 else ("running" if n % 3 else "sleeping")
                )
                assert await view.task(2, CTX) == expected
            # a task written three times in one commit: the view after it shows the last write
            writes = [
                {"type": "task", "value": task(2, ROOT, 100 + k, "running")} for k in range(3)
            ]
            seq = await storage.commit(writes, CTX)
            await storage.commit([{"type": "task", "value": task(2, ROOT, 200, "sleeping")}], CTX)
            assert await (await storage.as_of(seq)).task(2, CTX) == task(2, ROOT, 102, "running")
            assert await (await storage.as_of(seq - 1)).task(2, CTX) == task(
                2, ROOT, 60, "running" if 60 % 3 else "sleeping"
            )
        finally:
            await storage.close()

    asyncio.run(run())
    assert call(capsys, "verify", path)[0] == 0
    env = Environment(path, readonly=True)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(name for name in names if name.endswith(".history")))
        with env.read() as txn:
            rows = list(txn.cursor(db=db))
    finally:
        env.close()
    logged = [value for _, value in rows if value[:1] == b"\x03"]
    assert len(logged) >= 60 and all(len(value) == 17 for value in logged)


def test_a_damaged_log_reference_in_history_is_named_not_served(tmp_path: Path) -> None:
    path = tmp_path / "store"
    write_turns(path, 5)
    env = Environment(path)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(name for name in names if name.endswith(".history")))
        with env.read() as txn:
            key, value = next((k, v) for k, v in txn.cursor(db=db) if v[:1] == b"\x03")
        env.write(
            lambda txn: txn.put(key, value[:-1] + bytes([value[-1] ^ 1]), db=db)
        )  # the checksum
    finally:
        env.close()

    async def run() -> None:
        storage = await LmdbStorage.open(path, durability="process")
        try:
            seq = int.from_bytes(key[-8:], "big")
            with pytest.raises(CorruptProjectionError):
                await (await storage.as_of(seq - 1)).task(2, CTX)
        finally:
            await storage.close()

    asyncio.run(run())


def test_document_reads_at_every_point_use_packed_snapshots_as_memory_storage_answers(
    tmp_path: Path,
) -> None:
    async def run() -> None:
        storage = await LmdbStorage.open(tmp_path / "store", durability="process")
        memory = MemoryStorage()
        try:
            for store in (storage, memory):
                await store.commit([conversation(ROOT)], CTX)
                await store.commit([document_create(2)], CTX)
                for _ in range(300):
                    await store.commit([document_delta(2)], CTX)
            for seq in [2, 3, 64, 65, 66, 67, 130, 131, 200, 302, "current"]:
                assert await storage.document(2, seq, CTX) == await memory.document(2, seq, CTX), (
                    seq
                )
        finally:
            await storage.close()

    asyncio.run(run())
    env = Environment(tmp_path / "store", readonly=True)
    try:
        with env.read() as txn:
            names = [bytes(key).decode() for key, _ in txn.cursor()]
        db = env.db(next(n for n in names if n.endswith(".documents.snapshots")))
        with env.read() as txn:
            snapshots = list(txn.cursor(db=db))
    finally:
        env.close()
    assert len(snapshots) == 4 and all(value[8:9] == b"\xc1" for _, value in snapshots)
