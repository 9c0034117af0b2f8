"""A record a transaction noted and hashed (it crossed a tile's end) and that then aborted, appended
again as a commit appends it, must not leave its old leaf for a tile that a record appended as a
replica appends it completes (a replicated writer's group taking in the stream, a deposed writer
following it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pi_durable_lmdb import tlog
from pi_durable_lmdb.log import Environment, WriteLog, encode_batch
from pi_durable_lmdb.log.records import encode_record, record_leaf
from pi_durable_lmdb.log.tree import TILE, WRITE_TILES


def _payload(n: int, doomed: bool) -> bytes:
    return encode_batch([{"type": "conversation", "value": {"id": n, "doomed": doomed}}]).payload


def test_aborted_notes_do_not_reach_a_tile_a_replica_append_writes(tmp_path: Path) -> None:
    class Aborted(Exception):
        pass

    group = WRITE_TILES * TILE
    env = Environment(tmp_path / "store", durability="process")
    log = WriteLog(env)
    try:
        for seq in range(1, group - 12):
            env.write(
                lambda txn, seq=seq: log.append(txn, _payload(seq, False), 1_760_000_000_000 + seq)
            )

        def doomed(txn: Any) -> None:  # crosses the group's end, whose record hashes the notes
            after = None
            for at in range(group - 12, group + 3):
                after = log.append(txn, _payload(at, True), 1_760_000_000_000 + at, after)
            raise Aborted

        try:
            env.write(doomed)
        except Aborted:
            pass
        for seq in range(group - 12, group):  # appended again as commits
            env.write(
                lambda txn, seq=seq: log.append(txn, _payload(seq, False), 1_760_000_000_000 + seq)
            )
        record = encode_record(_payload(group, False), 1_760_000_000_000 + group)
        env.write(
            lambda txn: log.append_record(txn, group, record)
        )  # as a replica: completes the group
        with env.read() as txn:
            assert log.tree.size(txn) == group
        root = log.root()
        found = log.tree.check(log, log.head())
    finally:
        env.close()
    env = Environment(tmp_path / "store", readonly=True)
    try:
        leaves = [
            record_leaf(seq, data)
            for seq, data in WriteLog(env).read(1, None, decode=lambda seq, data: (seq, data))
        ]
    finally:
        env.close()
    assert found == ([], 0)
    assert root == tlog.root_of(leaves)
