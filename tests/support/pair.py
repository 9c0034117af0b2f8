"""This engine and pi-durable's ``MemoryStorage`` holding the same batches, on one event loop: for
tests that ask both the same read and compare the outcomes (``compare.outcome``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.storage import LmdbStorage

from .compare import REFUSALS, outcome
from .workload import Workload


class Pair:
    """The same ``commits`` batches of ``Workload(seed)`` (the ones the reference accepts) in a
    ``process`` store at ``path`` and in the reference."""

    def __init__(self, path: Path, seed: int, commits: int) -> None:
        self.loop = asyncio.new_event_loop()
        self.reference = MemoryStorage()
        self.storage = self.loop.run_until_complete(LmdbStorage.open(path, durability="process"))
        self.work = Workload(seed)
        done = 0
        while done < commits:
            writes = self.work.batch()
            try:
                self.reference.prepare_commit(writes)
            except REFUSALS:
                continue
            self.loop.run_until_complete(self.reference.commit(writes, CTX))
            self.loop.run_until_complete(self.storage.commit(writes, CTX))
            done += 1

    def both(self, method: str, *args: Any) -> tuple[Any, Any]:
        """The outcome of ``method(*args)`` on the reference, then on this engine."""

        run = self.loop.run_until_complete
        return (
            run(outcome(getattr(self.reference, method)(*args))),
            run(outcome(getattr(self.storage, method)(*args))),
        )

    def close(self) -> None:
        self.loop.run_until_complete(self.storage.close())
        self.loop.close()
