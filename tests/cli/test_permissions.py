"""A store this user may not read is reported as a permission problem naming what is missing,
not as "no store": each command is run as ``nobody`` (through ``setpriv``) on a store root made,
with the directory, ``data.mdb`` and ``lock.mdb`` opened up one at a time. The last step is what
an auditor running as another user needs (the README says so)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SETPRIV = shutil.which("setpriv")
AS_NOBODY = [SETPRIV or "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AS_NOBODY, sys.executable, *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def shared_store() -> Iterator[Path]:
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("needs root and setpriv to run a command as another user")
    if _as_nobody("-c", "import pi_durable_lmdb.cli").returncode != 0:
        pytest.skip("nobody cannot run this interpreter or import the package from here")
    from pi_durable_lmdb.cli.demo import run_workload

    root = Path(tempfile.mkdtemp(prefix="durable-log-permissions-"))
    os.chmod(root, 0o755)
    try:
        asyncio.run(run_workload(str(root / "store")))
        yield root / "store"
    finally:
        shutil.rmtree(root)


STEPS = [
    # (mode of the directory, of data.mdb, of lock.mdb), what the refusal says
    ((0o700, 0o600, 0o600), "may not read the store directory"),
    ((0o755, 0o600, 0o600), "may not read {store}/data.mdb"),
    ((0o755, 0o644, 0o644), "may not write {store}/lock.mdb"),
]


NOBODY_CLI = """
import contextlib, io, json, sys
from pi_durable_lmdb.cli import main
for line in sys.stdin:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(json.loads(line))
        except SystemExit as exit:
            code = int(exit.code or 0)
    print(json.dumps({"code": code, "stderr": err.getvalue()}), flush=True)
"""
"""``durable-log``'s entry point in one process of ``nobody``'s: a command line per line in, its exit
code and stderr per line out (the same checks as a process per command, without the start-ups)."""


@pytest.fixture(scope="module")
def nobody_cli(shared_store: Path) -> Iterator[Callable[[list[str]], tuple[int, str]]]:
    process = subprocess.Popen(
        [*AS_NOBODY, sys.executable, "-c", NOBODY_CLI],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    def run(argv: list[str]) -> tuple[int, str]:
        stdin.write(json.dumps(argv) + "\n")
        stdin.flush()
        ready, _, _ = select.select([stdout], [], [], 60)
        assert ready, f"durable-log {argv} gave no answer in 60 s"
        answer = json.loads(stdout.readline())
        return int(answer["code"]), str(answer["stderr"])

    try:
        yield run
    finally:
        stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    "command",
    [["stats"], ["tail"], ["verify"], ["show", "conversation", "1"], ["serve", "--port", "0"]],
)
def test_a_store_nobody_may_read_is_a_permission_problem_naming_what_is_missing(
    shared_store: Path, nobody_cli: Callable[[list[str]], tuple[int, str]], command: list[str]
) -> None:
    for step, ((directory, data, lock), words) in enumerate(STEPS):
        os.chmod(shared_store, directory)
        os.chmod(shared_store / "data.mdb", data)
        os.chmod(shared_store / "lock.mdb", lock)
        argv = [command[0], str(shared_store), *command[1:]]
        if step == len(STEPS) - 1:  # the last step as its own process: the exit status is the point
            done = _as_nobody("-m", "pi_durable_lmdb.cli", *argv)
            code, stderr = done.returncode, done.stderr
        else:
            code, stderr = nobody_cli(argv)
        assert code == 2, (step, code, stderr)
        assert "Permission denied: nobody " + words.format(store=shared_store) in stderr, stderr
        assert "No store" not in stderr and "Traceback" not in stderr, stderr
        assert "write lock.mdb" in stderr, "the refusal says what a reader needs"


def test_an_auditor_with_the_documented_access_reads_the_store(shared_store: Path) -> None:
    os.chmod(shared_store, 0o755)
    os.chmod(shared_store / "data.mdb", 0o644)
    os.chmod(shared_store / "lock.mdb", 0o666)
    for command in (["stats"], ["tail"], ["verify"]):
        done = _as_nobody("-m", "pi_durable_lmdb.cli", command[0], str(shared_store), *command[1:])
        assert done.returncode == 0, (command, done.stderr)
    assert (
        not (shared_store / "last-verify.json").exists()
        or os.stat(shared_store / "last-verify.json").st_uid == 0
    ), "verify keeps its outcome only where its user may write"
