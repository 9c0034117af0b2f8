"""The view's side of the word index: one handle on the store's ``search.index``, kept level with
the log by ``serve`` itself. On a store never searched it is built in the background as soon as
the server starts (the search page shows how far it has got), then every ``POLL`` seconds the
records committed since are folded into it; each query brings it level first. Catch-ups run in a
thread (a fold must not stall other pages) and write only the index's own environment, never the
store's files."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
from markupsafe import Markup
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.types import ConversationId

from ..audit.search import SearchResults, catch_up, index_exists, search
from ..projections.search_index import MAX_WORD, Activity, SearchIndex
from ..storage.reads import StorageReads
from .text import visible

POLL: Final = 1.0
"""Seconds between two looks at the log's head (one short read) for records to fold."""
RETRY: Final = 5.0
"""Seconds before an index that could not be built or kept is tried again."""


class IndexState(msgspec.Struct, frozen=True):
    """Where the view's word index stands: ``ready`` once it has been level with the log (searches
    are answered from then on), ``folded`` the last log sequence folded into it, ``head`` the log's
    head when last looked at, ``error`` why it cannot be built or kept (tried again shortly)."""

    ready: bool
    folded: int
    head: int
    error: str | None


class Finder:
    def __init__(self, path: str, head: Callable[[], Awaitable[int]]) -> None:
        self.path = path
        self._head = head
        """Reads the log's head."""
        self.state = IndexState(False, 0, 0, None)
        self._index: SearchIndex | None = None
        self._folding = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self._work: asyncio.Future[Any] | None = None
        """The catch-up or compaction running in a thread: waited for before the index closes."""
        self._stopping = False

    @property
    def ready(self) -> bool:
        return self.state.ready

    async def start(self, _app: object = None) -> None:
        """Build the index if there is none and keep it level with the log, until ``stop`` (an
        application's startup hook)."""

        self._keeper = asyncio.create_task(self._keep())

    async def stop(self) -> None:
        """Stop keeping the index: a catch-up in a thread stops after the chunk it is folding
        (each chunk is one write transaction: the index stays whole), then the handle closes."""

        self._stopping = True
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper
            self._keeper = None
        if self._work is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._work
        self.close()

    async def _in_thread(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` in a thread, which a cancelled caller leaves to finish (``stop``
        waits for it: the handle it writes through is never closed under it)."""

        self._work = asyncio.ensure_future(asyncio.to_thread(work, *args))
        return await asyncio.shield(self._work)

    async def _keep(self) -> None:
        while True:
            try:
                seen = await self._head()
                self.state = msgspec.structs.replace(self.state, head=seen)
                if not self.state.ready or seen > self.state.folded or self._stale():
                    await self.level()
                await asyncio.sleep(POLL)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a store being replaced, a directory the view may not write
                self.state = msgspec.structs.replace(
                    self.state, error=f"{type(error).__name__}: {error}"
                )
                async with self._folding:
                    self.close()
                await asyncio.sleep(RETRY)

    def _stale(self) -> bool:
        return self._index is None or self._index.replaced()

    async def level(self) -> SearchIndex:
        """The index, brought level with the log (built first when there is none)."""

        async with self._folding:
            if self._index is not None and self._index.replaced():  # compacted or deleted since
                self.close()
            fresh = False
            if self._index is None:
                fresh = not index_exists(self.path)
                if fresh:
                    self.state = IndexState(False, 0, self.state.head, None)
                self._index = await self._in_thread(_opened, self.path)
            index = self._index
            await self._in_thread(catch_up, self.path, index, self._progress)
            if fresh:  # a first build leaves pages half full: rewrite it as the CLI does
                await self._in_thread(index.compact)
            header = index.header()
            folded = 0 if header is None else header.folded_seq
            self.state = IndexState(True, folded, max(folded, self.state.head), None)
        return index

    def _progress(self, folded: int, head: int) -> None:
        """Called from the catch-up's thread after each chunk (one assignment: atomic); raises
        to end the catch-up there once the server stops."""

        self.state = IndexState(self.state.ready, folded, head, None)
        if self._stopping:
            raise asyncio.CancelledError("the server stops")

    async def find(
        self, storage: Any, reader: StorageReads, query: str, as_of: int | None, before: int | None
    ) -> SearchResults:
        return await search(await self.level(), storage, reader, query, as_of, before)

    def close(self) -> None:
        if self._index is not None:
            index, self._index = self._index, None
            index.close()


def _opened(path: str) -> SearchIndex:
    return SearchIndex(path, create=True)


def marked(text: str, terms: list[str]) -> Markup:
    """``text`` shown as ``visible`` shows it, with each of ``terms``' words in ``<mark>``."""

    wanted = set(terms)
    parts: list[str] = []
    last = 0
    for found in re.finditer(r"\w+", text):
        if found.group().lower()[:MAX_WORD] in wanted:
            parts.append(str(visible(text[last : found.start()], None)))
            parts.append(f"<mark>{visible(found.group(), None)}</mark>")
            last = found.end()
    parts.append(str(visible(text[last:], None)))
    return Markup("".join(parts))


async def active(
    finder: Finder, reader: StorageReads, skip: int, count: int
) -> tuple[list[tuple[Activity, Any]], int]:
    """A page of conversations by newest activity (each with its record), and how many there are."""

    index = await finder.level()
    with index.env.begin() as txn:
        found = index.active(txn, skip, count)
        total = index.conversations(txn)
    rows = [
        (activity, await reader.conversation(ConversationId(activity.conversationId), CTX))
        for activity in found
    ]
    return rows, total


__all__ = [
    "Finder",
    "active",
    "marked",
]
