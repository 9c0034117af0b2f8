"""The paths of the records shown on their conversation's page, ``/tasks/N``, ``/entries/N`` and
``/submissions/N``: each answers with a redirect to that page at the record's row, at the same
point, so an address built from a record's kind and id always leads to it."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web
from pi_durable.context import BACKGROUND_CONTEXT as CTX

from . import data, links
from .respond import STORE, as_of_point, missing, path_number


async def record_place(request: web.Request) -> web.Response:
    """``/tasks/N``, ``/entries/N``, ``/submissions/N``: a redirect to the page that shows the
    record (its conversation's, at its row), or to its JSON (the path plus ``.json``, or a task
    of no conversation), at the same point."""

    kind = request.path.split("/")[1]
    id = path_number(request, "id")
    as_of, _ = await as_of_point(request)
    reader = await request.app[STORE].reader(as_of)
    found: Any
    if kind == "entries":
        lookup = await reader.entry(id, CTX)  # type: ignore[call-overload]
        found = None if lookup is None else lookup["entry"]
    elif kind == "tasks":
        found = await reader.task(id, CTX)  # type: ignore[arg-type]
    else:
        found = await reader.submission(id, CTX)  # type: ignore[arg-type]
    named = PLACES[kind]
    if found is None:
        return missing(request, f"{named} {id}", as_of)
    conversation = found.get("conversationId")
    if data.asked(request) or not isinstance(conversation, int):
        place = links.at(f"/records/{named}/{id}", as_of)
    else:
        place = links.at(f"/conversations/{conversation}", as_of, f"{named}-{id}")
    return web.Response(status=303, headers={"Location": place})


PLACES: Final = {"tasks": "task", "entries": "entry", "submissions": "submission"}
"""The paths of the records shown on their conversation's page, and each one's kind."""


__all__ = ["PLACES", "record_place"]
