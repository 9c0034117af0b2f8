"""The writer whose os calls fail: a real process committing through ``LmdbStorage`` (power
durability, a small journal so segments fill, recycle and are checkpointed every few commits),
with one call of one kind failed (``inject.Injector``), then killed without closing a few
commits after it (``--after``), so that what the fault touched is inside the range recovery
replays.

Usage (run by ``tools/harness/io_faults.py``)::

    python -m tools.harness.iofaults.child STORE KIND NTH ERRNO --commits N --seed S [--burst N] [--after N] [--plant FAULT]

Prints one line per event: ``ack SEQ ID`` (a commit returned SEQ), ``fail WHAT ERROR`` (a call
was refused: it is tried again, the fault being spent), ``wedged WHAT ERROR`` (it was refused
again after the fault cleared), and last ``counts JSON`` (calls of each kind) and ``fired 0|1``.
Exits with ``os._exit`` (no close: the journal and its marker stay, as a kill leaves them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import string
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from tools.harness.iofaults.inject import Injector

T = TypeVar("T")
ATTEMPTS = 4
"""Tries of each call: the first ones may meet the fault (a burst of two calls can fail two
tries of a commit that makes a segment); once it is spent, the next must succeed."""


def say(line: str) -> None:
    print(line, flush=True)


async def attempt(what: str, call: Callable[[], Awaitable[T]]) -> T | None:
    for number in range(ATTEMPTS):
        try:
            return await call()
        except Exception as error:
            text = f"{type(error).__name__}: {error}".replace("\n", " ")
            say(f"{'fail' if number < ATTEMPTS - 1 else 'wedged'} {what} {text}")
    return None


def options(args: argparse.Namespace) -> dict[str, Any]:
    from pi_durable_lmdb.log import journal

    for fault in args.plant:
        journal._faults.add(fault)
    return {
        "journal": journal.JournalOptions(
            segment_size=2 * journal.HEADER_SIZE,
            checkpoint_commits=12,
            checkpoint_bytes=1 << 20,
            checkpoint_seconds=600.0,
            background=args.background,
            checkpoint_half_segment=False,
            pinned_pages=1 << 20,
        )
    }  # a checkpoint every 12 commits


async def run(args: argparse.Namespace, injector: Injector) -> None:
    from pi_durable_lmdb.storage import LmdbStorage, lmdb_storage

    lmdb_storage.ID_BLOCK = 24  # type: ignore[misc]  # reservations (each a checkpoint) now and then
    rng = random.Random(args.seed)
    storage = await attempt(
        "open", lambda: LmdbStorage.open(args.store, map_size=args.map_size, **options(args))
    )
    if storage is None:
        return
    after = 0
    for n in range(args.commits):
        if injector.failed:
            after += 1
            if after > args.after:
                return  # killed soon after the fault: what it left is inside the range recovery replays
        conversation = await attempt(f"mint {n}", storage.mint_id)
        if conversation is None:
            return
        size = rng.choice([40, 300, 1500, 3000, 5000])  # the big ones need a segment of their own
        writes = [
            {
                "type": "conversation",
                "value": {
                    "id": conversation,
                    "n": n,
                    "pad": "".join(rng.choices(string.ascii_letters, k=size)),
                },
            }
        ]
        seq = await attempt(f"commit {n}", lambda: storage.commit(writes, CTX))
        if seq is None:
            return
        say(f"ack {seq} {conversation}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("kind")
    parser.add_argument("nth", type=int)
    parser.add_argument("errno", type=int)
    parser.add_argument("--commits", type=int, default=41)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--map-size",
        type=int,
        default=256 * 1024,
        help="LMDB's map: small, so that it fills and grows",
    )
    parser.add_argument(
        "--burst", type=int, default=1, help="consecutive calls of the kind that fail"
    )
    parser.add_argument(
        "--after", type=int, default=3, help="commits after the fault fired, then the kill"
    )
    parser.add_argument("--plant", action="append", default=[])
    parser.add_argument("--background", action="store_true")
    args = parser.parse_args()
    injector = Injector(args.kind, args.nth, args.errno, args.burst)
    injector.install()
    try:
        asyncio.run(run(args, injector))
    finally:
        say("counts " + json.dumps(injector.counts))
        say(f"fired {int(injector.failed)}")
        os._exit(0)


if __name__ == "__main__":
    main()
