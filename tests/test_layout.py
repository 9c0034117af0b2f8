"""The package's rooms and the one way they import each other: ``log`` <- ``projections`` <-
``storage`` (the ``Storage`` contract) <- ``audit`` (the operator functions) <- ``cli``, ``web``
on top. ``web`` never imports ``cli``; ``cli`` imports ``web`` in one place, ``cli/serve.py``,
which starts it. No import cycle between any two modules; no module of ``cli``, ``audit`` or
``web`` over 600 lines; ``serve`` a command of its own that says what to install when the
``[web]`` extra is missing."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "pi_durable_lmdb"

LAYERS: Final = (
    ("errors", "formats", "tlog"),
    ("log",),
    ("projections",),
    ("storage",),
    ("audit",),
    ("metrics",),
    ("",),
    ("web",),
    ("cli",),
)
"""The rooms from the bottom up (``""``: the package itself, ``__init__.py``, which re-exports the
public names); a module may import its own room's and the ones below, never one above. ``errors``
is raised everywhere; ``tlog`` is pure functions (see below); ``metrics`` reads ``audit.stats``
for the web view's /metrics."""
WEB_STARTED_FROM: Final = frozenset({"cli/serve.py"})
"""The only modules of ``cli`` that may import ``web``: ``durable-log serve`` starts it."""
KNOWN_CYCLES: Final[frozenset[frozenset[str]]] = frozenset()
"""Import cycles allowed: none. A lower module that needs a higher one's shape names it in a
``Protocol``; a type two modules share lives in a module of its own."""


def _module_of(path: Path, root: Path) -> str:
    """``path``'s dotted name inside the package: ``log.stream.writer``, ``log`` for
    ``log/__init__.py``, ``""`` for the package's own ``__init__.py``."""

    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_of(path, root): path for path in sorted(root.rglob("*.py"))}


def _inside(name: str) -> str | None:
    """``name`` (absolute) as a name inside the package, or None for another package's."""

    if name == PACKAGE:
        return ""
    if name.startswith(PACKAGE + "."):
        return name[len(PACKAGE) + 1 :]
    return None


def _imports(path: Path, root: Path, modules: Iterable[str]) -> set[str]:
    """The modules of the package (names as ``_module_of`` gives them) that ``path`` imports, at
    any depth of the file (a function's local import, one under ``TYPE_CHECKING`` too): ``from
    P import n`` is module ``P.n`` when there is one, else ``P`` itself (its ``__init__``)."""

    known = set(modules)
    own = _module_of(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                inside = _inside(alias.name)
                if inside is not None:
                    found.add(inside)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = [part for part in package.split(".") if part]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target: str | None = ".".join(base + ([node.module] if node.module else []))
            else:
                target = _inside(node.module or "")
            if target is None:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}" if target else alias.name
                if sub in known:
                    found.add(sub)
                else:
                    found.add(target)
    found.discard(own)
    return found


def _graph(root: Path) -> dict[str, set[str]]:
    modules = _modules(root)
    return {module: _imports(path, root, modules) for module, path in modules.items()}


def _room(module: str) -> str:
    return module.split(".", 1)[0]


def _rank(room: str) -> int:
    for rank, rooms in enumerate(LAYERS):
        if room in rooms:
            return rank
    raise AssertionError(f"the room {room!r} is in no layer of LAYERS: give it its place")


def _upward(root: Path) -> dict[str, str]:
    """``{file: the module above it that it imports}``, for every import that reaches upward (or
    from ``web`` into ``cli``, or from ``cli`` into ``web`` outside ``WEB_STARTED_FROM``)."""

    modules = _modules(root)
    found: dict[str, str] = {}
    for module, imported in _graph(root).items():
        file = str(modules[module].relative_to(root))
        for target in sorted(imported):
            low, high = _room(module), _room(target)
            if _rank(high) > _rank(low) or (
                (low, high) == ("cli", "web") and file not in WEB_STARTED_FROM
            ):
                found.setdefault(file, target)
    return found


def _cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_import_goes_down_the_layers() -> None:
    assert {_room(module) for module in _modules(SRC)} >= {
        "log",
        "projections",
        "storage",
        "audit",
        "cli",
        "web",
    }
    assert _upward(SRC) == {}


def test_no_import_cycle_but_the_known_ones() -> None:
    assert len(_graph(SRC)) > 80
    cycles = _cycles(_graph(SRC))
    new = [sorted(cycle) for cycle in cycles if cycle not in KNOWN_CYCLES]
    assert new == [], (
        "modules that import each other (directly or round a ring); take one import apart"
    )
    gone = [sorted(cycle) for cycle in KNOWN_CYCLES if cycle not in cycles]
    assert gone == [], "a known cycle is gone: take it off KNOWN_CYCLES"


def _plant(root: Path, files: Mapping[str, str]) -> Path:
    for name, text in {
        "__init__.py": "",
        "storage/__init__.py": "",
        "audit/__init__.py": "",
        "cli/__init__.py": "",
        "web/__init__.py": "",
        **files,
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    return root


UPWARD: Final = [
    ("storage/planted.py", "from ..audit import tail"),
    ("storage/planted.py", "from .. import audit"),
    ("storage/planted.py", "import pi_durable_lmdb.cli"),
    ("storage/planted.py", "def f():\n    from ..cli.common import usage"),
    (
        "storage/planted.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..audit.tail import Tail",
    ),
    ("audit/planted.py", "from ..web import app"),
    ("audit/planted.py", "from .. import Tail"),
    ("web/planted.py", "from ..cli import common"),
    ("web/planted.py", "from ..cli.serve import run"),
    ("cli/planted.py", "from ..web.app import make_app"),
]


@pytest.mark.parametrize(("file", "text"), UPWARD)
def test_the_scan_sees_every_way_of_importing_upward(tmp_path: Path, file: str, text: str) -> None:
    root = _plant(
        tmp_path,
        {
            "audit/tail.py": "from ..storage import lmdb_storage",  # downward: allowed
            "cli/common.py": "from ..audit.tail import Tail\nfrom .. import open_lmdb_storage",
            "cli/serve.py": "def run():\n    from ..web.app import make_app",  # cli starts web here
            "web/app.py": "from ..audit import tail",
            "storage/lmdb_storage.py": "",
            file: text,
        },
    )
    assert list(_upward(root)) == [file]


def test_the_scan_sees_an_import_cycle_and_only_one(tmp_path: Path) -> None:
    root = _plant(
        tmp_path,
        {
            "storage/a.py": "from . import b",
            "storage/b.py": "def f():\n    from .c import C",
            "storage/c.py": "from .a import A",
            "storage/d.py": "from .a import A",
            "audit/e.py": "from ..storage import a",
        },
    )
    assert _cycles(_graph(root)) == [frozenset({"storage.a", "storage.b", "storage.c"})]
    (root / "storage" / "c.py").write_text("import json\n")  # the ring broken
    assert _cycles(_graph(root)) == []


def test_a_fresh_interpreter_using_the_engine_loads_no_command_line_module() -> None:
    script = (
        "import sys, pi_durable_lmdb, pi_durable_lmdb.audit, pi_durable_lmdb.audit.migrate, "
        "pi_durable_lmdb.audit.restore, pi_durable_lmdb.audit.numbers, pi_durable_lmdb.metrics\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pi_durable_lmdb.cli', 'pi_durable_lmdb.web'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "path",
    sorted(
        str(path.relative_to(SRC))
        for room in ("cli", "audit", "web")
        for path in (SRC / room).rglob("*.py")
    ),
)
def test_no_module_of_the_command_line_the_audit_functions_or_the_web_view_is_over_600_lines(
    path: str,
) -> None:
    assert len((SRC / path).read_text().splitlines()) <= 600


def test_the_transparency_log_functions_import_nothing_of_the_store() -> None:
    """``tlog`` is pure: the log layer uses it, and an auditor's program can use it with no store."""

    graph = _graph(SRC)
    tlog = [module for module in graph if _room(module) == "tlog"]
    assert len(tlog) >= 4
    assert {module: sorted(graph[module] - set(tlog) - {"errors"}) for module in tlog} == {
        module: [] for module in tlog
    }


def test_each_family_registers_its_own_commands() -> None:
    import argparse

    from pi_durable_lmdb.cli import demo, inspect, lists, move, operate, serve, transparency

    families = {
        demo: {"demo"},
        inspect: {"stats", "show", "tail", "verify"},
        move: {"export", "import", "backup", "restore"},
        operate: {"rebuild", "compact", "erase", "trim", "replica", "promote"},
        transparency: {"keygen", "checkpoint", "prove", "verify-proof"},
        lists: {"list"},
    }
    for family, names in families.items():
        parser = argparse.ArgumentParser()
        commands = parser.add_subparsers()
        family.register(commands)
        assert set(commands.choices) == names, family.__name__
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    serve.add_parser(commands)
    assert set(commands.choices) == {"serve"}


def test_tail_is_importable_where_users_import_it() -> None:
    import pi_durable_lmdb
    from pi_durable_lmdb import audit
    from pi_durable_lmdb.audit import tail

    assert audit.Tail is tail.Tail is pi_durable_lmdb.Tail
    assert audit.TailFilter is tail.TailFilter is pi_durable_lmdb.TailFilter
    for name in audit.__all__:
        assert getattr(audit, name) is not None, name


def _run_cli(prelude: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = (
        prelude
        + f"\nimport sys\nfrom pi_durable_lmdb.cli import main\nsys.exit(main({list(args)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )


WEB_MISSING: Final = "import sys\nsys.modules['aiohttp'] = None  # importing it raises ImportError, as when the [web] extra is missing"


@pytest.mark.parametrize(
    "args", [["serve", "store"], ["serve", "store", "--port", "8080", "--host", "0.0.0.0"]]
)
def test_serve_without_the_web_extra_says_what_to_install(args: list[str]) -> None:
    done = _run_cli(WEB_MISSING, *args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert (
        "pip install '/path/to/pi-durable-lmdb[web]'" in done.stderr
        and "Traceback" not in done.stderr
    )
    assert "py3-none-any.whl[web]'" in done.stderr
    helped = _run_cli(WEB_MISSING, "--help")
    assert "serve" in helped.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["serve"], "the following arguments are required: PATH"),
        (["serve", "store", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_serve_refuses_bad_arguments_with_or_without_the_web_extra(
    args: list[str], said: str
) -> None:
    for prelude in ("", WEB_MISSING):
        done = _run_cli(prelude, *args)
        assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, (
            prelude,
            done.stderr,
        )


@pytest.mark.parametrize("blocked", ["aiohttp", "jinja2", "prometheus_client"])
def test_serve_with_the_web_modules_missing_says_what_to_install_and_exits_2(
    tmp_path: Path, blocked: str
) -> None:
    """The web view's own module imports, but a package of the [web] extra does not (as when it
    was never installed): a message naming it and an install that works (a checkout or the
    wheel, the package is on no index), exit 2, no traceback, nothing served."""

    import asyncio

    from pi_durable_lmdb.cli.demo import run_workload

    store = tmp_path / "store"
    asyncio.run(run_workload(str(store)))
    gone = f"import sys\nsys.modules[{blocked!r}] = None  # importing it raises ImportError, as when it is missing"
    done = _run_cli(gone, "serve", str(store), "--port", "0")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert f"({blocked} is not installed)" in done.stderr and "Traceback" not in done.stderr, (
        done.stderr
    )
    assert (
        "pip install '/path/to/pi-durable-lmdb[web]'" in done.stderr and ".whl[web]'" in done.stderr
    ), done.stderr
    assert "serving" not in done.stderr


def test_tail_nats_with_nats_py_missing_says_what_to_install_and_exits_2() -> None:
    gone = "import sys\nsys.modules['nats'] = None"
    done = _run_cli(gone, "tail", "--nats", "nats://127.0.0.1:1", "--stream", "S")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert (
        "pip install '/path/to/pi-durable-lmdb[nats]'" in done.stderr
        and "Traceback" not in done.stderr
    ), done.stderr


@pytest.mark.parametrize("part", ["replica", "roles", "ids", "options"])
def test_the_parts_of_lmdb_storage_never_import_it(part: str) -> None:
    """The facade holds its parts; a part that needs the store's shape names it in a ``Protocol``
    (``replica.ReplicaHost``), so no import cycle runs through ``lmdb_storage``."""

    imported = _imports(SRC / "storage" / f"{part}.py", SRC, _modules(SRC))
    assert imported and "storage.lmdb_storage" not in imported


OPERATOR_ROOMS: Final = frozenset({"audit", "cli", "web", "metrics"})
"""The rooms over the engine: they use its public surface only (docs/architecture.md)."""


def _private_uses(path: Path) -> list[str]:
    """Where ``path`` takes an underscore name of another module (``from m import _x``) or an
    underscore attribute of an object other than its own (``thing._x``, not ``self._x``,
    ``cls._x`` or a dunder)."""

    tree = ast.parse(path.read_text(), str(path))
    other_packages = {  # ``argparse._SubParsersAction``: another package's business
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if _inside(alias.name) is None
    }
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [
                f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import {alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (
                isinstance(node.value, ast.Name)
                and node.value.id in {"self", "cls", *other_packages}
            )
            and not (  # an override calling the base class's own
                isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "super"
            )
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    """Underscore names stay in their module: a module that needs one, needs a public name."""

    found = {
        module: uses
        for module, path in _modules(SRC).items()
        if (uses := [use for use in _private_uses(path) if " import " in use])
    }
    assert found == {}


def test_the_operator_rooms_use_only_the_engines_public_surface() -> None:
    """``audit``, ``cli``, ``web`` and ``metrics`` reach no underscore name of the engine: not by
    import, not as an attribute of the engine's objects."""

    found = {
        module: uses
        for module, path in _modules(SRC).items()
        if _room(module) in OPERATOR_ROOMS and (uses := _private_uses(path))
    }
    assert found == {}


def test_the_private_scan_sees_both_ways_in(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import argparse\nfrom .log.environment import _remap\nx = env._gate\ny = self._own\n"
        "z = argparse._SubParsersAction\nw = super()._fill_text\n"
    )
    assert _private_uses(probe) == ["line 2: from .log.environment import _remap", "line 3: ._gate"]
