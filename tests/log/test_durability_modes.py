"""Durability is resolved once (``log.durability.mode_for``): every durability asked for, by every
role, names one mode, and an environment of that mode holds a journal exactly when the mode is
the journaled writer's, runs LMDB with the sync flag the mode gives, and keeps the marker it
names. Read from the open environment and the disk, not from the mode's own properties alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pi_durable_lmdb.log import Environment, Mode, Role, WriteLog, encode_batch, mode_for
from pi_durable_lmdb.log.journal import JOURNAL_DIR
from pi_durable_lmdb.log.storedir import POWER_FILE, UNSYNCED_FILE

TABLE = {
    ("power", Role.WRITER): Mode.JOURNALED,
    ("power", Role.REPLICA): Mode.SYNCED,
    ("process", Role.WRITER): Mode.PROCESS,
    ("process", Role.REPLICA): Mode.PROCESS,
    ("replicated", Role.WRITER): Mode.REPLICATED,
    ("replicated", Role.REPLICA): Mode.REPLICATED,
    ("power", Role.READER): Mode.READONLY,
    ("process", Role.READER): Mode.READONLY,
    ("replicated", Role.READER): Mode.READONLY,
}


def test_every_durability_and_role_names_one_mode() -> None:
    for (durability, role), mode in TABLE.items():
        assert mode_for(durability, role) is mode, (durability, role)  # type: ignore[arg-type]
    assert set(TABLE.values()) == set(Mode)


@pytest.mark.parametrize("asked", ["fsync", "", None, "Power"])
def test_a_durability_that_is_none_of_the_three_is_refused_by_name(asked: object) -> None:
    with pytest.raises(ValueError, match="durability must be 'power', 'process' or 'replicated'"):
        mode_for(asked, Role.WRITER)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [Mode.JOURNALED, Mode.SYNCED, Mode.PROCESS, Mode.REPLICATED])
def test_an_environment_runs_its_mode(tmp_path: Path, mode: Mode) -> None:
    path = tmp_path / "store"
    env = Environment(path, mode=mode)
    try:
        log = WriteLog(env)
        payload = encode_batch([{"type": "conversation", "value": {"id": 1}}]).payload
        assert env.write(lambda txn: log.append(txn, payload)) == 1
        assert (env.journal is not None) is (mode is Mode.JOURNALED)
        assert env.env.flags()["sync"] is (mode is Mode.SYNCED)
        assert os.path.isdir(path / JOURNAL_DIR) is (mode is Mode.JOURNALED)
        assert (path / POWER_FILE).exists() is (mode is Mode.JOURNALED)
        assert (path / UNSYNCED_FILE).exists() is (mode in (Mode.PROCESS, Mode.REPLICATED))
    finally:
        env.close()
    assert not (path / POWER_FILE).exists() and not (path / UNSYNCED_FILE).exists()
    reader = Environment(path, readonly=True)
    try:
        assert reader.mode is Mode.READONLY and reader.journal is None
        assert WriteLog(reader).head() == 1
    finally:
        reader.close()


def test_a_bare_environment_is_a_reader_or_a_writer_without_a_journal(tmp_path: Path) -> None:
    """A tool's ``Environment(path)`` syncs LMDB itself; none of them makes a journal."""

    for durability, mode in (
        ("power", Mode.SYNCED),
        ("process", Mode.PROCESS),
        ("replicated", Mode.REPLICATED),
    ):
        env = Environment(tmp_path / durability, durability=durability)  # type: ignore[arg-type]
        try:
            assert env.mode is mode and env.journal is None
        finally:
            env.close()
