"""One I/O fault case: run the writer (``child.py``) with the Nth call of a kind failed, kill
it, give the store another boot (its markers' boot id changed, LMDB's meta pages zeroed: only
the journal's checkpoint holds them, the worst a power cut leaves), open it with a power writer
and check: every acknowledged commit is there (none lost, recovery did not stop early), the open
does not refuse the store, and no call was refused again once the fault was spent (no wedged
writer)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
from dataclasses import dataclass, field

from tools import ROOT, module_command, module_env

CHILD = "tools.harness.iofaults.child"
OTHER_BOOT = b"00000000-0000-0000-0000-000000000000"


@dataclass
class Outcome:
    """What one case found; ``problems`` empty when it passed."""

    kind: str
    nth: int
    errno: int
    fired: bool = False
    acked: int = 0
    refused: int = 0
    replayed: int = 0
    """Journal records the recovery replayed past its checkpoint."""
    counts: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def run_case(
    store: str,
    kind: str,
    nth: int,
    error: int,
    *,
    commits: int = 41,
    seed: int = 1,
    map_size: int = 256 * 1024,
    plant: tuple[str, ...] = (),
    background: bool = False,
    burst: int = 1,
    timeout: float = 120.0,
) -> Outcome:
    outcome = Outcome(kind, nth, error)
    command = [
        *module_command(CHILD),
        store,
        kind,
        str(nth),
        str(error),
        "--commits",
        str(commits),
        "--seed",
        str(seed),
        "--map-size",
        str(map_size),
    ]
    command += (
        [f"--plant={fault}" for fault in plant]
        + (["--background"] if background else [])
        + ["--burst", str(burst)]
    )
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=module_env()
    )
    acked: list[tuple[int, int]] = []
    for line in done.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "ack":
            seq, conversation = rest.split()
            acked.append((int(seq), int(conversation)))
        elif word == "fail":
            outcome.refused += 1
        elif word == "wedged":
            outcome.problems.append(f"WEDGED: refused again after the fault was spent: {rest}")
        elif word == "counts":
            outcome.counts = json.loads(rest)
        elif word == "fired":
            outcome.fired = rest == "1"
    if done.returncode != 0 or not outcome.counts:
        outcome.problems.append(
            f"the writer died (exit {done.returncode}): {done.stderr.strip()[-600:]}"
        )
    outcome.acked = len(acked)
    if not os.path.exists(os.path.join(store, "data.mdb")):
        if acked:
            outcome.problems.append("LOST: no data.mdb, but commits were acknowledged")
        return outcome
    reboot(store)
    outcome.problems.extend(asyncio.run(recovered(store, acked, outcome)))
    return outcome


def reboot(store: str | os.PathLike[str], process: bool = True) -> None:
    """The store as the next boot after a power cut may find it (see the module docstring);
    ``process``: a ``process.unsynced`` marker is given another boot too (False: one left in
    place is looked at on the same boot)."""

    store = os.fspath(store)
    for name in ("power.unsynced", "process.unsynced") if process else ("power.unsynced",):
        marker = os.path.join(store, name)
        if os.path.exists(marker):
            with open(marker, "rb") as file:
                _, _, rest = file.read().partition(b"\n")
            with open(marker, "wb") as file:
                file.write(OTHER_BOOT + b"\n" + rest)
    if os.path.exists(os.path.join(store, "power.unsynced")):
        with open(os.path.join(store, "data.mdb"), "r+b") as file:
            file.write(bytes(8192))


class _Replayed(logging.Handler):
    """The storage's own word of how many journal records its open replayed."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().count("replaying") and len(record.args or ()) >= 2:
            self.count = int(record.args[1])  # type: ignore[index]


async def recovered(store: str, acked: list[tuple[int, int]], outcome: Outcome) -> list[str]:
    from pi_durable.context import BACKGROUND_CONTEXT as CTX
    from pi_durable_lmdb.storage import LmdbStorage

    logger = logging.getLogger("pi_durable_lmdb.storage.lmdb_storage")
    replayed = _Replayed()
    logger.addHandler(replayed)
    propagate, logger.propagate = logger.propagate, False
    try:
        storage = await LmdbStorage.open(store)
    except Exception as error:
        return [f"RECOVERY REFUSED: {type(error).__name__}: {error}"]
    finally:
        logger.removeHandler(replayed)
        logger.propagate = propagate
    outcome.replayed = replayed.count
    problems = []
    try:
        head = storage.log.head()
        last = max((seq for seq, _ in acked), default=0)
        if head < last:
            problems.append(
                f"TRUNCATED: recovery ended at sequence {head}, commits were acknowledged up to {last}"
            )
        for seq, conversation in acked:
            if await storage.conversation(conversation, CTX) is None:
                problems.append(f"LOST: acknowledged commit {seq} (conversation {conversation})")
                if len(problems) > 5:
                    break
    finally:
        await storage.close()
    return problems
