"""A reader in its own process for tests/storage/test_long_document_reader.py: it opens a store
read-only and reads one long document again and again while another process commits to it.

Usage: python tests/support/long_document_reader_child.py PATH DOCUMENT STOP [--max-reads N]
[--seconds S]

Prints ``ready`` once open, then one JSON line per read::

    {"before": H1, "after": H2, "at": "current" or SEQ, "digest": D, "version": V}

``before``/``after``: the log's head just before and just after the read, so a current read
must show the document as some commit from ``before`` to ``after`` left it; a read at ``SEQ``
(a point at or below ``before``, drawn at random) must show it exactly as commit ``SEQ`` left it.
``digest`` is ``value_digest`` of the value read, or ``"error: ..."`` when the read raised. Every
50 reads the store is closed and opened again (a fresh handle reads from the disk, caching
nothing). When the file STOP exists it holds the writer's last sequence: the reader waits until
its head reaches it, reads once more, prints ``done`` and exits; also after ``--max-reads``
reads or ``--seconds`` (bounds, not expectations).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import sys
import time
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX


def value_digest(stored: Any) -> str:
    """What a read shows of a document, as one comparable string: its value and version."""

    if stored is None:
        return "none"
    shown = json.dumps(
        [stored["version"], stored["value"]],
        sort_keys=True,
        ensure_ascii=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(shown.encode()).hexdigest()


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _read(storage: Any, document: int, at: Any) -> str:
    try:
        return value_digest(await storage.document(document, at, CTX))
    except Exception as error:  # reported, judged by the test
        return f"error: {type(error).__name__}: {str(error)[:200]}"


async def main() -> None:
    from pi_durable_lmdb.storage import LmdbStorage

    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("document", type=int)
    parser.add_argument("stop")
    parser.add_argument("--max-reads", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=300.0)
    args = parser.parse_args()
    rng = random.Random(args.document)
    storage = await LmdbStorage.open(args.path, readonly=True)
    _say("ready")
    first = storage.log.head()
    deadline = time.monotonic() + args.seconds
    try:
        for number in range(args.max_reads):
            if time.monotonic() > deadline:
                break
            if os.path.exists(args.stop):
                with open(args.stop, encoding="utf-8") as file:
                    last = int(file.read().strip() or "0")
                while storage.log.head() < last and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                head = storage.log.head()
                digest = await _read(storage, args.document, "current")
                line = {"before": head, "after": storage.log.head(), "at": "current"}
                _say(json.dumps({**line, "digest": digest, "final": True}))
                break
            if number and number % 50 == 0:
                await storage.close()
                storage = await LmdbStorage.open(args.path, readonly=True)
            before = storage.log.head()
            at: Any = "current" if rng.random() < 0.75 else rng.randint(first, before)
            digest = await _read(storage, args.document, at)
            after = storage.log.head()
            _say(json.dumps({"before": before, "after": after, "at": at, "digest": digest}))
    finally:
        await storage.close()
    _say("done")


if __name__ == "__main__":
    asyncio.run(main())
