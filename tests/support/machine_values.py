"""The value pools of the state machine's draws (``tests/support/machine_draws.py``): few
enough values that collisions are likely, odd enough (lone surrogates, ``__proto__``, the edges of
safe integers) that each write path meets them; the invalid ops and cursors it tries."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

MAX_SAFE = 9_007_199_254_740_991

# ── Value pools ─────────────────────────────────────────────────────────────

ID_POOL = list(range(1, 17))
TEXTS = ["", "a", "zz", "é", "日本語", "😀x", "\ud800", "x\udfffy", "__proto__"]
KEYS = ["a", "b", "é", "\ud800", "__proto__", "n"]
INTS = [0, 1, -1, 42, 2**53 + 1, -(2**63), 2**63 - 1]
FLOATS = [0.5, -0.0, 1.0, 1e300, -2.5e-8]
ENTRY_KINDS = ["message", "marker", "ü", "\ud800"]
TASK_KINDS = ["test.task", "other", "ké", "\udc00"]
DOC_KINDS = ["notes", "cache", "\ud801k"]
DOC_KEYS = [None, "k1", "ключ", "\ud800"]
REQUEST_IDS = ["r1", "ré", "\ud800", "\ud801"]
TASK_STATUSES = ["pending", "running", "waiting", "sleeping", "completing", "terminal"]
SUBMISSION_STATUSES = ["queued", "placed", "done", "unanswered"]
ORDERS = [None, "ascending", "descending"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(INTS),
    st.sampled_from(FLOATS),
    st.sampled_from(TEXTS),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)
    ),
    max_leaves=5,
)
json_objects = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=3)
texts = st.sampled_from(TEXTS)

BAD_OPS: list[Any] = [
    ["s", [], 1],
    ["q", ["a"]],
    ["s", ["__proto__"], 1],
    ["d", ["missing", "deeper"]],
    ["m", [], [0, 0]],
    ["t", ["a"], -1],
    ["p", ["a"], -1, 0, []],
    "not-an-op",
    [],
    ["r"],
    ["s", ["a", -1], 1],
    ["a", ["a"], 5],
    ["a", ["a"], "x"],
    ["s", ["missing", "x"], 1],
    ["p", ["missing"], 0, 0, []],
    ["m", ["a"], [0]],
]

BAD_CURSORS: list[Any] = [
    {},
    {"after": "3"},
    {"after": 1.5},
    {"after": True},
    {"after": None},
    {"after": MAX_SAFE + 1},
    {"after": 3, "order": "sideways"},
    {"after": 0},
    {"after": -2},
    {"after": 3, "order": "ascending"},
    {"after": 3, "order": "descending"},
    {"after": 3, "order": None},
]
