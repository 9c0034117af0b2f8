"""Strict structural comparison of JSON results, shared by the tests that compare backends."""

from __future__ import annotations

import math
from typing import Any


def canonical(value: Any, *, tuples_as_arrays: bool = False) -> Any:
    """A strict structural form: booleans, integers and floats never compare equal to each other,
    and key order is ignored."""

    arrays = (list, tuple) if tuples_as_arrays else (list,)
    if value is None:
        return ("null",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else repr(value))
    if isinstance(value, str):
        return ("str", value)
    if isinstance(value, dict):
        return (
            "object",
            sorted(
                (key, canonical(item, tuples_as_arrays=tuples_as_arrays))
                for key, item in value.items()
            ),
        )
    if isinstance(value, arrays):
        return ("array", [canonical(item, tuples_as_arrays=tuples_as_arrays) for item in value])
    return ("other", type(value).__name__, repr(value))
