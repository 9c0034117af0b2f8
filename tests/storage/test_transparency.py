"""The log's Merkle tree as the store keeps it: the same root and leaves whatever path appended the
records (commits alone or in groups with rejections, a reopen mid-tile, a store written before the
tree, an export imported, a compaction), the tree filled in on open, rebuilt, and checked."""

from __future__ import annotations

import asyncio
import copy
import os
import random
from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, tlog
from pi_durable_lmdb.audit.export import export_lines
from pi_durable_lmdb.audit.migrate import import_export
from pi_durable_lmdb.log import Environment, WriteLog, encode_batch
from pi_durable_lmdb.log.compact import compact
from pi_durable_lmdb.log.records import encode_record, record_leaf
from pi_durable_lmdb.log.tree import TILE, WRITE_TILES

from tests.fixtures import old_store
from tests.support.compare import REFUSALS
from tests.support.workload import Workload


def leaves_of(path: Path) -> list[bytes]:
    """Every record's leaf hash, from the log's stored bytes (not from the tree)."""

    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        return [
            record_leaf(seq, data)
            for seq, data in log.read(1, None, decode=lambda seq, data: (seq, data))
        ]
    finally:
        env.close()


def stored_tree(path: Path) -> tuple[int, bytes, list[str]]:
    """The stored tree's size, the log's root as the store computes it, and ``check``'s findings."""

    env = Environment(path, readonly=True)
    try:
        log = WriteLog(env)
        with env.read() as txn:
            size = log.tree.size(txn)
        found, _ = log.tree.check(log, log.head())
        return size, log.root(), found
    finally:
        env.close()


async def test_groups_with_rejections_and_a_reopen_mid_tile_keep_the_logs_tree(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store"
    work, rng = Workload(3), random.Random(3)
    batches: list[list[dict[str, Any]]] = []
    while len(batches) < 150:
        batches.append(
            copy.deepcopy(rng.choice(batches[-8:]))
            if batches and rng.random() < 0.2
            else work.batch()
        )
    storage = await LmdbStorage.open(path, durability="process")
    await storage.commit(batches[0], CTX)
    queue = iter(batches[1:])

    async def agent() -> None:
        for writes in queue:
            try:
                await storage.commit(writes, CTX)
            except REFUSALS:
                pass

    await asyncio.gather(*(agent() for _ in range(12)))
    head = storage.log.head()
    assert head < len(batches), "some batches must have been refused"
    await storage.close()
    leaves = leaves_of(path)
    size, root, found = stored_tree(path)
    assert (size, root, found) == (head - head % TILE, tlog.root_of(leaves), [])

    storage = await LmdbStorage.open(
        path, durability="process"
    )  # the tail of the last tile is the log's
    for n in range(2 * TILE + 3):
        await storage.commit([{"type": "conversation", "value": {"id": 50_000 + n}}], CTX)
    head = storage.log.head()
    assert storage.log.root() == tlog.root_of(leaves_of(path))
    for old in (0, 1, TILE, head // 2, head - 1):
        proof = storage.log.prove_consistency(old)
        tlog.verify_consistency(
            old,
            head,
            storage.log.root(old),
            storage.log.root(),
            [bytes.fromhex(value) for value in proof.consistency],
        )
    await storage.close()
    size, root, found = stored_tree(path)
    assert (size, root, found) == (head - head % TILE, tlog.root_of(leaves_of(path)), [])


async def test_rebuild_refills_the_tree_and_check_names_a_damaged_tile(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    for n in range(5 * TILE + 1):
        await storage.commit([{"type": "conversation", "value": {"id": 2 + n}}], CTX)
    root = storage.log.root()
    await storage.rebuild()
    assert storage.log.root() == root
    await storage.close()

    env = Environment(path, durability="process")
    log = WriteLog(env)
    key = (2).to_bytes(8, "big")
    with env.read() as txn:
        tile = bytes(txn.get(key, db=log.tree.db))
    env.write(lambda txn: txn.put(key, tile[:-1] + bytes([tile[-1] ^ 1]), db=log.tree.db))
    found, total = log.tree.check(log, log.head())
    env.close()
    assert total == 1 and found == [
        f"the log tree's tile of records {2 * TILE + 1} to {3 * TILE} differs from the hashes of the log's records"
    ]


async def test_rebuild_rewrites_a_damaged_tree_in_place_and_trims_tiles_past_the_log(
    tmp_path: Path,
) -> None:
    """A rebuild writes every tile over the stored one (never dropping the tree first, so a
    reader never sees a hole) and deletes tiles the log does not cover; ``check`` names both."""

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    for n in range(3 * TILE + 5):
        await storage.commit([{"type": "conversation", "value": {"id": 2 + n}}], CTX)
    root = storage.log.root()
    await storage.close()

    env = Environment(path, durability="process")
    log = WriteLog(env)
    first, far = (0).to_bytes(8, "big"), (9).to_bytes(8, "big")
    with env.read() as txn:
        tile = bytes(txn.get(first, db=log.tree.db))
    env.write(
        lambda txn: (
            txn.put(first, bytes(len(tile)), db=log.tree.db),
            txn.put(far, tile, db=log.tree.db),
        )
    )
    found, total = log.tree.check(log, log.head())
    assert total == 2 and any(
        f"holds {10 * TILE} leaves, more than the log's {3 * TILE + 5} records" in line
        for line in found
    ), found
    log.tree.rebuild(log)
    assert log.tree.check(log, log.head()) == ([], 0)
    with env.read() as txn:
        assert log.tree.size(txn) == 3 * TILE
    env.close()
    storage = await LmdbStorage.open(path, durability="process")
    assert storage.log.root() == root
    await storage.close()


async def test_stores_written_before_the_tree_get_it_and_keep_their_root_through_import_and_compaction(
    tmp_path: Path,
) -> None:
    for version, archive in old_store.ARCHIVES.items():
        where = old_store.extract(tmp_path / f"v{version}", archive)
        path = where / "store"
        expected = tlog.root_of(leaves_of(path))
        env = Environment(
            path, readonly=True
        )  # read-only, never opened by this version: hashed from the log
        try:
            assert WriteLog(env).root() == expected
        finally:
            env.close()
        storage = await LmdbStorage.open(
            path, durability="process"
        )  # a writer's open fills the tree in
        head = storage.log.head()
        assert storage.log.root() == expected
        await storage.close()
        assert stored_tree(path) == (head - head % TILE, expected, [])

        lines = (where / "export.jsonl").read_text().splitlines()
        await import_export(lines, where / "imported")
        assert stored_tree(where / "imported")[1] == expected
        assert list(export_lines(where / "imported")) == list(export_lines(path))

        compact(path)
        assert stored_tree(path) == (head - head % TILE, expected, [])


async def test_root_and_proofs_refuse_sizes_the_log_does_not_have(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        assert storage.log.root() == tlog.EMPTY_ROOT == storage.log.root(0)
        await storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
        for call in (
            lambda: storage.log.root(2),
            lambda: storage.log.prove(2),
            lambda: storage.log.prove(1, 2),
            lambda: storage.log.prove_consistency(2),
            lambda: storage.log.root(-1),
        ):
            try:
                call()
            except ValueError as error:
                assert (
                    "0 to the log head 1" in str(error)
                    or "not in the tree" in str(error)
                    or "from 0 to" in str(error)
                )
            else:
                raise AssertionError("accepted a size beyond the log")
        proof = storage.log.prove(1)
        assert (proof.seq, proof.leaf_index, proof.tree_size, proof.inclusion) == (1, 0, 1, [])
        assert proof.leaf_hash == proof.root_hash == storage.log.root().hex()
    finally:
        await storage.close()
    assert os.path.isdir(tmp_path / "store")


async def test_verify_checks_the_stored_tree(tmp_path: Path) -> None:
    from pi_durable_lmdb.audit.verify import check

    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    for n in range(3 * TILE):
        await storage.commit([{"type": "conversation", "value": {"id": 2 + n}}], CTX)
    await storage.close()
    assert check(path).sound
    env = Environment(path, durability="process")
    log = WriteLog(env)
    key = (1).to_bytes(8, "big")
    with env.read() as txn:
        tile = bytes(txn.get(key, db=log.tree.db))
    env.write(lambda txn: txn.put(key, bytes([tile[0] ^ 1]) + tile[1:], db=log.tree.db))
    env.close()
    report = check(path)
    assert not report.sound
    assert [str(difference) for difference in report.differences] == [
        f"the log's Merkle tree: the log tree's tile of records {TILE + 1} to {2 * TILE} differs from the hashes of the log's records (table tlog)"
    ]


async def test_a_replica_has_its_writers_tree_at_every_sequence(tmp_path: Path) -> None:
    from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryStream

    server = MemoryStream("MEM")
    writer = await LmdbStorage.open(
        tmp_path / "w", durability="process", nats=MemoryLink(server), stream="MEM", store="s1"
    )
    replica = await LmdbStorage.open_replica(
        tmp_path / "r", nats=MemoryLink(server), stream="MEM", store="s1"
    )
    try:
        for n in range(1, 2 * TILE + 6):
            await writer.commit([{"type": "conversation", "value": {"id": n}}], CTX)
        assert await writer._link.arun(writer.replication.drain(10))  # type: ignore[union-attr]
        head = writer.log.head()
        await replica.wait(head, 10)
        assert [replica.log.root(size) for size in range(head + 1)] == [
            writer.log.root(size) for size in range(head + 1)
        ]
        signer = tlog.generate_signer("audit.example.com/s1")
        checkpoint = tlog.verify_checkpoint(writer.log.checkpoint(signer), signer.verifier())
        assert replica.log.root(checkpoint.size) == checkpoint.root
    finally:
        await replica.close()
        await writer.close()
    assert stored_tree(tmp_path / "r")[::2] == (head - head % TILE, [])


async def test_a_damaged_tree_never_refuses_a_commit_and_rebuild_mends_it(tmp_path: Path) -> None:
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    for n in range(TILE):
        await storage.commit([{"type": "conversation", "value": {"id": 2 + n}}], CTX)
    await storage.close()
    env = Environment(path, durability="process")
    log = WriteLog(env)
    env.write(
        lambda txn: txn.put((0).to_bytes(8, "big"), b"short", db=log.tree.db)
    )  # a tile cut short
    env.close()
    storage = await LmdbStorage.open(path, durability="process")
    try:
        for n in range(2 * TILE):
            await storage.commit([{"type": "conversation", "value": {"id": 100 + n}}], CTX)
        assert storage.log.head() == 3 * TILE
        await storage.rebuild()
        assert storage.log.root() == tlog.root_of(leaves_of(path))
    finally:
        await storage.close()
    assert stored_tree(path) == (3 * TILE, tlog.root_of(leaves_of(path)), [])


def test_a_legacy_big_integer_record_has_the_leaf_of_its_writes_encoded_today() -> None:
    """Early versions wrote integers beyond 64 bits as extension type 2 (format-1 records only):
    such a record hashes as a commit encodes the same writes today, so its export imports to the
    same leaf."""

    import msgspec
    from pi_durable_lmdb.log.records import RawRecord, _checksum, encode_batch, encode_record
    from pi_durable_lmdb.tlog import record_leaf_hash

    big = 10**30
    legacy = msgspec.msgpack.encode(
        [
            {
                "type": "conversation",
                "value": {"id": 2, "n": msgspec.msgpack.Ext(2, str(big).encode())},
            }
        ]
    )
    today = encode_batch([{"type": "conversation", "value": {"id": 2, "n": big}}]).payload
    assert legacy != today
    stored = msgspec.msgpack.encode(RawRecord(1, 5, _checksum(5, legacy), legacy))
    assert (
        record_leaf(1, stored)
        == record_leaf_hash(1, 5, today)
        == record_leaf(1, encode_record(today, 5))
    )


async def test_commits_write_tiles_a_group_at_a_time_and_close_writes_the_rest(
    tmp_path: Path,
) -> None:
    """A commit touches the tree's table only when its record completes a group of WRITE_TILES
    tiles; roots in between hash the rest from the log, and a close stores every whole tile."""

    path = tmp_path / "store"
    group = WRITE_TILES * TILE
    storage = await LmdbStorage.open(path, durability="process")
    sizes = []
    try:
        for n in range(group + 2 * TILE + 3):
            await storage.commit([{"type": "conversation", "value": {"id": 2 + n}}], CTX)
            with storage.log.env.read() as txn:
                sizes.append((storage.log.head(), storage.log.tree.size(txn)))
        head = storage.log.head()
        assert storage.log.root() == tlog.root_of(leaves_of(path))
    finally:
        await storage.close()
    assert sizes == [(seq, seq - seq % group) for seq in range(1, head + 1)]
    assert stored_tree(path) == (head - head % TILE, tlog.root_of(leaves_of(path)), [])


def test_records_appended_again_after_an_aborted_transaction_are_the_trees_leaves(
    tmp_path: Path,
) -> None:
    """A transaction that appends records and then aborts (across a tile's end, within a tile, up
    to a tile's end, up to the end of a group of tiles, whose commit writes them) leaves nothing
    of its records in the tree: the records appended in their place are the leaves of the tiles
    the commits write, whether appended as a commit appends them or as a replica does."""

    class Aborted(Exception):
        pass

    def payload(n: int, doomed: bool) -> bytes:
        return encode_batch(
            [{"type": "conversation", "value": {"id": n, "doomed": doomed}}]
        ).payload

    env = Environment(tmp_path / "store", durability="process")
    log = WriteLog(env)
    group = WRITE_TILES * TILE
    aborted = {
        TILE - 1: TILE + 3,
        2 * TILE + 3: 2 * TILE + 8,
        4 * TILE - 6: 4 * TILE,
        5 * TILE + 3: 5 * TILE + 6,
        group - 19: group,
    }
    replicated = range(5 * TILE + 3, 5 * TILE + 7)  # appended again as a replica appends records
    try:
        for seq in range(1, group + TILE + 4):
            if seq in aborted:

                def doomed(txn: Any, first: int = seq, end: int = aborted[seq]) -> None:
                    after = None
                    for at in range(first, end + 1):
                        after = log.append(txn, payload(at, True), 1_760_000_000_000 + at, after)
                    raise Aborted

                try:
                    env.write(doomed)
                except Aborted:
                    pass
            if seq in replicated:
                record = encode_record(payload(seq, False), 1_760_000_000_000 + seq)
                env.write(lambda txn, seq=seq, record=record: log.append_record(txn, seq, record))
            else:
                env.write(
                    lambda txn, seq=seq: log.append(
                        txn, payload(seq, False), 1_760_000_000_000 + seq
                    )
                )
        with env.read() as txn:
            assert log.tree.size(txn) == group
        assert log.tree.check(log, log.head()) == ([], 0)
        root = log.root()
    finally:
        env.close()
    leaves = leaves_of(tmp_path / "store")
    assert len(leaves) == group + TILE + 3
    assert root == tlog.root_of(leaves)
    assert stored_tree(tmp_path / "store") == (group, root, [])
