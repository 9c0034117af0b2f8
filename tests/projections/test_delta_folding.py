"""``delta.Folding`` (text appends kept pending and joined once) against pi-durable's own applier:
random histories of every op over arrays and objects of texts give the same value, or raise the
same exception, as ``pi_durable.delta`` applying them one by one; and a run of appends to one
text copies its characters a bounded number of times, whatever other ops come between."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pi_durable import delta as reference
from pi_durable.json import copy_json as reference_copy_json
from pi_durable_lmdb.projections.delta import Folding, apply_batches

from tests.projections.test_documents import count_copies
from tests.support.compare import REFUSALS

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

words = st.text(alphabet=st.sampled_from(["a", "b", "é", "😀", "\ud83d", " "]), max_size=5)
items = st.fixed_dictionaries({"text": words, "n": st.integers(0, 3)})
trees = st.fixed_dictionaries(
    {
        "items": st.lists(items, max_size=4),
        "log": st.lists(words, max_size=3),
        "o": st.fixed_dictionaries({"a": words, "b": st.fixed_dictionaries({"c": words})}),
        "t": words,
    }
)
small_values = words | st.integers(0, 3) | items | st.lists(words, max_size=2)


def paths_in(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path of ``value`` (the root's ``()`` first)."""

    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_in(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths_in(item, prefix + (index,))
    return found


def at(value: Any, path: tuple[Any, ...]) -> Any:
    """What ``path`` holds in ``value``, or None where it leads nowhere."""

    for segment in path:
        try:
            value = value[segment]
        except (KeyError, IndexError, TypeError):
            return None
    return value


@st.composite
def op_on(draw: st.DrawFn, value: Any, last: list[Any] | None, keys: bool) -> list[Any]:
    """One op on ``value``: mostly one that applies (appends to its texts above all, often to
    ``last``, the text appended to before; deletes of array elements, often of one before
    ``last``'s; splices and moves of its arrays), now and then one that does not; with ``keys``,
    sets of integer keys in objects."""

    paths = paths_in(value)
    texts = [path for path in paths if isinstance(at(value, path), str)] or [("t",)]
    arrays = [path for path in paths if isinstance(at(value, path), list)] or [("log",)]
    elements = [path for path in paths if path and isinstance(at(value, path[:-1]), list)]
    members = [path for path in paths if path] or [("t",)]
    wild = list(
        draw(st.lists(st.sampled_from(["items", "log", "o", "t", "text", 0, 1, 2]), min_size=1))
    )
    verb = draw(st.sampled_from("aaaaaddsstpmr"))
    if verb == "a":
        choice = draw(st.integers(0, 9))
        path = wild if choice == 0 else list(draw(st.sampled_from(texts)))
        return ["a", last if last is not None and choice > 4 else path, draw(words)]
    if verb == "t":
        return ["t", list(draw(st.sampled_from(texts))), draw(st.integers(0, 3))]
    earlier = [
        [*last[:spot], index]
        for spot, segment in enumerate(last or [])
        if type(segment) is int
        for index in range(segment)
    ]
    if verb == "d" and earlier and draw(st.booleans()):  # an element before the text appended to
        return ["d", draw(st.sampled_from(earlier))]
    if verb == "d":
        path = draw(st.sampled_from(elements or members)) if draw(st.booleans()) else ()
        return ["d", list(path or draw(st.sampled_from(members)))]
    if verb == "s":
        parent = draw(st.sampled_from(arrays + [("o",), ("o", "b")]))
        target = at(value, parent)
        key = (
            draw(st.integers(0, len(target) - (len(target) > 0 and draw(st.integers(0, 5)) > 0)))
            if isinstance(target, list)
            else draw(st.sampled_from(["a", "c", "x", 0, 1] if keys else ["a", "c", "x"]))
        )
        return ["s", [*parent, key], draw(small_values)]
    if verb == "p":
        path = list(draw(st.sampled_from(arrays)))
        return ["p", path, draw(st.integers(0, 4)), draw(st.integers(0, 2)), draw(st.lists(items))]
    if verb == "m":
        path = draw(st.sampled_from(arrays))
        target = at(value, path)
        size = len(target) if isinstance(target, list) else 0
        return ["m", list(path), draw(st.permutations(range(size)))]
    return ["r", draw(trees)]


@st.composite
def histories(draw: st.DrawFn, keys: bool = False) -> tuple[Any, list[list[Any]]]:
    """A tree and batches of ops drawn on the value the reference reaches as it goes."""

    root = draw(trees)
    value = copy.deepcopy(root)
    batches: list[list[Any]] = []
    last = None
    for _ in range(draw(st.integers(1, 8))):
        batch = []
        for _ in range(draw(st.integers(1, 5))):
            op = draw(op_on(value, last, keys))
            batch.append(op)
            last = op[1] if op[0] == "a" and op[1] else last
            try:
                value = reference.apply(copy.deepcopy(value), [copy.deepcopy(op)])
            except REFUSALS:
                pass  # the rest of the history is drawn on the value before the failing op
        batches.append(batch)
    return root, batches


def outcome(run: Any) -> tuple[str, str]:
    try:
        return "ok", repr(run())
    except REFUSALS as error:
        return type(error).__name__, str(error)


def referenced(root: Any, batches: list[list[Any]]) -> tuple[str, str]:
    return outcome(lambda: reference.apply_immutable_batches(root, copy.deepcopy(batches)))


@pytest.mark.slow
@SETTINGS
@given(histories(keys=True))
def test_a_replay_of_random_histories_is_the_references(case: tuple[Any, list[list[Any]]]) -> None:
    """A replay reads as the reference's store reads: the value copied out (an integer key
    left in an object raises ``TypeError`` there)."""

    root, batches = case
    read = outcome(
        lambda: reference_copy_json(reference.apply_immutable_batches(root, copy.deepcopy(batches)))
    )
    assert outcome(lambda: apply_batches(root, copy.deepcopy(batches))) == read


@pytest.mark.slow
@SETTINGS
@given(histories(), st.data())
def test_a_folding_read_between_batches_is_the_references(
    case: tuple[Any, list[list[Any]]], data: st.DataObject
) -> None:
    """A long document's value in the writer: batches applied one by one to one folding, read
    (``joined``) between some of them, each read the reference's value at that point."""

    root, batches = case
    folding = Folding(copy.deepcopy(root))
    for done, ops in enumerate(batches, 1):
        try:
            folding.apply(copy.deepcopy(ops))
        except REFUSALS as error:
            assert (type(error).__name__, str(error)) == referenced(root, batches[:done])
            return
        if data.draw(st.booleans()) or done == len(batches):
            assert ("ok", repr(folding.joined())) == referenced(root, batches[:done])


@pytest.mark.parametrize(
    "removal",
    [
        ["d", ["items", 0]],
        ["d", ["items", 1]],
        ["p", ["items"], 0, 1, []],
        ["m", ["items"], [2, 1, 0]],
    ],
)
def test_appends_pending_on_an_array_element_are_joined_before_the_array_shifts(
    removal: list[Any],
) -> None:
    root = {"items": [{"text": "a"}, {"text": "b"}, {"text": "c"}]}
    batches = [
        [["a", ["items", 2, "text"], "x"]],
        [["a", ["items", 2, "text"], "y"], ["a", ["items", 2, "text"], "z"]],
        [removal],
        [["s", ["n"], 1]],
    ]
    expected = reference.apply_immutable_batches(root, copy.deepcopy(batches))
    assert apply_batches(root, batches) == expected
    folding = Folding(copy.deepcopy(root))
    for ops in batches:
        folding.apply(ops)
    assert folding.joined() == expected


CHUNK_TEXT = "a chunk of a long transcript. " * 3


@st.composite
def noise_on(draw: st.DrawFn) -> list[list[Any]]:
    """Ops that leave ``items[0].text`` where it is: on other texts, on later elements of its
    array, on other arrays and keys (each choice leaves the shape it found)."""

    return draw(
        st.sampled_from(
            [
                [["s", ["turns"], draw(st.integers(0, 9))]],
                [["a", ["items", 1, "text"], draw(words)]],
                [["t", ["items", 1, "text"], 1]],
                [["s", ["items", 1, "n"], draw(st.integers(0, 3))]],
                [["d", ["items", 2]]],
                [["s", ["items", 2], {"text": draw(words)}]],
                [["a", ["items", 2, "text"], draw(words)]],
                [["a", ["log", 0], draw(words)]],
                [["p", ["log"], 1, 1, [draw(words)]]],
                [["m", ["log"], [0, 2, 1]]],
                [["d", ["o", "a"]]],
                [["s", ["o", "a"], draw(words)]],
            ]
        )
    )


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(noise_on(), max_size=3), min_size=60, max_size=100))
def test_appends_to_one_text_copy_its_length_a_bounded_number_of_times_whatever_comes_between(
    drawn: list[list[list[Any]]],
) -> None:
    noise = [[op for ops in turn for op in ops] for turn in drawn]
    with pytest.MonkeyPatch.context() as patch:
        copied = count_copies(patch)
        root = {
            "items": [{"text": ""}, {"text": "b", "n": 0}] + [{"text": "c"}] * 400,
            "log": ["x", "y", "z"],
            "o": {"a": "q"},
            "turns": 0,
        }
        batches = [[["a", ["items", 0, "text"], CHUNK_TEXT], *ops] for ops in noise]
        value = apply_batches(root, batches)
    expected = reference.apply_immutable_batches(root, copy.deepcopy(batches))
    assert value == expected
    total = len(value["items"][0]["text"])
    other = sum(len(op[2]) for ops in noise for op in ops if op[0] == "a")
    # each noise op may make a short text copy itself once: bounded by the texts it can reach
    noise_cost = sum(map(len, noise)) * (other + 10)
    assert copied[0] <= 2 * total + noise_cost
    assert copied[0] < total * len(batches) / 10  # one append at a time cost about n²/2 chunks
