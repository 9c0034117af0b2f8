"""Explore crash states of recorded writers and check each one (shared by the test and the tool).

For a mode and a seed: record writers (``writer.py``, seeds ``seed``, ``seed + 1``, ...), draw
crash points from each recording (every sync boundary, after every acknowledgement, and random
points) and variants (``none``, ``prefix``, ``subset``, ``torn``), build each distinct state on
disk, and run ``check.py`` over them in batches.

What each mode must survive (what docs/reliability.md promises):

``power``
    every state checks ``ok``: every commit acknowledged before the cut is there exactly,
    nothing partial, ids never handed out twice, the store opens without repair.
``process``
    a state cut while a ``process``-mode writer had the store open (its ``process.unsynced``
    file is on disk) must be ``refused``: the writer open raises ``StoreDamagedError``. Every other
    state must check ``ok``, with every commit acknowledged before the data file's last
    completed sync present.

A power cut is followed by a reboot: a state's ``process.unsynced`` file (if the engine wrote one)
gets the boot id of an earlier boot, as it would hold after a real power cut, and so does the
first line of a journaled power writer's ``power.unsynced``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tools import module_command, module_env

from .crash import (
    FDATASYNC,
    FSYNC,
    MSYNC,
    SYNC,
    VARIANTS,
    WRITE,
    CrashState,
    Event,
    crash_points,
    crash_state,
    marks,
)
from .record import Recording, record

CHECKER = "tools.harness.powerloss.check"
UNSYNCED_FILE = "process.unsynced"
POWER_FILE = "power.unsynced"
EARLIER_BOOT = b"00000000-0000-0000-0000-000000000000\n"
BATCH = 40
COMMANDS = ("import", "restore", "backup", "backup-plain")
"""Workloads that record a durable-log command building a new store (writer.py)."""
COMMAND_DRAWS = 6
"""Random draws per crash point and variant for a backup: its recording is short (LMDB copies a
store in a few big writes), so more of its distinct states come from one recording."""


@dataclass(frozen=True)
class StateId:
    recording_seed: int
    point: int
    variant: str
    seed: int

    def __str__(self) -> str:
        return f"{self.recording_seed}:{self.point}:{self.variant}:{self.seed}"

    @classmethod
    def parse(cls, text: str) -> StateId:
        recording_seed, point, variant, seed = text.split(":")
        return cls(int(recording_seed), int(point), variant, int(seed))


@dataclass
class Failure:
    state: StateId
    problems: list[str]
    detail: str


@dataclass
class Summary:
    mode: str
    states: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    by_variant: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    erasures: dict[str, int] = field(default_factory=dict)
    """The erase workload's states by whether the erasure is in them (present, absent)."""
    trims: dict[str, int] = field(default_factory=dict)
    """The trim workload's states by the trims in them (absent, ``N of M`` intended)."""
    recordings: int = 0
    events: int = 0
    duplicates: int = 0
    seconds: float = 0.0


def expectations(
    events: list[Event], point: int, mode: str, workload: str = "single"
) -> dict[str, Any]:
    """What the recording says a state cut at ``point`` must hold."""

    acked: dict[int, str] = {}
    intents: dict[str, str] = {}  # caller tag -> its batch, until acknowledged ("" for one caller)
    minted_max = 0
    ack_at: dict[int, int] = {}
    created = False
    expect: dict[str, Any] | None = None  # a command workload: what a complete NEWPATH holds
    done = False
    erasure: dict[str, Any] | None = None  # the erase workload's, once intended
    erased_at = -1
    trims: list[dict[str, Any]] = []  # the trim workload's, each once intended
    for index, line in marks(events, point):
        word, _, rest = line.partition(" ")
        word, _, tag = word.partition("@")
        if line == "phase opened":
            created = True
        elif word == "intent":
            intents[tag] = rest
        elif word == "ack":
            acked[int(rest)] = intents.pop(tag, "")
            ack_at[int(rest)] = index
        # a cancelled caller's intent stays possible: its batch may have entered the log
        elif word == "mint":
            minted_max = max(minted_max, int(rest))
        elif word == "expect":
            digest, head, store = rest.split()
            expect = {"digest": digest, "head": int(head), "store": store}
        elif word == "done":
            done = True
        elif word == "erase-intent":
            erasure = json.loads(rest)
        elif word == "erased":
            erased_at = index
        elif word == "trim-intent":
            trims.append({"point": json.loads(rest)["point"], "returned": -1})
        elif word == "trimmed":
            trims[-1]["returned"] = index
    last_sync = -1
    if mode == "power":
        required = sorted(acked)
    else:  # acknowledged before the data file's last completed sync
        last_sync = max(
            (
                event.index
                for event in events[:point]
                if (event.kind in (FSYNC, FDATASYNC) and event.path == "data.mdb")
                or event.kind in (SYNC, MSYNC)
                or (event.kind == WRITE and event.synced and event.path == "data.mdb")
            ),
            default=-1,
        )
        required = sorted(seq for seq, at in ack_at.items() if at < last_sync)
    if erasure is not None:  # required once it returned (process: and the data file synced)
        erasure["required"] = erased_at >= 0 and (mode == "power" or erased_at < last_sync)
    for trim in trims:  # required once it returned (process: and the data file synced)
        returned = trim.pop("returned")
        trim["required"] = returned >= 0 and (mode == "power" or returned < last_sync)
    return {
        "acked": {str(seq): batch for seq, batch in acked.items()},
        "required": required,
        "maybe": sorted(intents.values()),
        "minted_max": minted_max,
        "created": created,
        "expect": expect,
        "done": done,
        "workload": workload,
        "erasure": erasure,
        "trims": trims,
    }


def materialize(state: CrashState, directory: str) -> None:
    """Write the state's files, then reboot: every ``process.unsynced`` file (the store's, or one
    inside a store a command was building) now names an earlier boot."""

    state.write(directory)
    for name in state.files:
        if os.path.basename(name) == UNSYNCED_FILE:
            with open(os.path.join(directory, name), "wb") as file:
                file.write(EARLIER_BOOT)
        elif os.path.basename(name) == POWER_FILE:  # boot id, then the writer life's epoch
            _, newline, rest = state.files[name].partition(b"\n")
            with open(os.path.join(directory, name), "wb") as file:
                file.write(EARLIER_BOOT + rest if newline else EARLIER_BOOT[:-1])


def judge(
    mode: str, state: CrashState, expected: dict[str, Any], result: dict[str, Any]
) -> list[str]:
    """The problems of one checked state under what ``mode`` promises."""

    problems = list(result.get("problems", []))
    if expected["workload"] in COMMANDS:  # a command building NEWPATH: the checker judged it all
        if result.get("outcome") is None:
            problems.append("CHECKER DIED on this state (a crash inside LMDB, or a timeout)")
        return problems
    if not expected["created"]:
        # cut inside the store's first open (nothing acknowledged yet): readers and verify may
        # refuse the half-made store or call it incomplete; the writer must open it and finish it
        problems = [
            p for p in problems if not p.startswith(("VERIFY (as left)", "READ-ONLY OPEN/READ"))
        ]
    outcome = result.get("outcome")
    if outcome == "refused":
        if mode == "power":
            problems.append(f"REFUSED in power mode: {result.get('refusal')}")
        elif UNSYNCED_FILE not in state.files:
            problems.append(f"REFUSED without a process.unsynced file: {result.get('refusal')}")
        else:
            # the promised outcome: every open, read-only ones included, refuses such a store
            problems = [
                f"READ-ONLY OPEN did not refuse: {p}"
                for p in problems
                if p.startswith("READ-ONLY OPEN/READ") and "StoreDamagedError" not in p
            ]
            if result.get("data_file") and not any(
                "StoreDamagedError" in p for p in result.get("problems", [])
            ):
                problems.append("READ-ONLY OPEN did not refuse the store the writer open refused")
    elif mode == "process" and UNSYNCED_FILE in state.files:
        problems.append(
            f"NOT REFUSED: {UNSYNCED_FILE} from an earlier boot is there, the store opened ({outcome})"
        )
    elif outcome is None:
        problems.append("CHECKER DIED on this state (a crash inside LMDB, or a timeout)")
    return problems


def explore(
    mode: str,
    states: int,
    seed: int,
    recorder: str,
    *,
    batches: int = 30,
    workload: str = "single",
    drop: str = "",
    fault: str = "",
    only: StateId | None = None,
    keep: str | None = None,
    say: Callable[[str], None] = print,
    deadline: float | None = None,
) -> Summary:
    """Check ``states`` distinct crash states (or just ``only``); failures are reported to ``say``."""

    summary = Summary(mode)
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix=f"powerloss-{mode}-")
    seen: set[str] = set()
    try:
        recording_seed = seed if only is None else only.recording_seed
        while summary.states < states:
            if deadline is not None and time.monotonic() > deadline:
                say(f"power_loss: stopping at the time limit after {summary.states} states")
                break
            recording = record(
                recorder,
                mode,
                recording_seed,
                batches,
                os.path.join(workdir, "rec"),
                workload=workload,
                drop=drop,
                fault=fault,
            )
            summary.recordings += 1
            summary.events += len(recording.events)
            rng = random.Random(f"{mode}:{recording_seed}")
            if only is not None:
                candidates = [only]
            else:
                points = crash_points(recording.events, rng, randoms=40)
                draws = COMMAND_DRAWS if workload.startswith("backup") else 1
                candidates = [
                    StateId(recording_seed, point, variant, rng.randrange(1 << 30))
                    for point in points
                    for variant in VARIANTS
                    for _ in range(1 if variant == "none" else draws)
                ]
                rng.shuffle(candidates)
            pending: list[tuple[StateId, CrashState]] = []
            for candidate in candidates:
                if summary.states + len(pending) >= states:
                    break
                state = crash_state(
                    recording.events, candidate.point, candidate.variant, candidate.seed
                )
                expected = expectations(recording.events, candidate.point, mode, workload)
                digest = state.digest() + json.dumps(
                    [expected["required"], expected["done"], expected["erasure"], expected["trims"]]
                )
                if digest in seen and only is None:
                    summary.duplicates += 1
                    continue
                seen.add(digest)
                pending.append((candidate, state))
                if len(pending) >= BATCH:
                    _check_batch(mode, recording, pending, workdir, summary, say, keep, fault)
                    pending = []
            if pending:
                _check_batch(mode, recording, pending, workdir, summary, say, keep, fault)
            if only is not None:
                break
            recording_seed += 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary.seconds = time.monotonic() - started
    return summary


def _check_batch(
    mode: str,
    recording: Recording,
    batch: list[tuple[StateId, CrashState]],
    workdir: str,
    summary: Summary,
    say: Callable[[str], None],
    keep: str | None,
    fault: str = "",
) -> None:
    states_dir = os.path.join(workdir, "states")
    shutil.rmtree(states_dir, ignore_errors=True)
    jobs = []
    by_id: dict[str, tuple[StateId, CrashState, str]] = {}
    for number, (state_id, state) in enumerate(batch):
        directory = os.path.join(states_dir, str(number))
        materialize(state, directory)
        job = {
            "id": str(state_id),
            "dir": directory,
            **expectations(recording.events, state_id.point, mode, recording.workload),
        }
        jobs.append(job)
        by_id[str(state_id)] = (state_id, state, directory)
    results: dict[str, dict[str, Any]] = {}
    remaining = jobs
    while remaining:
        jobs_path = os.path.join(workdir, "jobs.json")
        results_path = os.path.join(workdir, "results.jsonl")
        with open(jobs_path, "w", encoding="utf-8") as file:
            json.dump(remaining, file)
        if os.path.exists(results_path):
            os.unlink(results_path)
        completed = subprocess.run(
            module_command(CHECKER, jobs_path, results_path),
            capture_output=True,
            text=True,
            timeout=600,
            env=module_env(),
        )
        started: list[str] = []
        with open(results_path, encoding="utf-8") as file:
            for line in file:
                row = json.loads(line)
                if "start" in row:
                    started.append(row["start"])
                else:
                    results[row["id"]] = row
        if completed.returncode == 0 or not started or started[-1] in results:
            break
        # the checker died on the last state it started: record that, go on with the rest
        dead = started[-1]
        results[dead] = {
            "id": dead,
            "outcome": None,
            "problems": [],
            "stderr": completed.stderr[-500:],
        }
        ids = [job["id"] for job in remaining]
        remaining = remaining[ids.index(dead) + 1 :]
    for state_id, state, directory in by_id.values():
        result = results.get(str(state_id), {"outcome": None, "problems": []})
        summary.states += 1
        summary.by_variant[state_id.variant] = summary.by_variant.get(state_id.variant, 0) + 1
        problems = judge(
            mode,
            state,
            expectations(recording.events, state_id.point, mode, recording.workload),
            result,
        )
        if problems:
            outcome = "failed"
        elif result.get("outcome") in ("absent", "complete"):
            outcome = str(result["outcome"])  # a command's NEWPATH: not there yet, or whole
        elif result.get("outcome") == "refused":
            outcome = "refused"
        elif result.get("problems"):
            outcome = (
                "not made yet"  # cut in the first open: readers refused, the writer finished it
            )
        else:
            outcome = "ok"
        summary.outcomes[outcome] = summary.outcomes.get(outcome, 0) + 1
        if "erasure" in result:
            summary.erasures[result["erasure"]] = summary.erasures.get(result["erasure"], 0) + 1
        if "trim" in result:
            summary.trims[result["trim"]] = summary.trims.get(result["trim"], 0) + 1
        if problems:
            point_event = recording.events[state_id.point - 1] if state_id.point else None
            detail = (
                f"cut after {state_id.point} of {len(recording.events)} events (last: {point_event}); "
                f"{state.pending} changes pending, {state.kept} kept; files {sorted((n, len(c)) for n, c in state.files.items())}"
            )
            failure = Failure(state_id, problems, detail)
            summary.failures.append(failure)
            say(f"FAIL {mode} state {state_id}: {detail}")
            for problem in problems[:6]:
                say(f"    {problem}")
            extra = f" --workload {recording.workload}" if recording.workload != "single" else ""
            extra += f" --fault {fault}" if fault else ""
            say(
                f"    reproduce: python -m tools.harness.power_loss --mode {mode} --state {state_id} --batches {recording.batches}{extra}"
            )
            if keep:
                target = os.path.join(keep, f"{mode}-{str(state_id).replace(':', '-')}")
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(directory, target)
                say(f"    state kept in {target}")
