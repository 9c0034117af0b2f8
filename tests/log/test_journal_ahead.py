"""Journal segments made ready ahead (``Journal.prepare``, on the checkpoint thread), so that the
commit that fills a segment only switches to the next one; and what recovery makes of a segment
made ready that no frame went into: the chain's empty end, never a frame read from it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.journal import HEADER_SIZE, Journal, JournalOptions
from pi_durable_lmdb.log.storedir import POWER_FILE

OPTIONS = JournalOptions(segment_min=3 * HEADER_SIZE, segment_size=3 * HEADER_SIZE)
"""Segments of two 4 KiB blocks after the header: a frame of 3,000 bytes fills half of one."""


def _records(first: int, count: int, size: int = 3000) -> list[tuple[int, bytes]]:
    return [(seq, bytes([seq % 251]) * size) for seq in range(first, first + count)]


def _write(journal: Journal, records: list[tuple[int, bytes]]) -> None:
    journal.write(records)
    journal.confirm()


def _journal(tmp_path: Path) -> Journal:
    (tmp_path / "data.mdb").write_bytes(b"")
    journal = Journal(str(tmp_path), OPTIONS)
    journal.begin()
    return journal


def test_moving_on_to_a_segment_made_ahead_flushes_nothing_but_frames(tmp_path: Path) -> None:
    """A segment made ready ahead (from a released one) is the chain's next number; the write
    that fills the segment in use switches to it without a segment flush, and every record reads
    back through the switch."""

    journal = _journal(tmp_path)
    first = journal.current_number
    _write(journal, _records(1, 2))
    _write(journal, _records(3, 2))  # the first segment filled: the second made inline
    assert journal.current_number == first + 1
    journal.release(journal.current_number)  # a checkpoint needs nothing of the first
    assert journal.prepare(), "a released segment was free, yet none was made ready"
    assert journal.ready == first + 2 and not journal.prepare(), "one ready segment at most"
    counters = journal.counters
    flushes, switches = counters.segment_flushes, counters.segment_switches
    _write(journal, _records(5, 2))  # fills the second: switches to the ready one
    assert journal.current_number == first + 2 and journal.ready is None
    assert counters.segment_flushes == flushes, "moving on to a ready segment flushed it again"
    assert counters.segment_switches == switches + 1
    assert counters.segments_ahead == 1
    journal.close()
    assert [seq for seq, _ in Journal(str(tmp_path), OPTIONS).records(first + 1, 2)] == [3, 4, 5, 6]


def test_a_new_store_makes_its_second_segment_ahead_once_the_first_is_half_written(
    tmp_path: Path,
) -> None:
    """No segment is free before the first rotation: a new file is made ahead only once the
    segment in use is half written, so a small store keeps one segment until it needs two."""

    journal = _journal(tmp_path)
    assert not journal.prepare(), "a new file made ahead for an empty segment"
    _write(journal, _records(1, 2))  # past half of the segment's frame space
    assert journal.prepare() and journal.ready == journal.current_number + 1
    journal.close()


def test_a_segment_made_ready_and_unused_is_the_chain_s_empty_end_after_a_cut(
    tmp_path: Path,
) -> None:
    """A power cut with a ready segment recycled from one that still holds frames of its earlier
    life (another number, another salt): recovery reads every frame of the chain and nothing of
    the ready segment, and the next writer life recycles it."""

    journal = _journal(tmp_path)
    first = journal.current_number
    _write(journal, _records(1, 2))
    _write(journal, _records(3, 2))
    journal.release(journal.current_number)  # the first segment, holding 1 and 2, is free
    assert journal.prepare()
    ready = journal.ready
    assert ready is not None
    old_frames = (Path(journal.directory) / f"{ready:016x}.seg").read_bytes()[HEADER_SIZE:]
    assert old_frames.strip(b"\0"), "the ready segment was recycled from one holding frames"
    # The cut: nothing closed, nothing more written. Recovery opens the journal afresh.
    again = Journal(str(tmp_path), OPTIONS)
    assert ready in again.segments and again.next_number == ready + 1
    assert again.records(first + 1, 2) == _records(3, 2)
    again.begin()  # a new writer life: every segment free, the ready one recycled among them
    assert again.current_number == ready + 1
    _write(again, _records(7, 1))
    assert Journal(str(tmp_path), OPTIONS).records(again.current_number, 6) == _records(7, 1)
    journal.close()
    again.close()


def test_a_frame_bigger_than_the_ready_segment_grows_it_in_place(tmp_path: Path) -> None:
    """A commit whose frame does not fit the ready segment: the segment is grown (zeros written
    and synced) under its own number, so the chain keeps no hole, and the frame reads back."""

    journal = _journal(tmp_path)
    first = journal.current_number
    _write(journal, _records(1, 2))
    assert journal.prepare()
    ready = journal.ready
    assert ready is not None
    big = _records(3, 1, 5 * HEADER_SIZE)
    _write(journal, big)
    assert journal.current_number == ready and journal.ready is None
    assert os.path.getsize(Path(journal.directory) / f"{ready:016x}.seg") > 5 * HEADER_SIZE
    journal.close()
    assert Journal(str(tmp_path), OPTIONS).records(first, 0) == _records(1, 2) + big


KILLED_AHEAD = """
import asyncio, os, sys
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.journal import JournalOptions

async def main():
    storage = await LmdbStorage.open(sys.argv[1], map_size=64 * 1024, journal=JournalOptions(
        segment_size=3 * 4096, checkpoint_commits=4, background=False))
    journal = storage._env.journal._journal
    n = 0
    while n < 12 or journal.ready is None:  # killed with a segment made ready and unused
        conversation = await storage.mint_id()
        await storage.commit([{"type": "conversation", "value": {"id": conversation}},
                              {"type": "entry", "value": {"id": await storage.mint_id(), "conversationId": conversation,
                               "kind": "m", "data": {"n": n, "pad": "p" * 700}}}], CTX)
        print(conversation, flush=True)
        n += 1
    print("ready", journal.ready, flush=True)
    os._exit(0)  # no close: the journal and its marker stay

asyncio.run(main())
"""


async def test_a_power_writer_cut_with_a_segment_made_ready_replays_every_commit(
    tmp_path: Path,
) -> None:
    """A writer killed with a ready segment, then a reboot (LMDB's meta pages lost, only the
    checkpoint's remain): the open replays every acknowledged commit, and commits again."""

    path = tmp_path / "store"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_AHEAD, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = done.stdout.split()
    assert lines[-2] == "ready"
    ready = int(lines[-1])
    conversations = [int(line) for line in lines[:-2]]
    assert (path / "journal" / f"{ready:016x}.seg").exists()
    marker = path / POWER_FILE
    _boot, _, rest = marker.read_bytes().partition(b"\n")
    marker.write_bytes(b"00000000-0000-0000-0000-000000000000\n" + rest)  # another boot
    with open(path / "data.mdb", "r+b") as file:
        file.write(bytes(8192))
    storage = await LmdbStorage.open(path)
    try:
        assert storage.log.head() == len(conversations)
        for conversation in conversations:
            assert await storage.conversation(conversation, CTX) is not None
        seq = await storage.commit(
            [{"type": "conversation", "value": {"id": await storage.mint_id()}}], CTX
        )
        assert seq == len(conversations) + 1
    finally:
        await storage.close()
    assert not marker.exists()
