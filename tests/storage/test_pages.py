"""Entry pages at their edges, against MemoryStorage: limits below one, cursors through a fork
chain in both orders, bounds, and lookups of an entry through a conversation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.storage.memory import MemoryStorage
from pi_durable_lmdb.storage import LmdbStorage

from tests.support.compare import REFUSALS

from ..support.compare import canonical


async def _call(store: Any, method: str, *args: Any) -> Any:
    try:
        return ("ok", canonical(await getattr(store, method)(*args)))
    except REFUSALS as error:
        return ("error", type(error).__name__, str(error))


async def _walk(store: Any, query: dict[str, Any], limit: int) -> list[Any]:
    pages, cursor = [], None
    for _ in range(50):
        outcome = await _call(store, "scan_entries", query, limit, cursor, CTX)
        pages.append(outcome)
        cursor = _next(outcome) if outcome[0] == "ok" else None
        if cursor is None:
            return pages
    raise AssertionError(f"more than 50 pages of {query}")


def _next(outcome: Any) -> dict[str, Any] | None:
    """The cursor of a page in ``canonical`` form, as a plain dict again."""

    fields = dict(outcome[1][1])
    if "next" not in fields:
        return None
    return {key: value[1] for key, value in fields["next"][1]}


async def test_entry_pages_match_memory_storage_at_the_edges(tmp_path: Path) -> None:
    ours = await LmdbStorage.open(tmp_path / "store", durability="process")
    reference = MemoryStorage()
    writes: list[list[dict[str, Any]]] = [[{"type": "conversation", "value": {"id": 1}}]]
    next_id, parent = 2, 1
    for level in range(4):  # a fork chain 1 <- c2 <- c3 ..., forked at the parent's newest entry
        entries = [
            {"type": "entry", "value": {"id": next_id + n, "conversationId": parent, "kind": "m"}}
            for n in range(3)
        ]
        writes.append(entries)
        fork_at, next_id = next_id + 2, next_id + 3
        child = next_id
        writes.append(
            [
                {
                    "type": "conversation",
                    "value": {
                        "id": child,
                        "parent": {"conversationId": parent, "at": fork_at - level % 2},
                    },
                }
            ]
        )
        next_id, parent = next_id + 1, child
    writes.append(
        [{"type": "entry", "value": {"id": next_id, "conversationId": parent, "kind": "m"}}]
    )
    orphan = {
        "id": 500,
        "parent": {"conversationId": 777, "at": 3},
    }  # an ancestor that does not exist
    writes.append([{"type": "conversation", "value": orphan}])
    writes.append(
        [
            {"type": "entry", "value": {"id": id, "conversationId": 500, "kind": "m"}}
            for id in (501, 502)
        ]
    )
    for batch in writes:
        await reference.commit(batch, CTX)
        await ours.commit(batch, CTX)
    leaf = parent
    for conversation in (1, leaf, 500, 999):
        for order in (None, "ascending", "descending"):
            for bounds in (
                {},
                {"minEntryId": 4},
                {"maxEntryId": 9},
                {"minEntryId": 30, "maxEntryId": 3},
            ):
                query = {"conversationId": conversation, **bounds}
                if order is not None:
                    query["order"] = order
                for limit in (-1, 0, 1, 2, 100):
                    assert await _walk(ours, query, limit) == await _walk(
                        reference, query, limit
                    ), (query, limit)
        for id in [*range(next_id + 2), 501, 502]:
            assert await _call(ours, "entry", conversation, id, CTX) == await _call(
                reference, "entry", conversation, id, CTX
            )
    await ours.close()
