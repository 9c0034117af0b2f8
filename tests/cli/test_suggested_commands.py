"""Every ``durable-log`` command the demo's own output, the README and the docs suggest for the
demo store works as printed: read from the text (a new suggestion is tested with no change
here) and run by a shell, each on a fresh copy of a store the demo made in that directory.
Commands that run until Ctrl-C (``--follow``, ``serve``) must start, answer and stop with 0."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.demo_store import BIN, BOUND, durable_log, make_demo, run_as_printed

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"(?:\.venv/bin/)?(durable-log [^`\n]*\bdemo-store\b[^`\n]*)")


def _commands(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        for match in COMMAND.finditer(line):
            command = re.sub(r"\s+#.*$", "", match.group(1)).strip()
            if command not in found:
                found.append(command)
    return found


def _suggested() -> list[tuple[str, str]]:
    """``(where, command)`` for each suggestion of the texts, and of the demo's output (read by
    running it once, at collection)."""

    import tempfile

    found = [(path.name, command) for path in TEXTS for command in _commands(path.read_text())]
    with tempfile.TemporaryDirectory() as scratch:
        said = make_demo(Path(scratch))
    suggested = said.split("Try next", 1)[1]
    found += [("demo output", command) for command in _commands(suggested)]
    return found


SUGGESTED = _suggested()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("demo")
    make_demo(directory)
    return directory


def test_the_texts_suggest_the_commands_a_new_user_types_first() -> None:
    commands = [command for _, command in SUGGESTED]
    assert any(c.startswith("durable-log search demo-store ") for c in commands), commands
    assert any(c.startswith("durable-log show demo-store ") for c in commands), commands
    assert len({where for where, _ in SUGGESTED}) >= 3  # the README, a doc, the demo


@pytest.mark.parametrize("where, command", SUGGESTED, ids=[f"{w}: {c}" for w, c in SUGGESTED])
def test_a_suggested_command_works_as_printed(
    made: Path, tmp_path: Path, where: str, command: str
) -> None:
    here = tmp_path / "here"
    shutil.copytree(made, here)
    env = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    if "--follow" in command.split() or command.split()[1] == "serve":
        _runs_until_stopped(command, here, env)
        return
    done = run_as_printed(command, here)
    assert done.returncode == 0, f"{where}: {command}\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr


def _runs_until_stopped(command: str, here: Path, env: dict[str, str]) -> None:
    serving = command.split()[1] == "serve"
    if serving:
        command += " --port 0"  # as printed, on a port of its own (tests run side by side)
    process = subprocess.Popen(
        ["bash", "-c", "exec " + command],
        cwd=here,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stream = process.stderr if serving else process.stdout
        assert stream is not None
        first = stream.readline()  # serve says where it serves; tail --follow prints the log
        assert first, process.communicate(timeout=BOUND)
        assert "serving" in first if serving else first.strip()
        process.send_signal(signal.SIGINT)
        assert process.wait(BOUND) == 0
    finally:
        process.kill()
        process.communicate()


def test_search_takes_the_words_as_typed_quoted_or_not(made: Path) -> None:
    def search(*words: str) -> str:
        done = durable_log("search", "demo-store", *words, "--json", cwd=made)
        assert done.returncode == 0, done.stderr
        return done.stdout

    several = search("writer", "killed")
    assert several == search("writer killed") and '"words":["writer","killed"]' in several
    assert '"entries":[]' not in several  # the demo's question and its answer


AUDIT = ROOT / "docs" / "audit.md"


def _quick_start() -> list[str]:
    """The command lines of docs/audit.md's quick start, in order, comments left out."""

    text = AUDIT.read_text().split("## Quick start", 1)[1]
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [
        line for line in block.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


@pytest.mark.slow  # a store, keys, checkpoints and proofs, line by line (about 5 s)
def test_the_audit_quick_start_runs_as_printed(made: Path, tmp_path: Path) -> None:
    """Every line, in order, in a directory holding a store ``orders``: each file a later line
    names (the verifier key, the checkpoint, the proof, the record's line) an earlier one wrote."""

    lines = _quick_start()
    assert len(lines) >= 6 and lines[-1].startswith("durable-log verify-proof "), lines
    shutil.copytree(made / "demo-store", tmp_path / "orders")
    for line in lines:
        done = run_as_printed(line, tmp_path)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr
    assert "holds" in done.stdout, done.stdout  # verify-proof: the proof and the record check
