"""What a ``power`` store costs on disk: journal segments sized with the store, and checkpoints
that come sooner when the pages the pin keeps from reuse would outgrow their share of the file."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.log.journal import HEADER_SIZE, Journal, JournalOptions, segment_sizing
from pi_durable_lmdb.log.journaled import CommitJournal

KiB = 1024


def test_a_new_segment_is_a_share_of_the_store_within_its_bounds() -> None:
    options = JournalOptions()
    assert segment_sizing(options, 0, HEADER_SIZE) == 64 * KiB
    assert (
        segment_sizing(options, 6 * (1 << 20), HEADER_SIZE) == 64 * KiB
    )  # 96 KiB, down to a power of two
    assert segment_sizing(options, 8 * (1 << 20), HEADER_SIZE) == 128 * KiB
    assert segment_sizing(options, 1 << 30, HEADER_SIZE) == 1 << 20
    assert segment_sizing(options, 0, 300 * KiB) == 300 * KiB, "one frame always fits"
    small = JournalOptions(segment_size=3 * HEADER_SIZE)
    assert segment_sizing(small, 1 << 30, HEADER_SIZE) == 3 * HEADER_SIZE, (
        "segment_size bounds it, below segment_min too"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("segment_min", 4096),
        ("segment_min", 1.5),
        ("pinned_share", 0),
        ("pinned_share", 1.5),
        ("pinned_pages", 0),
        ("pinned_pages", "8"),
    ],
)
def test_the_new_options_refuse_what_makes_no_sense(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        JournalOptions(**{field: value})


def _fill(journal: Journal, first: int, frames: int) -> int:
    for seq in range(first, first + frames):
        journal.write([(seq, bytes([seq % 251]) * 3000)])
        journal.confirm()
    return first + frames


def test_segments_grow_with_the_store_and_outgrown_free_ones_are_deleted(tmp_path: Path) -> None:
    options = JournalOptions(segment_min=2 * HEADER_SIZE, segment_size=16 * HEADER_SIZE)
    data = tmp_path / "data.mdb"
    data.write_bytes(b"")
    journal = Journal(str(tmp_path), options)
    journal.begin()
    seq = _fill(journal, 1, 6)  # 8 KiB segments, 3 KiB frames: several rotations
    journal.release(journal.current_number)
    small = {
        name: os.path.getsize(os.path.join(journal.directory, name))
        for name in os.listdir(journal.directory)
        if name.endswith(".seg")
    }
    assert set(small.values()) == {2 * HEADER_SIZE} and len(small) >= 2
    with open(data, "wb") as file:  # the store grew: 4 MiB / 64 = 64 KiB segments from now on
        file.truncate(4 << 20)
    checkpoint = journal.current_number
    seq = _fill(journal, seq, 12)
    sizes = {
        name: os.path.getsize(os.path.join(journal.directory, name))
        for name in os.listdir(journal.directory)
        if name.endswith(".seg")
    }
    assert max(sizes.values()) == 16 * HEADER_SIZE
    assert not [name for name in small if name in sizes and name != f"{checkpoint:016x}.seg"], (
        small,
        sizes,
    )
    assert [s for s, _ in Journal(str(tmp_path), options).records(checkpoint, 6)] == list(
        range(7, seq)
    )
    journal.close()


async def _commit_turns(
    path: Path, options: JournalOptions, turns: int, words: int = 80
) -> tuple[int, int]:
    """(data.mdb's bytes, the commit bound at the end) after ``turns`` commits of an entry (of
    ``words`` words) and a task record each."""

    storage = await LmdbStorage.open(path, journal=options)
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for n in range(turns):
            await storage.commit(
                [
                    {
                        "type": "entry",
                        "value": {
                            "id": 10 + n,
                            "conversationId": 1,
                            "kind": "m",
                            # as many bytes as ``words`` words, random: an entry row that
                            # compresses keeps nothing of a repeated word's bytes
                            "data": {
                                "n": n,
                                "text": random.Random(n).randbytes(words * 5 // 2).hex(),
                            },
                        },
                    },
                    {
                        "type": "task",
                        "value": {
                            "id": 2,
                            "conversationId": 1,
                            "kind": "t",
                            "version": 1,
                            "input": None,
                            "background": False,
                            "abortRequested": False,
                            "startedAt": 1,
                            "state": {"status": "running", "n": n},
                        },
                    },
                ],
                CTX,
            )
        bound = storage._env.journal.bound
    finally:
        await storage.close()
    return os.path.getsize(path / "data.mdb"), bound


async def test_checkpoints_come_sooner_when_the_pin_would_hold_more_than_its_share(
    tmp_path: Path,
) -> None:
    """With the free pages' share bounded, the commit bound stays lower and the file smaller than
    with no bound but ``checkpoint_commits`` (the same commits, checkpoints on the committing
    thread so both runs are the same every time)."""

    fixed = JournalOptions(
        checkpoint_commits=32,
        checkpoint_seconds=1e9,
        pinned_share=1.0,
        pinned_pages=1 << 30,
        background=False,
    )
    bounded = JournalOptions(
        checkpoint_commits=32,
        checkpoint_seconds=1e9,
        pinned_share=0.05,
        pinned_pages=8,
        background=False,
    )
    fixed_bytes, fixed_bound = await _commit_turns(tmp_path / "fixed", fixed, 300)
    bounded_bytes, bounded_bound = await _commit_turns(tmp_path / "bounded", bounded, 300)
    assert 1 <= bounded_bound < fixed_bound
    assert bounded_bytes < fixed_bytes * 0.8, (bounded_bytes, fixed_bytes)


def _segments(store: Path) -> dict[str, int]:
    """The journal's segments and their sizes; listed again when one is renamed between the
    listing and its size (an open writer's checkpoint thread recycles released segments)."""

    journal = store / "journal"
    for _ in range(100):
        try:
            return {
                name: os.path.getsize(journal / name)
                for name in os.listdir(journal)
                if name.endswith(".seg")
            }
        except FileNotFoundError:
            continue
    raise AssertionError(f"the segments of {journal} kept changing under 100 listings")


async def test_a_clean_close_keeps_one_segment_and_the_next_life_recycles_it(
    tmp_path: Path,
) -> None:
    """A closed store holds one preallocated segment, not every one it wrote: the others are cut
    to zero bytes at the close (nothing reads the journal of a cleanly closed store), the next
    open recycles the one kept and deletes the empty ones, and every commit is there."""

    store = tmp_path / "store"
    options = JournalOptions(
        segment_min=2 * HEADER_SIZE, segment_size=2 * HEADER_SIZE, checkpoint_commits=2
    )
    storage = await LmdbStorage.open(store, durability="power", journal=options)
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    for n in range(12):  # 1.5 KiB entries in 4 KiB of frames per segment: several segments
        await storage.commit(
            [
                {
                    "type": "entry",
                    "value": {
                        "id": 100 + n,
                        "conversationId": 1,
                        "kind": "note",
                        "data": {"text": os.urandom(750).hex()},
                    },
                }
            ],
            CTX,
        )
    assert len(_segments(store)) >= 2, _segments(store)
    await storage.close()
    closed = _segments(store)
    assert sorted(closed.values())[-1] == 2 * HEADER_SIZE and sorted(closed.values())[:-1] == [
        0
    ] * (len(closed) - 1), closed
    storage = await LmdbStorage.open(store, durability="power", journal=options)
    try:
        reopened = _segments(store)
        assert list(reopened.values()) == [2 * HEADER_SIZE], (
            f"the empty segments stayed, or the kept one was not recycled: {reopened}"
        )
        assert int(max(reopened)[:-4], 16) > int(max(closed)[:-4], 16), (
            f"segment numbers went back: {closed} then {reopened}"
        )
        await storage.commit(
            [{"type": "entry", "value": {"id": 200, "conversationId": 1, "kind": "note"}}], CTX
        )
        page = await storage.scan_entries({"conversationId": 1}, 100, None, CTX)
        assert sorted(item["id"] for item in page["items"]) == [*range(100, 112), 200]
    finally:
        await storage.close()


@pytest.mark.parametrize(
    ("pinned_share", "pinned_pages", "skipped"),
    [(0.05, 8, False), (JournalOptions.pinned_share, JournalOptions.pinned_pages, True)],
)
async def test_the_commit_bound_counts_free_pages_only_when_the_file_grew_and_adapts_as_before(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    pinned_share: float,
    pinned_pages: int,
    skipped: bool,
) -> None:
    """``_adapt`` counts a state's free pages (a ``stat`` of every database) only at a
    checkpoint that finds the file grown, counting the checkpoint before's in the pin it still
    holds when that one was skipped: the bound after every checkpoint is the one the rule gives
    when every checkpoint counts (a shadow of it here, fed the same states). A tight share
    (the file grows at nearly every checkpoint) moves the bound often; with the default one
    most checkpoints find the file as it was and count nothing."""

    counted: list[int] = []
    bounds: list[tuple[int, int]] = []
    grown: list[bool] = []  # per checkpoint: the file grew since the one before
    counts: list[int] = []  # per checkpoint: free pages counted (states stat-ed)
    shadow = {"last": 0, "free": 0, "bound": 1}
    real_free = CommitJournal._free_pages
    real_adapt = CommitJournal._adapt

    def free_pages(self: CommitJournal, txn: Any, last: int, earlier: bool = False) -> int:
        counted.append(last)
        return real_free(self, txn, last, earlier)

    def adapt(self: CommitJournal, pin: Any, old: Any, commits: int, last: int) -> None:
        options = self._journal.options
        grown.append(last > shadow["last"] > 0)
        before = len(counted)
        free = real_free(self, pin, last)  # the rule with every checkpoint counted
        grew = shadow["last"] > 0 and last > shadow["last"] and free > shadow["free"]
        shadow["last"], shadow["free"] = last, free
        if grew and free > max(options.pinned_pages, options.pinned_share * (last + 1)):
            shadow["bound"] = max(1, shadow["bound"] // 2)
        elif commits >= shadow["bound"]:
            shadow["bound"] = min(
                options.checkpoint_commits, shadow["bound"] + (1 if grew else shadow["bound"])
            )
        real_adapt(self, pin, old, commits, last)
        bounds.append((self.bound, shadow["bound"]))
        counts.append(len(counted) - before)

    monkeypatch.setattr(CommitJournal, "_free_pages", free_pages)
    monkeypatch.setattr(CommitJournal, "_adapt", adapt)
    options = JournalOptions(
        checkpoint_commits=32,
        checkpoint_seconds=1e9,
        pinned_share=pinned_share,
        pinned_pages=pinned_pages,
        background=False,
    )
    await _commit_turns(tmp_path / "store", options, 600, words=8)
    assert len(bounds) > 10, bounds
    assert [mine for mine, _ in bounds] == [rule for _, rule in bounds], bounds
    assert len({mine for mine, _ in bounds}) > 2, "the bound never moved: nothing was compared"
    assert all(count <= (2 if grew else 0) for grew, count in zip(grown, counts)), [
        (g, c) for g, c in zip(grown, counts) if c > (2 if g else 0)
    ]
    if skipped:
        assert not all(grown), "every checkpoint found the file grown: none skipped its count"
