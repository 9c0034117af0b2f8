"""Simulated power loss: record real writers, build the disk states a power cut could leave, check each.

Usage::

    python -m tools.harness.power_loss --mode power --states 2000 --seed 1
    python -m tools.harness.power_loss --mode process --states 2000 --seed 1 --keep /tmp/failing
    python -m tools.harness.power_loss --mode power --state 3:412:torn:99   # one state again
    python -m tools.harness.power_loss --mode power --workload group --states 1500
    python -m tools.harness.power_loss --mode power --workload group --drop fdatasync:data.mdb   # must fail

Each writer (``tools/harness/powerloss/writer.py``) runs under an ``LD_PRELOAD`` write recorder built with
the machine's C compiler; see ``tools/harness/powerloss/`` for how states are built and what is checked.
Every failing state is printed with the command that reproduces it. The last line is always
``power_loss: N states, M failures``. Exit status 0 when M is 0, 1 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

from tools.harness.powerloss.explore import StateId, explore
from tools.harness.powerloss.record import build_recorder


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mode",
        choices=["power", "process"],
        default="power",
        help="the durability mode recorded (default power)",
    )
    parser.add_argument("--states", type=int, default=500, help="distinct crash states to check")
    parser.add_argument(
        "--seed", type=int, default=1, help="first recording's seed (later ones count up)"
    )
    parser.add_argument(
        "--batches",
        type=int,
        help="batches each recorded writer commits (default 30; trim 36, so it trims twice)",
    )
    parser.add_argument(
        "--workload",
        choices=[
            "single",
            "group",
            "documents",
            "longdocs",
            "erase",
            "trim",
            "import",
            "restore",
            "backup",
            "backup-plain",
        ],
        default="single",
        help="single: one committer; group: concurrent callers (group commit), some cancelled; "
        "documents: one committer on documents past a chunk (head rows, snapshots); "
        "longdocs: one committer on documents many chunks long (every read checked); "
        "erase: one committer, one conversation erased two thirds in (all or nothing); "
        "trim: one committer, the log trimmed two thirds in and near the end (all or nothing); "
        "import, restore (a real nats-server), backup (--compact), backup-plain: the durable-log "
        "command building NEWPATH (the mode is then the source's, not the command's)",
    )
    parser.add_argument(
        "--drop",
        default="",
        help="planted faults: the recorder leaves these syncs out "
        "(KIND:PATH-SUFFIX,...; KIND fsync, fdatasync, dirsync or dsync); a sound workload must then fail",
    )
    parser.add_argument(
        "--fault",
        default="",
        choices=["", "skip-journal-flush", "skip-pin", "recycle-early", "split-trim"],
        help="a planted fault in the power writer's journal (log.journal._faults), or (trim "
        "workload) a trim whose records are dropped in a transaction after its base's; the "
        "explorer must then fail",
    )
    parser.add_argument("--state", help="check one state again: RECORDING_SEED:POINT:VARIANT:SEED")
    parser.add_argument("--keep", help="copy every failing state's files into this directory")
    parser.add_argument(
        "--minutes", type=float, help="stop after this long (the last line still counts)"
    )
    args = parser.parse_args()
    if args.batches is None:
        args.batches = 36 if args.workload == "trim" else 30
    with tempfile.TemporaryDirectory(prefix="powerloss-cc-") as build:
        recorder = build_recorder(build)
        only = StateId.parse(args.state) if args.state else None
        deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
        summary = explore(
            args.mode,
            1 if only else args.states,
            args.seed,
            recorder,
            batches=args.batches,
            workload=args.workload,
            drop=args.drop,
            fault=args.fault,
            only=only,
            keep=args.keep,
            say=lambda line: print(line, flush=True),
            deadline=deadline,
        )
    print(
        f"{summary.recordings} recordings ({summary.events} events), outcomes {summary.outcomes}, "
        f"variants {summary.by_variant}, {summary.duplicates} duplicate states skipped, {summary.seconds:.0f} s"
        + (f", erasure {summary.erasures}" if summary.erasures else "")
        + (f", trims {summary.trims}" if summary.trims else ""),
        flush=True,
    )
    print(f"power_loss: {summary.states} states, {len(summary.failures)} failures", flush=True)
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
