"""The package as a user gets it: one import name, ``pi_durable_lmdb``, that a project's own
``storage.py``, ``log/`` and ``projections.py`` cannot shadow; typed (``py.typed`` in the wheel,
``mypy --strict`` on the typed host in ``tests/support/typed_host.py``); and the CLI it installs.

The wheel is built once per run from a copy of the source (about five seconds) and installed with
``pip install --target``, so these tests read what a registry user would get, not the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds a wheel, installs it and runs mypy --strict

ROOT = Path(__file__).resolve().parents[2]
SHADOWS = {
    "storage.py": "raise ImportError('the project\\'s own storage.py was imported')\n",
    "projections.py": "raise ImportError('the project\\'s own projections.py was imported')\n",
    "log/__init__.py": "raise ImportError('the project\\'s own log/ was imported')\n",
}


def _run(args: list[str], **options: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=180, **options)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for tree in ("src", "pi_durable_lmdb_launcher"):
        shutil.copytree(ROOT / tree, source / tree, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(source)]
    )
    assert built.returncode == 0, built.stderr
    (out / "build.log").write_text(built.stdout + built.stderr)
    (found,) = out.glob("pi_durable_lmdb-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    done = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ]
    )
    assert done.returncode == 0, done.stderr
    return target


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project directory holding modules named like our subpackages."""

    for name, text in SHADOWS.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_the_wheel_holds_one_package_typed(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(
            next(n for n in names if n.endswith(".dist-info/METADATA"))
        ).decode()
        entry_points = archive.read(
            next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        ).decode()
    tops = {name.split("/")[0] for name in names}
    # beside the one package, the command's entry point: a package that imports none of it
    # before it has installed its Ctrl-C handler (tests/cli/test_startup.py), typed like it
    launcher = "pi_durable_lmdb_launcher"
    assert tops == {"pi_durable_lmdb", launcher, wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert "pi_durable_lmdb/py.typed" in names
    assert "pi_durable_lmdb_launcher/py.typed" in names
    for sub in ("log", "projections", "storage", "cli"):
        assert f"pi_durable_lmdb/{sub}/__init__.py" in names
    assert not any(
        "task_outcomes" in name for name in names
    )  # the example lives in examples/, not the engine
    assert any(
        line.startswith("Requires-Dist: pi-durable-python") for line in metadata.splitlines()
    )
    assert "durable-log = pi_durable_lmdb_launcher:main" in entry_points


def test_the_build_prints_no_warning(wheel: Path) -> None:
    """setuptools' deprecations (a license table, data folders missing from ``packages``) turn
    into errors in later releases: the build must print none of them."""

    log = (wheel.parent / "build.log").read_text()
    warnings = [
        line for line in log.splitlines() if "Warning" in line or "deprecated" in line.lower()
    ]
    assert not warnings, "\n".join(warnings)
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(
            next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        ).decode()
    assert "License-Expression: MIT" in metadata
    assert any(
        name.endswith(".dist-info/licenses/LICENSE") for name in zipfile.ZipFile(wheel).namelist()
    )


def test_a_project_with_its_own_storage_log_and_projections_imports_and_runs_it(
    installed: Path, project: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(installed)}
    script = (
        "import asyncio, pi_durable_lmdb\n"
        "from pi_durable.context import BACKGROUND_CONTEXT as CTX\n"
        "from pi_durable_lmdb import LmdbStorage, open_lmdb_storage, StorageRequestError, WriterLockedError\n"
        "print(pi_durable_lmdb.__file__)\n"
        "async def main():\n"
        "    storage = await open_lmdb_storage('store', durability='process', projections=[])\n"
        "    print(await storage.commit([{'type': 'conversation', 'value': {'id': 1}}], CTX))\n"
        "    await storage.close()\n"
        "asyncio.run(main())\n"
    )
    done = _run([sys.executable, "-c", script], cwd=project, env=env)
    assert done.returncode == 0, done.stderr
    location, seq = done.stdout.split()
    assert Path(location).is_relative_to(installed) and seq == "1"
    cli = _run(
        [sys.executable, "-m", "pi_durable_lmdb.cli", "stats", "store"], cwd=project, env=env
    )
    assert cli.returncode == 0, cli.stderr
    assert "head sequence    1" in cli.stdout


def test_mypy_strict_accepts_the_typed_host(installed: Path, tmp_path: Path) -> None:
    done = _run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(ROOT / "tests" / "support" / "typed_host.py"),
        ],
        env={**os.environ, "MYPYPATH": str(installed)},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_accepts_the_installed_package(installed: Path, tmp_path: Path) -> None:
    """``mypy --strict -p pi_durable_lmdb`` on the installed copy: its ``python -m`` entry imports
    the launcher beside it, which must be typed too (a bare module is "installed, but missing
    library stubs or py.typed")."""

    done = _run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "cache"),
            "-p",
            "pi_durable_lmdb",
        ],
        env={**os.environ, "PYTHONPATH": str(installed)},  # found as a user's site-packages
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_typed_host_runs(tmp_path: Path) -> None:
    done = _run(
        [sys.executable, str(ROOT / "tests" / "support" / "typed_host.py"), str(tmp_path / "store")]
    )
    assert done.returncode == 0, done.stderr
    assert "'commitSeq': 1" in done.stdout


def test_every_public_method_says_why() -> None:
    import inspect

    from pi_durable_lmdb import LmdbStorage, Projection
    from pi_durable_lmdb.audit import Tail
    from pi_durable_lmdb.projections.user import Tables, UserProjections
    from pi_durable_lmdb.storage.lmdb_storage import StorageView

    missing = [
        f"{cls.__name__}.{name}"
        for cls in (LmdbStorage, StorageView, UserProjections, Tables, Projection, Tail)
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_")
        and (callable(member) or isinstance(member, property))
        and not member.__doc__
    ]
    assert missing == []
