"""Kill a writer at random moments, many rounds on one store, and check nothing acknowledged is lost.

Each round starts ``tools/harness/crash_writer.py write`` on the store: a real process committing
mixed batches through ``LmdbStorage`` (entries, task replacements, document create / change /
retire, forks copying documents), printing every acknowledged sequence and every minted id. The
harness SIGKILLs it at a random moment, then starts ``tools/harness/crash_writer.py check``, a fresh
process that opens the store and checks that

* every acknowledged commit is in the log, whole and exactly as the writer sent it, and every
  record an earlier check saw is still there byte for byte;
* the log holds nothing else but, at most, the one batch the writer was committing when it was
  killed (whole, never partial);
* the projections match a fresh fold of the log (``pi_durable_lmdb.audit.verify``), before and after the
  checker's own commit;
* a new commit gets the next sequence, and ``mint_id()`` returns an id above every stored id and
  every id handed out before.

Round kinds (in a fixed rotation): ``normal``; ``rebuild`` (the writer bumps
``pi_durable_lmdb.projections.tables.SCHEMA_VERSION`` so its open rebuilds the projections, and is killed after a
random number of rebuild chunks); ``tiny-map`` (the writer opens with ``map_size=64 KiB`` and writes
bigger batches, so the map grows under it; it is often killed right after it announces a growth);
``group`` (16 concurrent agents commit at once, so commits share write transactions and syncs; it
is killed while groups are in flight, leaving up to one pending batch per agent, each whole or
absent).

Usage::

    python -m tools.harness.crash_harness --rounds 200 --store /tmp/crash-store --durability mixed
    python -m tools.harness.crash_harness --rounds 30 --json          # a temporary store, JSON summary

Exit status 0 when every round passed, 1 otherwise (the problems are printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve().parent / "crash_writer.py"
"""The writer and checker process, run as a script: it imports only the installed package."""
KINDS = ("normal", "rebuild", "normal", "tiny-map", "normal", "group")
GROUP_AGENTS = 16
TINY_MAP = 64 * 1024
FOLD_CHUNK = 256  # records per rebuild transaction in rebuild rounds (passed to the writer)


@dataclass
class Summary:
    rounds: int = 0
    kills: int = 0
    acknowledged: int = 0
    adopted: int = 0
    """Batches committed whole but killed before the writer could print their sequence."""
    pending_absent: int = 0
    """Batches being committed at the kill that are not in the log (never acknowledged)."""
    log_records: int = 0
    minted: int = 0
    entries_read_back: int = 0
    rebuild_rounds: int = 0
    kills_mid_rebuild: int = 0
    tiny_map_rounds: int = 0
    group_rounds: int = 0
    group_acknowledged: int = 0
    growths: int = 0
    kills_after_growth: int = 0
    kills_during_open: int = 0
    writer_errors: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


class Round:
    """One writer process, its output file, and when to kill it."""

    def __init__(
        self,
        store: Path,
        work: Path,
        number: int,
        kind: str,
        durability: str,
        rng: random.Random,
        max_delay: float,
        head: int,
    ) -> None:
        self.number, self.kind, self.durability = number, kind, durability
        self.out_path = work / f"round-{number:05d}.out"
        args = [
            sys.executable,
            str(CHILD),
            "write",
            str(store),
            "--seed",
            str(rng.randrange(2**32)),
            "--durability",
            durability,
        ]
        if kind == "rebuild":
            args += ["--bump-schema", "--fold-chunk", str(FOLD_CHUNK)]
        if kind == "tiny-map":
            args += ["--map-size", str(TINY_MAP), "--pad", "16384"]
        if kind == "group":
            args += ["--agents", str(GROUP_AGENTS)]
        self.rng = rng
        self.max_delay = max_delay
        self.head = head
        self.out = open(self.out_path, "wb")
        env = dict(os.environ)
        self.proc = subprocess.Popen(
            args, stdout=self.out, stderr=subprocess.STDOUT, cwd=ROOT, env=env
        )

    def lines(self) -> list[str]:
        data = self.out_path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]  # a line cut by the kill is not evidence
        return complete.decode("utf-8", "replace").splitlines()

    def _wait_for(self, predicate: Any, timeout: float) -> list[str] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.lines()
            if predicate(lines):
                return lines
            if self.proc.poll() is not None:
                return None
            time.sleep(0.002)
        return None

    def run_and_kill(self) -> str:
        """Wait for the moment chosen for this round, SIGKILL the writer; returns when it hit."""

        rng = self.rng
        started = self._wait_for(lambda lines: any(line == "opening" for line in lines), 30)
        if started is None:
            return self._finish("exited before opening")
        if self.kind == "rebuild":
            chunks = max(1, math.ceil(self.head / FOLD_CHUNK))
            target = rng.randint(1, max(1, chunks - 1))  # the last chunk is followed by the swap
            hit = self._wait_for(
                lambda lines: (
                    sum(line.startswith("progress ") for line in lines) >= target
                    or any(line.startswith("opened") for line in lines)
                ),
                60,
            )
            time.sleep(rng.uniform(0, 0.002))
            moment = f"after rebuild chunk {target}/{chunks}" if hit else "rebuild wait timed out"
        elif self.kind == "tiny-map" and rng.random() < 0.6:
            hit = self._wait_for(lambda lines: any(line.startswith("grow ") for line in lines), 5)
            time.sleep(rng.uniform(0, 0.003))
            moment = "right after a map growth" if hit else "no growth seen"
        elif rng.random() < 0.15:
            time.sleep(rng.uniform(0, 0.05))
            moment = "during open"
        else:
            self._wait_for(lambda lines: "ready" in lines, 60)
            time.sleep(rng.uniform(0, self.max_delay))
            moment = "while committing"
        return self._finish(moment)

    def _finish(self, moment: str) -> str:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.out.close()
        return moment


def parse(lines: list[str]) -> dict[str, Any]:
    acked: dict[int, str] = {}
    minted: list[int] = []
    intents: dict[str, str] = {}  # agent tag ("" for a lone writer) -> its batch in flight
    events = {"opened": False, "grows": 0, "progress": 0, "error": None, "closed": False}
    for line in lines:
        word, _, rest = line.partition(" ")
        word, _, tag = word.partition("#")
        if word == "intent":
            intents[tag] = rest
        elif word == "ack":
            intent = intents.pop(tag, None)
            assert intent is not None, f"ack#{tag} without intent"
            if int(rest) in acked:
                raise AssertionError(f"sequence {rest} acknowledged twice")
            acked[int(rest)] = intent
        elif word == "mint":
            minted.append(int(rest))
        elif word == "opened":
            events["opened"] = True
        elif word == "grow":
            events["grows"] += 1
        elif word == "progress":
            events["progress"] += 1
        elif word == "error":
            events["error"] = json.loads(rest)
        elif word == "closed":
            events["closed"] = True
    pending = list(intents.values())
    return {"acked": acked, "pending": pending, "minted": minted, "events": events}


def run(args: argparse.Namespace) -> Summary:
    rng = random.Random(args.seed)
    summary = Summary()
    store = Path(args.store) if args.store else None
    temp = tempfile.mkdtemp(prefix="crash-harness-")
    work = Path(temp)
    if store is None:
        store = work / "store"
    elif store.exists() and any(store.iterdir()):
        raise SystemExit(f"crash_harness: {store} is not empty; give a new or empty directory")
    digests: dict[str, str] = {}
    checked_head = 0
    minted_max = 0
    started = time.monotonic()
    try:
        for number in range(args.rounds):
            kind = KINDS[number % len(KINDS)] if number else "normal"
            durability = args.durability
            if durability == "mixed":  # group rounds fall on odd numbers: alternate them apart
                durability = ("process", "power")[
                    (number // len(KINDS) if kind == "group" else number) % 2
                ]
            round_ = Round(store, work, number, kind, durability, rng, args.max_delay, checked_head)
            moment = round_.run_and_kill()
            summary.rounds += 1
            summary.kills += 1
            parsed = parse(round_.lines())
            events = parsed["events"]
            if events["error"] is not None:
                summary.writer_errors += 1
                summary.problems.append(
                    f"round {number} ({kind}): the writer failed:\n{events['error']}"
                )
            summary.kills_during_open += not events["opened"]
            summary.rebuild_rounds += kind == "rebuild"
            summary.tiny_map_rounds += kind == "tiny-map"
            summary.group_rounds += kind == "group"
            summary.group_acknowledged += len(parsed["acked"]) if kind == "group" else 0
            summary.growths += events["grows"]
            summary.kills_after_growth += (
                kind == "tiny-map" and moment == "right after a map growth"
            )
            minted_max = max([minted_max, *parsed["minted"]])
            summary.minted += len(parsed["minted"])

            ledger = {
                "digests": digests,
                "acked": {str(seq): batch for seq, batch in parsed["acked"].items()},
                "pending": parsed["pending"],
                "checked_head": checked_head,
                "minted_max": minted_max,
            }
            ledger_path = work / f"ledger-{number:05d}.json"
            result_path = work / f"result-{number:05d}.json"
            ledger_path.write_text(json.dumps(ledger))
            check = subprocess.run(
                [
                    sys.executable,
                    str(CHILD),
                    "check",
                    str(store),
                    "--ledger",
                    str(ledger_path),
                    "--result",
                    str(result_path),
                ],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env=dict(os.environ),
                timeout=300,
            )
            if check.returncode != 0 or not result_path.exists():
                summary.problems.append(
                    f"round {number} ({kind}, {moment}): the checker failed:\n{check.stdout}{check.stderr}"
                )
                break
            result = json.loads(result_path.read_text())
            for problem in result["problems"]:
                summary.problems.append(
                    f"round {number} ({kind}, {durability}, killed {moment}): {problem}"
                )
            before = result.get("verify_before")
            if before is not None and not before.startswith("skipped"):
                summary.problems.append(
                    f"round {number} ({kind}, killed {moment}): verify before reopening: {before}"
                )
            summary.kills_mid_rebuild += kind == "rebuild" and result.get("building") is not None
            summary.acknowledged += len(parsed["acked"])
            summary.adopted += len(result.get("adopted", {}))
            summary.pending_absent += len(parsed["pending"]) - len(result.get("adopted", {}))
            summary.entries_read_back += result.get("entries_checked", 0)
            digests.update(result.get("digests", {}))
            checked_head = result.get("check_seq", checked_head)
            minted_max = max(minted_max, result.get("minted_after", 0))
            summary.log_records = checked_head
            if args.verbose:
                print(
                    f"round {number:4d} {kind:8s} {durability:7s} killed {moment:26s} "
                    f"acked {len(parsed['acked']):5d} adopted {len(result.get('adopted', {}))} head {checked_head}",
                    file=sys.stderr,
                )
            if summary.problems and not args.keep_going:
                break
            round_.out_path.unlink()
            ledger_path.unlink()
            result_path.unlink()
    finally:
        summary.seconds = round(time.monotonic() - started, 1)
        if summary.problems or args.keep_work:
            print(f"crash_harness: work files kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--store", help="a new or empty directory (default: a temporary one)")
    parser.add_argument("--durability", choices=("power", "process", "mixed"), default="power")
    parser.add_argument(
        "--seed", type=int, default=None, help="seed the kill moments and the batches"
    )
    parser.add_argument(
        "--max-delay",
        type=float,
        default=0.5,
        help="longest run of a writer before its kill, in seconds",
    )
    parser.add_argument(
        "--keep-going", action="store_true", help="run every round even after a problem"
    )
    parser.add_argument(
        "--keep-work", action="store_true", help="keep writer outputs, ledgers and results"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per round on stderr")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(2**32)
    summary = run(args)
    if args.json:
        print(json.dumps({"seed": args.seed, **asdict(summary)}))
    else:
        info = asdict(summary)
        problems = info.pop("problems")
        print(f"seed {args.seed}")
        for name, value in info.items():
            print(f"{name:20s} {value}")
        for problem in problems:
            print("PROBLEM", problem)
    return 1 if summary.problems else 0


if __name__ == "__main__":
    sys.exit(main())
