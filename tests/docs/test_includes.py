"""Every example a page includes (``<!-- include: PATH -->`` above a code block) is there as the
file is, and the host's guide includes the examples of what a host does: forking, reading the
past, the errors it meets. ``tests/docs/test_examples.py`` runs each of them."""

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


def test_the_hosts_guide_includes_its_examples() -> None:
    named = [path for path, _ in includes.included((ROOT / "docs" / "host.md").read_text())]
    assert named == ["examples/fork.py", "examples/history.py", "examples/errors.py"]
    assert all((ROOT / path).is_file() for path in named)
