"""Strict structural comparison of JSON results, shared by the tests that compare backends."""

from __future__ import annotations

import math
from collections.abc import Awaitable
from typing import Any, Final

from pi_durable.delta import PathError, UnsafePathError
from pi_durable.errors import StorageRequestError
from pi_durable_lmdb.errors import DurableLmdbError


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


REFUSALS: Final = (
    DurableLmdbError,
    StorageRequestError,
    PathError,
    UnsafePathError,
    ValueError,
    TypeError,
    LookupError,
    RuntimeError,
)
"""What this store and pi-durable's ``MemoryStorage`` raise for a request they refuse: the named
errors of both and the builtins the contract uses. A test comparing the two catches these; any
other exception (an ``AttributeError``, an ``AssertionError``) is a bug it must not hide."""


async def outcome(call: Awaitable[Any]) -> tuple[Any, ...]:
    """``("ok", result)``, or ``("error", class name, message)`` for a refusal: the two stores'
    answers compared as one value."""

    try:
        return ("ok", await call)
    except REFUSALS as error:
        return ("error", type(error).__name__, str(error))
