"""The API reference (``docs/reference.md``) is generated from the code and current: regenerated
in memory it is the file as committed, so a name added to a module's ``__all__``, a changed
signature or docstring fails here until ``python -m tools.apiref`` is run."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from tools import apiref

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_is_as_generated_from_the_code() -> None:
    page = (ROOT / "docs" / "reference.md").read_text()
    assert apiref.render() == page, "docs/reference.md is not current: run python -m tools.apiref"


def test_every_name_of_each_listed_module_has_its_entry() -> None:
    page = (ROOT / "docs" / "reference.md").read_text()
    for section in apiref.SECTIONS:
        module = importlib.import_module(section.module)
        for name in section.names or module.__all__:
            assert f'<a id="{section.module}.{name}"></a>' in page, (section.module, name)
    assert ":::" not in page and not re.search(r" at 0x[0-9a-f]+", page)


def test_the_check_says_what_to_run_when_the_file_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "reference.md"
    stale.write_text("# API reference\n")
    monkeypatch.setattr(apiref, "TARGET", stale)
    monkeypatch.setattr(apiref, "ROOT", tmp_path)
    assert apiref.main(["--check"]) == 1
    assert "run python -m tools.apiref" in capsys.readouterr().err
    assert apiref.main([]) == 0 and stale.read_text() == apiref.render()
    assert apiref.main(["--check"]) == 0
