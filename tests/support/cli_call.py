"""Running ``durable-log`` inside the test process (no interpreter start-up), shared by the tests
of the command line and of the stores it inspects."""

from __future__ import annotations

import pytest
from pi_durable_lmdb import cli as cli_module


def call(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``durable-log ARGS`` in this process: exit code, stdout, stderr."""

    capsys.readouterr()
    try:
        code = cli_module.main([str(arg) for arg in args])
    except SystemExit as exit:  # argparse's usage errors
        code = int(exit.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
