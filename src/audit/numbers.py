"""Every number, duration and point of the log that ``durable-log`` reads, on its command line and
in the web view's query string, is parsed here, one way: ASCII digits only (``int()`` and
``float()`` would take ``٣``, and ``str.isdigit`` ``²``), a stated range, and a text too long to
be a number refused before Python converts it (``int()`` gives up past 4,300 digits). A refusal is
a ``NumberError`` (a ``ValueError``) that says what the value must be; the caller names where it
came from (argparse its option, the web view its query parameter)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Final, TypeVar

import msgspec

from ..errors import NumberError

INT64_MAX: Final = 2**63 - 1
"""The largest id, sequence or count a store holds (LMDB keys are unsigned 64-bit; ids are the
contract's signed 64-bit integers)."""
LONGEST: Final = 40
"""Characters a number may have, sign and leading zeros included; a longer text is refused unread."""
_DIGITS: Final = frozenset("0123456789")
_DECIMAL: Final = frozenset("0123456789.eE+-")


class Whole(msgspec.Struct, frozen=True):
    """A whole number from ``low`` to ``high``; ``what`` is what it is (``a log sequence``)."""

    what: str
    low: int = 0
    high: int = INT64_MAX

    def rule(self) -> str:
        if self.low == -INT64_MAX and self.high == INT64_MAX:
            return "a whole number, such as 3"
        if self.high == INT64_MAX:
            return f"a whole number, {self.low} or more"
        return f"a whole number from {self.low} to {self.high}"


class Seconds(msgspec.Struct, frozen=True):
    """A finite number of seconds from ``low`` to ``high`` (decimals allowed)."""

    what: str
    low: float
    high: float

    def rule(self) -> str:
        return f"a number of seconds from {self.low:g} to {self.high:g}"


def _shown(text: str) -> str:
    if len(text) > LONGEST:
        return f"{text[:12]!r}... ({len(text):,} characters)"
    return repr(text)


def whole(text: str, rule: Whole) -> int:
    """``text`` as a whole number within ``rule``: an optional sign and ASCII digits."""

    stripped = text.strip()
    refused = f"{_shown(stripped)} is not {rule.what}: {rule.rule()}"
    if len(stripped) > LONGEST:
        raise NumberError(f"{refused} (at most {LONGEST} characters)")
    digits = stripped[1:] if stripped[:1] in ("-", "+") else stripped
    if not digits or not set(digits) <= _DIGITS:
        raise NumberError(f"{refused}, in ASCII digits 0-9")
    value = int(stripped)
    if not rule.low <= value <= rule.high:
        raise NumberError(refused)
    return value


def seconds(text: str, rule: Seconds) -> float:
    """``text`` as a finite number of seconds within ``rule`` (``inf``, ``nan`` and ``1e-300``
    refused): ASCII digits, a point, an exponent."""

    stripped = text.strip()
    refused = f"{_shown(stripped)} is not {rule.what}: {rule.rule()}"
    if len(stripped) > LONGEST or not stripped or not set(stripped) <= _DECIMAL:
        raise NumberError(refused)
    try:
        value = float(stripped)
    except ValueError:
        raise NumberError(refused) from None
    if not math.isfinite(value) or not rule.low <= value <= rule.high:
        raise NumberError(refused)
    return value


# ── times and points of the log ───────────────────────────────────────────────

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(text: str) -> int:
    """Unix milliseconds of an ISO 8601 timestamp (``2026-12-02T18:30:00Z``, ``2026-12-02``,
    ``...+02:00``), in ASCII; one without a zone is UTC, as every time the CLI prints is."""

    stripped = text.strip()
    how = "write ISO 8601, e.g. 2026-12-02T18:30:00Z"
    if len(stripped) > 64 or not stripped.isascii():
        raise NumberError(f"{_shown(stripped)} is not a timestamp; {how}")
    try:
        moment = datetime.fromisoformat(stripped)
    except ValueError:
        raise NumberError(f"{_shown(stripped)} is not a timestamp; {how}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def format_time(ms: int) -> str:
    """Unix milliseconds ``ms`` as the ISO 8601 UTC time ``parse_time`` reads back."""

    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


AS_OF: Final = Whole("a log sequence", 0)


def point(text: str) -> tuple[str, int]:
    """A point of the log (``--as-of``, ``?as_of=``): ``("seq", n)`` for a number, ``("time", ms)``
    for an ISO 8601 time. A text of digits of another script is refused, never read as either."""

    stripped = text.strip()
    if stripped.isdigit() or stripped[:1] in ("-", "+"):
        return "seq", whole(stripped, AS_OF)
    try:
        return "time", parse_time(stripped)
    except NumberError:
        raise NumberError(
            f"{_shown(stripped)} is neither a log sequence (ASCII digits 0-9) nor a time "
            "(ISO 8601, e.g. 2026-12-02T18:30:00Z)"
        ) from None


def end_point(text: str) -> tuple[str, int]:
    """A point a range ends at (``restore --to``): as ``point``, its log sequence 1 or more."""

    kind, at = point(text)
    if kind == "seq" and at < 1:
        raise NumberError(f"{_shown(text.strip())} is not a log sequence: {SEQUENCE.rule()}")
    return kind, at


# ── the command line's rules ──────────────────────────────────────────────────

SEQUENCE: Final = Whole("a log sequence", 1)
COUNT: Final = Whole("a count", 0)
CONVERSATION: Final = Whole("a conversation id", 1)
RECORD_ID: Final = Whole("a record id", -INT64_MAX, INT64_MAX)
"""``show``'s id: any integer, so the contract itself answers an id below 1, as it does."""
DIFFERENCES: Final = Whole("a number of differences", 1)
PORT: Final = Whole("a TCP port", 0, 65535)
MAX_LAG: Final = Whole("a number of records", 0)
LEASE_TTL: Final = Whole("a lease time to live in whole seconds", 1, 3600)
"""As the lease itself refuses one (``lease_ttl must be whole seconds from 1 to 3600``)."""
INTERVAL: Final = Seconds("an interval", 0.1, 86400.0)
"""``stats --every``, ``replica --interval``: at least a tenth of a second (each round reads the
whole store's statistics or status), at most a day."""

T = TypeVar("T")


def argument(rule: Whole | Seconds) -> Callable[[str], int | float]:
    """An argparse ``type=`` for ``rule``: a refusal is argparse's, naming the option (exit 2)."""

    def parse(text: str) -> int | float:
        try:
            return whole(text, rule) if isinstance(rule, Whole) else seconds(text, rule)
        except NumberError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = rule.what
    return parse


def typed(parser: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse ``type=`` for a parser of this module that takes only the text."""

    def parse(text: str) -> T:
        try:
            return parser(text)
        except NumberError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = parser.__name__
    return parse


__all__ = [
    "AS_OF",
    "CONVERSATION",
    "COUNT",
    "DIFFERENCES",
    "INT64_MAX",
    "INTERVAL",
    "LEASE_TTL",
    "LONGEST",
    "MAX_LAG",
    "PORT",
    "RECORD_ID",
    "SEQUENCE",
    "Seconds",
    "Whole",
    "argument",
    "parse_time",
    "point",
    "seconds",
    "typed",
    "whole",
]
