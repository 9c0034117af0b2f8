"""pi_durable 1.4.0's runner-independent Storage conformance suite, one pytest test per case.

Every case runs on a fresh storage in its own ``tmp_path`` directory and closes it at the end,
also when the case itself already closed it (MemoryStorage's ``close()`` is idempotent).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT
from pi_durable.testing import create_storage_conformance

from tests.support.compare import REFUSALS

from ..support.compare import canonical as _canonical

EXPECTED_CASES = 25


def _match_object(actual: Any, expected: Any, path: str = "$") -> None:
    """Jest's ``toMatchObject``: objects match on the expected keys, arrays element-wise."""

    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{path}: expected an object, got {actual!r}"
        for key, item in expected.items():
            assert key in actual, f"{path}: missing key {key!r} in {actual!r}"
            _match_object(actual[key], item, f"{path}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list), f"{path}: expected an array, got {actual!r}"
        assert len(actual) == len(expected), f"{path}: {actual!r} != {expected!r}"
        for index, (left, right) in enumerate(zip(actual, expected, strict=True)):
            _match_object(left, right, f"{path}[{index}]")
    else:
        assert _canonical(actual) == _canonical(expected), f"{path}: {actual!r} != {expected!r}"


class PytestAssertions:
    """``StorageConformanceAssertions`` backed by plain asserts."""

    def ok(self, value: object, message: str | None = None) -> None:
        assert value, message or f"expected a truthy value, got {value!r}"

    def strict_equal(self, actual: object, expected: object) -> None:
        assert _canonical(actual) == _canonical(expected), f"{actual!r} is not {expected!r}"

    def deep_equal(self, actual: object, expected: object) -> None:
        assert _canonical(actual) == _canonical(expected), f"{actual!r} != {expected!r}"

    def partial_deep_equal(self, actual: object, expected: object) -> None:
        _match_object(actual, expected)

    def greater_than(self, actual: float, expected: float) -> None:
        assert actual > expected, f"{actual!r} is not greater than {expected!r}"

    async def rejects(self, operation: Awaitable[object], message_includes: str) -> None:
        try:
            value = await operation
        except REFUSALS as error:
            assert message_includes in str(error), (
                f"rejected with {type(error).__name__}: {error!s}; "
                f"expected the message to include {message_includes!r}"
            )
        else:
            raise AssertionError(
                f"expected a rejection including {message_includes!r}; resolved {value!r}"
            )


async def _unused_provider(use: Callable[[Any], Awaitable[None]]) -> None:
    raise AssertionError("only names are read from this suite")


CASE_NAMES = [
    case.name
    for case in create_storage_conformance(
        {"assertions": PytestAssertions(), "with_storage": _unused_provider}
    )
]


def test_suite_has_every_case() -> None:
    assert len(CASE_NAMES) == EXPECTED_CASES
    assert len(set(CASE_NAMES)) == EXPECTED_CASES


@pytest.mark.parametrize("case_name", CASE_NAMES)
async def test_storage_conformance(case_name: str, tmp_path: Any, open_storage: Any) -> None:
    runs = 0

    async def with_storage(use: Callable[[Any], Awaitable[None]]) -> None:
        nonlocal runs
        runs += 1
        storage = await open_storage(str(tmp_path / f"store-{runs}"))
        try:
            await use(storage)
        finally:
            await storage.close(BACKGROUND_CONTEXT)

    cases = {
        case.name: case
        for case in create_storage_conformance(
            {"assertions": PytestAssertions(), "with_storage": with_storage}
        )
    }
    await cases[case_name].run()
    assert runs == 1
