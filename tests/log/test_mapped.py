"""A ``process`` writer writes LMDB's pages through its map (``Mode.mapped``): the file is
allocated as far as the map goes before LMDB maps it, grows in few big steps (given back at a
clean close), and only on a file system that overwrites an allocated block in place. (A full disk at a growth is
``StoreFullError``: ``test_reliability.test_a_full_disk_fails_the_commit_loses_nothing_and_recovers``,
where a map written through without its file allocated killed the process with SIGBUS.)"""

from __future__ import annotations

import asyncio
import errno
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.log import environment
from pi_durable_lmdb.log.storedir import (
    ALLOCATION_SHARE,
    ALLOCATION_STEP,
    GROWTH_CAP,
    next_allocation,
    overwrites_in_place,
)
from pi_durable_lmdb.storage import LmdbStorage

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:40 / /srv/data rw,relatime - btrfs /dev/vdb rw
41 40 0:41 / /srv/data/fast rw,relatime - xfs /dev/vdc rw
42 27 0:42 / /mnt/my\\040disk rw,relatime - zfs tank rw
43 27 0:43 / /var/lib rw,relatime - btrfs /dev/vdd rw
44 43 0:44 / /var/lib rw,relatime - tmpfs tmpfs rw
"""


def test_the_file_system_decides_whether_pages_are_written_through_the_map(
    tmp_path: Path,
) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert overwrites_in_place("/home/agent/store", str(info))  # ext4
    assert not overwrites_in_place("/srv/data/store", str(info))  # btrfs: copy on write
    assert overwrites_in_place("/srv/data/fast/store", str(info))  # xfs mounted inside it
    assert overwrites_in_place("/srv/database", str(info))  # not under /srv/data: ext4
    assert not overwrites_in_place("/mnt/my disk/store", str(info))  # zfs, its name escaped
    assert overwrites_in_place("/var/lib/store", str(info))  # tmpfs mounted over the btrfs
    assert not overwrites_in_place("/x", str(tmp_path / "missing"))  # unknown: pwrite


def test_growth_doubles_then_comes_in_capped_steps_then_in_sixteenths() -> None:
    assert next_allocation(64 << 10) == (64 << 10) + ALLOCATION_STEP
    assert next_allocation(8 << 20) == 16 << 20
    assert next_allocation(GROWTH_CAP) == 2 * GROWTH_CAP
    assert next_allocation(5 * GROWTH_CAP) == 6 * GROWTH_CAP
    big = 4 * ALLOCATION_SHARE * GROWTH_CAP
    assert next_allocation(big) == big + big // ALLOCATION_SHARE
    assert next_allocation(big, 3) == big + 4 * (big // ALLOCATION_SHARE)  # again in a row


async def test_a_process_writer_maps_an_allocated_file_and_a_power_writer_does_not(
    tmp_path: Path,
) -> None:
    if not overwrites_in_place(str(tmp_path)):
        pytest.skip(f"{tmp_path} is on a file system that does not overwrite in place")
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process", map_size=64 << 10)
    try:
        env = storage._env
        assert env.env.flags()["writemap"]
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
        for _ in range(300):  # about 4 MB of text, half of it left after compression
            id = await storage.mint_id()
            text = os.urandom(7000).hex()
            await storage.commit(
                [{"type": "entry", "value": {"id": id, "conversationId": 1, "text": text}}], CTX
            )
        assert env.counters.map_growths >= 3
        info, stat = env.env.info(), os.stat(path / "data.mdb")
        used = (info["last_pgno"] + 1) * env.env.stat()["psize"]
        assert stat.st_size == info["map_size"]  # LMDB's file is its map...
        assert stat.st_blocks * 512 >= stat.st_size  # ...every block of it allocated: no hole
        assert used <= stat.st_size <= 2 * used + ALLOCATION_STEP
        assert stat.st_size > used + 64 * 4096  # the test grows the map: something to give back
    finally:
        await storage.close()
    closed = os.path.getsize(path / "data.mdb")  # a clean close gives the rest back (the
    assert used <= closed <= used + 16 * 4096  # close may commit a page or two of its own)
    storage = await LmdbStorage.open(path, durability="power")
    try:
        assert not storage._env.env.flags()["writemap"]
        assert await storage.entry(id, CTX) is not None
    finally:
        await storage.close()
    storage = await LmdbStorage.open(path, readonly=True)
    try:
        assert not storage._env.env.flags()["writemap"]
    finally:
        await storage.close()


_READ = """
import asyncio, json, sys
from pi_durable_lmdb import LmdbStorage

async def main():
    storage = await LmdbStorage.open(sys.argv[1], readonly=True)
    try:
        seqs = {}
        for id in json.loads(sys.argv[2]):
            row = await storage.entry(id)
            seqs[id] = None if row is None else row["commitSeq"]
        print(json.dumps({"head": storage.log.head(), "seqs": seqs}))
    finally:
        await storage.close()

asyncio.run(main())
"""


async def test_a_growth_ahead_that_fails_leaves_each_commit_committed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mapped writer grows its map ahead after a commit: an I/O error there comes after the
    commit, so its caller must hear of the commit only (it heard EIO before). The first growth
    ahead fails with EIO, alone and in groups of commits; a fresh process then finds every entry
    once, at its acknowledged seq."""

    if not overwrites_in_place(str(tmp_path)):
        pytest.skip(f"{tmp_path} is on a file system that does not overwrite in place")
    real = environment.grow_allocation
    failed: list[int] = []

    def failing_ahead(path: str, size: int, growths: int = 1) -> int:
        if not failed and any(frame.function == "_grow_ahead" for frame in inspect.stack()):
            failed.append(size)
            raise OSError(errno.EIO, "injected: the allocation ahead failed")
        return real(path, size, growths)

    monkeypatch.setattr(environment, "grow_allocation", failing_ahead)
    path = tmp_path / "store"
    storage = await LmdbStorage.open(path, durability="process")
    acked: dict[int, int] = {}
    try:
        await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)

        async def one() -> None:
            id = await storage.mint_id()
            text = os.urandom(2000).hex()
            acked[id] = await storage.commit(
                [{"type": "entry", "value": {"id": id, "conversationId": 1, "text": text}}], CTX
            )

        for round in range(40):  # alone, then in groups of eight
            await asyncio.gather(*(one() for _ in range(1 if round % 2 else 8)))
        assert failed, "no growth ahead was tried"
        head = storage.log.head()
    finally:
        await storage.close()
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(path), json.dumps(sorted(acked))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout)
    assert read["head"] == head == len(acked) + 1  # no batch committed twice
    assert read["seqs"] == {str(id): seq for id, seq in acked.items()}
