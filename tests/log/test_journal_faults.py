"""A power writer's journal when its I/O fails (ENOSPC, EIO at each kind of call), and recovery
that never stops early in silence. The faults are raised at the os calls the journal makes
(``tools/harness/iofaults/inject.py``); a power cut is a copy of the store taken while the writer has it
open (what the page cache holds), with the boot id in its marker changed and LMDB's meta pages
zeroed, as a reboot after a cut leaves them at worst."""

from __future__ import annotations

import errno
import os
import random
import shutil
import string
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import JournalDamagedError, LmdbStorage, StoreDamagedError, StoreFullError
from pi_durable_lmdb.log.journal import (
    HEADER_SIZE,
    Journal,
    JournalOptions,
    encode_frame,
    read_frames,
)

from tools.harness.iofaults.check import reboot as give_another_boot
from tools.harness.iofaults.check import run_case
from tools.harness.iofaults.inject import Injector

OPTIONS = JournalOptions(
    segment_size=3 * HEADER_SIZE,
    checkpoint_commits=1000,
    checkpoint_bytes=1 << 30,
    checkpoint_seconds=3600.0,
    background=False,
)


def crash_copy(store: Path, copy: Path, reboot: bool = True) -> None:
    """The store as a writer killed now leaves it; ``reboot``: as the machine's next boot finds
    it after a power cut (the markers name another boot, LMDB's own meta pages are gone)."""

    shutil.copytree(store, copy, ignore=shutil.ignore_patterns("lock.mdb", "writer.lock"))
    if reboot:
        give_another_boot(copy)


async def commit(storage: LmdbStorage, n: int, pad: int = 1500) -> tuple[int, int]:
    """One commit of about ``pad`` bytes that do not compress away; (its sequence, its id)."""

    conversation = await storage.mint_id()
    noise = random.Random(n).choices(string.ascii_letters, k=pad)
    seq = await storage.commit(
        [{"type": "conversation", "value": {"id": conversation, "n": n, "pad": "".join(noise)}}],
        CTX,
    )
    return seq, conversation


async def check_recovered(path: Path, acked: list[tuple[int, int]]) -> None:
    storage = await LmdbStorage.open(path, journal=OPTIONS)
    try:
        assert storage.log.head() >= max(seq for seq, _ in acked), (
            "recovery stopped before acknowledged commits"
        )
        for seq, conversation in acked:
            assert await storage.conversation(conversation, CTX) is not None, f"commit {seq} lost"
    finally:
        await storage.close()


SEGMENT_KINDS = ["create", "zero-fill", "header", "segsync", "dirsync"]
ERRORS = pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])


async def fail_a_new_segment(
    storage: LmdbStorage, kind: str, error: int, acked: list[tuple[int, int]]
) -> None:
    """Commit until one needs a new segment, whose making fails at its first ``kind`` call."""

    with Injector(kind, 1, error) as injector:
        for n in range(3, 12):
            try:
                acked.append(await commit(storage, n))
            except OSError as refused:
                if error == errno.ENOSPC and kind in ("create", "zero-fill"):
                    assert isinstance(refused, StoreFullError)
                break
        assert injector.failed


@pytest.mark.parametrize("kind", SEGMENT_KINDS)
@ERRORS
async def test_a_segment_that_could_not_be_made_leaves_no_gap_recovery_stops_at(
    tmp_path: Path, kind: str, error: int
) -> None:
    """A failure while a new segment is made (the disk full while it is zero-filled, say): the
    commit that needed it fails, and the next segment made takes the number it would have had,
    so after a power cut recovery replays every acknowledged commit (it used to stop, silently,
    at the hole the lost number left)."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, journal=OPTIONS)
    acked = [await commit(storage, n) for n in range(3)]
    await fail_a_new_segment(storage, kind, error, acked)
    for n in range(12, 20):
        acked.append(await commit(storage, n, pad=6000))  # each needs a new segment
    crash_copy(path, tmp_path / "cut")
    await storage.close()
    await check_recovered(tmp_path / "cut", acked)
    await check_recovered(path, acked)


@pytest.mark.parametrize("kind", SEGMENT_KINDS)
@ERRORS
async def test_the_same_open_storage_commits_again_once_the_fault_clears(
    tmp_path: Path, kind: str, error: int
) -> None:
    """docs/reliability.md section 5: after a failed segment, commits that fit the segment in use
    go on there, and bigger ones make the segment then (the journal used to be left with no open
    file: a bare AssertionError on every commit until the store was reopened)."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, journal=OPTIONS)
    acked = [await commit(storage, n) for n in range(3)]
    await fail_a_new_segment(storage, kind, error, acked)
    acked.append(await commit(storage, 99, pad=10))
    acked.append(await commit(storage, 100, pad=6000))
    acked.append(await commit(storage, 101, pad=10))
    crash_copy(path, tmp_path / "cut")
    await storage.close()
    await check_recovered(tmp_path / "cut", acked)


def _records(first: int, count: int, size: int = 900) -> list[tuple[int, bytes]]:
    return [(seq, bytes([seq % 251]) * size) for seq in range(first, first + count)]


def _journal_of_segments(path: Path) -> tuple[Journal, int]:
    """A journal of several segments (frames of sequences 1 to 12); the first segment's number."""

    journal = Journal(str(path), JournalOptions(segment_size=2 * HEADER_SIZE))
    start = journal.current_number
    for first in range(1, 13, 2):
        journal.write(_records(first, 2))
        journal.confirm()
    journal.close()
    assert journal.current_number == start + 2, "three segments, two frames each"
    return Journal(str(path), journal.options), start


@pytest.mark.parametrize("damage", ["deleted", "header", "directory", "unreadable"])
def test_a_hole_or_an_unreadable_segment_inside_the_range_is_named_never_a_quiet_end(
    tmp_path: Path, damage: str
) -> None:
    journal, start = _journal_of_segments(tmp_path)
    assert [seq for seq, _ in journal.records(start, 0)] == list(range(1, 13))
    middle = journal.segments[start + 1].path
    if damage in ("deleted", "directory"):
        os.unlink(middle)
        if damage == "directory":
            os.mkdir(middle)
    elif damage == "header":
        with open(middle, "r+b") as file:
            file.write(b"\xff" * 16)
    reopened = Journal(str(tmp_path), journal.options)
    if (
        damage == "unreadable"
    ):  # gone between the open's listing and the read (an I/O error, as far as recovery knows)
        os.unlink(middle)
    with pytest.raises(StoreDamagedError, match=f"{start + 1:016x}.seg") as raised:
        reopened.records(start, 0)
    assert isinstance(raised.value, JournalDamagedError)


def test_the_last_segment_with_a_damaged_header_but_frames_is_named(tmp_path: Path) -> None:
    """The newest segment's header damaged: its frames were written after the header was
    durable, so it is damage, not a segment cut while it was made (which holds no frame)."""

    journal, start = _journal_of_segments(tmp_path)
    last = journal.segments[max(journal.segments)]
    with open(last.path, "r+b") as file:
        file.write(b"\xff" * 16)
    with pytest.raises(JournalDamagedError, match=f"{last.number:016x}.seg has a damaged header"):
        Journal(str(tmp_path), journal.options).records(start, 0)


def test_a_frame_that_does_not_continue_the_chain_is_named(tmp_path: Path) -> None:
    journal, start = _journal_of_segments(tmp_path)
    last = journal.segments[max(journal.segments)]
    with open(last.path, "rb") as file:
        data = file.read()
    first, records = read_frames(data, last.number, last.salt)[0]
    with open(
        last.path, "r+b"
    ) as file:  # its first frame names a sequence further on, checksum and all
        file.seek(HEADER_SIZE)
        file.write(encode_frame(last.number, last.salt, first + 5, records))
    with pytest.raises(
        JournalDamagedError, match=f"starting at sequence {first + 5} after sequence {first - 1}"
    ):
        Journal(str(tmp_path), journal.options).records(start, 0)


def test_the_journal_s_end_is_no_damage(tmp_path: Path) -> None:
    """A last segment made (header durable) and never written, or one whose frame was cut: the end."""

    journal, start = _journal_of_segments(tmp_path)
    last = journal.segments[max(journal.segments)]
    with open(last.path, "r+b") as file:
        file.seek(HEADER_SIZE + 30)
        file.write(b"\x00" * 8)
    records = Journal(str(tmp_path), journal.options).records(start, 0)
    assert [seq for seq, _ in records] == list(range(1, 9)), "the cut frame (9, 10) ends the chain"
    made = Journal(str(tmp_path), journal.options)
    made._next_segment(HEADER_SIZE)  # a segment made after it, holding nothing
    made.close()
    assert Journal(str(tmp_path), journal.options).records(start, 0) == records


@ERRORS
async def test_a_checkpoint_that_fails_after_a_commit_does_not_fail_the_commit(
    tmp_path: Path, error: int
) -> None:
    """With checkpoints on the committing thread (``background=False``), a checkpoint that failed
    right after a commit made the commit raise, though it was committed and durable in the
    journal: its caller, trying again, was refused (its ids already stored). Found by
    tools/harness/io_faults.py. The commit is acknowledged; the checkpoint is retried at the next trigger."""

    path = tmp_path / "store"
    options = JournalOptions(segment_size=3 * HEADER_SIZE, checkpoint_commits=2, background=False)
    storage = await LmdbStorage.open(path, journal=options)
    acked = [await commit(storage, 0, pad=10)]
    n = 1
    with Injector("checkpoint", 1, error) as injector:
        while (
            not injector.failed and n < 20
        ):  # the first commit that ends in a checkpoint: it fails
            acked.append(await commit(storage, n, pad=10))
            n += 1
        assert injector.failed
    acked.extend([await commit(storage, m, pad=10) for m in range(n, n + 4)])
    crash_copy(path, tmp_path / "cut")
    await storage.close()
    await check_recovered(tmp_path / "cut", acked)


async def test_a_frame_its_unmaking_failed_for_is_unmade_before_the_journal_moves_on(
    tmp_path: Path,
) -> None:
    """A frame's flush fails and so does the write that unmakes it: the frame may be whole on
    disk. The next commit (same sequence) needs a new segment: the old frame is unmade first,
    or recovery would find two frames of one sequence (the stale one unacknowledged)."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, journal=OPTIONS)
    acked = [await commit(storage, 0, pad=10)]
    with Injector("flush", 1, errno.EIO) as flush, Injector("unmake", 1, errno.EIO) as unmake:
        with pytest.raises(OSError):
            await commit(storage, 1, pad=10)
        assert flush.failed and unmake.failed
    acked.append(await commit(storage, 2, pad=20000))  # a segment of its own
    acked.append(await commit(storage, 3, pad=10))
    crash_copy(path, tmp_path / "cut")
    await storage.close()
    await check_recovered(tmp_path / "cut", acked)


@ERRORS
def test_a_failed_unmaking_while_the_map_grows_does_not_wedge_the_writer(
    tmp_path: Path, error: int
) -> None:
    """A transaction whose commit found the map full unmakes its frame before the map grows;
    when that write failed, the transaction was left open and counted as running, so every later
    growth waited for it and failed (MapBusyError): the writer was wedged. Found by
    tools/harness/io_faults.py. Where the writer meets a full map at commit time depends on its seeded
    workload, its map and every page a commit writes (checkpoint policy included), so the first
    of a bounded grid of seeds and map sizes that meets one runs."""

    cases = [(seed, size) for size in (256 << 10, 192 << 10, 320 << 10) for seed in range(1, 13)]
    for seed, size in cases:
        outcome = run_case(
            str(tmp_path / f"store-{seed}-{size}"), "unmake", 1, error, seed=seed, map_size=size
        )
        if outcome.fired:
            break
    assert outcome.fired, "none of the writer's seeded workloads meets a full map at commit time"
    assert not outcome.problems, outcome.problems
