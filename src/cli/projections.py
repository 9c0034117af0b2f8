"""User projections: ``projections PATH`` lists them (read-only; ``--follow`` shows a build's
progress until it is swapped in), ``projections retry PATH NAME`` clears a failure so the program
resumes the fold from the record it stopped at, ``projections drop PATH NAME`` deletes a retired
projection's databases and status. ``retry`` and ``drop`` take the writer lock, like ``rebuild``."""

from __future__ import annotations

import argparse
import asyncio
import time

import msgspec

from ..audit.stats import projection_statuses, require_store
from ..audit.words import plural
from ..projections.userstate import ProjectionStatus
from .common import EXIT_OK, READ_ONLY, Progress, add_command, print_json, readable, usage

_ACTIONS = ("retry", "drop")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "projections",
        "list user projections; retry a failed one; drop a retired one",
        "projections PATH [--json] [--follow]: each user projection's served version, the version "
        f"being built, folded sequence, lag, state and failure ({READ_ONLY}); --follow shows each "
        "build's progress (rate, ETA) until none is left. projections retry PATH NAME: clear NAME's "
        "failure, so the program that defines it resumes its fold from the record it stopped at on "
        "its next open. projections drop PATH NAME: delete NAME's databases (their pages become "
        "free) and status; its program, if it still defines it, folds it again from the start. "
        "retry and drop take the writer lock and never create a store.",
    )
    sub.add_argument(
        "words", nargs="+", metavar="ARGS", help="PATH, or retry PATH NAME, or drop PATH NAME"
    )
    sub.add_argument("--json", action="store_true", help="print one JSON object (the listing)")
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
    return EXIT_OK


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
    """A progress line per build (rate and ETA), until no projection is being built."""

    bars: dict[tuple[str, int], tuple[Progress, int]] = {}
    while True:
        building = {
            name: status.building
            for name, status in projection_statuses(path).items()
            if status.building is not None
        }
        for key, (bar, _first) in list(bars.items()):
            if (
                key[0] not in building or building[key[0]].version != key[1]
            ):  # swapped in (or given up)
                bar.finish(bar.total or 0)
                print(f"{key[0]}: version {key[1]} is served")
                del bars[key]
        if not building and not bars:
            print(f"{path}: no projection is being built")
            return EXIT_OK
        for name, build in building.items():
            assert build is not None
            key = (name, build.version)
            if key not in bars:
                bars[key] = (
                    Progress(f"{name} version {build.version}", None, True),
                    build.folded_seq,
                )
            bar, first = bars[key]
            if build.error is not None:
                print(
                    f"\n{name}: the build of version {build.version} stopped at sequence {build.failed_seq}: {build.error}"
                )
                return EXIT_OK
            bar.total = max(1, build.head - first)
            bar(build.folded_seq - first)
        time.sleep(0.5)


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
