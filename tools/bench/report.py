"""Benchmark LmdbStorage against pi-durable's own backends (SQLite, memory, JSONL), in one run.

Every workload (``tools/bench/workloads.py``) drives only the ``Storage`` API, on fresh stores in a
temporary directory. Backends are interleaved within each round (A, B, C, A, B, C, ... with the
order rotated every round), so slow phases of a shared, noisy machine hit all of them alike. Only
ratios from one run mean anything: the ratio column is ``sqlite_time / other_time`` taken per round
(paired) and then the median over rounds; > 1 means faster than SQLite.

Durability classes, compared only within a class:

``process``  LmdbStorage ``durability="process"`` | SQLite WAL + ``synchronous=NORMAL`` (the
             default of ``open_posix_sqlite_storage``) | JSONL without fsync | MemoryStorage
``power``    LmdbStorage ``durability="power"`` | SQLite WAL + ``synchronous=FULL`` | JSONL with
             ``fsync`` (pi-durable fsyncs the sidecar files, not the main file)

Commit workloads run in both classes; reads (durability-independent) in ``process`` only.

Usage::

    python -m tools.bench                      # default run, ~10 minutes (the Session host: --host-rounds)
    python -m tools.bench --quick              # ~30 s smoke run
    python -m tools.bench --long               # also host_100000: 100,000 Session turns, one round
    python -m tools.bench --only commit_turn --only read_point --scale 2 --rounds 7
    python -m tools.bench --markdown docs/bench-table.md
    python -m tools.bench --rss                # also peak RSS per workload, one subprocess each
    python -m tools.bench --profile --only read_point   # cProfile of the LMDB path only
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools import ROOT, module_command, module_env
from tools.bench.flush import overwrite_flush_seconds
from tools.bench.host import HOST_WORKLOADS, LONG_WORKLOADS
from tools.bench.report_markdown import BACKENDS, LABELS, Results, Series, render, write_markdown
from tools.bench.workloads import WORKLOADS as COMMON_WORKLOADS
from tools.bench.workloads import Workload

WORKLOADS: dict[str, Workload] = {**COMMON_WORKLOADS, **HOST_WORKLOADS}
"""Every workload of the run: ``workloads``'s, then the Session host's (``host``),
which runs both durability classes in the same rounds."""

MODE_BACKENDS = {
    "process": ("lmdb", "sqlite", "memory", "jsonl"),
    "power": ("lmdb", "sqlite", "jsonl", "floor"),
}


# ── stores ───────────────────────────────────────────────────────────────────


LMDB_OPTIONS: dict[str, Any] = {}
"""Extra ``LmdbStorage.open`` arguments for the whole run (``--no-read-checksums``)."""


class OneFlush:
    """The floor of a one-flush ``power`` commit on this engine: ``LmdbStorage`` in ``process``
    mode (the whole commit path, nothing synced) behind one journal-like flush per commit: 1 KiB
    written at the next offset of a preallocated, zero-filled file, then ``fdatasync``, as
    ``log.journal`` writes a frame (``mint_id`` reserves ids in blocks, as the store's own does). No
    checkpoint, no pin, nothing recoverable: what ``power`` would cost if keeping ``data.mdb``
    recoverable were free."""

    SIZE = 4 << 20
    BLOCK = b"j" * 1024

    def __init__(self, storage: Any, path: str) -> None:
        self._storage = storage
        self._fd = os.open(os.path.join(path, "floor.journal"), os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(self._fd, bytes(self.SIZE), 0)
        os.fsync(self._fd)
        self._offset = 0

    def _flush(self) -> None:
        os.pwrite(self._fd, self.BLOCK, self._offset)
        os.fdatasync(self._fd)
        self._offset = (self._offset + len(self.BLOCK)) % self.SIZE

    async def commit(self, *args: Any, **kwargs: Any) -> Any:
        self._flush()
        return await self._storage.commit(*args, **kwargs)

    async def close(self, *args: Any, **kwargs: Any) -> Any:
        os.close(self._fd)
        return await self._storage.close(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


class Store:
    """One backend's store in its own directory; ``open`` again reopens the same files."""

    def __init__(self, backend: str, mode: str, path: str) -> None:
        self.backend, self.mode, self.path = backend, mode, path
        self.storage: Any = None

    async def open(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        if self.backend == "lmdb":
            from pi_durable_lmdb.storage import LmdbStorage

            self.storage = await LmdbStorage.open(self.path, durability=self.mode, **LMDB_OPTIONS)
        elif self.backend == "floor":
            from pi_durable_lmdb.storage import LmdbStorage

            self.storage = OneFlush(
                await LmdbStorage.open(self.path, durability="process", **LMDB_OPTIONS), self.path
            )
        elif self.backend == "sqlite":
            from pi_durable.storage.sqlite.posix import open_posix_sqlite_storage

            storage = await open_posix_sqlite_storage(os.path.join(self.path, "durable.sqlite"))
            if self.mode == "power":
                await storage._db.exec("PRAGMA synchronous = FULL")
            row = await storage._db.get("PRAGMA synchronous")
            wanted = 2 if self.mode == "power" else 1
            if row is None or next(iter(row.values())) != wanted:
                raise RuntimeError(f"SQLite synchronous is {row}, wanted {wanted}")
            self.storage = storage
        elif self.backend == "memory":
            from pi_durable.storage.memory import MemoryStorage

            if self.storage is not None:
                raise RuntimeError("MemoryStorage cannot be reopened")
            self.storage = MemoryStorage()
        elif self.backend == "jsonl":
            from pi_durable.env.posix import PosixExecutionEnv
            from pi_durable.storage.jsonl import JsonlStorage

            options = {"fsync": self.mode == "power"}
            self.storage = await JsonlStorage.open(self.path, PosixExecutionEnv(), CTX, options)
        else:
            raise ValueError(self.backend)

    async def close(self) -> None:
        await self.storage.close(CTX)

    def disk_bytes(self) -> int:
        total = 0
        for root, _dirs, files in os.walk(self.path):
            for name in files:
                try:
                    total += os.path.getsize(os.path.join(root, name))
                except FileNotFoundError:
                    pass
        return total


# ── running ──────────────────────────────────────────────────────────────────


def engine_counts(store: Store) -> tuple[int, ...] | None:
    """A ``power`` LMDB store's commit counters now (``log.counters``), for ``Results.paths``:
    batches committed, those committed on the caller's thread, device flushes, checkpoints,
    journal segment switches and segments made ahead; None for another backend or class, or an
    engine without these counters."""

    if store.backend != "lmdb" or store.mode != "power":
        return None
    counters = store.storage.counters
    try:
        return (
            int(counters.group_batches.sum),
            counters.direct_commits,
            counters.device_flushes,
            counters.checkpoints,
            counters.segment_switches,
            counters.segments_ahead,
        )
    except AttributeError:
        return None


async def measure_counted(
    workload: Workload, store: Store, state: Any, round: int, results: Results
) -> dict[str, tuple[float, int, Any]]:
    """``workload.measure``, and for a ``power`` LMDB store what its commits did meanwhile
    (which path, how many flushes: ``Results.paths``)."""

    before = engine_counts(store)
    timings = await workload.measure(store, state, round)
    after = engine_counts(store)
    if before is not None and after is not None and round >= 0:
        results.paths.setdefault(workload.name, []).append(
            tuple(b - a for a, b in zip(before, after))
        )
    return timings


def rotated(items: tuple[Any, ...], round: int) -> list[Any]:
    shift = round % len(items)
    return list(items[shift:] + items[:shift])


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def source_version() -> str:
    """The git commit of the engine benchmarked, marked dirty when ``src/`` has local changes."""

    root = str(ROOT)
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes in src/" if dirty else "")


async def run_fresh(
    workload: Workload,
    pairs: tuple[tuple[str, str], ...],
    rounds: int,
    scale: float,
    base: str,
    results: Results,
) -> None:
    """A fresh store per (mode, backend) pair and round, the pairs rotated every round (so two
    durability classes can share rounds: ``host``)."""

    for round in range(rounds):
        for mode, backend in rotated(pairs, round):
            store = Store(
                backend, mode, os.path.join(base, f"{workload.name}-{mode}-{backend}-{round}")
            )
            await store.open()
            state = await workload.populate(store, scale)
            gc.collect()
            timings = await measure_counted(workload, store, state, round, results)
            results.add(mode, backend, round, timings)
            await store.close()
            results.sizes.setdefault((workload.name, mode, backend), []).append(
                (store.disk_bytes(), workload.commits(state))
            )
            shutil.rmtree(store.path, ignore_errors=True)
        _log(
            f"  {workload.name} [{', '.join(sorted({mode for mode, _ in pairs}))}] round {round + 1}/{rounds}"
        )


async def run_workload(
    workload: Workload,
    mode: str,
    backends: tuple[str, ...],
    rounds: int,
    scale: float,
    base: str,
    results: Results,
) -> None:
    key = f"{workload.name}-{mode}"
    if workload.fresh:
        await run_fresh(
            workload, tuple((mode, backend) for backend in backends), rounds, scale, base, results
        )
        return
    stores: dict[str, tuple[Store, Any]] = {}
    for backend in backends:
        store = Store(backend, mode, os.path.join(base, f"{key}-{backend}"))
        await store.open()
        started = time.perf_counter()
        stores[backend] = (store, await workload.populate(store, scale))
        _log(
            f"  {workload.name} [{mode}] populated {backend} in {time.perf_counter() - started:.1f} s"
        )
    for backend in backends:  # warm-up pass, not recorded
        store, state = stores[backend]
        await workload.measure(store, state, -1)
    for round in range(rounds):
        for backend in rotated(backends, round):
            store, state = stores[backend]
            gc.collect()
            results.add(
                mode, backend, round, await measure_counted(workload, store, state, round, results)
            )
        _log(f"  {workload.name} [{mode}] round {round + 1}/{rounds}")
    for backend, (store, state) in stores.items():
        await store.close()
        if backend != "memory":
            results.sizes.setdefault((workload.name, mode, backend), []).append(
                (store.disk_bytes(), workload.commits(state))
            )
        shutil.rmtree(store.path, ignore_errors=True)


def _check_digests(results: Results) -> None:
    rows: dict[tuple[str, str], dict[str, Series]] = {}
    for (row, mode, backend), series in results.series.items():
        rows.setdefault((row, mode), {})[backend] = series
    for (row, mode), by_backend in rows.items():
        reference = by_backend.get("sqlite")
        if reference is None:
            continue
        for backend, series in by_backend.items():
            for round, digest in series.digests.items():
                expected = reference.digests.get(round)
                if digest != expected:
                    results.mismatches.append(
                        f"{row} [{mode}] round {round}: {backend} answered {digest!r}, sqlite {expected!r}"
                    )


async def run_all(args: argparse.Namespace, names: list[str], base: str) -> Results:
    results = Results(source=source_version())
    started = time.perf_counter()
    if "power" in args.modes:
        results.flushes.append(overwrite_flush_seconds(base))
    for name in names:
        workload = WORKLOADS[name]
        if name in HOST_WORKLOADS:
            pairs = tuple(
                (mode, backend)
                for mode in workload.modes
                if mode in args.modes
                for backend in workload.backends
                if backend in MODE_BACKENDS[mode]
                and (backend in args.backends or backend in ("lmdb", "sqlite"))
            )
            _log(f"{name}: {', '.join(LABELS[(backend, mode)] for mode, backend in pairs)}")
            rounds = min(args.rounds, args.host_rounds, workload.rounds or args.rounds)
            await run_fresh(workload, pairs, rounds, args.scale, base, results)
            continue
        for mode in workload.modes:
            if mode not in args.modes:
                continue
            backends = tuple(
                b for b in MODE_BACKENDS[mode] if b in workload.backends and b in args.backends
            )
            if "sqlite" not in backends:
                backends = ("sqlite", *backends)
            _log(f"{name} [{mode}]: {', '.join(backends)}")
            await run_workload(workload, mode, backends, args.rounds, args.scale, base, results)
    if "power" in args.modes:
        results.flushes.append(overwrite_flush_seconds(base))
    results.elapsed = time.perf_counter() - started
    after = source_version()
    if after != results.source:
        results.source += f" at the start, {after} at the end (src/ changed during the run)"
    _check_digests(results)
    return results


# ── peak RSS, one subprocess per (workload, mode, backend) ──────────────────


def child_rss(workload: str, mode: str, backend: str, scale: float, base: str) -> None:
    """Runs in the child: populate and one timed pass, then print this process's peak RSS."""

    async def run() -> None:
        store = Store(backend, mode, os.path.join(base, "store"))
        await store.open()
        if workload != "none":  # "none": the baseline, an empty store of this backend
            spec = WORKLOADS[workload]
            state = await spec.populate(store, scale)
            await spec.measure(store, state, 0)
        await store.close()

    asyncio.run(run())
    print(json.dumps({"maxrss_kib": _peak_rss_kib()}))


def _peak_rss_kib() -> int:
    """This process's peak RSS. Linux keeps ``ru_maxrss`` across ``exec`` (the forked parent's
    peak leaks into the child), so prefer ``VmHWM``, which belongs to this image alone."""

    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def measure_rss(args: argparse.Namespace, names: list[str], base: str, results: Results) -> None:
    def spawn(workload: str, mode: str, backend: str) -> int:
        directory = tempfile.mkdtemp(prefix="rss-", dir=base)
        try:
            out = subprocess.run(
                module_command(
                    "tools.bench.report",
                    "--child-rss",
                    workload,
                    mode,
                    backend,
                    "--scale",
                    str(args.scale),
                    "--dir",
                    directory,
                    *(["--no-read-checksums"] if args.no_read_checksums else []),
                ),
                check=True,
                capture_output=True,
                text=True,
                env=module_env(),
            ).stdout
            return int(json.loads(out.strip().splitlines()[-1])["maxrss_kib"])
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    for backend in MODE_BACKENDS["process"]:
        if backend in args.backends or backend == "sqlite":
            results.rss[("none", "process", backend)] = spawn("none", "process", backend)
    for name in names:
        workload = WORKLOADS[name]
        for mode in workload.modes:
            if mode not in args.modes:
                continue
            for backend in MODE_BACKENDS[mode]:
                if backend in workload.backends and backend in args.backends and backend != "floor":
                    results.rss[(name, mode, backend)] = spawn(name, mode, backend)
        _log(f"  rss {name} done")


# ── profiling the LMDB path ──────────────────────────────────────────────────


async def profile_lmdb(args: argparse.Namespace, names: list[str], base: str) -> str:
    out = io.StringIO()
    for name in names:
        workload = WORKLOADS[name]
        for mode in workload.modes:
            if mode not in args.modes:
                continue
            store = Store("lmdb", mode, os.path.join(base, f"profile-{name}-{mode}"))
            await store.open()
            state = await workload.populate(store, args.scale)
            profiler = cProfile.Profile()
            gc.collect()
            rounds = 1 if workload.fresh else args.rounds
            profiler.enable()
            for round in range(rounds):
                await workload.measure(store, state, round)
            profiler.disable()
            await store.close()
            shutil.rmtree(store.path, ignore_errors=True)
            for sort in ("tottime", "cumulative"):
                out.write(f"\n### {name} [{mode}] lmdb, sorted by {sort}\n\n")
                stats = pstats.Stats(profiler, stream=out)
                stats.strip_dirs().sort_stats(sort).print_stats(args.profile_top)
    return out.getvalue()


# ── command line ─────────────────────────────────────────────────────────────


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--scale", type=float, default=None, help="size multiplier (default 1; --quick 0.2)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 7; --quick 3)"
    )
    parser.add_argument("--quick", action="store_true", help="~30 s smoke run")
    parser.add_argument(
        "--host-rounds",
        type=int,
        default=3,
        help="rounds of the Session host workloads at most (default 3)",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        help=f"also the long workloads, one round each ({', '.join(sorted(LONG_WORKLOADS))}: ~15 minutes)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="NAME",
        help=f"workloads to run (repeat or comma-separate): {', '.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--modes", default="process,power", help="durability classes (default both)"
    )
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help="backends (sqlite always runs)"
    )
    parser.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the tables to FILE (its marked block when it has one)",
    )
    parser.add_argument("--rss", action="store_true", help="peak RSS per workload in subprocesses")
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the LMDB path instead of benchmarking"
    )
    parser.add_argument("--profile-top", type=int, default=25, help="rows per profile (default 25)")
    parser.add_argument(
        "--dir", help="parent of the temporary stores (default: the system temp dir)"
    )
    parser.add_argument(
        "--no-read-checksums",
        action="store_true",
        help="open LMDB stores with verify_checksums=False (what the read checksums cost)",
    )
    parser.add_argument(
        "--child-rss", nargs=3, metavar=("WORKLOAD", "MODE", "BACKEND"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.scale is None:
        args.scale = 0.2 if args.quick else 1.0
    if args.rounds is None:
        args.rounds = 3 if args.quick else 7
    args.modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    args.backends = [backend.strip() for backend in args.backends.split(",") if backend.strip()]
    if args.no_read_checksums:
        LMDB_OPTIONS["verify_checksums"] = False

    if args.child_rss:
        child_rss(*args.child_rss, args.scale, args.dir or tempfile.gettempdir())
        return 0

    names = [name.strip() for item in args.only for name in item.split(",") if name.strip()] or [
        name for name in WORKLOADS if args.long or name not in LONG_WORKLOADS
    ]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(
            f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    for mode in args.modes:
        if mode not in MODE_BACKENDS:
            parser.error(f"unknown durability class {mode!r}")

    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)  # the stores' parent, made when named and missing
    base = tempfile.mkdtemp(prefix="pi-durable-bench-", dir=args.dir)
    try:
        if args.profile:
            print(asyncio.run(profile_lmdb(args, names, base)))
            return 0
        results = asyncio.run(run_all(args, names, base))
        if args.rss:
            measure_rss(args, names, base, results)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    command = "python -m tools.bench" + (
        ""
        if argv is None and len(sys.argv) == 1
        else " " + " ".join(sys.argv[1:] if argv is None else argv)
    )
    table = render(results, args, command)
    print(table)
    if args.markdown:
        write_markdown(args.markdown, table)
    return 1 if results.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
