"""Where each id lives in the view: every record a page names is a link to the page that shows it
(an entry: its conversation at that entry; a task: its conversation's task row; a document: its
page, at the version a write made when the write is named)."""

from __future__ import annotations

from typing import Any, NamedTuple
from urllib.parse import urlencode


class Link(NamedTuple):
    text: str
    href: str


def at(path: str, as_of: int | None, anchor: str = "") -> str:
    """``path`` as of a point (None: now), with an ``#anchor``."""

    query = "" if as_of is None else "?" + urlencode({"as_of": as_of})
    return f"{path}{query}{'#' + anchor if anchor else ''}"


def conversation(id: Any, as_of: int | None = None) -> str:
    return at(f"/conversations/{int(id)}", as_of)


def entry(id: Any, conversation_id: Any, as_of: int | None = None) -> str:
    return at(f"/conversations/{int(conversation_id)}", as_of, f"entry-{int(id)}")


def task(id: Any, conversation_id: Any, as_of: int | None = None) -> str:
    if isinstance(conversation_id, int):
        return at(f"/conversations/{conversation_id}", as_of, f"task-{int(id)}")
    return at(f"/records/task/{int(id)}", as_of)


def document(id: Any, as_of: int | None = None) -> str:
    return at(f"/documents/{int(id)}", as_of)


def sequence(seq: Any) -> str:
    return f"/log/{int(seq)}"


def scope(value: Any) -> Link | None:
    """A document's scope as a link, when it names a conversation."""

    if (
        isinstance(value, dict)
        and value.get("kind") == "conversation"
        and isinstance(value.get("conversationId"), int)
    ):
        return Link(
            f"conversation {value['conversationId']}", conversation(value["conversationId"])
        )
    return None


def owner(value: Any) -> list[Link]:
    """A conversation's owner: the conversation and the task that own it."""

    if not isinstance(value, dict):
        return []
    found = []
    if isinstance(value.get("conversationId"), int):
        found.append(
            Link(f"conversation {value['conversationId']}", conversation(value["conversationId"]))
        )
        if isinstance(value.get("taskId"), int):
            found.append(
                Link(f"task {value['taskId']}", task(value["taskId"], value["conversationId"]))
            )
    return found


def of_writes(seq: int, writes: list[Any]) -> list[Link]:
    """A link for each record a batch wrote (the log's writes column), in the batch's order."""

    found: list[Link] = []
    for write in writes:
        try:
            found.extend(_write_link(seq, write))
        except (TypeError, ValueError, AttributeError):  # a write without a usable id: no link
            continue
    return found


def _write_link(seq: int, write: Any) -> list[Link]:
    tag = type(write).__struct_config__.tag
    value = getattr(write, "value", None)
    if tag == "entry" and isinstance(value, dict):
        return [Link(f"entry {int(value['id'])}", entry(value["id"], value["conversationId"]))]
    if tag == "conversation" and isinstance(value, dict):
        return [Link(f"conversation {int(value['id'])}", conversation(value["id"]))]
    if tag == "task" and isinstance(value, dict):
        return [
            Link(f"task {int(value['id'])}", task(value["id"], value.get("conversationId"), seq))
        ]
    if tag == "submission" and isinstance(value, dict):
        return [
            Link(
                f"submission {int(value['id'])}", at(f"/records/submission/{int(value['id'])}", seq)
            )
        ]
    if tag in ("document.create", "document.copy"):
        return [Link(f"document {int(write.record['id'])}", document(write.record["id"], seq))]
    if tag == "document.change":
        return [Link(f"document {int(write.id)}", document(write.id, seq))]
    if tag == "document.retire":  # its page at the sequence before shows what was retired
        return [Link(f"document {int(write.id)}", document(write.id, max(0, seq - 1)))]
    return []


__all__ = [
    "Link",
    "at",
    "conversation",
    "document",
    "entry",
    "of_writes",
    "owner",
    "scope",
    "sequence",
    "task",
]
