"""A consistent copy of a store, even while a writer commits (``durable-log backup``)."""

from __future__ import annotations

import os
import shutil
import tempfile

from ..log import Environment


def backup(
    path: str | os.PathLike[str], dest: str | os.PathLike[str], compact: bool = False
) -> int:
    """A consistent copy of a store, live or not, in the new directory ``dest``: LMDB's own copy
    from one read snapshot (``compact`` leaves out free pages, so the copy is as small as the data).

    The copy is made beside ``dest`` and renamed into place once synced, so a failed backup leaves
    nothing. Returns the copy's size in bytes.
    """

    target = os.path.abspath(os.fspath(dest))
    if os.path.lexists(target):
        raise FileExistsError(f"{target} already exists; back up into a new directory")
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"No directory {parent} to hold the backup")
    env = Environment(path, readonly=True)
    building = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.partial-", dir=parent)
    try:
        env.copy(building, compact=compact)
        data = os.path.join(building, "data.mdb")
        _fsync(data)
        _fsync(building)  # data.mdb's name: without it a cut after the rename can leave DEST empty
        os.rename(building, target)
        _fsync(parent)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    finally:
        env.close()
    return os.path.getsize(os.path.join(target, "data.mdb"))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "backup",
]
