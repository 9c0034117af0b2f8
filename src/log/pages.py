"""Where a store file's pages go: each database's branch, leaf and overflow pages, and the free
pages between them (``Environment.page_stats``, ``durable-log stats``, ``compact``)."""

from __future__ import annotations

from typing import Final

import lmdb
import msgspec

MAIN_DB: Final = "(main)"
"""The name ``page_stats`` gives LMDB's main database (the one naming all the others)."""
META_PAGES: Final = 2


class DbPages(msgspec.Struct, frozen=True):
    """One database's pages (``mdb_stat``)."""

    entries: int
    depth: int
    branch: int
    leaf: int
    overflow: int
    page_size: int

    @classmethod
    def of(cls, stat: lmdb._StatDict) -> DbPages:
        return cls(
            stat["entries"],
            stat["depth"],
            stat["branch_pages"],
            stat["leaf_pages"],
            stat["overflow_pages"],
            stat["psize"],
        )

    @property
    def pages(self) -> int:
        return self.branch + self.leaf + self.overflow

    @property
    def bytes(self) -> int:
        return self.pages * self.page_size


class PageStats(msgspec.Struct, frozen=True):
    """Where a store file's pages go (``Environment.page_stats``)."""

    page_size: int
    file_bytes: int
    used_pages: int
    """Pages up to the map's last page in use (``last_pgno + 1``); the file may be longer."""
    free_pages: int
    """Pages below ``used_pages`` that no database holds (LMDB reuses them before growing)."""
    dbs: dict[str, DbPages]

    @property
    def free_bytes(self) -> int:
        """Free pages plus the file beyond its last used page: what a compacting copy gives back."""

        return self.free_pages * self.page_size + max(
            0, self.file_bytes - self.used_pages * self.page_size
        )


def tally(dbs: dict[str, DbPages], last_pgno: int, file_bytes: int) -> PageStats:
    """The file's pages from each database's (``MAIN_DB`` among them, the main database, which
    holds the names of the others), read from one snapshot.

    LMDB keeps its free-page list in a database of its own (``FREE_DBI``) whose statistics
    py-lmdb does not expose, so free pages are counted by difference: the pages in use up to the
    map's last page (``last_pgno + 1``), less the two meta pages and every database's pages. That
    count includes the few pages of the free list itself; ``last_pgno`` is the newest commit's (a
    writer committing meanwhile can shift it by that commit's pages)."""

    used = last_pgno + 1
    free = max(0, used - META_PAGES - sum(db.pages for db in dbs.values()))
    return PageStats(dbs[MAIN_DB].page_size, file_bytes, used, free, dbs)


__all__ = [
    "MAIN_DB",
    "META_PAGES",
    "DbPages",
    "PageStats",
    "tally",
]
