"""Build the recorder with the machine's C compiler and record a writer process under it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tools import module_command, module_env

from .crash import Event, parse

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "recorder.c"
WRITER = "tools.harness.powerloss.writer"


def find_compiler() -> str | None:
    """The C compiler the recorder is built with: ``$CC``, else ``cc`` or ``gcc``; None if none."""

    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build_recorder(directory: str) -> str:
    """Compile ``recorder.c`` into ``directory``; the path of the shared object."""

    compiler = find_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler (cc or gcc) to build the write recorder")
    output = os.path.join(directory, "recorder.so")
    subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wno-format-truncation",
            "-o",
            output,
            str(SOURCE),
            "-ldl",
            "-lpthread",
        ],
        check=True,
        capture_output=True,
    )
    return output


@dataclass(frozen=True)
class Recording:
    durability: str
    seed: int
    batches: int
    events: list[Event]
    workload: str = "single"


def record(
    recorder: str,
    durability: str,
    seed: int,
    batches: int,
    workdir: str | None = None,
    *,
    workload: str = "single",
    drop: str = "",
    fault: str = "",
) -> Recording:
    """Run ``writer.py`` (``workload``) on a new store under the recorder; its events (marks
    included). ``drop``: planted faults, the recorder's ``PL_DROP`` rules (syncs left out);
    ``fault``: one planted in the writer's power journal (``log.journal._faults``)."""

    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="powerloss-rec-")
    try:
        os.makedirs(workdir, exist_ok=True)
        store = os.path.join(workdir, "store")
        shutil.rmtree(store, ignore_errors=True)
        marks = os.path.join(workdir, "marks")
        recording = os.path.join(workdir, "recording")
        for path in (marks, recording):
            if os.path.exists(path):
                os.unlink(path)
        open(marks, "wb").close()
        env = module_env(
            dict(
                os.environ,
                LD_PRELOAD=recorder,
                PL_RECORD=recording,
                PL_STORE=store,
                PL_MARKER=marks,
                PL_EXCLUDE="lock.mdb",
                PL_DROP=drop,
            )
        )
        completed = subprocess.run(
            module_command(
                WRITER,
                store,
                marks,
                "--durability",
                durability,
                "--seed",
                str(seed),
                "--batches",
                str(batches),
                "--workload",
                workload,
                *(["--fault", fault] if fault else []),
            ),
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"the recorded writer failed ({completed.returncode}):\n{completed.stderr[-3000:]}"
            )
        with open(recording, "rb") as file:
            events = parse(file.read(), store)
        return Recording(durability, seed, batches, events, workload)
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
