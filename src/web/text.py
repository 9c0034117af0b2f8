"""Agent strings shown as text: what an agent stored is untrusted.

Templates autoescape (HTML and script are never markup); here the rest: control and format
characters (bidi overrides, zero-width) and lone surrogates are drawn as visible escapes, and a
huge value is cut with a note of what was left out (the page links to the whole record).
"""

from __future__ import annotations

import json
from typing import Any, Final

from markupsafe import Markup, escape

SHOWN_CHARS: Final = 4000
"""Characters of one value a page shows before cutting it (the JSON link shows all)."""
KEPT: Final = frozenset("\n\t")


def _escape_char(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _is_hidden(char: str) -> bool:
    """What a reader would not see, or not see as itself: control and format characters (bidi
    overrides, zero-width), lone surrogates, private and unassigned code points, separators
    other than the space (Python's ``isprintable``); newlines and tabs are kept."""

    return char not in KEPT and not char.isprintable()


def visible(text: str, limit: int | None = SHOWN_CHARS) -> Markup:
    """``text`` as safe markup: escaped, invisible characters drawn as ``\\uXXXX`` marks, and
    cut after ``limit`` characters with the count of those left out."""

    cut = 0
    if limit is not None and len(text) > limit:
        cut = len(text) - limit
        text = text[:limit]
    parts: list[str] = []
    plain: list[str] = []
    for char in text:
        if _is_hidden(char):
            if plain:
                parts.append(str(escape("".join(plain))))
                plain = []
            parts.append(
                f'<span class="ctl" title="an invisible character">{escape(_escape_char(char))}</span>'
            )
        else:
            plain.append(char)
    if plain:
        parts.append(str(escape("".join(plain))))
    if cut:
        parts.append(f'<span class="cut">… {cut:,} more characters not shown</span>')
    return Markup("".join(parts))


def plain(text: str) -> str:
    """``text`` with its invisible characters written as escapes, for a page that draws text
    itself (the live log sets ``textContent``): never HTML, always encodable."""

    return "".join(_escape_char(char) if _is_hidden(char) else char for char in text)


def is_cut(text: str, limit: int | None = SHOWN_CHARS) -> bool:
    return limit is not None and len(text) > limit


def pretty(value: Any) -> str:
    """A JSON value as indented text (lone surrogates stay in the text: ``visible`` marks them)."""

    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=repr)


def brief(value: Any, limit: int = 160) -> str:
    """One line of a value: the text of a message, or its compact JSON."""

    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def utf8_safe(text: str) -> str:
    """Text that encodes as UTF-8 (lone surrogates as ``\\udXXX``): for JSON and SSE bodies."""

    return text.encode("utf-8", "backslashreplace").decode("utf-8")


__all__ = [
    "KEPT",
    "SHOWN_CHARS",
    "brief",
    "is_cut",
    "plain",
    "pretty",
    "utf8_safe",
    "visible",
]
