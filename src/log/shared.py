"""One LMDB environment per store directory per process, shared by every handle on it.

py-lmdb allows one open environment per directory per process (and LMDB's locks break with
two), so handles share a ``SharedEnv``: its databases, its gate for map changes, and its sync
mode, fixed when it opens (a writer asking for another durability is refused with
``DurabilityConflictError``). After ``fork()`` the child forgets them: they belong to the parent.
"""

from __future__ import annotations

import os
import threading
from typing import Final

import lmdb

from ..errors import DurabilityConflictError, WriterLockedError
from .durability import Mode
from .storedir import (
    MAX_DBS,
    allocate,
    check_not_truncated,
    mapped_size,
    overwrites_in_place,
    refuse_links,
)

REMAP_DRAIN: Final = 0.02
"""Seconds a map change keeps new transactions out while waiting for the open ones to end,
before it lets them in again and retries (so a long read stalls the others only briefly)."""


class Gate:
    """Keeps this process's transactions out of the memory map while it changes (one per LMDB
    environment, shared by its handles): ``held`` has an item per begin, write transaction or
    other map use in flight (list ``append``/``pop`` are atomic under the GIL, so the read
    path takes no lock); ``growing`` is set by ``Environment._remap`` while it waits for them
    and changes the map. A thread adds to ``held`` and then checks ``growing``; ``_remap``
    sets ``growing`` and then checks ``held``: one of them always sees the other."""

    __slots__ = ("changed", "growing", "held", "lock")

    def __init__(self) -> None:
        self.held: list[None] = []
        self.growing = False
        self.lock = threading.Lock()
        self.changed = threading.Condition()

    def enter(self) -> None:
        """Count this thread into ``held``, waiting while the map changes; the caller pops
        ``held`` once done with the map."""

        held = self.held
        while True:
            held.append(None)
            if not self.growing:
                return
            held.pop()
            with self.changed:
                self.changed.wait_for(lambda: not self.growing, REMAP_DRAIN)


class SharedEnv:
    """py-lmdb allows one environment per directory per process; handles share it. Its sync mode
    is fixed when it opens (py-lmdb cannot change ``MDB_NOSYNC`` later), so a writer sharing it
    must ask for a mode that syncs as ``mode`` does."""

    def __init__(self, env: lmdb.Environment, mode: Mode, mapped: bool = False) -> None:
        self.env = env
        self.mode = mode
        self.mapped = mapped
        """LMDB writes pages through the map (``Mode.mapped``, on a file system that overwrites
        in place): its file is allocated as far as the map goes (``storedir.allocate``)."""
        self.readonly = not mode.writes
        self.users = 0
        self.dbs: dict[bytes, lmdb._Database] = {}
        self.gate = Gate()
        self.closing: threading.Event | None = None
        """Set (to an event that fires once it is closed) when its last handle gives it up."""


open_envs: dict[str, SharedEnv] = {}

_opening = threading.Lock()
"""Held while a handle takes or gives up an environment: the users counts and ``open_envs`` are
never changed by two threads at once. An environment being closed stays in ``open_envs`` until it
is, and an open of its store on another thread waits for that (py-lmdb refuses to open what is
still open); the closing itself runs outside the lock, as it may wait for another thread's
transaction to end."""


def acquire(path: str, mode: Mode, map_size: int) -> SharedEnv:
    """The environment of ``path`` in this process, opened for ``mode`` if it is not open yet."""

    real = os.path.realpath(path)
    while True:
        with _opening:
            shared = open_envs.get(real)
            if shared is None or shared.closing is None:
                return _acquire(path, real, shared, mode, map_size)
            closing = shared.closing
        closing.wait()


def _acquire(
    path: str, real: str, shared: SharedEnv | None, mode: Mode, map_size: int
) -> SharedEnv:
    if shared is None:
        refuse_links(path)
        check_not_truncated(path)
        mapped = mode.mapped and overwrites_in_place(path)
        if mapped:  # LMDB makes the file as long as the map: every block of it allocated
            map_size = mapped_size(path)
            allocate(path, map_size)
        env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=MAX_DBS,
            readonly=not mode.writes,
            sync=mode.lmdb_sync,
            metasync=True,
            mode=0o600,
            create=mode.writes,
            max_spare_txns=4,
            writemap=mapped,
        )
        env.reader_check()
        shared = open_envs[real] = SharedEnv(env, mode, mapped)
    elif mode.writes:
        _refuse_conflict(path, mode)
    shared.users += 1
    return shared


def refuse_shared_conflict(path: str, mode: Mode) -> None:
    """A writer cannot share an environment this process opened read-only, or for a mode that
    syncs otherwise (its sync mode is fixed when it opens)."""

    with _opening:
        _refuse_conflict(path, mode)


def _refuse_conflict(path: str, mode: Mode) -> None:
    shared = open_envs.get(os.path.realpath(path))
    if shared is None or shared.closing is not None:  # gone once closed: ``acquire`` waits
        return
    if shared.readonly:
        raise WriterLockedError(path, " read-only by this process; close those readers first")
    if shared.mode.unsynced != mode.unsynced:
        raise DurabilityConflictError(path, mode.durability, shared.mode.durability)
    if (
        shared.mode.journaled != mode.journaled
    ):  # a journaled writer's LMDB does not sync; a replica's does
        raise DurabilityConflictError(path, mode.value, shared.mode.value)


def release(shared: SharedEnv) -> bool:
    """One handle fewer on ``shared``; the last one closes it before another open may begin
    (True: this call closed it)."""

    with _opening:
        shared.users -= 1
        if shared.users:
            return False
        closing = shared.closing = threading.Event()
    try:
        shared.env.close()
    finally:
        with _opening:
            for key, value in list(open_envs.items()):
                if value is shared:
                    del open_envs[key]
        closing.set()
    return True


forks = 0
"""Forks this process descends from since the module loaded (``read`` checks it, not the pid)."""


def _forget_after_fork() -> None:
    global _opening, forks
    forks += 1
    open_envs.clear()
    _opening = threading.Lock()  # another thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_forget_after_fork)


__all__ = [
    "REMAP_DRAIN",
    "Gate",
    "SharedEnv",
    "acquire",
    "forks",
    "open_envs",
    "refuse_shared_conflict",
    "release",
]
