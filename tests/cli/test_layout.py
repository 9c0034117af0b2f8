"""Where the command line lives (issue 22 item 2): in ``pi_durable_lmdb.cli``, apart from the
engine, which never imports it; one module per family of commands; the audit API still importable
from its old path and from the package; ``serve`` taken from ``pi_durable_lmdb.web.command`` when
it is installed, and a clear refusal when it is not."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "pi_durable_lmdb"


def _imports(path: Path, root: Path = SRC) -> list[str]:
    """Every module ``path`` (a file of the package's source at ``root``) imports, relative
    imports resolved, at any depth of the file (a function's local import too)."""

    module = ".".join([PACKAGE, *path.relative_to(root).with_suffix("").parts])
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append(target)
            found.extend(f"{target}.{alias.name}" for alias in node.names)
    return found


def _engine_reaching_the_cli(root: Path) -> dict[str, str]:
    """``{engine file: the command-line module it imports}``: every file outside ``cli/`` and
    ``web/`` (the engine: log, projections, storage, errors, metrics, the package itself)."""

    return {
        str(path.relative_to(root)): name
        for path in root.rglob("*.py")
        if path.relative_to(root).parts[0] not in ("cli", "web")
        for name in _imports(path, root)
        if name == f"{PACKAGE}.cli" or name.startswith(f"{PACKAGE}.cli.")
    }


def test_the_engine_never_imports_the_command_line() -> None:
    assert len(list(SRC.rglob("*.py"))) > 20
    assert _engine_reaching_the_cli(SRC) == {}


@pytest.mark.parametrize(
    "text", ["from ..cli import common", "from .. import cli", "from ..cli.common import usage", "import pi_durable_lmdb.cli",
             "def f():\n    from ..cli import move"]
)
def test_the_scan_sees_every_way_of_importing_the_command_line(tmp_path: Path, text: str) -> None:
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "planted.py").write_text(text + "\n")
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "inspect.py").write_text("from ..storage import tail\n")  # the other way is allowed
    assert list(_engine_reaching_the_cli(tmp_path)) == ["storage/planted.py"]


def test_a_fresh_interpreter_using_the_engine_loads_no_command_line_module() -> None:
    script = (
        "import sys, pi_durable_lmdb, pi_durable_lmdb.audit, pi_durable_lmdb.audit.migrate, "
        "pi_durable_lmdb.audit.restore, pi_durable_lmdb.metrics\n"
        "print(sorted(m for m in sys.modules if m.startswith('pi_durable_lmdb.cli')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


CLI_FILES = ["__init__", "common", "inspect", "move", "operate", "demo", "transparency"]
ENGINE_AUDIT = ["audit", "tail", "stats", "verify", "export", "show", "backup", "words", "migrate", "jsonlines", "transparency"]


@pytest.mark.parametrize("path", [f"cli/{n}.py" for n in CLI_FILES] + [f"storage/{n}.py" for n in ENGINE_AUDIT])
def test_no_module_of_the_command_line_or_the_audit_functions_is_over_600_lines(path: str) -> None:
    assert len((SRC / path).read_text().splitlines()) <= 600


def test_the_transparency_log_functions_import_nothing_of_the_store() -> None:
    """``tlog`` is pure: the log layer uses it, and an auditor's program can use it with no store."""

    reaching = {
        str(path.relative_to(SRC)): name
        for path in (SRC / "tlog").rglob("*.py")
        for name in _imports(path)
        if name.startswith(PACKAGE + ".") and not name.startswith((f"{PACKAGE}.tlog", f"{PACKAGE}.errors"))
    }
    assert reaching == {}
    assert len(list((SRC / "tlog").rglob("*.py"))) >= 3


def test_each_family_registers_its_own_commands() -> None:
    import argparse

    from pi_durable_lmdb.cli import demo, inspect, move, operate, transparency

    families = {
        demo: {"demo"},
        inspect: {"stats", "show", "tail", "verify"},
        move: {"export", "import", "backup", "restore"},
        operate: {"rebuild", "compact", "replica", "promote"},
        transparency: {"keygen", "checkpoint", "prove"},
    }
    for family, names in families.items():
        parser = argparse.ArgumentParser()
        commands = parser.add_subparsers()
        family.register(commands)
        assert set(commands.choices) == names, family.__name__


def test_tail_is_importable_where_users_import_it() -> None:
    import pi_durable_lmdb
    from pi_durable_lmdb.storage import audit, tail

    assert audit.Tail is tail.Tail is pi_durable_lmdb.Tail
    assert audit.TailFilter is tail.TailFilter is pi_durable_lmdb.TailFilter
    for name in audit.__all__:
        assert getattr(audit, name) is not None, name


def _run_cli(prelude: str, *args: str) -> subprocess.CompletedProcess[str]:
    script = prelude + f"\nimport sys\nfrom pi_durable_lmdb.cli import main\nsys.exit(main({list(args)!r}))\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [["serve"], ["serve", "store"], ["serve", "store", "--port", "8080", "--host", "0.0.0.0"]])
def test_serve_without_the_web_extra_says_what_to_install(args: list[str]) -> None:
    missing = "import sys\nsys.modules['pi_durable_lmdb.web.command'] = None  # as when the [web] extra is missing"
    done = _run_cli(missing, *args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "pip install '/path/to/pi-durable-lmdb[web]'" in done.stderr and "Traceback" not in done.stderr
    assert "py3-none-any.whl[web]'" in done.stderr
    helped = _run_cli(missing, "--help")
    assert "serve" in helped.stdout


def test_serve_is_the_web_modules_own_command_when_it_is_there() -> None:
    web = (
        "import sys, types\n"
        "command = types.ModuleType('pi_durable_lmdb.web.command')\n"
        "def add_parser(subparsers):\n"
        "    sub = subparsers.add_parser('serve', help='serve a store')\n"
        "    sub.add_argument('path')\n"
        "    sub.add_argument('--port', type=int, default=8080)\n"
        "    sub.set_defaults(run=lambda args: print('serving', args.path, args.port) or 0)\n"
        "command.add_parser = add_parser\n"
        "import pi_durable_lmdb.web\n"
        "sys.modules['pi_durable_lmdb.web.command'] = command\n"
        "pi_durable_lmdb.web.command = command\n"
    )
    done = _run_cli(web, "serve", "store", "--port", "9")
    assert done.returncode == 0 and done.stdout == "serving store 9\n", done.stderr
    refused = _run_cli(web, "serve", "store", "--bogus")
    assert refused.returncode == 2 and "unrecognized arguments: --bogus" in refused.stderr


@pytest.mark.parametrize("blocked", ["aiohttp", "jinja2", "prometheus_client"])
def test_serve_with_the_web_modules_missing_says_what_to_install_and_exits_2(tmp_path: Path, blocked: str) -> None:
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
    assert f"({blocked} is not installed)" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert "pip install '/path/to/pi-durable-lmdb[web]'" in done.stderr and ".whl[web]'" in done.stderr, done.stderr
    assert "serving" not in done.stderr


def test_tail_nats_with_nats_py_missing_says_what_to_install_and_exits_2() -> None:
    gone = "import sys\nsys.modules['nats'] = None"
    done = _run_cli(gone, "tail", "--nats", "nats://127.0.0.1:1", "--stream", "S")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "pip install '/path/to/pi-durable-lmdb[nats]'" in done.stderr and "Traceback" not in done.stderr, done.stderr
