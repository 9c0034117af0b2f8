"""Id minting: fresh ids above every id a store holds or ever handed out.

Ids are handed out from blocks reserved durably (the reservation is a key of the ``meta``
table, raised in a write transaction of the store's committer), so minting touches the disk
once per block and never hands out an id twice, across reopen and crashes. Every id a commit
stores (the store's own, or another writer's taken in from a stream) raises the floor the next
id is minted from.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Final, TypeAlias

import lmdb

from ..projections.readmodel import MAX_SAFE_INTEGER

ID_BLOCK: Final = 4096
"""Ids reserved per durable write, so ``mint`` touches the disk once per block."""
RESERVED_KEY: Final = b"ids.reserved"
"""The ``meta`` key of the durable reservation: ids below it may have been handed out."""
_U64 = struct.Struct(">Q")

PublishIds: TypeAlias = "Callable[[lmdb.Transaction[bytes], int], None]"
"""What else a reservation does in its transaction (a replicated writer puts it on the stream)."""


class IdMinter:
    """A store's id counter and its durable reservation, safe from any thread or event loop."""

    def __init__(
        self, meta: lmdb._Database, stored: int, reserved: int, lock: threading.RLock | None = None
    ) -> None:
        """``stored``: one above the highest id the store holds; ``reserved``: the durable
        reservation read from ``meta`` (0 when none was made); ``lock``: the minter's lock,
        which the store's commits hold from LMDB's commit until they raised the floor
        (``Committer``), so an id visible in the store is never minted."""

        self._meta = meta
        self._lock = threading.RLock() if lock is None else lock
        self._reserved = reserved
        self._next_id = max(2, stored, reserved)

    @classmethod
    def load(
        cls,
        txn: lmdb.Transaction[bytes],
        meta: lmdb._Database,
        stored: int,
        lock: threading.RLock | None = None,
    ) -> IdMinter:
        """The minter of a store holding ids below ``stored``, its reservation read in ``txn``."""

        raw = txn.get(RESERVED_KEY, db=meta)
        return cls(meta, stored, 0 if raw is None else _U64.unpack(raw)[0], lock)

    async def mint(self, reserve: Callable[[int], Awaitable[int]]) -> int:
        """A fresh id; when the reserved block is used up, ``reserve(wanted)`` makes the next
        one durable (through ``reserve_in``, in a write transaction) and returns the reservation."""

        while True:
            with self._lock:
                if self._next_id > MAX_SAFE_INTEGER:
                    raise ValueError("ID space is exhausted")
                if self._next_id < self._reserved:
                    value = self._next_id
                    self._next_id += 1
                    return value
                wanted = self._next_id + ID_BLOCK
            reserved = await reserve(wanted)
            with self._lock:
                self._reserved = max(self._reserved, reserved)

    @property
    def floor(self) -> int:
        """The lowest id that may still be minted: one above every id stored or handed out."""

        with self._lock:
            return self._next_id

    def reserve_in(
        self, txn: lmdb.Transaction[bytes], wanted: int, publish: PublishIds | None = None
    ) -> int:
        """Raise the durable reservation to ``wanted`` in ``txn`` (never lower it); returns it.
        ``publish`` is called with it in the same transaction."""

        raw = txn.get(RESERVED_KEY, db=self._meta)
        reserved = max(wanted, 0 if raw is None else _U64.unpack(raw)[0])
        txn.put(RESERVED_KEY, _U64.pack(reserved), db=self._meta)
        if publish is not None:
            publish(txn, reserved)
        return reserved

    def raise_floor(self, max_id: int) -> None:
        """Id ``max_id`` is stored: it and every id below are never minted again."""

        if max_id >= self._next_id:
            with self._lock:
                self._next_id = max(self._next_id, max_id + 1)

    def skip_reserved(self, reserved: int) -> None:
        """Another writer reserved the ids below ``reserved`` (a stream's record of it): none
        of them is handed out here."""

        with self._lock:
            self._next_id = max(self._next_id, reserved)
            self._reserved = max(self._reserved, reserved)


__all__ = [
    "ID_BLOCK",
    "RESERVED_KEY",
    "IdMinter",
    "PublishIds",
]
