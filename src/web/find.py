"""The search page: ``/search?q=`` as ``durable-log search`` answers it (``/search.json`` as its
``--json`` prints it), and while ``serve`` is still building the store's word index, how far it
has got (``/search/index.json``: the same as data)."""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from . import data
from .respond import FINDER, STORE, as_of_point, query_int, render
from .search import IndexState

RETRY_AFTER: Final = 2
"""Seconds a client is asked to wait before asking again while the index is being built."""


def _wants_json(request: web.Request) -> bool:
    if data.asked(request) == "json" or request.query.get("format") == "json":
        return True
    accept = request.headers.get("Accept", "")
    json_at, html_at = accept.find("application/json"), accept.find("text/html")
    return json_at >= 0 and (html_at < 0 or json_at < html_at)


def building(state: IndexState) -> str:
    """What the index is doing, in one sentence (it is not ready yet)."""

    if state.error is not None:
        return f"the word index cannot be built yet ({state.error}); it is tried again shortly"
    return (
        f"the word index is being built: {state.folded:,} of {state.head:,} log records folded; "
        f"ask again in a moment"
    )


async def search_page(request: web.Request) -> web.Response:
    """``/search?q=``: entries, documents and tasks holding every word, now or ``?as_of=``; each
    result a link to where it lives. As JSON (``/search.json``, ``?format=json`` or ``Accept:
    application/json``): the results as ``durable-log search --json`` prints them."""

    text = request.query.get("q", "").strip()
    as_of, head = await as_of_point(request)
    before = query_int(request, "before")
    store, finder = request.app[STORE], request.app[FINDER]
    state = finder.state
    results = None
    if text and state.ready:
        results = await finder.find(
            await store.storage(), await store.reader(as_of), text, as_of, before
        )
    if _wants_json(request):
        if not text:
            return data.record({"error": "give ?q=WORDS"}, status=400)
        if results is None:
            response = data.record({"error": building(state), "index": state}, status=503)
            response.headers["Retry-After"] = str(RETRY_AFTER)
            return response
        return data.record(msgspec.to_builtins(results))
    return render(
        request,
        "search.html",
        {
            "title": "Search",
            "q": text,
            "results": results,
            "index": state,
            "building": None if state.ready else building(state),
            "as_of": as_of,
            "head": head,
        },
    )


async def index_state(request: web.Request) -> web.Response:
    """``/search/index.json``: where the word index stands (``IndexState``)."""

    return data.record(request.app[FINDER].state)


__all__ = [
    "RETRY_AFTER",
    "building",
    "index_state",
    "search_page",
]
