"""The power journal (``log.journal``): frames, segments, checkpoint records, and a writer that
stops without closing. The power cut itself is explored by tests/test_power_loss.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import JournalReplayPending, LmdbStorage, StoreFormatError
from pi_durable_lmdb.log.journal import (
    HEADER_SIZE,
    Checkpoints,
    Journal,
    JournalOptions,
    encode_frame,
    read_frames,
)
from pi_durable_lmdb.log.storedir import POWER_FILE

ROOT = Path(__file__).resolve().parent.parent


def _records(first: int, count: int, size: int = 10) -> list[tuple[int, bytes]]:
    return [(seq, bytes([seq % 251]) * (size + seq % 7)) for seq in range(first, first + count)]


def test_frames_read_back_whole_and_a_cut_or_changed_byte_ends_the_chain() -> None:
    salt, number = 12345, 7
    frames = [
        encode_frame(number, salt, first, [data for _, data in _records(first, count)])
        for first, count in ((1, 3), (4, 1), (5, 2))
    ]
    data = bytes(HEADER_SIZE) + b"".join(frames)
    got = read_frames(data, number, salt)
    assert [(first, len(records)) for first, records in got] == [(1, 3), (4, 1), (5, 2)]
    assert got[0][1] == [data for _, data in _records(1, 3)]
    end_of_first = HEADER_SIZE + len(frames[0])
    for cut in range(
        HEADER_SIZE, len(data), 3
    ):  # a frame torn anywhere is not read, nor any after it
        whole = sum(
            1
            for at in (
                HEADER_SIZE + len(frames[0]),
                HEADER_SIZE + len(frames[0]) + len(frames[1]),
                len(data),
            )
            if at <= cut
        )
        assert len(read_frames(data[:cut], number, salt)) == whole
    for at in range(HEADER_SIZE, end_of_first):  # any changed byte of the first frame stops at it
        changed = bytearray(data)
        changed[at] ^= 0x40
        assert read_frames(bytes(changed), number, salt) == []
    assert read_frames(data, number + 1, salt) == [], (
        "a recycled segment's earlier life is not read"
    )
    assert read_frames(data, number, salt + 1) == []


@pytest.mark.parametrize("sizes", [[0], [1], [650], [10, 0, 4000, 7], [70000]])
def test_a_frame_s_bytes_are_the_format_s_header_checksum_and_body(sizes: list[int]) -> None:
    """``encode_frame`` (built in one copy, its checksum streamed) gives the format's bytes: a
    header (magic, body length, count, segment, first sequence), the xxh3-64 seeded with the
    salt over header and body, then each record's u32 length and bytes."""

    import struct

    import xxhash

    records = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
    body = b"".join(struct.pack(">I", len(data)) + data for data in records)
    head = struct.pack(">IIIIQQ", 0x504A4652, len(body), len(records), 0, 7, 42)
    expected = head + struct.pack(">Q", xxhash.xxh3_64_intdigest(head + body, seed=99)) + body
    assert encode_frame(7, 99, 42, records) == expected
    assert read_frames(bytes(HEADER_SIZE) + expected, 7, 99) == [(42, records)]


def _write(journal: Journal, records: list[tuple[int, bytes]]) -> None:
    journal.write(records)
    journal.confirm()


@pytest.mark.parametrize("per_frame", [1, 3, 8])
def test_the_chain_runs_through_consecutive_recycled_segments_and_skips_their_earlier_lives(
    tmp_path: Path, per_frame: int
) -> None:
    options = JournalOptions(segment_size=3 * HEADER_SIZE)
    journal = Journal(str(tmp_path), options)
    seq = 1
    checkpoint_segment = journal.current_number
    for _ in range(40):
        _write(journal, _records(seq, per_frame, 900))
        seq += per_frame
        if seq % 13 < per_frame:  # a checkpoint at seq - 1: earlier segments may be recycled
            checkpoint_segment, checkpointed = journal.current_number, seq - 1
            journal.release(checkpoint_segment)
    journal.close()
    again = Journal(str(tmp_path), options)
    files = [name for name in os.listdir(again.directory) if name.endswith(".seg")]
    assert len(files) < again.next_number - 1, (
        f"segments were recycled: {files}, {again.next_number - 1} numbered"
    )
    records = again.records(checkpoint_segment, checkpointed)
    assert [s for s, _ in records] == list(range(checkpointed + 1, seq))
    assert dict(records) == dict(_records(checkpointed + 1, seq - checkpointed - 1, 900))


def test_an_abandoned_frame_is_gone_and_the_next_takes_its_place(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path), JournalOptions(segment_size=4 * HEADER_SIZE))
    start = journal.current_number
    _write(journal, _records(1, 2))
    journal.write(_records(3, 1, 500))
    journal.abandon()
    assert Journal(str(tmp_path), journal.options).records(start, 0) == _records(1, 2)
    _write(journal, _records(3, 1, 20))
    assert Journal(str(tmp_path), journal.options).records(start, 0) == _records(1, 2) + _records(
        3, 1, 20
    )


def test_a_chain_that_skips_past_the_checkpoint_is_named_as_damage(tmp_path: Path) -> None:
    journal = Journal(str(tmp_path), JournalOptions(segment_size=4 * HEADER_SIZE))
    start = journal.current_number
    _write(journal, _records(5, 3))
    with pytest.raises(
        StoreFormatError,
        match="continues at sequence 5, but the checkpoint it was written after ends at 2",
    ):
        journal.records(start, 2)
    assert journal.records(start, 4) == _records(5, 3)
    assert journal.records(start, 7) == []


def test_checkpoint_records_alternate_and_a_torn_newest_leaves_the_one_before(
    tmp_path: Path,
) -> None:
    checkpoints = Checkpoints(str(tmp_path))
    assert checkpoints.newest(1) is None
    for generation in range(1, 6):
        checkpoints.write(1, 10 + generation, bytes([generation]) * 8192)
    newest = checkpoints.newest(1)
    assert newest is not None and (newest.generation, newest.segment) == (5, 15)
    assert Checkpoints(str(tmp_path)).newest(1) == newest
    assert Checkpoints(str(tmp_path)).newest(2) is None, (
        "another writer life's checkpoints are not trusted"
    )
    slot = next(path for path in checkpoints.paths if Checkpoints._read(path) == newest)
    with open(slot, "r+b") as file:  # the newest record cut short by the power cut
        file.seek(100)
        file.write(bytes(50))
    older = Checkpoints(str(tmp_path)).newest(1)
    assert older is not None and (older.generation, older.segment) == (4, 14)


def test_checkpoint_slots_keep_their_descriptors_and_a_failed_write_opens_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint every few commits writes its slot through a descriptor kept open (no
    open and close each time); a write that fails drops it, the next opens the file again, and
    after a close a write opens them again. Every record reads back as the newest."""

    checkpoints = Checkpoints(str(tmp_path))
    checkpoints.write(1, 10, b"a" * 8192)
    checkpoints.write(1, 11, b"b" * 8192)
    kept = list(checkpoints._fds)
    assert None not in kept, "a slot's descriptor was not kept"
    checkpoints.write(1, 12, b"c" * 8192)
    assert checkpoints._fds == kept, "a slot was opened again"
    real = os.fdatasync
    failing = {"left": 1}

    def fdatasync(fd: int) -> None:
        if fd in kept and failing["left"]:
            failing["left"] -= 1
            raise OSError(5, "injected")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(OSError):
        checkpoints.write(1, 13, b"d" * 8192)
    assert checkpoints._fds.count(None) == 1, "the failed slot's descriptor was kept"
    newest = checkpoints.write(1, 13, b"d" * 8192)
    assert Checkpoints(str(tmp_path)).newest(1) == newest
    checkpoints.close()
    assert checkpoints._fds == [None, None]
    again = checkpoints.write(1, 14, b"e" * 8192)
    assert Checkpoints(str(tmp_path)).newest(1) == again
    checkpoints.close()


KILLED_WRITER = """
import asyncio, os, sys
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.journal import JournalOptions

async def main():
    storage = await LmdbStorage.open(sys.argv[1], map_size=64 * 1024, journal=JournalOptions(
        segment_size=3 * 4096, checkpoint_commits=int(sys.argv[3]), background=sys.argv[4] == "1"))
    for n in range(int(sys.argv[2])):
        conversation = await storage.mint_id()
        await storage.commit([{"type": "conversation", "value": {"id": conversation}},
                              {"type": "entry", "value": {"id": await storage.mint_id(), "conversationId": conversation,
                               "kind": "m", "data": {"n": n, "pad": "p" * 700}}}], CTX)
        print(conversation, flush=True)
    os._exit(0)  # no close: the journal and its marker stay

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("commits", "every", "background"), [(1, 5, "1"), (37, 4, "1"), (37, 4, "0"), (60, 1000, "1")]
)
async def test_a_power_writer_killed_without_closing_loses_nothing_and_readers_follow(  # the same boot: nothing to replay
    tmp_path: Path, commits: int, every: int, background: str
) -> None:
    path = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(path), str(commits), str(every), background],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    conversations = [int(line) for line in done.stdout.split()]
    assert len(conversations) == commits and (path / POWER_FILE).exists()
    reader = await LmdbStorage.open(
        path, readonly=True
    )  # the same boot: the page cache holds every commit
    try:
        assert reader.log.head() == commits
    finally:
        await reader.close()
    with pytest.raises(
        JournalReplayPending
    ):  # another writer must not take over a journal it cannot replay
        await LmdbStorage.open(path, durability="process")
    storage = await LmdbStorage.open(path)  # replays the journal past the last checkpoint
    try:
        assert storage.log.head() == commits
        for conversation in conversations:
            assert await storage.conversation(conversation, CTX) is not None
        seq = await storage.commit(
            [{"type": "conversation", "value": {"id": await storage.mint_id()}}], CTX
        )
        assert seq == commits + 1
    finally:
        await storage.close()
    assert not (path / POWER_FILE).exists()


@pytest.mark.parametrize(
    ("commits", "every", "background"), [(9, 4, "1"), (37, 4, "0"), (60, 1000, "1")]
)
async def test_after_a_reboot_readers_refuse_until_a_power_writer_replays(
    tmp_path: Path, commits: int, every: int, background: str
) -> None:
    """The writer's open restores the last checkpoint's meta pages (LMDB's own are zeroed here)
    and replays the journal past it; the other pages LMDB wrote since are still there, unlike
    after a real power cut (tools/harness/power_loss.py)."""

    path = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(path), str(commits), str(every), background],
        check=True,
        timeout=120,
        capture_output=True,
        text=True,
    )
    conversations = [int(line) for line in done.stdout.split()]
    marker = path / POWER_FILE
    _boot, _, rest = marker.read_bytes().partition(b"\n")
    marker.write_bytes(
        b"00000000-0000-0000-0000-000000000000\n" + rest
    )  # as after a power cut and a reboot
    with open(
        path / "data.mdb", "r+b"
    ) as file:  # and LMDB's meta pages lost with it: only the checkpoint's remain
        file.write(bytes(8192))
    for _attempt in range(2):
        with pytest.raises(JournalReplayPending, match="durability='power'"):
            await LmdbStorage.open(path, readonly=True)
    storage = await LmdbStorage.open(path)
    await storage.close()
    assert not marker.exists()
    reader = await LmdbStorage.open(path, readonly=True)
    try:
        assert reader.log.head() == commits
        for conversation in conversations:
            assert await reader.conversation(conversation, CTX) is not None
    finally:
        await reader.close()
