"""``Projector.admit``: the one check-append-fold sequence every path of a batch into the log
takes (a direct commit, a group's batch, a record from the stream, a fold).

Against pi-durable's ``MemoryStorage`` on random batches: a batch the reference refuses comes
back as the checks' error with nothing written and nothing appended; one it takes is appended
once, under the sequence ``append`` gave, and folded; anything raised after the checks (here the
append itself) propagates instead of passing for a refusal. The reads then match the reference.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import lmdb
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.log import encode_batch
from pi_durable_lmdb.storage import LmdbStorage

from tests.support.compare import REFUSALS

from ..support.workload import Workload, snapshot


class _AppendFailed(Exception):
    pass


def _everything(
    env: lmdb.Environment, txn: lmdb.Transaction[bytes]
) -> dict[bytes, list[tuple[bytes, bytes]]]:
    """Every row of every named database, as ``txn`` sees it."""

    names = [key for key, _ in txn.cursor()]
    return {name: list(txn.cursor(db=env.open_db(name, txn=txn, create=False))) for name in names}


async def _run(path: Path, seed: int, batches: int) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    reference = MemoryStorage()
    work = Workload(seed)
    projector, env, log = storage._committer.projector, storage._env, storage.log
    try:
        for number in range(batches):
            writes = work.batch()
            try:
                reference.prepare_commit(writes)
                refused = False
            except REFUSALS:
                refused = True
            try:
                encoded = encode_batch(writes)
            except REFUSALS:
                assert refused
                continue
            appended: list[int] = []

            def step(txn: lmdb.Transaction[bytes]) -> tuple[Any, Any, Any]:
                before = _everything(env.env, txn)

                def append() -> int:
                    seq = log.append(txn, encoded.payload, 1_000 + number)
                    appended.append(seq)
                    return seq

                outcome = projector.admit(txn, encoded.writes, append)
                return before, outcome, _everything(env.env, txn)

            before, outcome, after = env.write(step)
            if refused:
                assert isinstance(outcome, Exception), (
                    f"batch {number} was taken; the reference refuses it"
                )
                assert appended == [] and after == before, "a refused batch wrote something"
                continue
            assert not isinstance(outcome, Exception), f"batch {number} refused: {outcome!r}"
            assert appended == [outcome[0]] and outcome[0] == log.head()
            log.committed()
            await reference.commit(writes, CTX)

        # Anything raised once the checks passed spoils the transaction: it propagates.
        writes = [{"type": "conversation", "value": {"id": 10_000}}]
        encoded = encode_batch(writes)
        head = log.head()

        def failing(txn: lmdb.Transaction[bytes]) -> Any:
            def append() -> int:
                raise _AppendFailed("the disk went away")

            return projector.admit(txn, encoded.writes, append)

        try:
            env.write(failing)
        except _AppendFailed:
            pass
        else:
            raise AssertionError("an append that failed passed for a refusal")
        assert log.head() == head
        assert await snapshot(storage, work, head) == await snapshot(reference, work, head)
    finally:
        await storage.close()


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_admit_refuses_without_a_trace_and_takes_exactly_once(seed: int) -> None:
    with tempfile.TemporaryDirectory() as directory:  # a fresh store per example, shrinks included
        asyncio.run(_run(Path(directory) / "store", seed, 40))
