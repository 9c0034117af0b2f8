"""Long document values served from memory (``tables.ValueCache``) only while the stored head row
names the same bytes: never a value whose transaction did not commit."""

from __future__ import annotations

from pathlib import Path

import lmdb
from pi_durable_lmdb.projections import tables as t


def _env(tmp_path: Path) -> tuple[lmdb.Environment, lmdb._Database]:
    env = lmdb.open(str(tmp_path / "env"), max_dbs=2, map_size=64 << 20)
    return env, env.open_db(b"values")


def test_an_aborted_write_of_a_long_value_is_never_served_from_the_cache(tmp_path: Path) -> None:
    env, db = _env(tmp_path)
    cache = t.ValueCache()
    first = b"a" * (5 * t.CHUNK + 17)
    second = b"b" * len(first)  # the same length: the head rows differ by the checksum alone
    with env.begin(write=True) as txn:
        t.put_value(txn, db, 7, first, cache=cache)
    txn = env.begin(write=True)
    t.put_value(txn, db, 7, second, cache=cache)
    assert t.get_value(txn, db, 7, t.unseal, cache) == second  # the writer sees its own write
    txn.abort()
    with env.begin() as txn:
        assert t.get_value(txn, db, 7, t.unseal, cache) == first
        assert t.get_value(txn, db, 7, t.unseal, t.ValueCache()) == first  # read from the chunks
    with env.begin(write=True) as txn:
        t.put_value(txn, db, 7, second, first, cache)
    with env.begin() as txn:
        assert t.get_value(txn, db, 7, t.unseal, t.ValueCache()) == second
        assert t.get_value(txn, db, 7, t.unseal, cache) == second
    env.close()


def test_the_cache_keeps_the_newest_values_within_its_bounds() -> None:
    cache = t.ValueCache()
    for id in range(t.ValueCache.ENTRIES + 3):
        cache.put(id, id, bytes([id]) * 10)
    assert cache.get(0, 0) is None and cache.get(2, 2) is None
    assert cache.get(3, 3) == bytes([3]) * 10 and cache.get(3, 4) is None
    cache.put(100, 1, b"x" * (t.ValueCache.BYTES - 5))
    cache.put(101, 1, b"y" * 10)
    assert cache.get(100, 1) is None and cache.get(101, 1) == b"y" * 10, (
        "the bytes bound drops the oldest"
    )
