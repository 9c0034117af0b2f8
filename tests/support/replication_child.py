"""A writer process (or a replica) for ``tests/replication/test_replication*.py``: commits to a store linked to a NATS
JetStream stream until it is SIGKILLed (or has made ``--count`` commits, then closes).

Usage::

    python -m tests.support.replication_child STORE --nats URLS --stream NAME [--durability D]
        [--replicas N] [--agents K] [--count N] [--workload SEED] [--pause S] [--lease-ttl S]
    python -m tests.support.replication_child STORE --nats URLS --stream NAME --replica-of ID --until SEQ

Every line is written and flushed at once, so a parent that SIGKILLs this process knows exactly
what was acknowledged:

``opening``                 right before ``LmdbStorage.open`` (repeated while NATS is down)
``open-failed TYPE MSG``    the open failed (NATS down, say); it is tried again
``opened STORE HEAD``       the store's id and its log head once open
``ready``                   committing starts
``ack#K SEQ ID ID...``      agent K's commit returned SEQ; its batch wrote those entry ids
``fail#K TYPE MSG``         agent K's commit (or mint) failed with a ``ReplicationError``; the
                            batch may or may not be in the log (never acknowledged)
``intent#K N``              (``--workload``) agent K is committing workload batch number N
``ack#K SEQ w N``           (``--workload``) batch N was acknowledged as SEQ
``reject#K N TYPE``         (``--workload``) batch N was rejected by the checks (wrote nothing)
``deposed MSG``             the store refused commits (``NotWriterError``): the process exits 3
``closed``                  ``--count`` reached and the store closed cleanly
``caught-up HEAD``          (``--replica-of``) the replica holds record ``--until``; it closes

Agents other than the workload's commit *turns*: a new conversation with its first entry, then
an entry per commit in it (a fresh conversation after any failure, since a failed turn may or may
not have created it). Ids come from ``mint_id``, or with ``--workload`` from fixed ranges
(``10**9 + 10**6 * K + n``) so they never meet the workload's own ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import traceback
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__} {json.dumps(str(error)[:500])}"


async def open_store(args: argparse.Namespace) -> Any:
    from pi_durable_lmdb import NatsUnavailableError
    from pi_durable_lmdb.storage import LmdbStorage

    deadline = time.monotonic() + args.open_timeout
    while True:
        say("opening")
        try:
            return await LmdbStorage.open(
                args.store,
                durability=args.durability,
                nats=args.nats,
                stream=args.stream,
                replicas=args.replicas,
                lease_ttl=args.lease_ttl,
            )
        except NatsUnavailableError as error:
            say("open-failed " + one_line(error))
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def write(args: argparse.Namespace) -> int:
    from pi_durable_lmdb import NotWriterError, ReplicationError

    storage = await open_store(args)
    say(f"opened {storage.store_id} {storage.log.head()}")
    count = 0
    done = asyncio.Event()

    def counted() -> None:
        nonlocal count
        count += 1
        if args.count is not None and count >= args.count:
            done.set()

    async def turns(k: int) -> None:
        fixed = iter(range(10**9 + 10**6 * k, 10**9 + 10**6 * (k + 1)))

        async def fresh() -> int:
            return next(fixed) if args.workload is not None else await storage.mint_id()

        conversation = None
        turn = 0
        while not done.is_set():
            try:
                if conversation is None or turn % 25 == 0:
                    conversation = await fresh()
                    entry = await fresh()
                    writes = [
                        {"type": "conversation", "value": {"id": conversation}},
                        {
                            "type": "entry",
                            "value": {
                                "id": entry,
                                "conversationId": conversation,
                                "kind": "message",
                            },
                        },
                    ]
                else:
                    entry = await fresh()
                    writes = [
                        {
                            "type": "entry",
                            "value": {
                                "id": entry,
                                "conversationId": conversation,
                                "kind": "message",
                                "data": {"turn": turn, "agent": k},
                            },
                        }
                    ]
                seq = await storage.commit(writes, CTX)
            except NotWriterError as error:
                say("deposed " + one_line(error))
                os._exit(3)
            except ReplicationError as error:
                say(f"fail#{k} " + one_line(error))
                conversation = None
                turn = 0
                await asyncio.sleep(0.02)
                continue
            say(
                f"ack#{k} {seq} {' '.join(str(w['value']['id']) for w in writes if w['type'] == 'entry')}"
            )
            turn += 1
            counted()
            if args.pause:
                await asyncio.sleep(args.pause)

    async def workload() -> None:
        from tests.support.workload import Workload

        work = Workload(args.workload)
        number = 0
        while not done.is_set():
            writes = work.batch()
            say(f"intent#0 {number}")
            try:
                seq = await storage.commit(writes, CTX)
            except NotWriterError as error:
                say("deposed " + one_line(error))
                os._exit(3)
            except ReplicationError as error:
                say("fail#0 " + one_line(error))
            except Exception as error:  # the checks refused the batch: it wrote nothing
                say(f"reject#0 {number} {type(error).__name__}")
            else:
                say(f"ack#0 {seq} w {number}")
                counted()
            number += 1
            await asyncio.sleep(0)

    agents = []
    for k in range(args.agents):
        agents.append(workload() if args.workload is not None and k == 0 else turns(k))
    say("ready")
    await asyncio.gather(*agents)
    await storage.close()
    say("closed")
    return 0


async def follow(args: argparse.Namespace) -> int:
    """``--replica-of STORE``: follow that store into this directory until it holds ``--until``."""

    from pi_durable_lmdb.storage import LmdbStorage

    say("opening")
    replica = await LmdbStorage.open_replica(
        args.store, nats=args.nats, stream=args.stream, store=args.replica_of
    )
    say(f"opened {replica.store_id} {replica.log.head()}")
    say("ready")
    try:
        await replica.wait(args.until, timeout=args.open_timeout)
        say(f"caught-up {replica.log.head()}")
    finally:
        await replica.close()
    say("closed")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--nats", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument(
        "--durability", default="replicated", choices=["power", "process", "replicated"]
    )
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument(
        "--count",
        type=int,
        help="stop after this many acknowledged commits (all agents), then close",
    )
    parser.add_argument(
        "--workload", type=int, help="agent 0 commits tests.support.workload.Workload(SEED) batches"
    )
    parser.add_argument(
        "--pause", type=float, default=0.0, help="seconds each turn agent sleeps after a commit"
    )
    parser.add_argument("--lease-ttl", type=int, default=5)
    parser.add_argument("--open-timeout", type=float, default=30.0)
    parser.add_argument("--replica-of", help="be a replica of this store id instead of a writer")
    parser.add_argument(
        "--until", type=int, default=0, help="(--replica-of) the record to wait for, then close"
    )
    args = parser.parse_args()
    try:
        return asyncio.run(follow(args) if args.replica_of else write(args))
    except Exception:
        say("error " + json.dumps(traceback.format_exc()))
        return 1


if __name__ == "__main__":
    sys.exit(main())
