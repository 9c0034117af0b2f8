"""The write log against real LMDB files, real subprocesses and real signals (no mocks).

Covers: lossless round trips of every contract write kind, strict JSON rejections, sequences and
ranges across reopen, following another process's writer, SIGKILL at random moments in both
durability modes, the single-writer lock, map growth seen by a reader in another process,
corrupted records, file modes and use after fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import math
import os
import random
import select
import signal
import stat
import subprocess
import sys
import time
import weakref
from decimal import Decimal
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pi_durable_lmdb.log import (
    CorruptRecordError,
    Environment,
    ForkedEnvironmentError,
    WriteLog,
    WriterLockedError,
    decode_batch,
    encode_batch,
    seq_key,
    write_to_builtins,
)
from pi_durable_lmdb.log import codec
from pi_durable_lmdb.log.records import encode_record

ROOT = Path(__file__).resolve().parent.parent
CHILD = str(Path(__file__).resolve().parent / "log_writer_child.py")
CHILD_ENV = dict(os.environ)


def _load_child_module() -> Any:
    spec = importlib.util.spec_from_file_location("log_writer_child", CHILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_child_module()


# ── helpers ─────────────────────────────────────────────────────────────────


def same(a: Any, b: Any, where: str = "$") -> None:
    """Assert ``a`` and ``b`` are the same JSON value: types, float signs, code points, key order.

    Iterative, so it compares values of any depth.
    """

    stack = [(a, b, where)]
    while stack:
        a, b, at = stack.pop()
        assert type(a) is type(b), f"{at}: {type(a).__name__} != {type(b).__name__} ({a!r:.80} vs {b!r:.80})"
        if isinstance(a, float):
            assert a == b and math.copysign(1.0, a) == math.copysign(1.0, b), f"{at}: {a!r} != {b!r}"
        elif isinstance(a, str):
            assert len(a) == len(b) and a == b, f"{at}: {a!r} != {b!r}"
        elif isinstance(a, dict):
            assert list(a) == list(b), f"{at}: keys {list(a)!r} != {list(b)!r}"
            stack.extend((a[key], b[key], f"{at}.{key!r}") for key in a)
        elif isinstance(a, list):
            assert len(a) == len(b), f"{at}: length {len(a)} != {len(b)}"
            stack.extend((x, y, f"{at}[{index}]") for index, (x, y) in enumerate(zip(a, b)))
        else:
            assert a == b, f"{at}: {a!r} != {b!r}"


def open_log(path: Path, **options: Any) -> tuple[Environment, WriteLog]:
    env = Environment(path, **options)
    return env, WriteLog(env)


def commit(env: Environment, log: WriteLog, writes: list[dict[str, Any]]) -> int:
    payload = encode_batch(writes).payload
    seq = env.write(lambda txn: log.append(txn, payload))
    log.committed()
    return seq


def run_child(*args: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
        cwd=str(ROOT),
        **popen,
    )


_pending: weakref.WeakKeyDictionary[subprocess.Popen[str], bytearray] = weakref.WeakKeyDictionary()
"""Per child: bytes read from its stdout and not yet returned."""


def read_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """One line of a child's stdout, failing (not hanging) if it does not come.

    Reads the pipe with ``os.read`` (no Python-level buffer), so ``drain`` or ``communicate``
    afterwards sees exactly what this has not returned.
    """

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = _pending.setdefault(proc, bytearray())
    deadline = time.monotonic() + timeout
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            proc.kill()
            proc.wait(5)
            pytest.fail(f"child sent no line in {timeout}s; stderr: {proc.stderr.read() if proc.stderr else ''}")
        chunk = os.read(fd, 65536)
        if not chunk:
            proc.wait(5)
            pytest.fail(f"child exited ({proc.returncode}): {proc.stderr.read() if proc.stderr else ''}")
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    return line.decode()


def drain(proc: subprocess.Popen[str], timeout: float = 10.0) -> str:
    """Everything a dead (or finishing) child wrote that ``read_line`` has not returned."""

    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buffer = _pending.pop(proc, bytearray())
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            pytest.fail("child's stdout did not reach EOF")
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buffer += chunk
    proc.wait(timeout)
    return buffer.decode()


def finish(proc: subprocess.Popen[str], timeout: float = 30.0) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"child did not finish in {timeout}s: {err}")
    return out, err


def nest_lists(depth: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def nest_dicts(depth: int, leaf: Any, key: str = "k") -> Any:
    value = leaf
    for _ in range(depth):
        value = {key: value}
    return value


# ── strategies ──────────────────────────────────────────────────────────────

SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)
CHAR = st.one_of(st.characters(), SURROGATE)
TEXT = st.one_of(
    st.lists(CHAR, max_size=10).map("".join),
    st.sampled_from(["", "\ud800", "\udfff", "\udc00\ud800", "\ud83d\ude00", "a\ud83d\ude00b", "😀", "\x00", "é€"]),
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
BASE = st.builds(lambda version, value: {"kind": "base", "version": version, "value": value}, VERSION, JSON)
DELTA = st.builds(
    lambda version, ops: {"kind": "delta", "version": version, "ops": ops}, VERSION, st.lists(JSON, max_size=3)
)
WRITE = st.one_of(
    st.builds(
        lambda kind, value: {"type": kind, "value": value},
        st.sampled_from(["conversation", "entry", "task", "submission"]),
        JSON,
    ),
    st.builds(lambda record, content: {"type": "document.create", "record": record, "content": content}, OBJECT, BASE),
    st.builds(
        lambda record, id, at: {"type": "document.copy", "record": record, "source": {"id": id, "at": at}},
        OBJECT,
        ID,
        st.one_of(VERSION, st.just("current")),
    ),
    st.builds(lambda id, content: {"type": "document.change", "id": id, "content": content}, ID, st.one_of(BASE, DELTA)),
    st.builds(lambda id: {"type": "document.retire", "id": id}, ID),
)

ALL_KINDS = [
    {"type": "conversation", "value": {"id": 1, "title": "t\ud800", "n": 2**80}},
    {"type": "entry", "value": {"role": "user", "text": "\ud83d\ude00", "\udc00key": [-(2**65), -0.0]}},
    {"type": "task", "value": {"state": "running", "retries": 0, "x": None, "ok": True}},
    {"type": "submission", "value": [1, 2.5, "three", {"four": 4}]},
    {
        "type": "document.create",
        "record": {"id": 7, "name": "doc"},
        "content": {"kind": "base", "version": 1, "value": {"text": "hello", "big": 2**64}},
    },
    {"type": "document.copy", "record": {"id": 8}, "source": {"id": 7, "at": 1}},
    {"type": "document.copy", "record": {"id": 9}, "source": {"id": 7, "at": "current"}},
    {"type": "document.change", "id": 7, "content": {"kind": "base", "version": 2, "value": "\udfff"}},
    {
        "type": "document.change",
        "id": 7,
        "content": {"kind": "delta", "version": 3, "ops": [{"op": "insert", "at": 0, "text": "\ud800x"}]},
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
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=st.lists(WRITE, min_size=1, max_size=5))
def test_round_trip_property(tmp_path_factory: pytest.TempPathFactory, writes: list[dict[str, Any]]) -> None:
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
    seq = commit(env, log, [{"type": "task", "value": numbers}, {"type": "task", "value": {"n": numbers}}])
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
        tricky = {"k\udc00": tricky, "n": -(2**65) - level, "s": "\ud83d\ude00"} if level % 2 else [tricky, "\ud800"]
    env, log = open_log(tmp_path / "store")
    seq = commit(
        env,
        log,
        [
            {"type": "entry", "value": plain},
            {"type": "entry", "value": nest_dicts(depth, "\ud800")},
            {"type": "document.change", "id": 1, "content": {"kind": "delta", "version": 1, "ops": [tricky]}},
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
def test_every_accepted_depth_encodes_commits_and_reads(tmp_path: Path, shape: str, depth: int) -> None:
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
    ids=["unknown-type", "missing-field", "no-type", "id-beyond-64-bits", "id-str", "bad-kind", "bad-at"],
)
def test_non_contract_writes_are_refused_before_the_log(tmp_path: Path, bad: dict[str, Any]) -> None:
    env, log = open_log(tmp_path / "store")
    try:
        commit(env, log, [{"type": "entry", "value": 0}])
        with pytest.raises(ValueError, match="Invalid storage write"):
            env.write(lambda txn: log.append(txn, encode_batch([{"type": "task", "value": 1}, bad]).payload))
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
                {"type": "document.create", "record": {"r": bad}, "content": {"kind": "base", "version": 1, "value": 1}},
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


# ── 3. sequences, ranges, committed_at ──────────────────────────────────────


def test_sequences_ranges_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    assert log.head() == 0 and log.first() == 0 and log.count() == 0
    assert log.get(1) is None and list(log.read(1)) == []
    t0 = time.time() * 1000
    seqs = [commit(env, log, [{"type": "entry", "value": i}]) for i in range(5)]
    t1 = time.time() * 1000
    assert seqs == [1, 2, 3, 4, 5]
    env.close()

    seen = set(seqs)
    for round_ in range(3):  # reopen repeatedly: sequences continue, never reused
        env, log = open_log(path, durability="process" if round_ % 2 else "power")
        head = log.head()
        assert head == max(seen)
        new = [commit(env, log, [{"type": "task", "value": [round_, i]}]) for i in range(3)]
        assert new == [head + 1, head + 2, head + 3]
        assert not seen & set(new)
        seen |= set(new)
        env.close()

    env, log = open_log(path)
    try:
        head = log.head()
        assert head == 14 and log.count() == 14 and log.first() == 1
        # Two appends in one transaction take consecutive sequences.
        empty = encode_batch([]).payload
        pair = env.write(lambda txn: (log.append(txn, empty), log.append(txn, empty)))
        assert pair == (15, 16)
        # An aborted transaction commits nothing; the next commit takes the next free sequence.
        def append_then_fail(txn: lmdb.Transaction) -> None:
            assert log.append(txn, empty) == 17
            raise RuntimeError("abort")

        with pytest.raises(RuntimeError, match="abort"):
            env.write(append_then_fail)
        assert log.head() == 16
        assert commit(env, log, [{"type": "entry", "value": "x"}]) == 17

        assert [c.seq for c in log.read(1)] == list(range(1, 18))
        assert [c.seq for c in log.read()] == list(range(1, 18))
        assert [c.seq for c in log.read(0)] == list(range(1, 18))
        assert [c.seq for c in log.read(3, 6)] == [3, 4, 5, 6]
        assert [c.seq for c in log.read(6, 6)] == [6]
        assert [c.seq for c in log.read(7, 3)] == []
        assert [c.seq for c in log.read(15)] == [15, 16, 17]
        assert [c.seq for c in log.read(16, 1000)] == [16, 17]
        assert list(log.read(18)) == []
        assert log.get(0) is None and log.get(18) is None
        assert log.get(4) is not None and log.get(4).writes[0].value == 3  # type: ignore[union-attr]

        first_five = list(log.read(1, 5))
        for c in first_five:
            assert t0 - 1000 <= c.committed_at <= t1 + 1000, c.committed_at
        stamps = [c.committed_at for c in log.read(1)]
        assert all(1_500_000_000_000 < s < 4_000_000_000_000 for s in stamps)  # unix ms, not s or ns
    finally:
        env.close()


def test_read_spans_many_chunks(tmp_path: Path) -> None:
    env, log = open_log(tmp_path / "store", durability="process")
    try:
        payloads = [encode_batch([{"type": "entry", "value": i}]).payload for i in range(700)]
        last = env.write(lambda txn: [log.append(txn, p) for p in payloads][-1])
        assert last == 700
        assert [c.seq for c in log.read(1)] == list(range(1, 701))
        assert [c.writes[0].value for c in log.read(250, 520)] == list(range(249, 520))
        assert [c.seq for c in log.read(256, 257)] == [256, 257]
    finally:
        env.close()


# ── 4. follow ───────────────────────────────────────────────────────────────


async def test_follow_sees_another_process_commits_once_in_order(tmp_path: Path) -> None:
    path = tmp_path / "store"
    Environment(path).close()  # the store exists, its log database does not yet
    count = 150
    env, log = open_log(path, readonly=True)
    assert log.db is None
    proc = run_child(
        "append", str(path), "--count", str(count), "--delay", "0.002", "--durability", "process"
    )
    seen: list[int] = []

    async def consume() -> None:
        async with contextlib.aclosing(log.follow(1)) as commits:
            async for c in commits:
                seen.append(c.seq)
                same([write_to_builtins(w) for w in c.writes], child.batch(c.seq - 1, 64))
                if len(seen) == count:
                    return

    try:
        await asyncio.wait_for(consume(), timeout=30)
    finally:
        out, err = finish(proc)
        env.close()
    assert proc.returncode == 0, err
    assert seen == list(range(1, count + 1))
    acks = [int(line.split()[1]) for line in out.splitlines() if line.startswith("ack")]
    assert acks == seen


async def test_follow_from_the_middle_and_in_process_wakeup(tmp_path: Path) -> None:
    env, log = open_log(tmp_path / "store", durability="process")
    try:
        for i in range(10):
            commit(env, log, [{"type": "entry", "value": i}])
        got: list[int] = []
        arrived = asyncio.Event()

        async def consume() -> None:
            # Long poll intervals: only committed() can deliver new commits in time.
            async for c in log.follow(6, poll_interval=30, max_poll_interval=30):
                got.append(c.seq)
                if c.seq >= 12:
                    arrived.set()
                    return

        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)
        assert got == [6, 7, 8, 9, 10]
        started = time.monotonic()
        commit(env, log, [{"type": "entry", "value": 10}])
        commit(env, log, [{"type": "entry", "value": 11}])
        await asyncio.wait_for(arrived.wait(), timeout=5)
        assert time.monotonic() - started < 2
        await task
        assert got == [6, 7, 8, 9, 10, 11, 12]
    finally:
        env.close()


# ── 5. SIGKILL at a random moment ───────────────────────────────────────────


@pytest.mark.slow
@pytest.mark.parametrize("durability", ["power", "process"])
def test_kill_9_keeps_every_acknowledged_commit(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "store"
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    previous_head = 0
    start = 0
    for round_ in range(5):
        size = rng.choice([64, 500, 5000, 50_000])
        context = f"seed={seed} round={round_} durability={durability} size={size}"
        proc = run_child(
            "loop", str(path), "--durability", durability, "--start", str(start), "--size", str(size)
        )
        acked: dict[int, int] = {}  # seq -> batch counter
        for _ in range(rng.randint(1, 40)):
            seq, n = map(int, read_line(proc).split()[1:])
            acked[seq] = n
        time.sleep(rng.random() * 0.05)  # a random moment: mid-commit, mid-print or idle
        os.kill(proc.pid, signal.SIGKILL)
        out = drain(proc)
        assert proc.returncode == -signal.SIGKILL, context
        for line in out.split("\n")[:-1]:  # the last piece is unterminated or empty: not acknowledged
            seq, n = map(int, line.split()[1:])
            acked[seq] = n
        seqs = list(acked)
        assert seqs == list(range(previous_head + 1, previous_head + 1 + len(seqs))), context

        env, log = open_log(path, durability=durability)
        try:
            head = log.head()
            assert head >= max(seqs), context
            for seq, n in acked.items():
                c = log.get(seq)
                assert c is not None, f"acknowledged seq {seq} lost ({context})"
                same([write_to_builtins(w) for w in c.writes], child.batch(n, size), context)
            # Anything committed but not yet acknowledged is whole too.
            assert [c.seq for c in log.read(1)] == list(range(1, head + 1)), context
            extra = commit(env, log, [{"type": "entry", "value": "after kill"}])
            assert extra == head + 1, context
            previous_head = extra
        finally:
            env.close()
        start = max(acked.values()) + 1000


def _size_of(c: Any) -> int:
    return len(c.writes[0].value["text"])


# ── 6. one writer ───────────────────────────────────────────────────────────


def test_second_writer_refused_in_process_and_across_processes(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    commit(env, log, child.batch(0, 10))
    try:
        # Same process, second handle.
        with pytest.raises(WriterLockedError) as caught:
            Environment(path)
        assert str(path) in str(caught.value) and caught.value.path == str(path)
        assert f"by process {os.getpid()}" in str(caught.value)

        # Another process.
        proc = run_child("try-writer", str(path))
        out, err = finish(proc)
        assert proc.returncode == 0, err
        result = json.loads(out.splitlines()[-1])
        assert result["error"] == "WriterLockedError"
        assert str(path) in result["message"] and result["path"] == str(path)
        assert f"by process {os.getpid()}" in result["message"]

        # Readers are allowed meanwhile, in another process and in this one.
        reader = run_child("reader", str(path), stdin=subprocess.PIPE)
        assert read_line(reader) == "ready 1"
        out, err = reader.communicate(input="read\n", timeout=20)
        assert reader.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["seqs"] == [1]
        ro, ro_log = open_log(path, readonly=True)
        assert ro_log.head() == 1
        ro.close()
        commit(env, log, [{"type": "entry", "value": "still writing"}])
    finally:
        env.close()
    # Released: a new writer may open.
    env, log = open_log(path)
    assert log.head() == 2
    env.close()


def test_writer_in_another_process_blocks_this_one(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    commit(env, log, [{"type": "entry", "value": 1}])
    env.close()

    holder = run_child("hold", str(path), stdin=subprocess.PIPE)
    try:
        ready = read_line(holder)
        assert ready == f"ready {holder.pid}"
        with pytest.raises(WriterLockedError) as caught:
            Environment(path)
        message = str(caught.value)
        assert str(path) in message and f"by process {holder.pid}" in message
        ro, ro_log = open_log(path, readonly=True)  # a reader never takes the lock
        assert ro_log.head() == 1 and ro_log.get(1) is not None
        ro.close()
        # A relative path is reported absolute.
        with pytest.raises(WriterLockedError, match=str(path)):
            cwd = os.getcwd()
            os.chdir(tmp_path)
            try:
                Environment("store")
            finally:
                os.chdir(cwd)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(20)
    assert holder.returncode == 0
    env, log = open_log(path)
    assert commit(env, log, [{"type": "entry", "value": 2}]) == 2
    env.close()


def test_killed_writer_releases_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "store"
    holder = run_child("hold", str(path), stdin=subprocess.PIPE)
    try:
        assert read_line(holder).startswith("ready")
        with pytest.raises(WriterLockedError):
            Environment(path)
    finally:
        holder.kill()
        holder.communicate(timeout=10)
    env, log = open_log(path)
    assert commit(env, log, [{"type": "entry", "value": 1}]) == 1
    env.close()


# ── 7. map growth ───────────────────────────────────────────────────────────


def test_map_growth_with_a_reader_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "store"
    small = 64 * 1024
    env, log = open_log(path, map_size=small, durability="process")
    reader = None
    try:
        for n in range(3):
            commit(env, log, child.batch(n, 100))
        reader = run_child("reader", str(path), "--map-size", str(small), stdin=subprocess.PIPE)
        assert reader.stdin is not None
        assert read_line(reader) == "ready 3"
        reader.stdin.write("read\n")
        reader.stdin.flush()
        before = json.loads(read_line(reader))
        assert before["seqs"] == [1, 2, 3] and not before["resized_seen"]

        # ~6 MB in 120 commits of ~50 kB, plus one 1.5 MB commit far bigger than the initial map.
        for n in range(3, 123):
            commit(env, log, child.batch(n, 50_000))
        commit(env, log, child.batch(123, 1_500_000))
        grown = env.env.info()["map_size"]
        assert grown >= 8 * 1024 * 1024 > small
        assert [c.seq for c in log.read(1)] == list(range(1, 125))
        for c in log.read(1):
            same([write_to_builtins(w) for w in c.writes], child.batch(c.seq - 1, _size_of(c)))

        reader.stdin.write("read\n")
        reader.stdin.flush()
        after = json.loads(read_line(reader))
        assert after["resized_seen"], "the reader's map never needed resizing: the test proves nothing"
        assert after["head"] == 124
        assert after["seqs"] == list(range(1, 125))
        assert after["ns"] == list(range(124))
        assert after["digest"] == child._report(env, log, False)["digest"]
        assert after["map_size"] >= os.path.getsize(path / "data.mdb")

        commit(env, log, child.batch(124, 10))  # the reader keeps following after it adopted the size
        reader.stdin.write("read\n")
        reader.stdin.flush()
        assert json.loads(read_line(reader))["head"] == 125
    finally:
        if reader is not None:
            assert reader.stdin is not None
            reader.stdin.close()
            reader.wait(20)
            assert reader.returncode == 0, reader.stderr.read() if reader.stderr else ""
        env.close()


def test_reader_in_this_process_adopts_a_map_grown_by_another(tmp_path: Path) -> None:
    path = tmp_path / "store"
    small = 64 * 1024
    env, log = open_log(path, map_size=small)
    commit(env, log, child.batch(0, 10))
    env.close()
    env, log = open_log(path, readonly=True, map_size=small)
    try:
        assert log.head() == 1
        proc = run_child(
            "append", str(path), "--count", "60", "--start", "1", "--size", "60000",
            "--durability", "process", "--map-size", str(small),
        )  # fmt: skip
        out, err = finish(proc)
        assert proc.returncode == 0, err
        with pytest.raises(lmdb.MapResizedError):  # the situation really arose
            env.env.begin().abort()
        assert log.head() == 61
        assert [c.seq for c in log.read(1)] == list(range(1, 62))
        c = log.get(61)
        assert c is not None
        same([write_to_builtins(w) for w in c.writes], child.batch(60, 60000))
    finally:
        env.close()


def test_reader_opened_before_the_first_commit_sees_later_commits(tmp_path: Path) -> None:
    path = tmp_path / "store"
    Environment(path).close()  # a store with no log database yet
    env, log = open_log(path, readonly=True)
    try:
        assert log.head() == 0
        proc = run_child("append", str(path), "--count", "3", "--durability", "process")
        out, err = finish(proc)
        assert proc.returncode == 0, err
        assert WriteLog(env).head() == 3  # a fresh WriteLog on the same environment sees them
        assert log.head() == 3
        assert log.get(1) is not None
        assert [c.seq for c in log.read(1)] == [1, 2, 3]
    finally:
        env.close()


# ── 8. corruption ───────────────────────────────────────────────────────────


def _flip_last_byte(raw: bytes) -> bytes:
    return raw[:-1] + bytes([raw[-1] ^ 0x5A])


CORRUPTIONS = {
    "payload-byte": _flip_last_byte,
    "truncated": lambda raw: raw[: len(raw) // 2],
    "empty": lambda raw: b"",
    "garbage": lambda raw: b"\xc1\xff\x00garbage",
    "format": lambda raw: raw[:1] + b"\x09" + raw[2:],
    "valid-crc-invalid-writes": lambda raw: encode_record(msgspec.msgpack.encode([{"type": "bogus"}]), 1),
    "valid-crc-not-msgpack": lambda raw: encode_record(b"\xc1\xc1", 1),
}


@pytest.mark.parametrize("damage", list(CORRUPTIONS.values()), ids=list(CORRUPTIONS))
def test_corrupt_record_raises_naming_its_seq(tmp_path: Path, damage: Any) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    for i in range(4):
        commit(env, log, [{"type": "entry", "value": f"record {i}"}])
    with env.read() as txn:
        raw = txn.get(seq_key(3), db=log.db)
    env.write(lambda txn: txn.put(seq_key(3), damage(raw), db=log.db))
    env.close()

    env, log = open_log(path, readonly=True)
    try:
        with pytest.raises(CorruptRecordError, match=r"\b3\b") as caught:
            log.get(3)
        assert caught.value.seq == 3
        seen: list[int] = []
        with pytest.raises(CorruptRecordError) as caught:
            for c in log.read(1):
                seen.append(c.seq)
        assert caught.value.seq == 3 and seen == [1, 2]
        with pytest.raises(CorruptRecordError):
            list(log.read(3, 3))
        assert [c.seq for c in log.read(4)] == [4]
        assert log.get(2) is not None and log.get(4) is not None
    finally:
        env.close()


async def test_follow_raises_on_a_corrupt_record(tmp_path: Path) -> None:
    env, log = open_log(tmp_path / "store")
    try:
        for i in range(3):
            commit(env, log, [{"type": "entry", "value": i}])
        with env.read() as txn:
            raw = txn.get(seq_key(2), db=log.db)
        env.write(lambda txn: txn.put(seq_key(2), _flip_last_byte(raw), db=log.db))
        seen = []
        with pytest.raises(CorruptRecordError) as caught:
            async with contextlib.aclosing(log.follow(1)) as commits:
                async for c in commits:
                    seen.append(c.seq)
        assert caught.value.seq == 2 and seen == [1]
    finally:
        env.close()


def test_corruption_edited_into_data_mdb(tmp_path: Path) -> None:
    path = tmp_path / "store"
    marker = "MARKER-0123456789-abcdefghij"
    env, log = open_log(path)
    commit(env, log, [{"type": "entry", "value": "first"}])
    target = commit(env, log, [{"type": "entry", "value": marker}])
    commit(env, log, [{"type": "entry", "value": "third"}])
    with env.read() as txn:
        stored = bytes(txn.get(seq_key(target), db=log.db))
    env.close()

    data = bytearray((path / "data.mdb").read_bytes())
    needle = stored[-16:]  # the end of the stored (possibly deflated) payload
    hits = 0
    start = data.find(needle)
    while start != -1:
        data[start + 6] ^= 0x20  # one bit, inside the stored payload
        hits += 1
        start = data.find(needle, start + 1)
    assert hits >= 1
    (path / "data.mdb").write_bytes(bytes(data))

    env, log = open_log(path, readonly=True)
    try:
        with pytest.raises(CorruptRecordError, match=f"{target}") as caught:
            log.get(target)
        assert caught.value.seq == target == 2
        with pytest.raises(CorruptRecordError) as caught:
            list(log.read(1, 3))
        assert caught.value.seq == target
        assert log.get(1) is not None and log.get(3) is not None
    finally:
        env.close()


# ── 9. file modes and fork ──────────────────────────────────────────────────


def test_file_modes(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = tmp_path / "deeper" / "store"
        env, log = open_log(path)
        commit(env, log, [{"type": "entry", "value": 1}])
        env.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    names = sorted(os.listdir(path))
    assert {"data.mdb", "lock.mdb", "writer.lock"} <= set(names)
    for name in names:
        assert stat.S_IMODE(os.stat(path / name).st_mode) == 0o600, name


def test_environment_refuses_use_after_fork(tmp_path: Path) -> None:
    path = tmp_path / "store"
    env, log = open_log(path)
    commit(env, log, [{"type": "entry", "value": 1}])
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: report through the exit code only
        code = 0
        try:
            checks = [
                lambda: log.head(),
                lambda: log.get(1),
                lambda: list(log.read(1)),
                lambda: commit(env, log, [{"type": "entry", "value": 2}]),
                lambda: env.read().__enter__(),
                lambda: env.db("other"),
            ]
            for index, check in enumerate(checks):
                try:
                    check()
                    code = 10 + index
                    break
                except ForkedEnvironmentError as error:
                    if str(path) not in str(error):
                        code = 30 + index
                        break
            if code == 0:
                env.close()  # must be a no-op, not touch the parent's environment
        except BaseException:
            code = 99
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    assert os.WEXITSTATUS(status) == 0, f"child exit code {os.WEXITSTATUS(status)}"
    # The parent's environment is untouched by the child.
    assert commit(env, log, [{"type": "entry", "value": 2}]) == 2
    assert [c.seq for c in log.read(1)] == [1, 2]
    env.close()
