"""What a commit's acknowledgement promises: the durability a user asks for (``Durability``) and
the mode an open store runs in (``Mode``), resolved from it once, here, by ``mode_for``.

What a user asks for:

``"power"`` (default)
    An acknowledged commit survives power loss.
``"process"``
    An acknowledged commit survives the process being killed, not an OS crash or power loss.
``"replicated"``
    Locally as ``"process"``: a NATS JetStream stream is the durable copy (``log.stream.writer``
    publishes a commit's records before its LMDB transaction commits).

What the opener is (``Role``) decides how ``"power"`` is kept: a store's writer keeps a journal
(``Mode.JOURNALED``), anything else that writes the store syncs LMDB at every commit
(``Mode.SYNCED``). The modes, and what each does (``log.environment`` runs them):

``JOURNALED``
    A store's own ``power`` writer (``LmdbStorage.open``). LMDB runs without syncing; each write
    transaction's log records go to a write-ahead journal as one flushed frame before LMDB commits
    it: one device flush per commit or group (``log.journal``, ``log.journaled``). Checkpoints sync
    ``data.mdb`` off the commit path; a read transaction pinned on the last checkpoint keeps its
    pages from reuse; ``power.unsynced`` (boot id, the writer life's epoch) stays in the store
    until a clean close. An open that finds it writes the checkpoint's meta pages back and leaves
    the journal's later records for the storage to replay; until then a read-only open after a
    reboot, and a writer of any other mode, refuses the store (``JournalReplayPending``).
``SYNCED``
    ``"power"`` without a journal: a replica (its records come from a stream), or a tool or test
    writing the log itself on a bare ``Environment``. LMDB syncs data and meta pages on every
    commit; it never removes ``power.unsynced`` and refuses a store that holds one.
``PROCESS``
    ``MDB_NOSYNC``: a commit is in the OS page cache when acknowledged, so it survives the process
    being killed. It does not survive an OS crash or power loss: the OS writes unsynced pages back
    in any order (ext4 and xfs included), so the disk can hold a meta page whose tree was never
    written, and LMDB cannot tell. So the writer keeps ``process.unsynced`` in the store (holding
    the boot id, made durable before LMDB writes anything) until it has synced and closed; any
    open that finds one from an earlier boot refuses with ``StoreDamagedError`` (tools/powerloss:
    docs/reliability.md, "Power loss").
``REPLICATED``
    Locally as ``PROCESS``; commits are acknowledged once the stream holds them.
``READONLY``
    Commits nothing.
"""

from __future__ import annotations

import enum
from typing import Literal

Durability = Literal["power", "process", "replicated"]
"""The durability a user asks for (see the module docstring)."""

DURABILITIES: tuple[Durability, ...] = ("power", "process", "replicated")


class Role(enum.Enum):
    """What opens the store, which decides how ``"power"`` durability is kept."""

    WRITER = "writer"
    """A store's writer: its commits are made here, first (a journal keeps ``"power"``)."""
    REPLICA = "replica"
    """A replica taking records made elsewhere, or a tool writing the log on a bare
    ``Environment``: no journal (LMDB's own sync keeps ``"power"``)."""
    READER = "reader"
    """A read-only open."""


class Mode(enum.Enum):
    """How an open store makes its commits durable (see the module docstring); the value is the
    name a conflict between two handles is reported with."""

    JOURNALED = "power (journaled writer)"
    SYNCED = "power (replica)"
    PROCESS = "process"
    REPLICATED = "replicated"
    READONLY = "read-only"

    @property
    def writes(self) -> bool:
        return self is not Mode.READONLY

    @property
    def journaled(self) -> bool:
        """Commits are made durable by the journal (``log.journaled``)."""

        return self is Mode.JOURNALED

    @property
    def unsynced(self) -> bool:
        """LMDB runs without syncing and nothing flushes a commit: ``process.unsynced`` stays in
        the store while it is open, and its close syncs the file."""

        return self is Mode.PROCESS or self is Mode.REPLICATED

    @property
    def mapped(self) -> bool:
        """LMDB writes pages through a writable map (``MDB_WRITEMAP``): no ``pwrite`` per dirty
        page at each commit, which is most of what an unsynced commit costs LMDB. Only where
        nothing syncs at a commit: what a mapped write reaches is the page cache, as a
        ``pwrite``'s does, so a killed process loses nothing either way; ``power`` keeps
        ``pwrite`` (its checkpoints and the power-loss explorer see each page written). Only
        on a file system that overwrites in place (``storedir.overwrites_in_place``), with the
        file allocated before it is mapped (``storedir.allocate``): a full disk is then an
        error at a growth, never a SIGBUS at a write."""

        return self.unsynced and self.writes

    @property
    def lmdb_sync(self) -> bool:
        """LMDB's own ``sync`` flag: it syncs data and meta pages at every commit (a reader, which
        commits nothing, keeps LMDB's default)."""

        return self is Mode.SYNCED or self is Mode.READONLY

    @property
    def durability(self) -> str:
        """The durability a writer of this mode asked for (what a conflict names)."""

        return "power" if self is Mode.JOURNALED or self is Mode.SYNCED else self.value


def mode_for(durability: Durability, role: Role) -> Mode:
    """The mode an opener of ``role`` that asked for ``durability`` runs in: the one place that
    decides it (and whether a store has a journal)."""

    if durability not in DURABILITIES:
        raise ValueError(
            f"durability must be 'power', 'process' or 'replicated', not {durability!r}"
        )
    if role is Role.READER:
        return Mode.READONLY
    if durability == "power":
        return Mode.JOURNALED if role is Role.WRITER else Mode.SYNCED
    return Mode.PROCESS if durability == "process" else Mode.REPLICATED


__all__ = [
    "DURABILITIES",
    "Durability",
    "Mode",
    "Role",
    "mode_for",
]
