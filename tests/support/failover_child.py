"""Writer processes for ``tests/replication/test_failover*.py``: replicated writers that get SIGKILLed,
SIGSTOPped and fenced out, a minting writer, and a Harness whose tasks outlive their writer.

Usage::

    python -m tests.support.failover_child writer DIR --nats URLS --stream S --store ID [--ttl 2]
        [--take-over no|yes|force] [--agents K] [--loop] [--after-deposed N] [--pace S]
        [--stall-after-check N] [--name NAME]
    python -m tests.support.failover_child mint DIR --nats URLS --stream S --store ID [--ttl 2] [--count N]
    python -m tests.support.failover_child session DIR --nats URLS --stream S --store ID [--ttl 2]

Every line is written and flushed at once, so a parent that SIGKILLs this process knows exactly
what was acknowledged:

``opening``                    right before ``LmdbStorage.open``
``open-failed TYPE MSG``       the open raised (``--loop``: tried again)
``opened EPOCH HEAD``          the open returned: this process holds the lease of epoch EPOCH
``mint ID``                    ``mint_id()`` returned ID (printed before the id is used)
``mint-failed TYPE``           ``mint_id()`` raised
``intent CID JSON``            a commit is about to be made; CID (its conversation id) names it
``ack CID SEQ``                ``await commit()`` returned SEQ: the commit is acknowledged
``fail CID TYPE``              ``await commit()`` raised TYPE (``NotWriterError``: deposed)
``deposed``                    the store said this process no longer writes it
``closed``                     the store closed after being deposed (``--loop`` opens it again)
``stalled``                    (``--stall-after-check N``) the writer thread passed its N-th lease
                               check before a publish and now sleeps a moment (the parent
                               SIGSTOPs the process there: a writer paused between check and send)
``done``                       ``--after-deposed`` attempts made; the store is closed; exit 0

``writer`` agents commit *turns*: a conversation with an entry (both minted ids), every third
commit a task with a minted id, and an entry in the agent's previous acknowledged conversation
(it is in the stream, so in every writer's store). After deposition (without ``--loop``) each
agent makes ``--after-deposed`` more attempts with ids of a range no writer mints
(``9 * 10**12 + ...``); they must all fail.

``mint`` mints ``--count`` ids (printing them ``minted A B C ...`` in chunks), commits a
conversation every 700 ids, prints ``ready`` and waits to be killed.

``session`` runs a pi-durable ``Harness``: it starts ``failover.sleeper`` (goes to sleep for a
minute after its first phase) and ``failover.worker`` (its second phase hangs in this process),
prints ``ready SLEEPER WORKER`` once one sleeps and the other is inside its hanging phase, and
waits to be killed. The task definitions live here so the test's Harness runs the same ones.
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

from pi_durable import define_doc, define_task
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.entries import define_entry

HANG_ENV = "PD_FAILOVER_HANG"
"""Set in the ``session`` child: the worker's ``work`` phase hangs there (never in the test)."""

SYNTHETIC_IDS = 9 * 10**12
TEXTS = ["", "a", "héllo", "日本", "\U0001f600", "x" * 30]


def say(*parts: Any) -> None:
    sys.stdout.write(" ".join(str(part) for part in parts) + "\n")
    sys.stdout.flush()


# ── the Harness tasks (shared with the test) ─────────────────────────────────

Step = define_entry("failover.step")
Trail = define_doc(
    kind="failover.trail",
    version=1,
    scope="conversation",
    history="rewindable",
    fork="current",
    initial=lambda: {"lines": []},
    checkpoint_when=lambda value, ops, info: False,
)


async def _phase(task: Any, runtime: Any, context: Any) -> None:
    phase = task["state"]["checkpoint"]["phase"]
    if phase == "work" and os.environ.get(HANG_ENV):
        say("hanging", task["id"])
        await asyncio.sleep(3600)

    async def change(tx: Any, current: Any) -> Any:
        (await tx.doc(Trail, runtime.conversation_id))["lines"].append(f"{current['id']}:{phase}")
        await tx.append_entry(
            Step, runtime.conversation_id, {"data": {"task": current["id"], "phase": phase}}
        )
        if phase == "start" and current["kind"] == "failover.sleeper":
            return {
                "status": "sleeping",
                "checkpoint": {"phase": "wake"},
                "until": runtime.now() + 60_000,
            }
        if phase == "start":
            return {"status": "running", "checkpoint": {"phase": "work"}}
        if phase in ("wake", "work"):
            return {"status": "running", "checkpoint": {"phase": "finish"}}
        return {"status": "terminal", "outcome": {"status": "completed", "result": {"last": phase}}}

    await runtime.commit(change, context)


Sleeper = define_task(
    name="failover.sleeper",
    version=1,
    initial=lambda input: {"phase": "start"},
    phases={"start": _phase, "wake": _phase, "finish": _phase},
    abort=lambda *args: None,
)
Worker = define_task(
    name="failover.worker",
    version=1,
    initial=lambda input: {"phase": "start"},
    phases={"start": _phase, "work": _phase, "finish": _phase},
    abort=lambda *args: None,
)


def harness_options(clock: list[int]) -> dict[str, Any]:
    from pi_durable import create_registry
    from pi_durable.harness.define import define_extension

    registry = create_registry()
    registry.install(define_extension(name="failover", tasks=[Sleeper, Worker]))
    return {"registry": registry, "now": lambda: clock[0]}


# ── opening ──────────────────────────────────────────────────────────────────


async def open_writer(args: argparse.Namespace) -> Any:
    from tests.support.replication_helpers import open_writer as open_retrying

    take_over: Any = {"no": False, "yes": True, "force": "force"}[args.take_over]
    say("opening")
    storage = await open_retrying(
        args.dir,
        durability="replicated",
        nats=args.nats,
        stream=args.stream,
        replicas=args.replicas,
        store=args.store,
        take_over=take_over,
        lease_ttl=args.ttl,
    )
    say("opened", storage.replication.epoch, storage.log.head())
    return storage


def install_stall(after: int) -> None:
    """Pause the writer thread right after its ``after``-th passing lease check before a publish,
    so the parent can SIGSTOP the process between the check and the send."""

    from pi_durable_lmdb.log.stream import lease

    original = lease.WriterLease.check
    calls = [0]

    def check(self: Any) -> None:
        original(self)
        calls[0] += 1
        if calls[0] == after:
            say("stalled")
            time.sleep(0.5)

    lease.WriterLease.check = check  # type: ignore[method-assign]


# ── writer ───────────────────────────────────────────────────────────────────


class Deposed(Exception):
    pass


async def agent(number: int, storage: Any, args: argparse.Namespace, state: dict[str, Any]) -> None:
    from pi_durable_lmdb import NotWriterError

    previous: int | None = None
    turn = 0
    while not state["deposed"]:
        turn += 1
        try:
            conversation = await storage.mint_id()
            say("mint", conversation)
            entry = await storage.mint_id()
            say("mint", entry)
            again = None
            if previous is not None:
                again = await storage.mint_id()
                say("mint", again)
            task = None
            if turn % 3 == 0:
                task = await storage.mint_id()
                say("mint", task)
        except NotWriterError:
            say("mint-failed NotWriterError")
            state["deposed"] = True
            break
        except Exception as error:
            say("mint-failed", type(error).__name__)
            await asyncio.sleep(0.05)
            continue
        text = TEXTS[(turn + number) % len(TEXTS)]
        writes: list[dict[str, Any]] = [
            {
                "type": "conversation",
                "value": {
                    "id": conversation,
                    "createdAt": turn,
                    "metadata": {"by": args.name, "agent": number},
                },
            },
            {
                "type": "entry",
                "value": {
                    "id": entry,
                    "conversationId": conversation,
                    "kind": "turn",
                    "data": {"text": text, "n": turn},
                },
            },
        ]
        if again is not None:
            writes.append(
                {
                    "type": "entry",
                    "value": {
                        "id": again,
                        "conversationId": previous,
                        "kind": "again",
                        "head": again,
                    },
                }
            )
        if task is not None:
            writes.append(
                {
                    "type": "task",
                    "value": {
                        "id": task,
                        "conversationId": conversation,
                        "kind": "job",
                        "version": 1,
                        "input": {"turn": turn},
                        "state": {
                            "status": ["pending", "running", "sleeping", "terminal"][turn % 4]
                        },
                        "background": turn % 2 == 0,
                        "abortRequested": False,
                    },
                }
            )
        say("intent", conversation, json.dumps(writes, ensure_ascii=True, sort_keys=True))
        try:
            seq = await storage.commit(writes, CTX)
        except NotWriterError:
            say("fail", conversation, "NotWriterError")
            state["deposed"] = True
            break
        except Exception as error:
            say("fail", conversation, type(error).__name__)
            await asyncio.sleep(0.05)
            continue
        say("ack", conversation, seq)
        previous = conversation
        if args.pace:
            await asyncio.sleep(args.pace)


async def after_deposed(number: int, storage: Any, count: int) -> None:
    """Attempts after deposition: every one must fail with ``NotWriterError``."""

    from pi_durable_lmdb import NotWriterError

    for attempt in range(count):
        conversation = SYNTHETIC_IDS + number * 1000 + attempt
        writes = [
            {
                "type": "conversation",
                "value": {"id": conversation, "createdAt": 0, "metadata": {"late": True}},
            }
        ]
        say("intent", conversation, json.dumps(writes, ensure_ascii=True, sort_keys=True))
        try:
            seq = await storage.commit(writes, CTX)
        except NotWriterError:
            say("fail", conversation, "NotWriterError")
            continue
        except Exception as error:
            say("fail", conversation, type(error).__name__)
            continue
        say("ack", conversation, seq)
        await asyncio.sleep(0.01)


async def writer(args: argparse.Namespace) -> None:
    if args.stall_after_check:
        install_stall(args.stall_after_check)
    while True:
        try:
            storage = await open_writer(args)
        except Exception as error:
            say("open-failed", type(error).__name__, json.dumps(str(error)[:400]))
            if not args.loop:
                raise
            await asyncio.sleep(0.1)
            continue
        state = {"deposed": False}
        await asyncio.gather(
            *(agent(number, storage, args, state) for number in range(args.agents))
        )
        say("deposed")
        if not args.loop:
            await asyncio.gather(
                *(
                    after_deposed(number, storage, args.after_deposed)
                    for number in range(args.agents)
                )
            )
            await storage.close()
            say("done")
            return
        await storage.close()
        say("closed")


# ── mint ─────────────────────────────────────────────────────────────────────


async def mint(args: argparse.Namespace) -> None:
    storage = await open_writer(args)
    chunk: list[int] = []
    for number in range(args.count):
        value = await storage.mint_id()
        chunk.append(value)
        if number % 700 == 0:
            await storage.commit(
                [{"type": "conversation", "value": {"id": value, "createdAt": 1, "metadata": {}}}],
                CTX,
            )
        if len(chunk) == 500:
            say("minted", *chunk)
            chunk = []
    if chunk:
        say("minted", *chunk)
    say("ready", storage.log.head())
    await asyncio.sleep(3600)


# ── session ──────────────────────────────────────────────────────────────────


async def session(args: argparse.Namespace) -> None:
    from pi_durable import Harness

    os.environ[HANG_ENV] = "1"
    clock = [1_700_000_000_000]
    storage = await open_writer(args)
    harness = await Harness.open(storage, harness_options(clock), CTX)
    root = await harness.root(CTX)

    async def start(tx: Any) -> Any:
        sleeper = await tx.create_task(
            Sleeper, {}, {"ownership": {"kind": "conversation"}, "conversationId": root.id}
        )
        worker = await tx.create_task(
            Worker, {}, {"ownership": {"kind": "conversation"}, "conversationId": root.id}
        )
        return sleeper, worker

    sleeper, worker = await harness.commit(start, CTX)
    say("root", root.id)
    harness.resume()
    for _ in range(3000):
        a = await harness.get_task(sleeper, CTX)
        b = await harness.get_task(worker, CTX)
        if (
            a is not None
            and a["state"]["status"] == "sleeping"
            and b is not None
            and b["state"]["status"] == "running"
            and b["state"]["checkpoint"]["phase"] == "work"
        ):
            break
        await asyncio.sleep(0.01)
    else:
        raise SystemExit(f"the tasks never got there: {a!r} {b!r}")
    await asyncio.sleep(0.3)  # the worker is inside its hanging phase ("hanging" printed)
    say("ready", sleeper, worker, storage.log.head())
    await asyncio.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["writer", "mint", "session"])
    parser.add_argument("dir")
    parser.add_argument("--nats", required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=2)
    parser.add_argument("--take-over", choices=["no", "yes", "force"], default="yes")
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--loop", action="store_true")
    parser.add_argument("--after-deposed", type=int, default=3)
    parser.add_argument("--pace", type=float, default=0.0)
    parser.add_argument("--stall-after-check", type=int, default=0)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--name", default="w")
    args = parser.parse_args()
    try:
        asyncio.run({"writer": writer, "mint": mint, "session": session}[args.role](args))
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
