"""Differential tests: ``projections.delta`` must behave exactly like ``pi_durable.delta``."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable import delta as reference
from pi_durable.json import FrozenDict, FrozenList
from pi_durable.json import copy_json as reference_copy_json
from pi_durable_lmdb.projections.delta import (
    NON_STRING_KEYS,
    PathError,
    UnsafePathError,
    apply_batches,
    apply_ops,
    copy_json,
    validate_op,
)

from tests.support.compare import REFUSALS

SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = ["a", "b", "c", "", "constructor"]
TRICKY_CHARS = ["a", "b", "é", "😀", "𝄞", "\ud83d", "\ude00", "\ud834", "\udd1e"]

chars = st.sampled_from(TRICKY_CHARS) | st.characters()
texts = st.lists(chars, max_size=6).map("".join)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS), children, max_size=4)
    ),
    max_leaves=12,
)
documents = (
    st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4)
    | st.lists(json_values, max_size=4)
    | json_values
)
bad_segments = st.sampled_from(["__proto__", "constructor", "prototype"]) | st.sampled_from(
    [-1, True, False, 1.0, None, [0], {}]
)
segments = st.sampled_from(KEYS[:3]) | st.integers(0, 4)
bad_counts = st.sampled_from([-1, True, 1.5, None, "1", [1]])


def all_paths(value: Any, prefix: list[Any] | None = None) -> list[list[Any]]:
    prefix = prefix or []
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += all_paths(item, prefix + [key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += all_paths(item, prefix + [index])
    return found


@st.composite
def paths_for(draw: st.DrawFn, root: Any) -> list[Any]:
    """Mostly paths that exist in ``root``, nudged to the edges where the interesting errors live."""

    existing = draw(st.sampled_from(all_paths(root)))
    choice = draw(st.integers(0, 6))
    if choice == 0:
        return draw(st.lists(segments, max_size=4))
    if choice == 1 or (not existing and draw(st.booleans())):
        return existing + [draw(segments)]
    if choice == 2 and existing:
        spot = draw(st.integers(0, len(existing) - 1))
        return existing[:spot] + [draw(bad_segments)] + existing[spot + 1 :]
    if choice == 3 and existing:
        return existing[:-1] + [draw(st.integers(0, 6))]
    return existing


def resolve_quietly(root: Any, path: list[Any]) -> Any:
    try:
        for segment in path:
            root = root[segment]
        return root
    except (KeyError, IndexError, TypeError):
        return None


@st.composite
def ops_for(draw: st.DrawFn, root: Any) -> Any:
    path = draw(paths_for(root))
    verb = draw(st.sampled_from("rsdatpm"))
    if verb == "r":
        op: list[Any] = ["r", draw(json_values)]
    elif verb == "s":
        op = ["s", path, draw(json_values)]
    elif verb == "d":
        op = ["d", path]
    elif verb == "a":
        op = ["a", path, draw(texts)]
    elif verb == "t":
        op = ["t", path, draw(st.integers(0, 7))]
    elif verb == "p":
        op = [
            "p",
            path,
            draw(st.integers(0, 6)),
            draw(st.integers(0, 6)),
            draw(st.lists(json_values, max_size=3)),
        ]
    else:
        target = resolve_quietly(root, path)
        size = len(target) if isinstance(target, list) else draw(st.integers(0, 3))
        in_range = st.lists(st.integers(0, max(size - 1, 0)), min_size=size, max_size=size)
        order = draw(
            st.permutations(range(size))
            | in_range
            | st.lists(st.integers(-1, size), max_size=size + 1)
        )
        op = ["m", path, order]
    return draw(malformed(op)) if draw(st.integers(0, 4)) == 0 else op


@st.composite
def malformed(draw: st.DrawFn, op: list[Any]) -> Any:
    choice = draw(st.integers(0, 6))
    if choice == 0:
        return draw(st.sampled_from([(), [], "s", {}, None, tuple(op)]))
    if choice == 1:
        return [draw(st.sampled_from(["x", "", "R", 1, None, ["r"], {}]))] + op[1:]
    if choice == 2:
        return op[: draw(st.integers(1, max(1, len(op) - 1)))]
    if choice == 3:
        return op + [0]
    if choice == 4 and len(op) > 1:
        return [op[0], draw(st.sampled_from([None, "a", 0, {}, (), []]))] + op[2:]
    if choice == 5 and len(op) > 2:
        spot = draw(st.integers(2, len(op) - 1))
        return op[:spot] + [draw(bad_counts)] + op[spot + 1 :]
    if choice == 6 and op[0] == "m":
        return ["m", op[1], draw(st.lists(st.integers(-1, 4), max_size=4))]
    return op


@st.composite
def cases(draw: st.DrawFn) -> tuple[Any, list[Any]]:
    root = draw(documents)
    return root, draw(st.lists(ops_for(root), max_size=6))


def outcome(apply: Any, root: Any, ops: list[Any]) -> tuple[str, str, str]:
    """Run one applier on private copies; report the result or the error, plus the mutated input."""

    root = copy.deepcopy(root)
    try:
        result = apply(root, copy.deepcopy(ops))
    except REFUSALS as error:
        return type(error).__name__, str(error), repr(root)
    return "ok", repr(result), repr(root)


def reference_commit(root: Any, ops: list[Any]) -> Any:
    """The reference's applier, but refusing, as a commit's apply here does, an ``s`` of an
    integer key in an object (``TypeError``, where the set would happen: after every check)."""

    for op in ops:
        reference.apply(copy.deepcopy(root), [copy.deepcopy(op)])  # raises as the reference does
        if op[0] == "s" and type(op[1][-1]) is int:
            parent = root
            for segment in op[1][:-1]:
                parent = parent[segment]
            if isinstance(parent, dict):
                raise TypeError(NON_STRING_KEYS)
        root = reference.apply(root, [op])
    return root


def reference_read(root: Any, batches: list[list[Any]]) -> Any:
    """The value pi-durable's store reads: the batches replayed, then copied out (a key that is
    not a string raises ``TypeError`` there)."""

    return reference_copy_json(reference.apply_immutable_batches(root, batches))


@pytest.mark.slow
@SETTINGS
@given(cases())
def test_apply_ops_matches_reference(case: tuple[Any, list[Any]]) -> None:
    root, ops = case
    assert outcome(apply_ops, root, ops) == outcome(reference_commit, root, ops)


@pytest.mark.parametrize(
    ("root", "ops", "value"),
    [
        ({"o": {}}, [["s", ["o", 5], 1], ["d", ["o", 5]]], {"o": {}}),
        ({"o": {}}, [["s", ["o", 5], 1], ["s", ["o"], {}]], {"o": {}}),
        ({"o": {}}, [["s", ["o", 5], "x"], ["a", ["o", 5], "y"], ["d", ["o", 5]]], {"o": {}}),
        ({}, [["s", [0], 1], ["s", ["n"], 1], ["d", [0]]], {"n": 1}),
        ({"o": {}}, [["s", ["o", 5], 1], ["s", ["o", "5"], 2]], TypeError),
        ({"o": {}}, [["s", ["o", 5], 1]], TypeError),
        ({"o": {}}, [["s", ["o", 5], 1], ["s", ["x", "y"], 1]], KeyError),
    ],
)
def test_an_integer_key_set_in_an_object_is_refused_by_a_commit_and_read_as_the_reference_reads(
    root: Any, ops: list[Any], value: Any
) -> None:
    """A commit's apply refuses the set before it changes anything; a replay keeps the key while
    later ops may remove it and raises what the reference's read raises if one is left."""

    kept = copy.deepcopy(root)
    with pytest.raises(TypeError, match=NON_STRING_KEYS):
        apply_ops(kept, ops)
    assert kept == root
    mine = outcome(apply_batches, root, [ops[:1], ops[1:]])
    theirs = outcome(reference_read, root, [ops[:1], ops[1:]])
    assert mine[:2] == theirs[:2]
    if isinstance(value, type):
        assert mine[0] == value.__name__
    else:
        assert apply_batches(root, [ops]) == value


@st.composite
def edge_cases(draw: st.DrawFn) -> tuple[Any, list[Any]]:
    """String edits across surrogates and astral characters, and array ops at and past the end."""

    array = draw(st.lists(json_values, max_size=3))
    root = {"s": draw(texts), "l": array}
    index = draw(st.integers(0, len(array) + 1))
    op = draw(
        st.sampled_from(
            [
                ["t", ["s"], draw(st.integers(0, 7))],
                ["a", ["s"], draw(texts)],
                ["s", ["l", index], "x"],
                ["a", ["l", index], "x"],
                ["t", ["l", index], 1],
                ["d", ["l", index]],
                ["p", ["l"], index, draw(st.integers(0, 3)), [[index]]],
            ]
        )
    )
    return root, [op, ["t", ["s"], draw(st.integers(0, 3))]]


@pytest.mark.slow
@SETTINGS
@given(edge_cases())
def test_edges_match_reference(case: tuple[Any, list[Any]]) -> None:
    root, ops = case
    assert outcome(apply_ops, root, ops) == outcome(reference.apply, root, ops)
    try:
        result = apply_ops(copy.deepcopy(root), ops[:1])
    except REFUSALS:
        return
    assert_detached(result, ops[:1])


junk = st.sampled_from([None, True, 0, 2, -1, 1.0, "", "x", "__proto__", (), [], {}]) | st.lists(
    bad_segments | segments, max_size=3
)
junk_ops = st.builds(
    lambda verb, rest: [verb, *rest], st.sampled_from(list("rsdatpm")), st.lists(junk, max_size=5)
)


@SETTINGS
@given(ops_for([{"a": "x😀"}, ["b", {"c": 1}]]) | junk_ops)
def test_validate_op_matches_reference(op: Any) -> None:
    def mine(_: Any, op: Any) -> None:
        validate_op(op)

    def theirs(_: Any, op: Any) -> None:
        reference.assert_valid_op(op)

    assert outcome(mine, None, op) == outcome(theirs, None, op)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(documents, st.lists(st.lists(st.just(None)), max_size=3), st.data())
def test_apply_batches_matches_reference_and_leaves_input_alone(
    root: Any, shape: list[Any], data: Any
) -> None:
    batches = [[data.draw(ops_for(root)) for _ in batch] for batch in shape]
    snapshot = copy.deepcopy(root)
    assert outcome(apply_batches, root, batches) == outcome(reference_read, root, batches)
    try:
        apply_batches(root, batches)
    except REFUSALS:
        pass
    assert repr(root) == repr(snapshot)


def containers(value: Any) -> list[Any]:
    found = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, (dict, list)):
            found.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return found


def assert_detached(result: Any, ops: list[Any]) -> None:
    payload_ids = {
        id(node) for op in ops for node in containers(op[1:] if op[0] == "r" else op[2:])
    }
    assert not payload_ids & {id(node) for node in containers(result)}


@pytest.mark.slow
@SETTINGS
@given(cases())
def test_results_never_alias_op_payloads(case: tuple[Any, list[Any]]) -> None:
    root, ops = case
    root, applied = copy.deepcopy(root), []
    for op in ops:
        try:
            root = apply_ops(root, [op])
        except REFUSALS:
            continue
        applied.append(op)
    assert_detached(root, applied)


@SETTINGS
@given(json_values)
def test_copy_json_is_detached_and_equal(value: Any) -> None:
    copied = copy_json(value)
    assert repr(copied) == repr(value)
    assert not {id(node) for node in containers(value)} & {id(node) for node in containers(copied)}


def test_copy_json_thaws_frozen_values_and_rejects_non_json() -> None:
    frozen = FrozenDict({"a": FrozenList([1, FrozenDict({"b": "c"})])})
    thawed = copy_json(frozen)
    assert type(thawed) is dict and type(thawed["a"]) is list and type(thawed["a"][1]) is dict
    thawed["a"].append(2)
    assert thawed == {"a": [1, {"b": "c"}, 2]}
    message = "Value contains a non-JSON set; expected strict JSON"
    with pytest.raises(TypeError, match=message):
        reference_copy_json({1, 2})
    with pytest.raises(TypeError, match=message):
        copy_json({"a": [{1, 2}]})


@pytest.mark.parametrize(
    ("text", "count", "expected"),
    [
        ("😀x", 1, "x"),
        ("\ud83d\ude00x", 1, "\ude00x"),
        ("\ud83dx", 1, "x"),
        ("a\udd1e", 1, "\udd1e"),
        ("𝄞𝄞", 3, ""),
        ("abc", 0, "abc"),
    ],
)
def test_trim_counts_python_code_points_like_the_reference(
    text: str, count: int, expected: str
) -> None:
    ops = [["t", ["s"], count]]
    assert apply_ops({"s": text}, ops) == reference.apply({"s": text}, ops) == {"s": expected}


@pytest.mark.parametrize(
    ("root", "ops", "error", "message"),
    [
        ({}, [["s", ["__proto__"], 1]], UnsafePathError, "unsafe path segment: __proto__"),
        ({}, [["s", [-1], 1]], UnsafePathError, "unsafe path segment: -1"),
        ({}, [["d", ["prototype"]]], UnsafePathError, "unsafe path segment: prototype"),
        (
            {"a": {}},
            [["s", ["a", "constructor"], 1]],
            UnsafePathError,
            "unsafe path segment: constructor",
        ),
        ({}, [["a", [-1], 5]], TypeError, "a shape"),
        ({}, [["p", "x", -1, 0, []]], TypeError, "path is not an array"),
        ({}, [["p", [], -1, 0, []]], TypeError, "p index"),
        ({}, [["s", [1.0], 1]], UnsafePathError, "unsafe path segment: 1.0"),
        ({}, [["s", [True], 1]], UnsafePathError, "unsafe path segment: True"),
        ([1], [["s", [2], 1]], UnsafePathError, "unsafe path segment: 2"),
        ([1], [["s", ["a"], 1]], UnsafePathError, "unsafe path segment: a"),
        ([1], [["s", [1], 2]], IndexError, "list assignment index out of range"),
        ({"a": 1}, [["s", ["a", "b", "c"], 1]], PathError, "unresolvable path: ['a', 'b']"),
        ({}, [["s", ["a", "b"], 1]], KeyError, "'a'"),
        ({"a": 1}, [["t", ["a"], 1]], PathError, "unresolvable path: ['a']"),
        ({"a": "x"}, [["p", [], 0, 0, []]], PathError, "unresolvable path: []"),
        ([1, 2], [["m", [], [0, 0]]], TypeError, "m permutation is not a bijection"),
        ([1, 2], [["m", [], [0]]], PathError, "unresolvable path: []"),
        ({}, [["d", []]], TypeError, "path is empty"),
        ({}, [("r", 1)], TypeError, "op is not a tuple"),
        ({}, [["x"]], TypeError, "unknown op verb: x"),
        ({}, [["t", ["a"], -1]], TypeError, "t shape"),
    ],
)
def test_hand_written_failures(
    root: Any, ops: list[Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        apply_ops(copy.deepcopy(root), ops)
    assert str(raised.value) == message
    # the reference raises its own PathError and UnsafePathError, and the same builtins
    with pytest.raises(getattr(reference, error.__name__, error)) as expected:
        reference.apply(copy.deepcopy(root), ops)
    assert (type(expected.value).__name__, str(expected.value)) == (error.__name__, message)


def test_hand_written_batch() -> None:
    ops = [
        ["r", {"list": [3, 1, 2], "text": "hi😀"}],
        ["p", ["list"], 1, 1, [9, 8]],
        ["m", ["list"], [3, 2, 1, 0]],
        ["a", ["text"], "!"],
        ["t", ["text"], 2],
        ["s", ["new"], {"x": [1]}],
        ["d", ["list", 0]],
        ["d", ["missing"]],
        ["p", ["list"], 99, 0, [7]],
    ]
    expected = {"list": [8, 9, 3, 7], "text": "😀!", "new": {"x": [1]}}
    assert apply_ops(None, ops) == reference.apply(None, copy.deepcopy(ops)) == expected


def test_apply_batches_copies_its_input() -> None:
    root: dict[str, Any] = {"l": [1, {"x": "y"}], "s": "ab"}
    batches = [
        [["p", ["l"], 0, 1, []], ["s", ["l", 0, "x"], "z"]],
        [["t", ["s"], 1], ["d", ["l", 0]]],
    ]
    result = apply_batches(root, batches)
    assert result == {"l": [], "s": "b"}
    assert root == {"l": [1, {"x": "y"}], "s": "ab"}


def test_failed_op_keeps_earlier_ops_applied() -> None:
    root: dict[str, Any] = {"a": []}
    with pytest.raises(PathError):
        apply_ops(root, [["p", ["a"], 0, 0, [1]], ["t", ["a"], 1]])
    assert root == {"a": [1]}


text_paths = st.lists(st.sampled_from(["a", "b", 0, 1]), min_size=0, max_size=2)
append_ops = st.builds(lambda path, text: ["a", path, text], text_paths, texts)
run_ops = (
    append_ops
    | st.builds(lambda path, n: ["t", path, n], text_paths, st.integers(0, 3))
    | st.builds(
        lambda path, value: ["s", path, value],
        st.lists(st.sampled_from(["a", "b", 0, 1]), min_size=1, max_size=2),
        texts | st.integers(0, 3),
    )
)
text_documents = (
    st.fixed_dictionaries({"a": texts, "b": texts})
    | st.lists(texts, max_size=2)
    | texts
    | st.fixed_dictionaries({"a": st.lists(texts, max_size=2)})
)


@SETTINGS
@given(text_documents, st.lists(st.lists(run_ops, max_size=4), max_size=6))
def test_runs_of_appends_joined_match_the_reference(root: Any, batches: list[list[Any]]) -> None:
    """``apply_batches`` joins a run of appends to one path (across batches too) and applies it
    once: the same value, or the same error, as the reference applying them one by one, whatever
    breaks the run (another path, another verb, a path that holds no text)."""

    assert outcome(apply_batches, root, batches) == outcome(reference_read, root, batches)


def test_a_long_run_of_appends_across_batches_is_the_whole_text_once() -> None:
    """A transcript's run of appends, one per batch, ends as every line in order; the input is
    left as it was."""

    root = {"text": "Start.\n", "other": ["kept"]}
    batches = [
        [["a", ["text"], f"Turn {n}: ran the tests, {1834 + n % 97} tokens.\n"]]
        for n in range(1_000)
    ]
    result = apply_batches(root, batches)
    assert result == {
        "text": "Start.\n" + "".join(batch[0][2] for batch in batches),
        "other": ["kept"],
    }
    assert root == {"text": "Start.\n", "other": ["kept"]} and result["other"] is not root["other"]
