"""Checks crash states, one after the other, in a fresh process (LMDB may meet damaged pages).

Usage: ``python -m tools.harness.powerloss.check JOBS.json RESULTS.jsonl``. Each job names a state
directory and what the recording says about it; one JSON line per state goes to RESULTS (a
``start`` line first, so a crash of this process is pinned on its state).

Per state, in this order:

0. if a journaled power writer left ``power.unsynced``: a read-only open must refuse
   (``JournalReplayPending``), then a writer open replays the journal and closes; the steps
   below check what it left;
1. ``verify`` on the state as the power cut left it (read-only; nothing has touched it);
2. a read-only ``LmdbStorage.open``: the log holds sequences 1..head; each acknowledged one the
   job lists holds exactly the acknowledged batch, every other one is a batch being committed
   at the cut or whose caller was cancelled (whole, never partial, at most once), the ``required`` ones are all there, and every entry of
   an acknowledged batch reads back through ``storage.entry`` with its sequence;
3. a writer open (with the user projection): it must open as it is, no repair; ``mint_id()``
   returns an id above every id handed out before the cut and every stored id; a new commit gets
   the next sequence; the user projection catches up and equals a fresh count over the log;
4. ``verify`` again after the writer closed.

In the ``trim`` workload (no user projection: a trim is refused beside one) step 2 also checks
that the trims are all or nothing: the log begins at 1 with no base, or at the point of a trim
the recording intended with its base there, no record before it and every trim that returned
kept (``_trim_problems``); then every kind of record, listed now and as of kept points, equals
what a fresh store committing the acknowledged batches before the point and the kept records
lists (``_trim_reads_problems``).

In the ``longdocs`` workload, steps 2 and 3 also read every document at ``current`` and at every
sequence of the log, which must equal what pi-durable's ``MemoryStorage`` answers after the same
batches (``longdocs.documents_problems``).

The outcome is ``ok``, ``refused`` (the writer open raised ``StoreDamagedError``: the store says
it may be damaged; whether that is allowed is the explorer's call) or ``failed`` with problems.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import os
import resource
import signal
import sys
import traceback
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.harness.powerloss.longdocs import documents_problems
from tools.harness.powerloss.workload import (
    EntryCounts,
    canonical,
    counts_of,
    engine_tools,
    read_counts,
)


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:300]}"


async def check_command_state(job: dict[str, Any]) -> dict[str, Any]:
    """A state cut while a command (import, restore, backup) built NEWPATH (``DIR/new``): NEWPATH
    is absent (allowed only before the command returned) or the complete store: the source's
    export exactly, its store id, ``verify`` clean, a writer opens it and commits the next
    sequence. Never a partial store, whether or not it would open."""

    from pi_durable_lmdb.storage import LmdbStorage

    verify = engine_tools()[0]

    from tools.harness.powerloss.writer import export_digest

    expect: dict[str, Any] | None = job["expect"]  # None: cut before the command started
    target = os.path.join(job["dir"], "new")
    problems: list[str] = []
    result: dict[str, Any] = {"id": job["id"], "problems": problems}
    result["partials"] = sorted(name for name in os.listdir(job["dir"]) if name != "new")
    if not os.path.lexists(target):
        if job["done"]:
            problems.append("LOST: the command returned, NEWPATH is absent")
        result["outcome"] = "failed" if problems else "absent"
        return result
    held = sorted(os.listdir(target)) if os.path.isdir(target) else None
    result["held"] = held
    if expect is None:
        problems.append(f"UNEXPECTED: NEWPATH exists ({held}) before the command started")
        result["outcome"] = "failed"
        return result
    try:
        digest = export_digest(target)
        if digest != expect["digest"]:
            problems.append(
                f"PARTIAL: NEWPATH holds a log other than the source's (export digest {digest}); files {held}"
            )
    except BaseException as error:
        problems.append(
            f"PARTIAL: NEWPATH exists ({held}) but its log does not read: {_error(error)}"
        )
    if not problems:
        try:
            difference = verify(target)
            if difference is not None:
                problems.append(f"VERIFY: {difference}")
            storage = await LmdbStorage.open(target)
            try:
                if expect["store"] != "-" and storage.store_id != expect["store"]:
                    problems.append(
                        f"STORE ID: NEWPATH is store {storage.store_id}, the source {expect['store']}"
                    )
                minted = await storage.mint_id()
                seq = await storage.commit([{"type": "conversation", "value": {"id": minted}}], CTX)
                if seq != expect["head"] + 1:
                    problems.append(
                        f"SEQUENCE: a new commit got {seq}, the source's head is {expect['head']}"
                    )
            finally:
                await storage.close()
        except BaseException as error:
            problems.append(f"OPEN/COMMIT raised {_error(error)}")
    result["outcome"] = "failed" if problems else "complete"
    return result


async def check_state(job: dict[str, Any]) -> dict[str, Any]:
    if job["workload"] in ("import", "restore", "backup", "backup-plain"):
        return await check_command_state(job)
    from pi_durable_lmdb.log import write_to_builtins
    from pi_durable_lmdb.storage import LmdbStorage

    verify = engine_tools()[0]

    from pi_durable_lmdb import StoreDamagedError

    damaged_error: type[BaseException] = StoreDamagedError

    path = job["dir"]
    trims: list[dict[str, Any]] = job.get("trims", [])
    user = [] if job["workload"] == "trim" else [EntryCounts()]
    acked: dict[int, str] = {int(seq): batch for seq, batch in job["acked"].items()}
    required: list[int] = job["required"]
    maybe: dict[
        str, int
    ] = {}  # batches in flight or cancelled at the cut: each may be there once, whole
    for batch in job["maybe"]:
        maybe[batch] = maybe.get(batch, 0) + 1
    minted_max: int = job["minted_max"]
    problems: list[str] = []
    result: dict[str, Any] = {"id": job["id"], "problems": problems}
    exists = os.path.exists(os.path.join(path, "data.mdb"))
    result["data_file"] = exists

    # 0. a journaled power writer stopped without closing: after the reboot, read-only opens
    # refuse the store until a writer replays the journal (its open, then closed at once); every
    # later step checks the store that replay left
    if exists and os.path.exists(os.path.join(path, "power.unsynced")):
        from pi_durable_lmdb import JournalReplayPending

        result["replayed"] = True
        try:
            reader = await LmdbStorage.open(path, readonly=True)
            await reader.close()
            problems.append(
                "READ-ONLY OPEN/READ did not refuse a store whose journal is not replayed"
            )
        except JournalReplayPending:
            pass
        except BaseException as error:
            problems.append(f"READ-ONLY OPEN/READ raised {_error(error)}, not JournalReplayPending")
        try:
            replaying = await LmdbStorage.open(path, projections=user)
            await replaying.close()
        except BaseException as error:
            if isinstance(error, damaged_error):
                result["outcome"] = "refused"
                result["refusal"] = str(error)
                return result
            problems.append(f"WRITER OPEN (replaying the journal) raised {_error(error)}")
            result["outcome"] = "failed"
            return result

    # 1. verify the state as it is
    if exists:
        try:
            difference = verify(path)
            if difference is not None:
                problems.append(f"VERIFY (as left): {difference}")
        except BaseException as error:
            problems.append(f"VERIFY (as left) raised {_error(error)}")

    # 2. read-only: the log against the acknowledgements
    head = 0
    if exists:
        try:
            reader = await LmdbStorage.open(path, readonly=True)
            try:
                head = reader.log.head()
                seqs = [seq for seq, _ in _all_rows(reader)]
                first = reader.log.trimmed_before() or 1
                problem = sequences_problem(seqs, head, first)
                if problem is not None:
                    problems.append(problem)
                expected = dict(acked)
                if job["workload"] == "trim":
                    result["trim"], found_problems = await _trim_problems(reader, trims, acked)
                    problems += found_problems
                if job.get("erasure") is not None:
                    present, found_problems = _erasure_problems(reader, job["erasure"], expected)
                    result["erasure"] = "present" if present else "absent"
                    problems += found_problems
                for seq in seqs:
                    commit = reader.log.get(seq)
                    if commit is not None and commit.erasure is not None:
                        continue  # judged by _erasure_problems
                    found = canonical(
                        [write_to_builtins(write) for write in reader.log.get(seq).writes]
                    )  # type: ignore[union-attr]
                    if seq in expected:
                        if found != expected[seq]:
                            problems.append(
                                f"CHANGED: sequence {seq} holds {found[:150]}, acknowledged {expected[seq][:150]}"
                            )
                            continue
                        for write in json.loads(found):
                            if write["type"] == "entry":
                                got = await reader.entry(write["value"]["id"])
                                if (
                                    got is None
                                    or got["commitSeq"] != seq
                                    or canonical(got["entry"]) != canonical(write["value"])
                                ):
                                    problems.append(
                                        f"READ: entry {write['value']['id']} of sequence {seq} reads back as {str(got)[:150]}"
                                    )
                    elif maybe.get(found, 0) > 0:
                        maybe[found] -= 1
                        result.setdefault("adopted", []).append(
                            seq
                        )  # committed whole, not acknowledged
                    else:
                        problems.append(
                            f"UNEXPECTED: sequence {seq} holds a batch not committed as sequence {seq}: {found[:150]}"
                        )
                if job["workload"] == "longdocs" and not problems:
                    problems += await documents_problems(reader, _batches(reader, seqs))
            finally:
                await reader.close()
        except BaseException as error:
            problems.append(f"READ-ONLY OPEN/READ raised {_error(error)}")
    missing = [seq for seq in required if seq > head]
    if missing:
        problems.append(
            f"LOST: acknowledged sequences {missing[:10]} (of {len(missing)}) missing; head {head}"
        )
    result["head"] = head
    if exists and job["workload"] == "trim" and not problems:
        problems += await _trim_reads_problems(path, acked)

    # 3. the writer
    try:
        storage = await LmdbStorage.open(path, projections=user)
    except BaseException as error:
        if isinstance(error, damaged_error):
            result["outcome"] = "refused"
            result["refusal"] = str(error)
            return result
        problems.append(f"WRITER OPEN raised {_error(error)}")
        result["outcome"] = "failed"
        return result
    try:
        with storage._env.read() as txn:
            stored_max = storage._model.max_record_id(txn)
        minted = await storage.mint_id()
        if minted <= max(minted_max, stored_max):
            problems.append(
                f"MINT: mint_id() returned {minted}; ids up to {minted_max} were handed out before the cut, stored up to {stored_max}"
            )
        entry_id = await storage.mint_id()
        batch = [
            {"type": "conversation", "value": {"id": minted}},
            {"type": "entry", "value": {"id": entry_id, "conversationId": minted, "kind": "check"}},
        ]
        writer_head = storage.log.head()
        seq = await storage.commit(batch, CTX)
        if seq != writer_head + 1:
            problems.append(f"SEQUENCE: a new commit got {seq} after head {writer_head}")
        if user:
            await asyncio.wait_for(storage.projections.wait(seq), 10)
            with storage.projections.read("entry_counts") as tables:
                held = read_counts(tables)
            expected = counts_of(storage.log.read())
            if held != expected:
                problems.append(
                    f"USER PROJECTION: holds {sorted(held.items())[:6]}, the log counts {sorted(expected.items())[:6]}"
                )
        if job["workload"] == "longdocs" and not problems:
            seqs = list(range(1, storage.log.head() + 1))
            problems += await documents_problems(storage, _batches(storage, seqs))
    except BaseException as error:
        problems.append(f"WRITER raised {_error(error)}")
    finally:
        try:
            await storage.close()
        except BaseException as error:
            problems.append(f"CLOSE raised {_error(error)}")

    # 4. verify after the writer
    try:
        difference = verify(path)
        if difference is not None:
            problems.append(f"VERIFY (after the writer): {difference}")
    except BaseException as error:
        problems.append(f"VERIFY (after the writer) raised {_error(error)}")
    result["outcome"] = "failed" if problems else "ok"
    return result


def _erasure_problems(
    reader: Any, erasure: dict[str, Any], expected: dict[int, str]
) -> tuple[bool, list[str]]:
    """The erase workload's erasure is all or nothing: its record at its sequence and every
    planned record a tombstone holding the acknowledged batch without the erased writes (which
    ``expected`` then holds), or no erasure record and no tombstone (a required one: LOST).
    Whether the erasure is there, and the problems."""

    seq: int = erasure["seq"]
    planned = {int(number): set(positions) for number, positions in erasure["erased"].items()}
    record = reader.log.get(seq) if seq <= reader.log.head() else None
    present = record is not None and record.erasure is not None
    if present:
        if sorted(record.erasure.records) != sorted(planned):
            return True, [
                f"ERASURE: record {seq} names {record.erasure.records}, planned {sorted(planned)}"
            ]
        for number, gone in planned.items():
            if number in expected:
                batch = json.loads(expected[number])
                kept = [write for at, write in enumerate(batch) if at not in gone]
                expected[number] = canonical(kept)
    problems: list[str] = []
    for commit in reader.log.read():
        if commit.erasure is not None and commit.seq != seq:
            problems.append(f"ERASURE: an erasure record at {commit.seq}, none was made there")
        if (commit.tombstone is not None) != (present and commit.seq in planned):
            problems.append(
                f"PARTIAL ERASURE: record {commit.seq} is "
                + ("a tombstone" if commit.tombstone is not None else "whole")
                + f", the erasure record {'is' if present else 'is not'} there"
            )
    if erasure["required"] and not present:
        problems.append(f"LOST: the erasure returned (record {seq}), the log holds none")
    return present, problems


def sequences_problem(seqs: list[int], head: int, first: int = 1) -> str | None:
    """What is wrong with a log holding ``seqs`` under ``head`` from ``first`` (above 1 once
    trimmed), if anything. A damaged head may be ~2**63: nothing here is as long as the head (a
    list of it once took 21 GB)."""

    if (not seqs and head == 0) or (
        seqs and seqs[-1] == head and all(seq == n for n, seq in enumerate(seqs, first))
    ):
        return None
    return f"LOG: sequences are not {first}..{head}: {seqs[:5]}...{seqs[-5:]}"


async def _trim_problems(
    reader: Any, trims: list[dict[str, Any]], acked: dict[int, str]
) -> tuple[str, list[str]]:
    """The trim workload's trims are all or nothing: the log untrimmed (no base, its records from
    1), or trimmed at the point of a trim the recording intended (its base there, its records from
    the point on, a read as of the sequence before refused); every trim that returned is kept (a
    required one not there: LOST), and every record before the point was acknowledged. Which
    trims are there (``absent``, ``N of M``), and the problems."""

    from pi_durable_lmdb import HistoryTrimmed
    from pi_durable_lmdb.log import base as log_base

    point = reader.log.trimmed_before()
    first = reader.log.first()
    with reader._env.read() as txn:
        header = log_base.read_header(log_base.base_db(reader._env), txn)
    problems: list[str] = []
    points = [trim["point"] for trim in trims]
    if point == 0:
        label = "absent"
        if header is not None:
            problems.append(f"PARTIAL TRIM: a base before {header.point}, the log untrimmed")
        if first not in (0, 1):
            problems.append(f"PARTIAL TRIM: no base, the log begins at {first}")
    else:
        label = f"{points.index(point) + 1} of {len(points)}" if point in points else "unknown"
        if point not in points:
            problems.append(f"TRIM: the log is trimmed before {point}, intended {points}")
        if first != point:
            problems.append(f"PARTIAL TRIM: the base is before {point}, the log begins at {first}")
        missing = [seq for seq in range(1, point) if seq not in acked]
        if missing:
            problems.append(f"TRIM: records {missing[:5]} before the point were never acknowledged")
        try:
            await reader.as_of(point - 1)
            problems.append(f"TRIM: a read as of {point - 1}, before the point, was not refused")
        except HistoryTrimmed:
            pass
    lost = [trim["point"] for trim in trims if trim["required"] and trim["point"] > point]
    if lost:
        problems.append(
            f"LOST: the trim before {lost[0]} returned, the log is trimmed before {point}"
        )
    return label, problems


TRIM_KINDS = ("conversations", "entries", "tasks", "documents")


async def _trim_reads_problems(path: str, acked: dict[int, str]) -> list[str]:
    """A trimmed state reads as the log says: every kind of record, now and as of the point,
    the middle of the kept records and the head, equals what a fresh store lists after committing
    the acknowledged batches before the point and then the kept records (commit times aside)."""

    import shutil
    import tempfile

    from pi_durable_lmdb.audit.listing import list_records
    from pi_durable_lmdb.log import write_to_builtins
    from pi_durable_lmdb.storage import LmdbStorage

    storage = await LmdbStorage.open(path, readonly=True)
    try:
        point, head = storage.log.trimmed_before(), storage.log.head()
        if not point:
            return []
        batches = [json.loads(acked[seq]) for seq in range(1, point)]
        batches += [
            [write_to_builtins(write) for write in storage.log.get(seq).writes]
            for seq in range(point, head + 1)
        ]
    finally:
        await storage.close()
    reference = tempfile.mkdtemp(prefix="powerloss-trim-ref-")
    problems: list[str] = []
    try:
        made = await LmdbStorage.open(reference, durability="process")
        try:
            for writes in batches:
                await made.commit(writes, CTX)
        finally:
            await made.close()
        for as_of in sorted({point, (point + head) // 2, head}) + [None]:
            for kind in TRIM_KINDS:
                mine = [_timeless(r) async for r in list_records(path, kind, as_of=as_of)]
                theirs = [_timeless(r) async for r in list_records(reference, kind, as_of=as_of)]
                if mine != theirs:
                    problems.append(
                        f"TRIMMED READ: {kind} as of {as_of} list {canonical(mine)[:200]}, "
                        f"the untrimmed log {canonical(theirs)[:200]}"
                    )
    finally:
        shutil.rmtree(reference, ignore_errors=True)
    return problems[:5]


def _timeless(record: Any) -> str:
    """A listed record without the commit times a fresh store gives it anew."""

    if isinstance(record, dict):
        record = {k: v for k, v in record.items() if not k.endswith("At")}
    return canonical(record)


def _batches(storage: Any, seqs: list[int]) -> list[list[dict[str, Any]]]:
    """The writes of the log's sequences ``seqs`` (1, 2, 3, ...) as the callers committed them."""

    from pi_durable_lmdb.log import write_to_builtins

    return [[write_to_builtins(write) for write in storage.log.get(seq).writes] for seq in seqs]


def _all_rows(storage: Any) -> list[tuple[int, bytes]]:
    rows: list[tuple[int, bytes]] = []
    next_seq = 1
    while True:
        chunk = storage.log.raw_chunk(next_seq, None)
        if not chunk:
            return rows
        rows.extend(chunk)
        next_seq = chunk[-1][0] + 1


MEMORY_LIMIT = 4 << 30
"""A damaged store must never take the machine's memory (a read looping over a damaged B-tree
grows without end: a damaged log's head of ~2**63 once made a list of 21 GB here): past this heap size the state's
finding is a ``MemoryError``. LMDB's map is a shared file mapping and does not count."""


async def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(
        resource.RLIMIT_DATA,
        (MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard), hard),
    )
    faulthandler.register(signal.SIGUSR1)  # where a slow state is: kill -USR1 (to stderr)
    jobs_path, results_path = sys.argv[1], sys.argv[2]
    with open(jobs_path, encoding="utf-8") as file:
        jobs = json.load(file)
    with open(results_path, "a", encoding="utf-8") as out:
        for job in jobs:
            out.write(json.dumps({"start": job["id"]}) + "\n")
            out.flush()
            try:
                result = await check_state(job)
            except BaseException:
                result = {
                    "id": job["id"],
                    "outcome": "failed",
                    "problems": ["CHECKER: " + traceback.format_exc()[-800:]],
                }
            out.write(json.dumps(result) + "\n")
            out.flush()


if __name__ == "__main__":
    asyncio.run(main())
