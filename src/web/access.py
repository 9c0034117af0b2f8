"""Who may read the view: the token (when set) on every request, or else only a loopback Host;
the security headers on every answer; ``?token=`` moved into a cookie by a redirect."""

from __future__ import annotations

import hmac
import string
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from yarl import URL

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OPTIONS: Final = web.AppKey("options", dict)
TOKEN_COOKIE: Final = "durable_log_token"
CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
LOOPBACK_HOSTS: Final = ("127.0.0.1", "localhost", "[::1]", "::1")

PROBE: Final = "/healthz"
"""Answers without the token (a load balancer's probe cannot send one), saying only whether the
store is readable; with the token, what is wrong too."""


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The token (when set) on every request; without one, only a loopback Host (a page of
    another site cannot reach the view through DNS rebinding); security headers on every answer."""

    token = request.app[OPTIONS]["token"]
    allowed = authorized(request)
    if not allowed and request.path != PROBE:
        return web.Response(
            status=401,
            text="durable-log serve: this view needs its token (header Authorization: Bearer T, or ?token=T)\n",
        )
    if token is None and request.host.rsplit(":", 1)[0] not in LOOPBACK_HOSTS:
        return web.Response(
            status=403,
            text="durable-log serve: without --token, only loopback host names are served\n",
        )
    # the cookie only for the right token: a wrong ``?token=`` on the probe never earns it
    set_cookie = allowed and token is not None and request.query.get("token") is not None
    if set_cookie and request.method == "GET":
        response: web.StreamResponse = _without_token(request)  # out of the address bar and history
    else:
        response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["X-Frame-Options"] = "DENY"
    if set_cookie and token is not None and not response.prepared:
        response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict", path="/")
    return response


_PATH_SAFE: Final = frozenset(string.ascii_letters + string.digits + "/%-._~!$&'()*+,;=:@")
_LEADING: Final = "/\\" + "".join(map(chr, range(0x21)))
"""What a browser skips or reads as a slash at the start of a path: a redirect to ``//host`` or
``/\\host`` (tabs and newlines between them dropped) would leave the view's origin."""


def authorized(request: web.Request) -> bool:
    """Whether the request may read everything: no token is set, or it carries the token. Asked
    of the request itself (twice costs a compare), never kept in its storage: what a request
    proves is read from what it sent."""

    token = request.app[OPTIONS]["token"]
    if token is None:
        return True
    given = _token_of(request)
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def _without_token(request: web.Request) -> web.Response:
    """A redirect to the same address without ``token=`` (the cookie, set with it, carries it),
    always a path of this origin: one ``/``, then never a second one or a backslash."""

    kept = [(key, value) for key, value in request.query.items() if key != "token"]
    location = same_origin(request.raw_path.split("?", 1)[0])
    if kept:
        location += "?" + str(URL.build(query=kept).raw_query_string)
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def same_origin(raw_path: str) -> str:
    """``raw_path`` as a path a browser resolves on this origin: its leading slashes, backslashes
    and control characters dropped, any character outside a path's own percent-escaped."""

    rest = raw_path.lstrip(_LEADING)
    return "/" + "".join(c if c in _PATH_SAFE else _escaped(c) for c in rest)


def _escaped(character: str) -> str:
    return "".join(f"%{byte:02X}" for byte in character.encode("utf-8", "surrogatepass"))


def _token_of(request: web.Request) -> str | None:
    """The token the request carries, the first of: the header, ``?token=`` (even empty: a wrong
    token, not an absent one), the cookie."""

    scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return bearer.strip()
    for given in (request.headers.get("X-Durable-Log-Token"), request.query.get("token")):
        if given is not None:
            return given
    return request.cookies.get(TOKEN_COOKIE)


__all__ = [
    "CSP",
    "LOOPBACK_HOSTS",
    "OPTIONS",
    "PROBE",
    "TOKEN_COOKIE",
    "Handler",
    "authorized",
    "guard",
    "same_origin",
]
