"""The text of ``durable-log export`` and ``tail --json``: one JSON value per line, lossless both
ways for everything a store holds.

Two kinds of value need care, because JSON tools lose them:

- Strings holding surrogate code points (lone, or a high and a low one side by side as two code
  points). A line is UTF-8: every other character is written as itself, and only surrogate code
  points as ``\\udXXX`` escapes, so on reading (``from_json``) an escaped surrogate is always one
  code point and a pair of escapes is never merged into one character (as ``json.loads`` would).
- Integers beyond Python's 4,300-digit string limit: written and read in pieces below the limit.

Ordinary lines take msgspec's encoder and pay nothing for this.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import msgspec

from ..log.codec import deep

_encoder: Final = msgspec.json.Encoder()
_SURROGATE: Final = "[\ud800-\udfff]"
_SURROGATE_ESCAPE: Final = r"(?s)\\(?:u([dD][89a-fA-F][0-9a-fA-F]{2})|.)"
"""Every backslash escape of a JSON text, capturing the code of a surrogate one (patterns as
strings: ``re`` caches them compiled)."""
_SAFE_BITS: Final = 13_000
"""Integers below 2**13000 (3,913 digits) convert to and from text in one piece under the limit."""
_SAFE_DIGITS: Final = 3_900


def to_json(value: Any) -> str:
    """One line of JSON text for ``value``; ``from_json`` gives back exactly ``value``."""

    try:
        return _encoder.encode(value).decode()
    except (
        UnicodeEncodeError,
        OverflowError,
        ValueError,
        RecursionError,
    ):  # RecursionError: nested past the default stack
        return deep(_written, value)


def _written(value: Any) -> str:
    """``value`` through ``_write``, into a list of its own: a try that ran out of stack leaves
    nothing behind for the next one to append to."""

    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def from_json(text: str) -> Any:
    """The value of one line written by ``to_json`` (or by any JSON writer that escapes only
    what it must); raises ``ValueError`` on malformed text."""

    if "\\u" in text:
        text = re.sub(_SURROGATE_ESCAPE, _unescape_surrogate, text)
    return deep(_loads, text)


def _loads(text: str) -> Any:
    return json.loads(text, parse_int=_parse_int)


def _unescape_surrogate(match: re.Match[str]) -> str:
    code = match[1]
    return match[0] if code is None else chr(int(code, 16))


def _write(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(re.sub(_SURROGATE, _escape_surrogate, json.dumps(value, ensure_ascii=False)))
    elif value is None or isinstance(value, bool):
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        out.append(_int_text(value))
    elif isinstance(value, float):
        out.append(json.dumps(value, allow_nan=False))
    elif isinstance(value, dict):
        out.append("{")
        for index, (key, item) in enumerate(value.items()):
            if index:
                out.append(",")
            _write(str(key), out)
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")


def _escape_surrogate(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


def _int_text(value: int) -> str:
    if value < 0:
        return "-" + _int_text(-value)
    if value.bit_length() <= _SAFE_BITS:
        return str(value)
    digits = int(value.bit_length() * 0.30103) // 2
    high, low = divmod(value, 10**digits)
    return _int_text(high) + _int_text(low).rjust(digits, "0")


def _parse_int(text: str) -> int:
    if len(text) <= _SAFE_DIGITS:
        return int(text)
    if text[0] == "-":
        return -_parse_int(text[1:])
    split = len(text) // 2
    low = text[split:]
    high: int = _parse_int(text[:split]) * 10 ** len(low)
    return high + _parse_int(low)


__all__ = [
    "from_json",
    "to_json",
]
