"""One LMDB environment per store directory per process, shared by every handle on it.

py-lmdb allows one open environment per directory per process (and LMDB's locks break with
two), so handles share a ``SharedEnv``: its databases, its gate for map changes, and its sync
mode, fixed when it opens (a writer asking for another durability is refused with
``DurabilityConflictError``). After ``fork()`` the child forgets them: they belong to the parent.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

import lmdb

from ..errors import DurabilityConflictError, WriterLockedError
from .storedir import MAX_DBS, check_not_truncated, refuse_links

if TYPE_CHECKING:
    from .environment import Durability

class Gate:
    """Keeps this process's transactions out of the memory map while it changes (one per LMDB
    environment, shared by its handles): ``held`` has an item per begin, write transaction or
    other map use in flight (list ``append``/``pop`` are atomic under the GIL, so the read
    path takes no lock); ``growing`` is set by ``Environment._remap`` while it waits for them
    and changes the map. A thread adds to ``held`` and then checks ``growing``; ``_remap``
    sets ``growing`` and then checks ``held``: one of them always sees the other."""

    __slots__ = ("held", "growing", "lock", "changed")

    def __init__(self) -> None:
        self.held: list[None] = []
        self.growing = False
        self.lock = threading.Lock()
        self.changed = threading.Condition()


class SharedEnv:
    """py-lmdb allows one environment per directory per process; handles share it. Its sync mode
    is fixed when it opens (py-lmdb cannot change ``MDB_NOSYNC`` later), so ``durability`` is the
    only durability a writer sharing it can be given."""

    def __init__(self, env: lmdb.Environment, readonly: bool, durability: Durability, journaled: bool = False) -> None:
        self.env = env
        self.readonly = readonly
        self.durability = durability
        self.journaled = journaled
        self.users = 0
        self.dbs: dict[bytes, lmdb._Database] = {}
        self.gate = Gate()


open_envs: dict[str, SharedEnv] = {}


def acquire(path: str, readonly: bool, durability: Durability, map_size: int, journaled: bool = False) -> SharedEnv:
    """``journaled``: a ``power`` writer whose commits are made durable by its journal
    (``log.journal``): LMDB itself does not sync them."""

    real = os.path.realpath(path)
    shared = open_envs.get(real)
    if shared is None:
        refuse_links(path)
        check_not_truncated(path)
        env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=MAX_DBS,
            readonly=readonly,
            sync=durability == "power" and not journaled,
            metasync=True,
            mode=0o600,
            create=not readonly,
            max_spare_txns=4,
        )
        env.reader_check()
        shared = open_envs[real] = SharedEnv(env, readonly, durability, journaled)
    elif not readonly:
        refuse_shared_conflict(path, durability, journaled)
    shared.users += 1
    return shared


def refuse_shared_conflict(path: str, durability: Durability, journaled: bool = False) -> None:
    """A writer cannot share an environment this process opened read-only, or for another
    durability (its sync mode is fixed when it opens)."""

    shared = open_envs.get(os.path.realpath(path))
    if shared is None:
        return
    if shared.readonly:
        raise WriterLockedError(path, " read-only by this process; close those readers first")
    if (shared.durability == "power") != (durability == "power"):
        raise DurabilityConflictError(path, durability, shared.durability)
    if shared.journaled != journaled:  # a journaled writer's LMDB does not sync; a replica's does
        def label(journaled: bool) -> str:
            return "power (journaled writer)" if journaled else "power (replica)"

        raise DurabilityConflictError(path, label(journaled), label(shared.journaled))


def release(shared: SharedEnv) -> None:
    shared.users -= 1
    if shared.users == 0:
        for key, value in list(open_envs.items()):
            if value is shared:
                del open_envs[key]
        shared.env.close()


forks = 0
"""Forks this process descends from since the module loaded (``read`` checks it, not the pid)."""


def _forget_after_fork() -> None:
    global forks
    forks += 1
    open_envs.clear()


os.register_at_fork(after_in_child=_forget_after_fork)
