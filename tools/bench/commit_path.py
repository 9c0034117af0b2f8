"""Where a sequential commit's CPU goes, and py-lmdb's floor for the same work.

Runs ``commit_turn`` (or ``commit_doc_delta``, or the Session host ``host_1000`` or ``host_10000``,
whose plain total then holds the Session's part of each turn too) of ``tools/bench/report.py``
against ``LmdbStorage`` in ``process`` mode, three ways, per round:

1. **plain**: the commits as the benchmark runs them, timed as a whole (µs per commit);
2. **parts**: the same with ``perf_counter`` wrappers around the commit path's functions, each
   part's *self* time (its own time minus that of the wrapped parts it calls) per commit; the
   wrappers add their own cost (the ``wrapped total`` row against ``plain``);
3. **floor**: every LMDB operation the commits made (recorded through a proxy of the write
   transaction: gets, puts with their flags, replaces, pops, cursor moves), replayed with raw
   py-lmdb on a fresh environment opened as ``process`` mode opens it (no sync), one write
   transaction per commit, same sub-databases, keys and values: what the store would cost if
   Python did nothing but LMDB's part; and again with the projection databases merged into one
   (what fewer sub-databases per turn would save).

    python -m tools.bench.commit_path                       # commit_turn, 5 rounds
    python -m tools.bench.commit_path --workload commit_doc_delta --rounds 3
    python -m tools.bench.commit_path --workload host_1000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from typing import Any

import lmdb
from pi_durable_lmdb.log import codec, environment, writelog, zstd
from pi_durable_lmdb.projections import projector, rows, tables
from pi_durable_lmdb.storage import committer, lmdb_storage

from tools.bench.host import HOST_WORKLOADS
from tools.bench.report import Store
from tools.bench.workloads import WORKLOADS

# ── self-time wrappers ───────────────────────────────────────────────────────

_self: dict[str, float] = defaultdict(float)
_calls: dict[str, int] = defaultdict(int)
# The innermost wrapped part running in this context: ``[name, started, time spent in wrapped
# callees, the part it runs in]``. A context variable, not one shared list: a group's parts run on
# the writer thread while the caller's coroutines run (and suspend) on the loop, each asyncio task
# in a context of its own, so a shared stack's pops would take each other's frames.
_current: ContextVar[list[Any] | None] = ContextVar("commit_path_part", default=None)


def _enter(name: str, clock: Callable[[], float]) -> tuple[list[Any], Token[list[Any] | None]]:
    frame = [name, clock(), 0.0, _current.get()]
    return frame, _current.set(frame)


def _leave(frame: list[Any], token: Token[list[Any] | None], clock: Callable[[], float]) -> None:
    _current.reset(token)
    spent = clock() - frame[1]
    name = frame[0]
    _self[name] += spent - frame[2]
    _calls[name] += 1
    if frame[3] is not None:
        frame[3][2] += spent


def _timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    clock = time.perf_counter

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        frame, token = _enter(name, clock)
        try:
            return function(*args, **kwargs)
        finally:
            _leave(frame, token, clock)

    return wrapper


def _timed_async(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """A coroutine's self time from its start to its end (a direct commit never suspends
    between its first and last step, except the rare yield of a run of direct commits; a
    commit handed to the writer thread counts its wait, its parts there counting apart)."""

    clock = time.perf_counter

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        frame, token = _enter(name, clock)
        try:
            return await function(*args, **kwargs)
        finally:
            _leave(frame, token, clock)

    return wrapper


# (label, owner, attribute, async): patched on ``owner`` where the path looks the name up.
PARTS: tuple[tuple[str, Any, str, bool], ...] = (
    ("storage.commit (counters, kick, glue)", lmdb_storage.LmdbStorage, "commit", True),
    ("encode_batch: msgspec encode + decode", lmdb_storage, "encode_batch", False),
    ("check_json walk", codec, "check_json", False),
    ("committer (direct path, hand-off)", committer.Committer, "commit", True),
    ("env.write: begin + commit + gate", environment.Environment, "write", False),
    ("projector.admit glue", projector.Projector, "admit", False),
    ("projector.prepare (checks)", projector.Projector, "prepare", False),
    ("log.append (cursor.last, put, stage)", writelog.WriteLog, "append", False),
    ("encode_record (header, crc)", writelog, "encode_record", False),
    ("zstd: log record", zstd, "compress", False),
    ("deflate: projection rows", tables, "deflate", False),
    ("projector.apply + _put_* (fold)", projector.Projector, "apply", False),
    ("rows: put/replace/claim/delete (puts, seal)", rows.Rows, "replace", False),
    ("rows: put/replace/claim/delete (puts, seal)", rows.Rows, "claim", False),
    ("rows: put/replace/claim/delete (puts, seal)", rows.Rows, "delete", False),
    ("rows: put/replace/claim/delete (puts, seal)", rows.Rows, "get", False),
    ("rows._remember (history)", rows.Rows, "_remember", False),
    ("codec.encode (the batch, then rows in the fold)", codec, "encode", False),
)
for _label, _owner, _name, _ in PARTS:
    if not hasattr(_owner, _name):
        raise SystemExit(f"commit_path: {_owner.__name__}.{_name} is gone; update PARTS")


@contextmanager
def _wrapped() -> Iterator[None]:
    saved = [(owner, name, owner.__dict__[name]) for _, owner, name, _ in PARTS]
    originals = {(id(owner), name): getattr(owner, name) for _, owner, name, _ in PARTS}
    try:
        for label, owner, name, is_async in PARTS:
            original = originals[(id(owner), name)]
            setattr(owner, name, (_timed_async if is_async else _timed)(label, original))
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


# ── recording LMDB operations ────────────────────────────────────────────────


class _Names:
    """Distinct database handles in the order first seen (``None``: the main database)."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}

    def __call__(self, db: Any) -> int:
        if db is None:
            return -1
        return self.index.setdefault(id(db), len(self.index))


class _RecordingCursor:
    def __init__(self, cursor: Any, ops: list[tuple[Any, ...]], db: int) -> None:
        self._cursor, self._ops, self._db = cursor, ops, db

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._cursor, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            self._ops.append(("cursor." + name, self._db, args, kwargs))
            return method(*args, **kwargs)

        return call


class _RecordingTxn:
    """Passes every call to the real write transaction and writes it down."""

    def __init__(self, txn: Any, ops: list[tuple[Any, ...]], names: _Names) -> None:
        self._txn, self._ops, self._names = txn, ops, names

    def cursor(self, db: Any = None) -> _RecordingCursor:
        index = self._names(db)
        self._ops.append(("cursor", index, (), {}))
        return _RecordingCursor(self._txn.cursor(db=db), self._ops, index)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._txn, name)

        def call(*args: Any, db: Any = None, **kwargs: Any) -> Any:
            self._ops.append(
                (
                    name,
                    self._names(db),
                    tuple(bytes(a) if isinstance(a, memoryview) else a for a in args),
                    kwargs,
                )
            )
            return method(*args, db=db, **kwargs)

        return call


@contextmanager
def _recording(commits: list[list[tuple[Any, ...]]], names: _Names) -> Iterator[None]:
    original = environment.Environment.write

    def write(self: Any, work: Callable[[Any], Any]) -> Any:
        ops: list[tuple[Any, ...]] = []
        commits.append(ops)

        def recorded(txn: Any) -> Any:
            wrapped = _RecordingTxn(txn, ops, names)
            self.writing.txn = wrapped  # its effects are those of the transaction it records
            return work(wrapped)

        return original(self, recorded)

    environment.Environment.write = write  # type: ignore[method-assign]
    try:
        yield
    finally:
        environment.Environment.write = original  # type: ignore[method-assign]


def replay_floor(
    commits: list[list[tuple[Any, ...]]], databases: int, path: str, merged: bool = False
) -> float:
    """Seconds per commit for raw py-lmdb doing exactly the recorded operations. ``merged``: every
    database but the log (the one appended to) is one database, each key prefixed with a byte
    naming its former database: what fewer sub-databases per turn would save."""

    log = next(
        (
            index
            for ops in commits
            for op, index, _, kwargs in ops
            if op == "put" and kwargs.get("append")
        ),
        None,
    )
    env = lmdb.open(
        path, map_size=1 << 30, max_dbs=max(databases, 1) + 3, sync=False, metasync=True
    )
    try:
        dbs = {index: env.open_db(f"d{index}".encode()) for index in range(databases)}
        dbs[-1] = None
        one = env.open_db(b"merged")
        gc.collect()
        started = time.perf_counter()
        for ops in commits:
            with env.begin(write=True) as txn:
                cursors: dict[int, Any] = {}
                for op, index, args, kwargs in ops:
                    db = dbs[index]
                    if merged and index not in (-1, log):
                        db = one
                        if args and isinstance(args[0], bytes):
                            args = (bytes([index]) + args[0], *args[1:])
                        kwargs = {key: value for key, value in kwargs.items() if key != "append"}
                    if op == "cursor":
                        cursors[index] = txn.cursor(db=db)
                    elif op.startswith("cursor."):
                        getattr(cursors[index], op[7:])(*args, **kwargs)
                    else:
                        getattr(txn, op)(*args, db=db, **kwargs)
        return (time.perf_counter() - started) / max(len(commits), 1)
    finally:
        env.close()


# ── the run ──────────────────────────────────────────────────────────────────


async def one_round(workload: str, base: str, how: str) -> tuple[float, int, Any]:
    """One fresh store's timed pass; ``(seconds, commits, extra)``: for ``plain``, ``extra`` is
    the thread's CPU seconds over the pass (steadier than wall time on a shared machine)."""

    spec = {**WORKLOADS, **HOST_WORKLOADS}[workload]
    store = Store("lmdb", "process", tempfile.mkdtemp(prefix=f"{how}-", dir=base))
    await store.open()
    try:
        state = await spec.populate(store, 1.0)
        gc.collect()
        extra: Any = None
        if how == "parts":
            _self.clear()
            _calls.clear()
            with _wrapped():
                timings = await spec.measure(store, state, 0)
        elif how == "record":
            commits: list[list[tuple[Any, ...]]] = []
            names = _Names()
            with _recording(commits, names):
                timings = await spec.measure(store, state, 0)
            extra = (commits, len(names.index))
        else:
            cpu = time.thread_time()
            timings = await spec.measure(store, state, 0)
            extra = time.thread_time() - cpu
        seconds, count, _ = timings[workload]
        return seconds, count, extra
    finally:
        await store.close()
        shutil.rmtree(store.path, ignore_errors=True)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workload",
        default="commit_turn",
        choices=("commit_turn", "commit_doc_delta", "host_1000", "host_10000"),
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="parent of the temporary stores")
    args = parser.parse_args()

    base = tempfile.mkdtemp(prefix="commit-path-", dir=args.dir)
    plain: list[float] = []
    plain_cpu: list[float] = []
    wrapped: list[float] = []
    floor: list[float] = []
    merged_floor: list[float] = []
    parts: dict[str, list[float]] = defaultdict(list)
    calls: dict[str, float] = {}
    ops_per_commit = databases = 0.0
    try:
        for _ in range(args.rounds):
            seconds, count, cpu = await one_round(args.workload, base, "plain")
            plain.append(seconds / count)
            plain_cpu.append(cpu / count)
            seconds, count, _ = await one_round(args.workload, base, "parts")
            wrapped.append(seconds / count)
            for label in set(label for label, *_ in PARTS):
                parts[label].append(_self.get(label, 0.0) / count)
                calls[label] = _calls.get(label, 0) / count
            _, count, (commits, databases) = await one_round(args.workload, base, "record")
            floor_dir = tempfile.mkdtemp(prefix="floor-", dir=base)
            floor.append(replay_floor(commits, databases, floor_dir))
            shutil.rmtree(floor_dir, ignore_errors=True)
            floor_dir = tempfile.mkdtemp(prefix="floor-merged-", dir=base)
            merged_floor.append(replay_floor(commits, databases, floor_dir, merged=True))
            shutil.rmtree(floor_dir, ignore_errors=True)
            ops_per_commit = sum(len(ops) for ops in commits) / len(commits)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    median = statistics.median
    print(f"## {args.workload}, process mode: µs per commit, median of {args.rounds} rounds\n")
    print("| part (self time) | µs | calls per commit |")
    print("|---|---:|---:|")
    labels = list(dict.fromkeys(label for label, *_ in PARTS))
    accounted = 0.0
    for label in labels:
        value = median(parts[label])
        accounted += value
        print(f"| {label} | {_us(value)} | {calls[label]:.2f} |")
    rest = median(wrapped) - accounted
    print(f"| rest: asyncio, the benchmark's loop, wrappers | {_us(rest)} | |")
    print(f"| **wrapped total** | **{_us(median(wrapped))}** | |")
    print(f"| **plain total (no wrappers)** | **{_us(median(plain))}** | |")
    print(
        f"| plain total, CPU of the committing thread | {_us(median(plain_cpu))} (best {_us(min(plain_cpu))}) | |"
    )
    print(
        f"| py-lmdb floor: the same {ops_per_commit:.1f} operations in {databases} databases, "
        f"one no-sync write txn per commit | {_us(median(floor))} | |"
    )
    print(
        f"| py-lmdb floor, the projection databases merged into one (keys prefixed, the log apart) "
        f"| {_us(median(merged_floor))} | |"
    )


if __name__ == "__main__":
    asyncio.run(main())
