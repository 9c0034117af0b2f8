"""The I/O fault checker (``tools/harness/io_faults.py``) in CI: every kind of journal call failed with
ENOSPC and with EIO, once each, in a real writer that is then killed and its store rebooted;
and the checker fails when a planted bug (``segment-gap``: a failed segment uses up its number)
brings the hole back."""

from __future__ import annotations

import pytest

from tools.harness.io_faults import explore, spread
from tools.harness.iofaults.inject import KINDS

pytestmark = pytest.mark.slow


def test_every_kind_of_journal_call_failing_loses_nothing_and_wedges_nothing() -> None:
    lines: list[str] = []
    outcomes = explore(list(KINDS), ["ENOSPC", "EIO"], 1, say=lines.append)
    assert len(outcomes) == 2 * len(KINDS), lines
    assert all(outcome.fired for outcome in outcomes), lines
    failures = [line for line in lines if "FAIL" in line]
    assert not failures, "\n".join(failures)


def test_a_transaction_that_fails_after_its_frame_is_written_has_its_frame_unmade() -> None:
    """The run without faults fills LMDB's map at a commit after its frame was written (the map
    size is searched for: where the pages run out moves with the store's layout), so the write of
    zeros over that frame is one of the calls failed."""

    lines: list[str] = []
    outcomes = explore(["unmake"], ["ENOSPC", "EIO"], 1, say=lines.append)
    assert len(outcomes) == 2, lines
    assert all(outcome.fired and outcome.refused for outcome in outcomes), lines
    assert not [line for line in lines if "FAIL" in line], lines


def test_the_checker_catches_a_planted_segment_gap() -> None:
    lines: list[str] = []
    outcomes = explore(
        ["create", "zero-fill"], ["ENOSPC"], 12, plant=("segment-gap",), say=lines.append
    )  # every call: where a hole meets a replay depends on the checkpoint rhythm
    failed = [outcome for outcome in outcomes if outcome.problems]
    assert failed, "\n".join(lines)
    assert all("JournalDamagedError" in " ".join(outcome.problems) for outcome in failed), (
        "\n".join(lines)
    )


def test_the_calls_failed_are_spread_over_the_count() -> None:
    assert (
        spread(0, 3) == []
        and spread(2, 3) == [1, 2]
        and spread(9, 3) == [1, 5, 9]
        and spread(9, 1) == [5]
    )


def test_a_fault_that_lasts_two_calls_loses_nothing_either() -> None:
    """A frame's flush failing and then the flush that unmakes it: the commit fails, its frame is
    written over by the next one, and nothing acknowledged is lost."""

    lines: list[str] = []
    outcomes = explore(["flush", "frame", "create"], ["EIO"], 1, burst=2, say=lines.append)
    assert outcomes and all(outcome.fired and not outcome.problems for outcome in outcomes), (
        "\n".join(lines)
    )
