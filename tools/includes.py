"""Copies each example a page includes into it: a block marked ``<!-- include: PATH -->`` above
a fenced code block holds the file PATH as it is, in README.md and every page of docs/. A page
then reads whole on the repository's page, and ``tests/docs/test_includes.py`` checks the copy.

    python -m tools.includes    # refresh every included block
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
COMMAND: Final = "python -m tools.includes"
BLOCK: Final = re.compile(r"<!-- include: (\S+) -->\n```(\w*)\n(.*?)```\n", re.S)
"""An include marker, the fence's language and the block's text."""


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def included(text: str) -> list[tuple[str, str]]:
    """``(path, text of its block)`` for each include of a page, in order."""

    return [(match[1], match[3]) for match in BLOCK.finditer(text)]


def refreshed(text: str) -> str:
    """The page with each included block holding its file as it is now."""

    return BLOCK.sub(
        lambda match: (
            f"<!-- include: {match[1]} -->\n```{match[2]}\n{(ROOT / match[1]).read_text()}```\n"
        ),
        text,
    )


def main() -> int:
    for page in pages():
        text = page.read_text()
        if refreshed(text) != text:
            page.write_text(refreshed(text))
            print(f"refreshed {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
