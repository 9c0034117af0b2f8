"""A fold chunk's rows kept aside (``StagedTables``) read and land exactly as if the fold had
written them in the write transaction itself; a row LMDB refuses still stops the projection at
the record that wrote it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable_lmdb import ProjectionFailed
from pi_durable_lmdb.log import Commit
from pi_durable_lmdb.projections.user import Projection, Tables
from pi_durable_lmdb.projections.usertables import StagedTables
from pi_durable_lmdb.storage import LmdbStorage

from .test_user_builds import _commit_entries

KEYS = st.sampled_from([bytes([a]) + bytes(b) for a in b"abc" for b in ([], [97], [98], [97, 98])])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(["x", "y"]), KEYS, st.binary(max_size=4)),
        st.tuples(st.just("delete"), st.sampled_from(["x", "y"]), KEYS, st.just(b"")),
        st.tuples(st.just("get"), st.sampled_from(["x", "y"]), KEYS, st.just(b"")),
        st.tuples(
            st.just("items"),
            st.sampled_from(["x", "y"]),
            st.sampled_from([b"", b"a", b"b", b"ab", b"d"]),
            st.just(b""),
        ),
    ),
    max_size=40,
)


def _run(tables: Tables, ops: list[tuple[str, str, bytes, bytes]]) -> list[object]:
    seen: list[object] = []
    for op, db, key, value in ops:
        if op == "put":
            tables.put(db, key, value)
        elif op == "delete":
            tables.delete(db, key)
        elif op == "get":
            seen.append(tables.get(db, key))
        else:
            seen.append(list(tables.items(db, key)))
    return seen


def _contents(
    env: lmdb.Environment, dbs: dict[str, lmdb._Database]
) -> dict[str, list[tuple[bytes, bytes]]]:
    with env.begin() as txn:
        return {name: list(txn.cursor(db=db)) for name, db in dbs.items()}


@settings(max_examples=150, deadline=None)
@given(stored=st.dictionaries(KEYS, st.binary(max_size=4), max_size=8), ops=OPS)
def test_staged_rows_read_and_land_as_written_ones(
    tmp_path_factory: pytest.TempPathFactory,
    stored: dict[bytes, bytes],
    ops: list[tuple[str, str, bytes, bytes]],
) -> None:
    outcomes = []
    for staged in (False, True):
        env = lmdb.open(str(tmp_path_factory.mktemp("env")), max_dbs=4, map_size=1 << 20)
        try:
            dbs = {name: env.open_db(name.encode()) for name in ("x", "y")}
            with env.begin(write=True) as txn:
                for key, value in stored.items():
                    txn.put(key, value, db=dbs["x"])
            if staged:
                with env.begin() as txn:
                    tables: Tables = StagedTables(txn, dbs)
                    seen = _run(tables, ops)
                with env.begin(write=True) as txn:
                    assert isinstance(tables, StagedTables)
                    tables.apply(txn)
            else:
                with env.begin(write=True) as txn:
                    seen = _run(Tables(txn, dbs), ops)
            outcomes.append((seen, _contents(env, dbs)))
        finally:
            env.close()
    assert outcomes[0] == outcomes[1]


class EmptyKey(Projection):
    """Writes a row LMDB refuses (an empty key) at record 5."""

    name = "emptykey"
    version = 1

    def fold(self, tables: Tables, commit: Commit) -> None:
        tables.put("main", b"" if commit.seq == 5 else commit.seq.to_bytes(8, "big"), b"x")


async def test_a_row_lmdb_refuses_stops_the_projection_at_its_record(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(
        tmp_path / "store", durability="process", projections=[EmptyKey()]
    )
    try:
        await _commit_entries(storage, 2, 12)
        with pytest.raises(ProjectionFailed, match="stopped at log sequence 5"):
            await asyncio.wait_for(storage.projections.wait(12), 10)
        status = storage.projections.status()["emptykey"]
        assert (status.state, status.folded_seq, status.failed_seq) == ("failed", 4, 5)
        with storage.projections.read("emptykey") as tables:
            assert [int.from_bytes(key, "big") for key, _ in tables.items("main")] == [1, 2, 3, 4]
    finally:
        await storage.close()
