"""Values a caller hands the store, of every kind, each an adversarial review's finding and the
family it stands for:

* record headers: every value a caller can put in one is checked before anything is written, so
  every record the program wrote reads back;
* scan limits: any limit, of any type, gives ``MemoryStorage``'s page (or its error).

``docs/reliability.md`` lists each finding with its test.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.audit import verify
from pi_durable_lmdb.log.records import decode_record, encode_record
from pi_durable_lmdb.storage import LmdbStorage

from ..support.pair import Pair
from ..support.workload import Workload

ENTRY = [{"type": "conversation", "value": {"id": 1}}]

# ── 1. record headers ───────────────────────────────────────────────────────

BAD_COMMITTED_AT = [
    True,
    False,
    1.5,
    1.0,
    "1700000000000",
    b"1",
    None.__class__,
    [1],
    {"t": 1},
    2**63,
    2**64,
    -(2**63) - 1,
    10**5000,
]


@pytest.mark.parametrize(
    "value",
    BAD_COMMITTED_AT,
    ids=lambda value: (
        f"{type(value).__name__}-{str(value)[:20] if not isinstance(value, int) or value.bit_length() < 100 else 'huge'}"
    ),
)
async def test_a_commit_time_the_header_cannot_hold_is_refused_before_writing(
    tmp_path: Path, value: Any
) -> None:
    storage = await LmdbStorage.open(tmp_path / "s", durability="process")
    try:
        await storage.commit(ENTRY, CTX)
        with pytest.raises((TypeError, ValueError), match="committed_at"):
            await storage.commit(
                [{"type": "conversation", "value": {"id": 2}}], CTX, committed_at=value
            )
        assert storage.log.head() == 1
        assert await storage.conversation(2, CTX) is None
        seq = await storage.commit([{"type": "conversation", "value": {"id": 3}}], CTX)
        assert seq == 2
    finally:
        await storage.close()
    assert verify(str(tmp_path / "s")) is None


@pytest.mark.parametrize(
    "value",
    BAD_COMMITTED_AT,
    ids=lambda value: (
        f"{type(value).__name__}-{str(value)[:20] if not isinstance(value, int) or value.bit_length() < 100 else 'huge'}"
    ),
)
def test_the_log_layer_refuses_such_a_header_too(value: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="committed_at"):
        encode_record(b"\x90", value)


@pytest.mark.parametrize("value", [0, 1, -(2**63), 2**63 - 1, 1_760_000_000_000])
async def test_every_commit_time_accepted_reads_back(tmp_path: Path, value: int) -> None:
    storage = await LmdbStorage.open(tmp_path / "s", durability="process")
    try:
        seq = await storage.commit(ENTRY, CTX, committed_at=value)
        commit = storage.log.get(seq)
        assert commit is not None and commit.committed_at == value
        assert [c.committed_at for c in storage.log.read(1)] == [value]
    finally:
        await storage.close()
    assert verify(str(tmp_path / "s")) is None
    assert decode_record(1, encode_record(b"\x90", value)).committed_at == value


@pytest.mark.parametrize("payload", ["\x90", 144, None, [1]], ids=repr)
def test_a_record_payload_must_be_bytes(payload: Any) -> None:
    with pytest.raises(TypeError, match="payload"):
        encode_record(payload, 1)


# ── 2. scan limits against MemoryStorage ────────────────────────────────────


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    made = Pair(tmp_path_factory.mktemp("hardening") / "store", 12, 60)
    yield made
    made.close()


LIMITS = st.one_of(
    st.integers(-10, 12),
    st.sampled_from([sys.maxsize, sys.maxsize + 1, 2**64, 2**100, -(2**64), -sys.maxsize - 1]),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2.0, -1.0, 0.5, float("inf"), float("-inf")]),
    st.text(max_size=2),
    st.sampled_from([[], [1], {}, (1,), b"2", object]),
)


def _scans(work: Workload) -> list[tuple[str, dict[str, Any]]]:
    conversations = work.conversations or [1]
    return [
        ("scan_conversations", {}),
        ("scan_conversations", {"order": "descending"}),
        ("scan_conversations", {"ownerConversationId": conversations[0]}),
        ("scan_conversations", {"ownerTaskId": (work.tasks or [7])[0]}),
        ("scan_tasks", {}),
        ("scan_tasks", {"order": "descending", "background": True}),
        ("scan_tasks", {"status": "pending"}),
        ("scan_tasks", {"kind": "no such kind"}),
        ("scan_submissions", {}),
        ("scan_submissions", {"status": "queued", "order": "descending"}),
        ("scan_submissions", {"conversationId": 10**6}),
        ("scan_entries", {"conversationId": conversations[0]}),
        ("scan_entries", {"conversationId": conversations[-1], "order": "ascending"}),
        ("scan_entries", {"conversationId": conversations[0], "minEntryId": 10**9}),
        ("scan_documents", {"scope": {"kind": "session"}, "at": "current"}),
        (
            "scan_documents",
            {
                "scope": {"kind": "conversation", "conversationId": conversations[0]},
                "at": "current",
            },
        ),
        ("scan_documents", {"scope": {"kind": "session"}, "at": 5, "kind": "no such kind"}),
    ]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limit=LIMITS, which=st.integers(0, 16), cursor=st.sampled_from([None, {"after": 3}]))
def test_every_scan_with_any_limit_matches_memory_storage(
    pair: Pair, limit: Any, which: int, cursor: Any
) -> None:
    method, query = _scans(pair.work)[which]
    if cursor is not None and method != "scan_documents":
        cursor = {
            **cursor,
            "order": query.get("order", "descending" if method == "scan_entries" else "ascending"),
        }
    expected, got = pair.both(method, query, limit, cursor, CTX)
    assert got == expected, (method, query, limit)


@pytest.mark.parametrize("limit", [-1, -5, 0, sys.maxsize, 2**64], ids=repr)
@pytest.mark.parametrize(
    "method",
    ["scan_tasks", "scan_conversations", "scan_submissions", "scan_documents", "scan_entries"],
)
def test_named_scan_limits_match_memory_storage(pair: Pair, method: str, limit: int) -> None:
    query = next(query for name, query in _scans(pair.work) if name == method)
    expected, got = pair.both(method, query, limit, None, CTX)
    assert got == expected
    if limit > 2**32:
        assert got[0] == "ok" and got[1]["items"] and "next" not in got[1]
