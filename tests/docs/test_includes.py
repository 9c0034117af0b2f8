"""Every example a page includes (``<!-- include: PATH -->`` above a code block) is there as the
file is, and every Python block of the host's guide is such an example: a host, forking,
reading the past, the errors it meets, a user projection. ``tests/docs/test_examples.py`` runs each of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import includes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", includes.pages(), ids=lambda page: page.name)
def test_each_included_example_is_the_file_as_it_is(page: Path) -> None:
    for path, text in includes.included(page.read_text()):
        assert text == (ROOT / path).read_text(), (
            f"{page.name} holds an old copy of {path}: run {includes.COMMAND}"
        )


def test_every_python_example_of_the_hosts_guide_is_an_example_file() -> None:
    """Each Python block of the guide is an included example, so each one runs."""

    guide = (ROOT / "docs" / "host.md").read_text()
    named = [path for path, _ in includes.included(guide)]
    assert named == [
        "examples/host.py",
        "examples/fork.py",
        "examples/history.py",
        "examples/errors.py",
        "examples/entries_per_conversation.py",
    ]
    assert guide.count("```python\n") == len(named)
