"""Print a store's tasks by kind and final outcome: ``python tools/task_outcomes.py PATH``.

The projection itself ships in the package (``pi_durable_lmdb.projections.task_outcomes``); this
script opens the store as its writer, lets the projection catch up, and prints its index.
"""

from __future__ import annotations

import asyncio
import sys

from pi_durable_lmdb import open_lmdb_storage
from pi_durable_lmdb.projections.task_outcomes import TaskOutcomes, outcome_counts


async def main(path: str) -> None:
    storage = await open_lmdb_storage(path, projections=[TaskOutcomes()])
    try:
        await storage.projections.wait(storage.log.head())
        for (kind, outcome), count in sorted(outcome_counts(storage.projections).items()):
            print(f"{count:>8}  {kind}  {outcome}")
    finally:
        await storage.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
