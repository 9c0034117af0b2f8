"""Waiting for a condition the tests cannot be told about: asked again every ``interval`` until it
holds, or ``timeout`` passes. The timeout is a bound load cannot cross (generous), never a claim
about speed; a test that can be told (an event, a line, a condition variable) waits on that."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def until(
    predicate: Callable[[], object],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> None:
    """Return once ``predicate()`` is true; an ``AssertionError`` naming ``what`` (and the
    ``detail`` said then, e.g. a child's stderr) after ``timeout`` seconds without it."""

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, timeout, detail))
        time.sleep(interval)


async def until_async(
    predicate: Callable[[], object],
    *,
    timeout: float,
    what: str,
    interval: float = 0.02,
    detail: Callable[[], str] | None = None,
) -> None:
    """``until`` for a coroutine: the event loop runs between the checks."""

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(_message(what, timeout, detail))
        await asyncio.sleep(interval)


def _message(what: str, timeout: float, detail: Callable[[], str] | None) -> str:
    said = f"no {what} within {timeout} s"
    return f"{said}:\n{detail()}" if detail is not None else said
