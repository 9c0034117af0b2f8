"""How the view's pages answer: the application's keys, the error pages (a bad query is a 400
naming it, an unreadable store a 503), HTML from the templates, JSON, and query parameters."""

from __future__ import annotations

import asyncio
from typing import Any, Final
from urllib.parse import urlencode

import jinja2
from aiohttp import web

from ..audit.jsonlines import to_json
from ..errors import BadQueryError
from . import data, views
from .access import Handler
from .query import parameter
from .search import Finder
from .text import utf8_safe

STORE: Final = web.AppKey("store", views.Store)
TEMPLATES: Final = web.AppKey("templates", jinja2.Environment)
FINDER: Final = web.AppKey("finder", Finder)


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A bad query parameter is a 400 page naming it; a store that cannot be read is a 503 page
    naming why, and is opened afresh by the next request (the handle other requests are reading
    through is closed only once they end)."""

    try:
        async with request.app[STORE].request():
            return await handler(request)
    except web.HTTPException:
        raise
    except BadQueryError as error:
        return data.refusal(request, 400, str(error)) or render(
            request, "error.html", {"title": "Bad request", "message": str(error)}, status=400
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as error:
        await request.app[STORE].forget()
        message = f"{type(error).__name__}: {error}"
        return data.refusal(request, 503, message) or render(
            request, "error.html", {"title": "Store unavailable", "message": message}, status=503
        )


def render(
    request: web.Request, name: str, context: dict[str, Any], status: int = 200
) -> web.Response:
    template = request.app[TEMPLATES].get_template(name)
    pairs = [(key, value) for key, value in request.query.items() if key != "token"]
    html = template.render(
        request_path=request.path,
        query=dict(pairs),
        query_string=urlencode(pairs),  # every value of a repeated parameter (?kind=a&kind=b)
        **context,
    )
    return web.Response(text=utf8_safe(html), content_type="text/html", status=status)


def missing(request: web.Request, what: str, as_of: int | None) -> web.Response:
    """A 404 naming what is not there (and the point looked at), in the format asked."""

    when = "" if as_of is None else f" as of log sequence {as_of}"
    message = f"No {what}{when}."
    return data.refusal(request, 404, message) or render(
        request, "error.html", {"title": "Not found", "message": message}, status=404
    )


def as_json(value: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=utf8_safe(to_json(value)), content_type="application/json", status=status
    )


def query_int(request: web.Request, name: str) -> int | None:
    found: int | None = parameter(request.query, name)
    return found


def path_number(request: web.Request, name: str) -> int:
    found: int = parameter(request.match_info, name)
    return found


async def as_of_point(request: web.Request) -> tuple[int | None, int]:
    """The page's point (None: now) and the log's head, for the history control."""

    store = request.app[STORE]
    as_of = await store.point(parameter(request.query, "as_of"))
    head = (await store.storage()).log.head()
    return as_of, head


__all__ = [
    "FINDER",
    "STORE",
    "TEMPLATES",
    "as_json",
    "as_of_point",
    "errors",
    "missing",
    "path_number",
    "query_int",
    "render",
]
