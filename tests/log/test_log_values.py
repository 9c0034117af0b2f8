"""The write log's values against real LMDB files: lossless round trips of every contract write kind
through reopen (also the deepest and the strangest values), and strict JSON rejections that write
nothing.
"""

from __future__ import annotations

import contextlib
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable_lmdb.audit.jsonlines import to_json
from pi_durable_lmdb.audit.migrate import parse_batch
from pi_durable_lmdb.log import codec, decode_batch, encode_batch, write_to_builtins
from pi_durable_lmdb.log.records import decode_record_builtins, encode_record

from ..support.log_helpers import commit, nest_dicts, nest_lists, open_log, same

# ── strategies ──────────────────────────────────────────────────────────────

SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
CHAR = st.one_of(st.characters(), SURROGATE)
TEXT = st.one_of(
    st.lists(CHAR, max_size=10).map("".join),
    st.sampled_from(
        [
            "",
            "\ud800",
            "\udfff",
            "\udc00\ud800",
            "\ud83d\ude00",
            "a\ud83d\ude00b",
            "😀",
            "\x00",
            "é€",
        ]
    ),
)
INTEGER = st.one_of(
    st.integers(-(2**70), 2**70),
    st.integers(),
    st.sampled_from(
        [0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**1000, -(2**1000) - 7]
    ),
)
FLOAT = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(
        [-0.0, 0.0, 1e308, -1.7976931348623157e308, 5e-324, -5e-324, 2.2250738585072014e-308, 0.1]
    ),
)
SCALAR = st.one_of(st.none(), st.booleans(), INTEGER, FLOAT, TEXT)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=20,
)
OBJECT = st.dictionaries(TEXT, JSON, max_size=4)
ID = st.integers(0, 2**63 - 1)
VERSION = st.integers(0, 2**40)
BASE = st.builds(
    lambda version, value: {"kind": "base", "version": version, "value": value}, VERSION, JSON
)
DELTA = st.builds(
    lambda version, ops: {"kind": "delta", "version": version, "ops": ops},
    VERSION,
    st.lists(JSON, max_size=3),
)
WRITE = st.one_of(
    st.builds(
        lambda kind, value: {"type": kind, "value": value},
        st.sampled_from(["conversation", "entry", "task", "submission"]),
        JSON,
    ),
    st.builds(
        lambda record, content: {"type": "document.create", "record": record, "content": content},
        OBJECT,
        BASE,
    ),
    st.builds(
        lambda record, id, at: {
            "type": "document.copy",
            "record": record,
            "source": {"id": id, "at": at},
        },
        OBJECT,
        ID,
        st.one_of(VERSION, st.just("current")),
    ),
    st.builds(
        lambda id, content: {"type": "document.change", "id": id, "content": content},
        ID,
        st.one_of(BASE, DELTA),
    ),
    st.builds(lambda id: {"type": "document.retire", "id": id}, ID),
)

ALL_KINDS = [
    {"type": "conversation", "value": {"id": 1, "title": "t\ud800", "n": 2**80}},
    {
        "type": "entry",
        "value": {"role": "user", "text": "\ud83d\ude00", "\udc00key": [-(2**65), -0.0]},
    },
    {"type": "task", "value": {"state": "running", "retries": 0, "x": None, "ok": True}},
    {"type": "submission", "value": [1, 2.5, "three", {"four": 4}]},
    {
        "type": "document.create",
        "record": {"id": 7, "name": "doc"},
        "content": {"kind": "base", "version": 1, "value": {"text": "hello", "big": 2**64}},
    },
    {"type": "document.copy", "record": {"id": 8}, "source": {"id": 7, "at": 1}},
    {"type": "document.copy", "record": {"id": 9}, "source": {"id": 7, "at": "current"}},
    {
        "type": "document.change",
        "id": 7,
        "content": {"kind": "base", "version": 2, "value": "\udfff"},
    },
    {
        "type": "document.change",
        "id": 7,
        "content": {
            "kind": "delta",
            "version": 3,
            "ops": [{"op": "insert", "at": 0, "text": "\ud800x"}],
        },
    },
    {"type": "document.retire", "id": 9},
]


# ── 1. round trips ──────────────────────────────────────────────────────────


@pytest.mark.parametrize("durability", ["power", "process"])
def test_every_write_kind_round_trips_through_reopen(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "store"
    env, log = open_log(path, durability=durability)
    seq = commit(env, log, ALL_KINDS)
    one_each = [commit(env, log, [write]) for write in ALL_KINDS]
    env.close()

    env, log = open_log(path, readonly=True)
    try:
        got = log.get(seq)
        assert got is not None and got.seq == seq
        same([write_to_builtins(w) for w in got.writes], ALL_KINDS)
        assert {write_to_builtins(w)["type"] for w in got.writes} == {
            "conversation",
            "entry",
            "task",
            "submission",
            "document.create",
            "document.copy",
            "document.change",
            "document.retire",
        }
        commits = list(log.read(one_each[0], one_each[-1]))
        assert [c.seq for c in commits] == one_each
        for c, write in zip(commits, ALL_KINDS):
            same([write_to_builtins(w) for w in c.writes], [write])
    finally:
        env.close()


@pytest.mark.slow
@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(writes=st.lists(WRITE, min_size=1, max_size=5))
def test_round_trip_property(
    tmp_path_factory: pytest.TempPathFactory, writes: list[dict[str, Any]]
) -> None:
    path = tmp_path_factory.getbasetemp() / "property-store"
    encoded = encode_batch(writes)
    same([write_to_builtins(w) for w in encoded.writes], writes)
    same([write_to_builtins(w) for w in decode_batch(encoded.payload)], writes)

    env, log = open_log(path, durability="process")
    before = log.head()
    seq = commit(env, log, writes)
    assert seq == before + 1
    env.close()

    env, log = open_log(path, readonly=True)
    try:
        got = log.get(seq)
        assert got is not None
        same([write_to_builtins(w) for w in got.writes], writes)
        (ranged,) = list(log.read(seq, seq))
        same([write_to_builtins(w) for w in ranged.writes], writes)
    finally:
        env.close()


def test_surrogates_stay_code_points(tmp_path: Path) -> None:
    values = {
        "lone_high": "\ud800",
        "lone_low": "\udfff",
        "pair_as_two": "\ud83d\ude00",
        "reversed_pair": "\ude00\ud83d",
        "real_emoji": "😀",
        "mixed": "a\ud83d\ude00b😀c\ud800",
        "\ud800key": "surrogate in a key",
        "\ud83d\ude00": "pair in a key",
    }
    env, log = open_log(tmp_path / "store")
    seq = commit(env, log, [{"type": "entry", "value": values}])
    env.close()
    env, log = open_log(tmp_path / "store", readonly=True)
    got = log.get(seq)
    env.close()
    assert got is not None
    value = write_to_builtins(got.writes[0])["value"]
    same(value, values)
    assert len(value["pair_as_two"]) == 2
    assert value["pair_as_two"] == "\ud83d\ude00" and value["pair_as_two"] != "😀"
    assert len(value["real_emoji"]) == 1
    assert "\ud83d\ude00" in value and "😀" not in value


def test_numbers_round_trip(tmp_path: Path) -> None:
    numbers = [
        0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**40, -(10**40), 2**4000,
        -0.0, 0.0, 1e308, -1e308, 1.7976931348623157e308, 5e-324, -5e-324, 2.2250738585072014e-308, 0.1,
        True, False, None,
    ]  # fmt: skip
    env, log = open_log(tmp_path / "store")
    seq = commit(
        env, log, [{"type": "task", "value": numbers}, {"type": "task", "value": {"n": numbers}}]
    )
    env.close()
    env, log = open_log(tmp_path / "store", readonly=True)
    got = log.get(seq)
    env.close()
    assert got is not None
    back = [write_to_builtins(w)["value"] for w in got.writes]
    same(back, [numbers, {"n": numbers}])
    assert math.copysign(1.0, back[0][11]) == -1.0  # -0.0 keeps its sign


def test_deep_nesting_round_trips(tmp_path: Path) -> None:
    depth = 200
    plain = nest_lists(depth, {"leaf": 1})
    tricky = {"\ud800": 2**70}
    for level in range(depth):
        tricky = (
            {"k\udc00": tricky, "n": -(2**65) - level, "s": "\ud83d\ude00"}
            if level % 2
            else [tricky, "\ud800"]
        )
    env, log = open_log(tmp_path / "store")
    seq = commit(
        env,
        log,
        [
            {"type": "entry", "value": plain},
            {"type": "entry", "value": nest_dicts(depth, "\ud800")},
            {
                "type": "document.change",
                "id": 1,
                "content": {"kind": "delta", "version": 1, "ops": [tricky]},
            },
        ],
    )
    env.close()
    env, log = open_log(tmp_path / "store", readonly=True)
    got = log.get(seq)
    env.close()
    assert got is not None
    back = [write_to_builtins(w) for w in got.writes]
    same(back[0]["value"], plain)
    same(back[1]["value"], nest_dicts(depth, "\ud800"))
    same(back[2]["content"]["ops"], [tricky])


# The deepest accepted value: the batch list and the write dict are two levels, so a value may
# nest 998 containers (MAX_DEPTH = 1000); one more is refused. Deep values with surrogates or big
# integers take the codec's slow path, which recurses in Python.
DEEPEST = 998
DEEP_VALUES = {
    "lists-surrogate": lambda depth: nest_lists(depth, "\ud800"),
    "lists-bigint": lambda depth: nest_lists(depth, 2**70),
    "dicts-surrogate-keys": lambda depth: nest_dicts(depth, -(2**80), key="\udc00"),
    "dicts-plain": lambda depth: nest_dicts(depth, 1.5),
}


@pytest.mark.parametrize("shape", list(DEEP_VALUES))
@pytest.mark.parametrize("depth", [700, DEEPEST])
def test_every_accepted_depth_encodes_commits_and_reads(
    tmp_path: Path, shape: str, depth: int
) -> None:
    value = DEEP_VALUES[shape](depth)
    encoded = encode_batch([{"type": "entry", "value": value}])
    same(encoded.writes[0].value, value)
    same(decode_batch(encoded.payload)[0].value, value)
    env, log = open_log(tmp_path / "store", durability="process")
    try:
        seq = env.write(lambda txn: log.append(txn, encoded.payload))
        got = log.get(seq)
        assert got is not None
        same(got.writes[0].value, value)
        (ranged,) = list(log.read(seq, seq))
        same(ranged.writes[0].value, value)
    finally:
        env.close()
    with pytest.raises(TypeError, match="strict JSON"):
        encode_batch([{"type": "entry", "value": DEEP_VALUES[shape](DEEPEST + 1)}])


async def test_follow_serves_the_deepest_values(tmp_path: Path) -> None:
    env, log = open_log(tmp_path / "store", durability="process")
    try:
        values = [DEEP_VALUES[shape](DEEPEST) for shape in DEEP_VALUES]
        for value in values:
            commit(env, log, [{"type": "entry", "value": value}])
        got = []
        async with contextlib.aclosing(log.follow(1)) as commits:
            async for c in commits:
                got.append(c.writes[0].value)
                if len(got) == len(values):
                    break
        for back, value in zip(got, values):
            same(back, value)
    finally:
        env.close()


@pytest.mark.parametrize("shape", list(DEEP_VALUES))
def test_write_to_builtins_handles_every_accepted_depth(shape: str) -> None:
    value = DEEP_VALUES[shape](DEEPEST)
    (write,) = encode_batch([{"type": "entry", "value": value}]).writes
    same(write_to_builtins(write), {"type": "entry", "value": value})


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "bogus", "value": 1},
        {"type": "entry"},
        {"value": 1},
        {"type": "document.retire", "id": 2**70},
        {"type": "document.retire", "id": "7"},
        {"type": "document.change", "id": 1, "content": {"kind": "patch", "version": 1, "ops": []}},
        {"type": "document.copy", "record": {}, "source": {"id": 1, "at": "latest"}},
    ],
    ids=[
        "unknown-type",
        "missing-field",
        "no-type",
        "id-beyond-64-bits",
        "id-str",
        "bad-kind",
        "bad-at",
    ],
)
def test_non_contract_writes_are_refused_before_the_log(
    tmp_path: Path, bad: dict[str, Any]
) -> None:
    env, log = open_log(tmp_path / "store")
    try:
        commit(env, log, [{"type": "entry", "value": 0}])
        with pytest.raises(ValueError, match="Invalid storage write"):
            env.write(
                lambda txn: log.append(
                    txn, encode_batch([{"type": "task", "value": 1}, bad]).payload
                )
            )
        with pytest.raises(ValueError, match="Invalid storage write"):
            decode_batch(codec.encode([bad]))
        assert log.head() == 1 and log.count() == 1
    finally:
        env.close()


# ── 2. strict JSON rejections ───────────────────────────────────────────────


def _cyclic_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


def _cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"a": [1, 2]}
    value["a"].append({"back": value})
    return value


class _Thing:
    pass


NOT_JSON = {
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "nested-nan": {"a": [1, {"b": float("nan")}]},
    "int-key": {1: "a"},
    "none-key": {None: "a"},
    "tuple-key": {("a",): 1},
    "bytes-key": {b"k": 1},
    "cycle-list": _cyclic_list(),
    "cycle-dict": _cyclic_dict(),
    "tuple": (1, 2),
    "nested-tuple": {"a": [(1,)]},
    "set": {1, 2},
    "frozenset": frozenset(),
    "bytes": b"raw",
    "bytearray": bytearray(b"raw"),
    "object": _Thing(),
    "decimal": Decimal("1.5"),
    "complex": 1j,
    "deep-5000-lists": nest_lists(5000, 1),
    "deep-5000-dicts": nest_dicts(5000, 1),
}


@pytest.mark.parametrize("name", list(NOT_JSON))
def test_strict_json_rejected_and_nothing_written(tmp_path: Path, name: str) -> None:
    bad = NOT_JSON[name]
    env, log = open_log(tmp_path / "store")
    try:
        commit(env, log, [{"type": "entry", "value": "before"}])
        head = log.head()
        for writes in (
            [{"type": "entry", "value": bad}],
            [
                {"type": "task", "value": 1},
                {
                    "type": "document.create",
                    "record": {"r": bad},
                    "content": {"kind": "base", "version": 1, "value": 1},
                },
            ],
        ):
            with pytest.raises(TypeError, match="strict JSON") as caught:
                env.write(lambda txn: log.append(txn, encode_batch(writes).payload))
            if name.startswith("cycle"):
                assert "cycles" in str(caught.value)
            if name.startswith("deep"):
                assert "deeper than" in str(caught.value)
            assert log.head() == head
            assert log.count() == 1
        assert commit(env, log, [{"type": "entry", "value": "after"}]) == head + 1
    finally:
        env.close()
    env, log = open_log(tmp_path / "store", readonly=True)
    assert [c.seq for c in log.read(1)] == [1, 2]
    env.close()


@pytest.mark.parametrize("shape", list(DEEP_VALUES))
def test_an_export_line_carries_every_accepted_depth(shape: str) -> None:
    """The line nests three levels more than the value (the line's object, its writes, the write):
    msgspec's JSON encoder ran out of the default stack on 3.11 and ``export`` failed."""

    value = DEEP_VALUES[shape](DEEPEST)
    payload = encode_batch([{"type": "entry", "value": value}]).payload
    line = to_json(decode_record_builtins(5, encode_record(payload, 1)))
    seq, committed_at, writes = parse_batch(1, line)
    assert (seq, committed_at) == (5, 1)
    same(writes, [{"type": "entry", "value": value}])
