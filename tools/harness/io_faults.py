"""I/O fault injection for the power writer's journal: fail the Nth os call of each kind with ENOSPC
or EIO in a real writer, kill it, reboot its store, and check what recovery gives back.

Usage::

    python -m tools.harness.io_faults                          # every kind, ENOSPC and EIO, 3 calls of each
    python -m tools.harness.io_faults --kinds create,zero-fill --errors ENOSPC --calls 5
    python -m tools.harness.io_faults --burst 2                # two calls in a row fail (a frame and its unmaking)
    python -m tools.harness.io_faults --plant segment-gap      # a planted bug: must fail

Kinds (``tools/harness/iofaults/inject.py``): create, zero-fill, header, rename, segsync, dirsync, frame,
flush, checkpoint. A run without faults first counts each kind's calls; the calls failed are
spread over that count (the first, the last, and between; with ``--background`` the counts vary
from run to run, so a case may never meet its fault: it is counted, not failed); it also finds the
writer's map size (``MAP_TRIES``) at which a commit meets a full map after its frame was written,
so that ``unmake`` is called. Each case checks (``check.py``): no
acknowledged commit lost after recovery, recovery never refuses nor stops early, and the writer
is not wedged (every refused call succeeds when tried again, the fault spent). The last line is
always ``io_faults: N cases, M failures``; exit status 0 when M is 0, 1 otherwise.
"""

from __future__ import annotations

import argparse
import errno
import shutil
import sys
import tempfile
import time

from tools.harness.iofaults.check import Outcome, run_case
from tools.harness.iofaults.inject import KINDS

ERRORS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO}
MAP_SIZE = 256 * 1024
"""The writer's first LMDB map: small, so that it fills (and grows) a few times in a run."""
MAP_TRIES = 64
"""Map sizes, a page apart from ``MAP_SIZE`` down, the run without faults tries until one fills
the map at a commit after its frame was written (LMDB finds the map full inside the
transaction's work, before any frame, or at its commit, after it: which one depends on where
the pages run out, and only the second unmakes a frame)."""


def spread(count: int, calls: int) -> list[int]:
    """``calls`` call numbers among 1..count: the first, the last, and evenly between."""

    if count <= calls:
        return list(range(1, count + 1))
    if calls == 1:
        return [(count + 1) // 2]
    return sorted({1 + round(index * (count - 1) / (calls - 1)) for index in range(calls)})


def explore(
    kinds: list[str],
    errors: list[str],
    calls: int,
    *,
    commits: int = 41,
    seed: int = 1,
    plant: tuple[str, ...] = (),
    background: bool = False,
    burst: int = 1,
    say=print,
    deadline: float | None = None,
) -> list[Outcome]:
    """Every case; each outcome printed as it is known (``say``)."""

    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="io-faults-") as work:
        for attempt in range(MAP_TRIES if "unmake" in kinds else 1):
            map_size = MAP_SIZE - attempt * 4096
            baseline = run_case(
                f"{work}/baseline-{attempt}",
                KINDS[0],
                0,
                errno.EIO,
                commits=commits,
                seed=seed,
                map_size=map_size,
                background=background,
            )
            if baseline.problems:
                say(f"io_faults: the run without faults fails: {baseline.problems}")
                return [baseline]
            if baseline.counts.get("unmake", 0):
                break
        say(f"io_faults: calls without faults: {baseline.counts} (map of {map_size} bytes)")
        number = 0
        for kind in kinds:
            for name in errors:
                for nth in spread(baseline.counts.get(kind, 0), calls):
                    if deadline is not None and time.monotonic() > deadline:
                        return outcomes
                    number += 1
                    store = f"{work}/case-{number}"
                    outcome = run_case(
                        store,
                        kind,
                        nth,
                        ERRORS[name],
                        commits=commits,
                        seed=seed,
                        map_size=map_size,
                        plant=plant,
                        background=background,
                        burst=burst,
                    )
                    shutil.rmtree(store, ignore_errors=True)
                    outcomes.append(outcome)
                    verdict = (
                        "ok" if not outcome.problems else "FAIL: " + "; ".join(outcome.problems)
                    )
                    if (
                        not outcome.fired
                    ):  # fewer calls than without faults (checkpoints on a thread vary)
                        verdict += " (the fault never fired)"
                    say(
                        f"{kind} call {nth} {name}: {outcome.acked} acknowledged, {outcome.refused} refused, "
                        f"{outcome.replayed} replayed, {verdict}"
                    )
    return outcomes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="comma-separated kinds of call to fail (default: all)",
    )
    parser.add_argument(
        "--errors", default="ENOSPC,EIO", help="comma-separated: ENOSPC, EIO (default both)"
    )
    parser.add_argument(
        "--calls", type=int, default=3, help="calls of each kind to fail, one per case (default 3)"
    )
    parser.add_argument(
        "--commits", type=int, default=41, help="commits each writer makes (default 41)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--burst",
        type=int,
        default=1,
        help="consecutive calls of the kind that fail in each case (default 1)",
    )
    parser.add_argument(
        "--background",
        action="store_true",
        help="checkpoints on their own thread (the default of LmdbStorage.open)",
    )
    parser.add_argument(
        "--plant",
        default="",
        choices=["", "segment-gap"],
        help="a planted bug in the journal (log.journal._faults): the run must then fail",
    )
    parser.add_argument(
        "--minutes", type=float, help="stop after this long (the last line still counts)"
    )
    args = parser.parse_args()
    kinds = [kind for kind in args.kinds.split(",") if kind]
    errors = [name for name in args.errors.split(",") if name]
    unknown = [kind for kind in kinds if kind not in KINDS] + [
        name for name in errors if name not in ERRORS
    ]
    if unknown:
        parser.error(f"unknown kinds or errors: {', '.join(unknown)}")
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    began = time.monotonic()
    outcomes = explore(
        kinds,
        errors,
        args.calls,
        commits=args.commits,
        seed=args.seed,
        plant=(args.plant,) if args.plant else (),
        background=args.background,
        burst=args.burst,
        say=lambda line: print(line, flush=True),
        deadline=deadline,
    )
    failures = [outcome for outcome in outcomes if outcome.problems]
    idle = sum(1 for outcome in outcomes if not outcome.fired)
    if idle:
        print(
            f"{idle} cases never met their fault (fewer calls of the kind than the run without faults made)",
            flush=True,
        )
    print(
        f"{sum(o.refused for o in outcomes)} calls refused, {sum(o.acked for o in outcomes)} commits acknowledged, "
        f"{sum(o.replayed for o in outcomes)} journal records replayed, "
        f"{time.monotonic() - began:.0f} s",
        flush=True,
    )
    print(f"io_faults: {len(outcomes)} cases, {len(failures)} failures", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
