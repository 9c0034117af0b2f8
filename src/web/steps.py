"""The history control's steps: the points its back and forward links go to. A list page exists
at every point, so it steps one log sequence at a time; a record's page steps between the points
at which the record changed, and never back past the point it was created (a link there would
answer 404)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable.types import ConversationId

from ..log.records import Commit
from .views import Store

SCAN: Final = 1024
"""Log records looked at each way for a record's changes: past them, a step goes to the last
point looked at (where the record is checked to exist), so a record unchanged for a long time
costs a bounded read."""
CHUNK: Final = 256
"""Log records read at a time (the scan stops at the chunk that holds what it looks for)."""
OF_CONVERSATION: Final = frozenset({"entry", "task", "submission"})
"""The records a conversation's page lists by their ``conversationId``."""


class Steps(msgspec.Struct, frozen=True):
    """The points the history control links to (None: no link): ``back``, an earlier point at
    which the thing on show existed; ``forward``, a later one."""

    back: int | None
    forward: int | None


def by_sequence(as_of: int | None, head: int) -> Steps:
    """A page that exists at every point (a list, the overview): one sequence each way."""

    at = head if as_of is None else as_of
    return Steps(
        back=at - 1 if at > 0 else None,
        forward=as_of + 1 if as_of is not None and as_of < head else None,
    )


def between(changes: Iterable[int], as_of: int | None, head: int) -> Steps:
    """A record changed at ``changes`` (every point, its creation the first): back to the change
    before the one in force at the point, forward to the next change."""

    at = head if as_of is None else as_of
    before = [seq for seq in changes if seq <= at]
    later = [seq for seq in changes if seq > at]
    return Steps(
        back=before[-2] if len(before) >= 2 else None,
        forward=later[0] if later and as_of is not None else None,
    )


async def of_conversation(store: Store, id: int, as_of: int | None, head: int) -> Steps:
    """A conversation's page: back to the point before its last change that is still one at which
    it existed, forward to its next change (read from the log, at most ``SCAN`` records each way)."""

    log = (await store.storage()).log

    def changed(commit: Commit) -> bool:
        return any(changes_conversation(write, id) for write in commit.writes)

    at = head if as_of is None else as_of
    found, lowest = _changes_back(log, changed, at)
    back = found[1] if len(found) >= 2 else None
    if back is None and lowest > 1:  # the scan stopped before the conversation's creation
        candidate = lowest - 1
        reader = await store.reader(candidate)
        if await reader.conversation(ConversationId(id), CTX) is not None:
            back = candidate
    forward = None if as_of is None else _change_after(log, changed, at, head)
    return Steps(back=back, forward=forward)


def changes_conversation(write: Any, id: int) -> bool:
    """Whether a write changes what conversation ``id``'s page shows: its record, one of its
    entries, tasks or submissions, or a conversation forked from it or owned by it."""

    value = getattr(write, "value", None)
    if not isinstance(value, dict):
        return False
    tag = type(write).__struct_config__.tag
    if tag in OF_CONVERSATION:
        return bool(value.get("conversationId") == id)
    if tag != "conversation":
        return False
    parent, owner = value.get("parent"), value.get("owner")
    return (
        value.get("id") == id
        or (isinstance(parent, dict) and parent.get("conversationId") == id)
        or (isinstance(owner, dict) and owner.get("conversationId") == id)
    )


def _changes_back(log: Any, changed: Callable[[Commit], bool], at: int) -> tuple[list[int], int]:
    """The last two changes at or before ``at`` (newest first) and the lowest sequence read."""

    found: list[int] = []
    floor = max(1, at - SCAN + 1)
    high = at
    lowest = at + 1
    while high >= floor and len(found) < 2:
        low = max(floor, high - CHUNK + 1)
        commits: list[Commit] = list(log.read(low, high))
        found += [commit.seq for commit in reversed(commits) if changed(commit)]
        lowest, high = low, low - 1
    return found[:2], lowest


def _change_after(log: Any, changed: Callable[[Commit], bool], at: int, head: int) -> int | None:
    """The first change after ``at``; past ``SCAN`` records, the last point read (a record once
    created exists at every later point); None when it does not change again."""

    last = min(head, at + SCAN)
    low = at + 1
    while low <= last:
        high = min(last, low + CHUNK - 1)
        for commit in log.read(low, high):
            if changed(commit):
                return int(commit.seq)
        low = high + 1
    return last if last < head else None


__all__ = [
    "CHUNK",
    "OF_CONVERSATION",
    "SCAN",
    "Steps",
    "between",
    "by_sequence",
    "changes_conversation",
    "of_conversation",
]
