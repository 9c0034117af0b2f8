"""User projections: ``projections PATH`` lists them (read-only; ``--follow`` shows a build's
progress until it is swapped in), ``projections retry PATH NAME`` clears a failure so the program
resumes the fold from the record it stopped at, ``projections drop PATH NAME`` deletes a retired
projection's databases and status. ``retry`` and ``drop`` take the writer lock, like ``rebuild``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import msgspec

from ..audit.stats import projection_statuses, require_store
from ..audit.words import plural
from ..log.storedir import writer_holders
from ..projections.userstate import BuildStatus, ProjectionStatus
from .common import (
    EXIT_DAMAGE,
    EXIT_OK,
    READ_ONLY,
    add_command,
    json_option,
    print_json,
    readable,
    usage,
)

_ACTIONS = ("retry", "drop")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "projections",
        "list user projections; retry a failed one; drop a retired one",
        "projections PATH [--json] [--follow]: each user projection's served version, the version "
        f"being built, folded sequence, lag, state and failure ({READ_ONLY}); --follow shows each "
        "build's progress (rate, ETA) until none is left and what became of it, waiting for the "
        "build of a writer still starting up. projections retry PATH NAME: clear NAME's "
        "failure, so the program that defines it resumes its fold from the record it stopped at on "
        "its next open. projections drop PATH NAME: delete NAME's databases (their pages become "
        "free) and status; its program, if it still defines it, folds it again from the start. "
        "retry and drop take the writer lock and never create a store. The listing exits 1 when "
        "a projection (or its build) is failed.",
        example="durable-log projections demo-store",
    )
    sub.add_argument(
        "words", nargs="+", metavar="ARGS", help="PATH, or retry PATH NAME, or drop PATH NAME"
    )
    json_option(sub, "one object, each projection's status by its name (the listing)")
    sub.add_argument(
        "--follow",
        action="store_true",
        help="show each build's progress until none is left (the listing)",
    )
    sub.set_defaults(run=_projections)


def _projections(args: argparse.Namespace) -> int:
    words: list[str] = args.words
    if words[0] in _ACTIONS and len(words) == 3:
        action, path, name = words
        require_store(path)
        return _act(action, path, name)
    if len(words) != 1:
        raise usage("projections takes PATH, or retry PATH NAME, or drop PATH NAME")
    path = words[0]
    require_store(path)
    if args.follow:
        return _follow(path)
    statuses = projection_statuses(path)
    if args.json:
        print_json(
            msgspec.to_builtins({name: as_json(status) for name, status in statuses.items()})
        )
    elif not statuses:
        print(f"{path}: no user projections")
    else:
        for name, status in statuses.items():
            print(readable(describe(name, status)))
    failed = any(status.state == "failed" for status in statuses.values())
    return EXIT_DAMAGE if failed else EXIT_OK  # a monitor's check: 1 as verify's for a problem


class ListedBuild(msgspec.Struct, frozen=True, rename="camel"):
    """A version being built, as ``projections --json`` lists it: its lag behind the head it saw."""

    version: int
    folded_seq: int
    lag: int
    rate: float
    eta: float | None
    failed_seq: int | None
    error: str | None


class ListedProjection(msgspec.Struct, frozen=True, rename="camel"):
    """One user projection as ``projections --json`` lists it."""

    version: int
    folded_seq: int
    lag: int
    state: str
    failed_seq: int | None
    error: str | None
    building: ListedBuild | None


def as_json(status: ProjectionStatus) -> ListedProjection:
    build = status.building
    return ListedProjection(
        version=status.version,
        folded_seq=status.folded_seq,
        lag=status.lag,
        state=status.state,
        failed_seq=status.failed_seq,
        error=status.error,
        building=None
        if build is None
        else ListedBuild(
            version=build.version,
            folded_seq=build.folded_seq,
            lag=max(0, build.head - build.folded_seq),
            rate=build.rate,
            eta=build.eta,
            failed_seq=build.failed_seq,
            error=build.error,
        ),
    )


def describe(name: str, status: ProjectionStatus) -> str:
    text = f"{name}: {status.state}, serves version {status.version} folded to sequence {status.folded_seq} (lag {status.lag:,})"
    if status.error is not None:
        text += f"; stopped at sequence {status.failed_seq}: {status.error}"
    build = status.building
    if build is not None:
        text += (
            f"; building version {build.version}: sequence {build.folded_seq:,} of {build.head:,}"
        )
        if build.error is not None:
            text += f", stopped at sequence {build.failed_seq}: {build.error}"
        elif build.eta is not None:
            text += f", {build.rate:,.0f} records/s, ETA {build.eta:,.0f} s"
    return text


def _follow(path: str) -> int:
    """Each build's progress as the build itself counts it (from its start: folded of head, its
    rate and ETA) until none is left, then what became of it: served, given up for another
    version, dropped, or stopped at a record (exit 1). A build no writer is folding is said to
    be paused; while nothing is built yet but a writer has the store open (one starting up), it
    waits for that writer's build."""

    watched: dict[str, int] = {}  # name -> the version seen being built
    shown: dict[str, str] = {}
    waiting_said = False
    live = sys.stderr.isatty()
    while True:
        statuses = projection_statuses(path)
        writers = writer_holders(path)
        for name, version in list(watched.items()):
            status = statuses.get(name)
            build = None if status is None else status.building
            if build is not None and build.version == version:
                continue
            del watched[name]
            if live:
                print(file=sys.stderr)
            print(readable(_ended(name, version, status)), flush=True)
        building = {n: s.building for n, s in statuses.items() if s.building is not None}
        for name, build in building.items():
            if build.error is not None:
                print(
                    readable(
                        f"{name}: the build of version {build.version} stopped at sequence "
                        f"{build.failed_seq}: {build.error} (projections retry {path} {name})"
                    ),
                    flush=True,
                )
                return EXIT_DAMAGE
            watched[name] = build.version
            line = f"{name} version {build.version}: {_progress(build, bool(writers))}"
            if shown.get(name) != line:
                shown[name] = line
                print(("\r" if live else "") + line, end=" " if live else "\n", file=sys.stderr)
                sys.stderr.flush()
        if not building:
            if shown:  # every build followed has ended (its writer may go on serving)
                return EXIT_OK
            if not writers:
                print(f"{path}: no projection is being built, and no writer has the store open")
                return EXIT_OK
            if not waiting_said:  # a writer starting up registers its builds as it opens
                waiting_said = True
                print(
                    f"durable-log: {path}: no projection is being built yet; waiting while a writer "
                    f"(process {', '.join(map(str, writers))}) has the store open (Ctrl-C stops)",
                    file=sys.stderr,
                    flush=True,
                )
        time.sleep(0.5)


def _progress(build: BuildStatus, folding: bool) -> str:
    done = f"sequence {build.folded_seq:,} of {build.head:,}"
    if not folding:
        return f"{done}, paused: no writer has the store open (one defining version {build.version} resumes it)"
    if build.eta is None:
        return f"{done}, ETA unknown (no record folded yet)"
    return f"{done}, {build.rate:,.0f} records/s, ETA {build.eta:,.0f} s"


def _ended(name: str, version: int, status: ProjectionStatus | None) -> str:
    """What became of a build no longer listed."""

    if status is None:
        return f"{name}: dropped, and the build of version {version} with it"
    if status.version == version and status.building is None:
        return f"{name}: version {version} is served"
    text = (
        f"{name}: the build of version {version} was given up; version {status.version} is served"
    )
    if status.building is not None:
        text += f", version {status.building.version} is being built"
    return text


def _act(action: str, path: str, name: str) -> int:
    from ..storage.lmdb_storage import LmdbStorage

    async def run() -> str:
        storage = await LmdbStorage.open(path)
        try:
            known = storage.projections.status()
            if name not in known:
                names = ", ".join(sorted(known)) or "none"
                raise usage(f"The store has no projection {name!r}; it has: {names}")
            if action == "drop":
                dropped = await storage.projections.drop(name)
                return f"{path}: dropped projection {name!r}: {plural(len(dropped), 'database')} deleted ({', '.join(dropped) or '-'}), its status removed"
            before = known[name]
            after = await storage.projections.retry(name)
            failed = (
                before.building
                if before.building is not None and before.building.error is not None
                else before
            )
            if failed.error is None:
                return f"{path}: projection {name!r} has no failure to retry ({before.state})"
            assert after is not None
            return (
                f"{path}: cleared the failure of projection {name!r} at sequence {failed.failed_seq}; its program "
                "resumes the fold from there on its next open"
            )
        finally:
            await storage.close()

    print(readable(asyncio.run(run())))
    return EXIT_OK


__all__ = [
    "ListedBuild",
    "ListedProjection",
    "as_json",
    "describe",
    "register",
]
