"""When each entry on a page was committed: its commit sequence (the entry's row keeps it) and
that commit's time (read once per sequence from the log)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX

from ..storage.reads import StorageReads


def _entries(nodes: Iterable[Any]) -> Iterator[Any]:
    for node in nodes:
        yield node.entry
        for branch in node.forks:
            yield from _entries(branch.nodes)


async def entry_times(
    log: Any, reader: StorageReads, nodes: Iterable[Any]
) -> dict[int, tuple[int, int]]:
    """``{entry id: (commit sequence, commit time in Unix ms)}`` for the entries of a tree."""

    times: dict[int, int] = {}
    found: dict[int, tuple[int, int]] = {}
    for entry in _entries(nodes):
        id = entry.get("id")
        if not isinstance(id, int) or id in found:
            continue
        lookup = await reader.entry(id, CTX)  # type: ignore[call-overload]
        if lookup is None:
            continue
        seq = int(lookup["commitSeq"])
        if seq not in times:
            commit = log.get(seq)
            times[seq] = 0 if commit is None else commit.committed_at
        found[id] = (seq, times[seq])
    return found


def roles(entry: Any) -> list[str]:
    """The roles an entry's messages speak in, once each, as a class name can carry them."""

    model = entry.get("model") if isinstance(entry, dict) else None
    if not isinstance(model, list):
        return []
    named = [message.get("role") for message in model if isinstance(message, dict)]
    return list(
        dict.fromkeys(
            role if role in ("user", "assistant", "tool", "system") else "other"
            for role in named
            if role is not None
        )
    )


__all__ = [
    "entry_times",
    "roles",
]
