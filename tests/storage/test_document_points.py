"""Every read taking a document point (``document``, ``find_document``, ``scan_documents``, on
the store and on a view ``as_of`` an earlier commit) answers a point of any type as pi-durable's
``MemoryStorage`` does: the same record, value and version, or the same error.

The reference compares a point with sequence numbers by Python's ``<=``, so ``3.0`` and ``True``
are points like ``3`` and ``1``, NaN is no point at all, and a point past the key space or below
it reads as the newest or the oldest; a point that cannot be compared raises its ``TypeError``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from ..support.compare import outcome
from ..support.pair import Pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    made = Pair(tmp_path_factory.mktemp("points") / "store", 31, 80)
    yield made
    made.close()


POINTS = st.one_of(
    st.integers(-3, 90),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, 90).map(float),
    st.integers(-3, 90).map(lambda n: n + 0.5),
    st.sampled_from(
        [True, False, math.nan, math.inf, -math.inf, 2**64, 2**64 - 1, 2**100, -(2**64)]
    ),
    st.sampled_from(["current", "Current", "", None, [1], {}, b"3"]),
)


def _reads(pair: Pair, at: Any) -> list[tuple[str, tuple[Any, ...]]]:
    reads: list[tuple[str, tuple[Any, ...]]] = []
    for record in pair.work.documents:
        reads.append(("document", (record["id"], at, CTX)))
        address = {"kind": record["kind"], "scope": record["scope"]}
        if "key" in record:
            address["key"] = record["key"]
        reads.append(("find_document", (address, at, CTX)))
        reads.append(("scan_documents", ({"scope": record["scope"], "at": at}, 50, None, CTX)))
    reads.append(("document", (10**6, at, CTX)))
    return reads


def test_the_workload_holds_documents_with_history(pair: Pair) -> None:
    assert len(pair.work.documents) >= 5
    scopes = {record["scope"]["kind"] for record in pair.work.documents}
    assert "conversation" in scopes


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(at=POINTS)
def test_every_document_read_answers_a_point_of_any_type_as_the_reference(
    pair: Pair, at: Any
) -> None:
    for method, args in _reads(pair, at):
        expected, got = pair.both(method, *args)
        assert got == expected, f"{method}{args[:2]!r}"


def _as_sequence(at: Any) -> Any:
    """The whole-number point the reference reads ``at`` as (itself when there is none)."""

    if isinstance(at, bool) or (isinstance(at, float) and math.isfinite(at)):
        return math.floor(at)
    if isinstance(at, float) and not math.isnan(at):
        return 2**64 if at > 0 else -1
    return at


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(at=POINTS, seq=st.integers(1, 80))
def test_a_view_as_of_an_earlier_commit_reads_a_point_as_its_whole_number(
    pair: Pair, at: Any, seq: int
) -> None:
    """On a view, ``3.5`` reads as ``3`` and infinity as the view's end; NaN finds no
    incarnation alive, and a point that is not a number is refused as the reference refuses it."""

    run = pair.loop.run_until_complete
    view = run(pair.storage.as_of(seq))
    for record in pair.work.documents:
        got = run(outcome(view.document(record["id"], at, CTX)))
        if isinstance(at, float) and math.isnan(at):
            assert got in (("ok", None), ("error", "StorageRequestError", got[-1])), got
            continue
        if isinstance(at, (int, float)):
            whole = run(outcome(view.document(record["id"], _as_sequence(at), CTX)))
            assert got == whole, (record["id"], at, seq)
        elif got[0] == "error":  # a point that is no number: the reference's refusal
            reference = run(outcome(pair.reference.document(record["id"], at, CTX)))
            assert got[:2] == reference[:2], (record["id"], at, seq)
