"""The change between two JSON values as their structure sees it, not as their text's lines do: a
member added, removed or changed is one line naming its path (a JSON pointer), whatever commas or
indentation its neighbours' text would have gained. Lists are matched item by item (an item
inserted in the middle is one added line, not a cascade of changes)."""

from __future__ import annotations

import difflib
import json
from typing import Any, Final

from .text import brief

MAX_LINES: Final = 500
"""Lines of a change drawn (a bigger change ends with a line saying how many were left out)."""
VALUE_CHARS: Final = 300


def _pointer(path: list[str]) -> str:
    return (
        "/" + "/".join(part.replace("~", "~0").replace("/", "~1") for part in path)
        if path
        else "(the whole value)"
    )


def _shown(value: Any) -> str:
    """A value in one line of JSON (a string in its quotes), cut when long."""

    return brief(
        json.dumps(value, ensure_ascii=False, default=repr) if isinstance(value, str) else value,
        VALUE_CHARS,
    )


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=repr)


def changes(before: Any, after: Any) -> list[tuple[str, str]]:
    """``(kind, line)`` for each change from ``before`` to ``after``: kind "+" (added), "-"
    (removed) or "@" (a note). ``after`` None: no value to show, no lines; ``before`` None: all of
    ``after`` is new."""

    if after is None:
        return []
    lines: list[tuple[str, str]] = []
    if before is None:
        if isinstance(after, dict) and after:
            for name, value in after.items():
                lines.append(("+", f"+ {_pointer([name])}: {_shown(value)}"))
        else:
            lines.append(("+", f"+ {_pointer([])}: {_shown(after)}"))
    else:
        _walk(before, after, [], lines)
    if len(lines) > MAX_LINES:
        left = len(lines) - MAX_LINES
        lines = lines[:MAX_LINES] + [("@", f"… {left:,} more changes not shown")]
    return lines


def _walk(before: Any, after: Any, path: list[str], lines: list[tuple[str, str]]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for name, value in before.items():
            if name not in after:
                lines.append(("-", f"- {_pointer(path + [name])}: {_shown(value)}"))
            else:
                _walk(value, after[name], path + [name], lines)
        for name, value in after.items():
            if name not in before:
                lines.append(("+", f"+ {_pointer(path + [name])}: {_shown(value)}"))
        return
    if isinstance(before, list) and isinstance(after, list):
        matcher = difflib.SequenceMatcher(
            None, [_key(item) for item in before], [_key(item) for item in after], autojunk=False
        )
        for tag, low, high, new_low, new_high in matcher.get_opcodes():
            if tag == "equal":
                continue
            if tag == "replace" and high - low == new_high - new_low:
                for offset in range(high - low):
                    _walk(
                        before[low + offset],
                        after[new_low + offset],
                        path + [str(new_low + offset)],
                        lines,
                    )
                continue
            for index in range(low, high):
                lines.append(("-", f"- {_pointer(path + [str(index)])}: {_shown(before[index])}"))
            for index in range(new_low, new_high):
                lines.append(("+", f"+ {_pointer(path + [str(index)])}: {_shown(after[index])}"))
        return
    if type(before) is not type(after) or before != after:
        lines.append(("-", f"- {_pointer(path)}: {_shown(before)}"))
        lines.append(("+", f"+ {_pointer(path)}: {_shown(after)}"))


__all__ = [
    "MAX_LINES",
    "VALUE_CHARS",
    "changes",
]
