"""Whether this user may read a store, said as a permission problem: without it, a directory the
user cannot enter looks like no store at all ("no data.mdb"), and a lock file it cannot write
like a bare "Permission denied".

A reader needs to enter and list the store's directory, to read ``data.mdb``, and to write
``lock.mdb``: every LMDB reader records itself in a slot of that file (so a writer never reuses
pages it still reads)."""

from __future__ import annotations

import getpass
import os
from typing import Final

NEEDS: Final = (
    "a reader needs to enter and list the directory, read data.mdb and write lock.mdb, "
    "where LMDB readers record themselves"
)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


def access_problem(path: str | os.PathLike[str]) -> str | None:
    """What keeps this user from reading the store at ``path``, or None (nothing does, or there
    is no store there: that is reported where the store is opened)."""

    where = os.path.abspath(os.fspath(path))
    if not os.path.isdir(where):
        parent = os.path.dirname(where)
        if not os.path.lexists(where) and os.path.isdir(parent) and not os.access(parent, os.X_OK):
            return f"{_user()} may not enter {parent}, the directory that holds {where}"
        return None
    if not os.access(where, os.R_OK | os.X_OK):
        return f"{_user()} may not read the store directory {where} ({NEEDS})"
    data, lock = os.path.join(where, "data.mdb"), os.path.join(where, "lock.mdb")
    if os.path.exists(data) and not os.access(data, os.R_OK):
        return f"{_user()} may not read {data} ({NEEDS})"
    if os.path.exists(lock) and not os.access(lock, os.R_OK | os.W_OK):
        return f"{_user()} may not write {lock} ({NEEDS})"
    if os.path.exists(data) and not os.path.exists(lock) and not os.access(where, os.W_OK):
        return f"{where} has no lock.mdb and {_user()} may not create it ({NEEDS})"
    return None


def require_access(path: str | os.PathLike[str]) -> None:
    """Refuse (``PermissionError``) a store this user cannot read, saying what is missing."""

    problem = access_problem(path)
    if problem is not None:
        raise PermissionError(f"Permission denied: {problem}")


__all__ = [
    "NEEDS",
    "access_problem",
    "require_access",
]
