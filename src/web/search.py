"""The search page's side of the word index: one handle on the store's ``search.index``, opened on
first use, brought level with the log (in a thread: a fold must not stall other pages) before each
query. A store without an index is told how to build one; the view never builds it unasked, since
it costs the store's directory bytes."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from markupsafe import Markup
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.types import ConversationId

from ..audit.search import SearchResults, catch_up, index_exists, search
from ..projections.search_index import MAX_WORD, Activity, SearchIndex
from ..storage.reads import StorageReads
from .text import visible


class Finder:
    def __init__(self, path: str) -> None:
        self.path = path
        self._index: SearchIndex | None = None
        self._folding = asyncio.Lock()

    def exists(self) -> bool:
        return index_exists(self.path)

    async def level(self) -> SearchIndex:
        """The index, brought level with the log."""

        if self._index is not None and self._index.replaced():  # compacted or deleted since
            self.close()
        if self._index is None:
            self._index = SearchIndex(self.path)
        async with self._folding:
            await asyncio.to_thread(catch_up, self.path, self._index)
        return self._index

    async def find(
        self, storage: Any, reader: StorageReads, query: str, as_of: int | None, before: int | None
    ) -> SearchResults:
        return await search(await self.level(), storage, reader, query, as_of, before)

    def close(self) -> None:
        if self._index is not None:
            index, self._index = self._index, None
            index.close()


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
