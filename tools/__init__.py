"""The repository's own tools, never installed with the engine. Run them from the repository's
root as modules (they import each other as ``tools.*``):

- ``tools.bench``: the benchmarks. ``python -m tools.bench`` is the report against pi-durable's
  other backends (``--markdown docs/benchmarks.md --readme README.md`` rewrites their generated
  blocks); ``python -m tools.bench.NAME`` runs one of the others (``tools.bench.tlog``,
  ``tools.bench.concurrent``, ...).
- ``tools.harness``: the fault harnesses the tests drive and that run long by hand: killed
  writers (``crash_harness``), failed journal calls (``io_faults``), power cuts (``power_loss``).
- ``tools.screenshots``: the README's screenshots of ``durable-log serve``.

A tool that starts another Python process of this package starts it with ``module_command`` and
``module_env``, so the child finds ``tools`` whatever its working directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository's root (the parent of ``tools/``)."""


def module_command(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS...`` with the running interpreter."""

    return [sys.executable, "-m", module, *args]


def module_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the repository's root first on
    ``PYTHONPATH``, so ``python -m tools...`` works from any working directory."""

    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [base.get("PYTHONPATH")])])
    return base
