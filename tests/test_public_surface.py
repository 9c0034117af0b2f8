"""Every public module of the package says what it offers: an ``__all__`` whose names all exist
and none of them private. The API reference (``docs/reference.md``) renders modules by it, and
``tests/docs/test_site.py`` checks the names a host uses are there."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "pi_durable_lmdb"


def _public_modules() -> list[str]:
    names = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue  # a private module, or __main__
        names.append(".".join((PACKAGE, *parts)))
    return names


MODULES = _public_modules()


def test_the_package_and_its_rooms_are_among_the_modules_checked() -> None:
    for room in ("", ".log", ".log.stream", ".projections", ".storage", ".audit", ".cli", ".web"):
        assert PACKAGE + room in MODULES, room
    assert f"{PACKAGE}.log.records" in MODULES
    assert not [name for name in MODULES if "._" in name]


@pytest.mark.parametrize("name", MODULES)
def test_every_public_module_declares_what_it_offers(name: str) -> None:
    module = importlib.import_module(name)
    assert "__all__" in vars(module), f"{name} has no __all__"
    offered = list(module.__all__)
    assert all(isinstance(item, str) for item in offered), name
    assert len(set(offered)) == len(offered), f"{name}: a name twice in __all__"
    assert [item for item in offered if not hasattr(module, item)] == [], name
    private = [item for item in offered if item.startswith("_") and item != "__version__"]
    assert private == [], f"{name} offers private names"
