"""The pages of ``durable-log serve``: GET only (no endpoint changes the store), HTML rendered on
the server by autoescaping templates, a strict Content-Security-Policy (no inline script: the one
script, the live log, is a static file), and the token checked on every request when one is set."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, Final

import jinja2
import msgspec
from aiohttp import web

from ..audit.export import seq_range
from ..audit.jsonlines import to_json
from ..audit.search import said
from ..audit.show import SHOW_KINDS, show
from ..audit.stats import UserBuild, format_stats, stats
from ..audit.tail import Tail, TailFilter, commit_to_builtins, summarize
from ..audit.transparency import verify_trusted
from ..audit.verify import last_outcome
from ..errors import NoteError
from ..log import write_to_builtins
from ..log.records import WRITE_TYPES
from . import chart, data, find, links, lists, places, search, steps, timeline, views
from .access import CSP, OPTIONS, authorized, guard
from .query import parameter
from .respond import (
    FINDER,
    STORE,
    TEMPLATES,
    as_json,
    as_of_point,
    errors,
    missing,
    path_number,
    query_int,
    render,
)
from .search import Finder, marked
from .text import brief, is_cut, plain, pretty, utf8_safe, visible

HERE: Final = os.path.dirname(os.path.abspath(__file__))
POLL: Final = 0.5
"""Seconds between two looks at the log's head for the live log (one read each)."""
LIVE_ROWS: Final = 200
"""Rows the live log keeps on its page: older ones are dropped as new ones arrive (the "older"
link pages through them), so a page left open all day stays small."""
REPLAY_CHUNK: Final = 64
"""Log records the live log reads and sends at a time before letting other requests run: a
client that asks for a long backlog (``?after=0`` on a big log) never holds the server."""
HEARTBEAT: Final = 15.0
"""Seconds of silence after which the live log sends a comment (keeps proxies from closing it)."""


def make_app(
    path: str, *, token: str | None = None, nats: str | None = None, stream: str | None = None
) -> web.Application:
    app = web.Application(middlewares=[guard, errors])
    app[STORE] = views.Store(path)
    app[TEMPLATES] = _templates()
    app[OPTIONS] = {"token": token, "nats": nats, "stream": stream}
    app[FINDER] = Finder(app[STORE].path, app[STORE].head)
    app.router.add_get("/", overview)
    app.router.add_get("/index.json", overview)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/favicon.ico", _no_icon)
    app.router.add_get("/metrics", metrics)
    for list_path, handler in LISTS.items():  # each list page, and as .json and .csv
        for suffix in ("", ".json", ".csv"):
            app.router.add_get(list_path + suffix, handler)
    for record_path, handler in RECORDS.items():  # each record page, and as .json
        for suffix in ("", ".json"):
            app.router.add_get(record_path + suffix, handler)
    app.router.add_get("/search", find.search_page)
    app.router.add_get("/search.json", find.search_page)
    app.router.add_get("/search/index.json", find.index_state)
    app.router.add_get("/log/events", log_events)
    app.router.add_get("/audit", audit_page)
    app.router.add_get("/records/{kind}/{id:[0-9]+}", record_json)
    for kind in places.PLACES:  # a record shown on its conversation's page
        for suffix in ("", ".json"):
            app.router.add_get(f"/{kind}/{{id:[0-9]+}}{suffix}", places.record_place)
    app.router.add_static("/static", os.path.join(HERE, "static"), append_version=True)
    app.on_startup.append(app[FINDER].start)  # the word index: built if missing, kept level
    app.on_cleanup.append(_close)
    return app


async def _close(app: web.Application) -> None:
    await app[FINDER].stop()
    await app[STORE].close()


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
        autoescape=True,  # every template: agent strings are never markup
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        text=visible, pretty=pretty, brief=brief, when=_when, cut=is_cut, marked=marked
    )
    env.globals.update(
        entry_text=views.entry_text,
        write_types=WRITE_TYPES,
        links=links,
        history_steps=steps.by_sequence,
        roles=timeline.roles,
        said=said,
    )
    return env


def _when(ms: Any) -> str:
    if not isinstance(ms, int):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


# ── middleware ────────────────────────────────────────────────────────────────


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)


# ── health and metrics ────────────────────────────────────────────────────────


async def healthz(request: web.Request) -> web.Response:
    from .health import health

    ok, found = await health(request.app[STORE].path, request.app[OPTIONS])
    body = msgspec.to_builtins(found)
    if not authorized(request):
        body = {"status": found.status}  # a probe without the token learns only this
    return web.json_response(
        body, status=200 if ok else 503, dumps=lambda value: utf8_safe(json.dumps(value))
    )


async def metrics(request: web.Request) -> web.Response:
    from .health import metrics_text

    text = await asyncio.to_thread(metrics_text, request.app[STORE].path, request.app[OPTIONS])
    return web.Response(
        body=text, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
    )


# ── pages ─────────────────────────────────────────────────────────────────────


async def overview(request: web.Request) -> web.Response:
    """The store now (``/index.json``: as ``durable-log stats --json``), or at ``?as_of=``: what
    it held then and the log up to there (the projections and the last verify are of now)."""

    store = request.app[STORE]
    as_of, _ = await as_of_point(request)
    point = None
    if as_of is not None:
        point = await views.counts_at(await store.storage(), await store.reader(as_of), as_of)
        if data.asked(request):
            return data.record(point)
    info = stats(store.path)
    if data.asked(request):
        return data.record(info)
    head = info.head_seq
    projections: list[tuple[str, int | None, int | None, str | None, UserBuild | None]] = [
        ("core", info.projections.core.folded_seq, None, None, None)
    ]
    projections += [
        (name, user.folded_seq, user.failed_seq, user.error, user.building)
        for name, user in info.projections.user.items()
    ]
    rows = [
        (name, folded, head - int(folded or 0), failed, error, build)
        for name, folded, failed, error, build in projections
    ]
    verified = last_outcome(store.path)
    drawn = chart.draw((await store.storage()).log, as_of)
    return render(
        request,
        "overview.html",
        {
            "title": "Overview",
            "as_of": as_of,
            "head": head,
            "point": point,
            "info": info,
            "chart": drawn,
            "text": format_stats(info),
            "projections": rows,
            "verified": verified,
            "verified_at": None
            if verified is None
            else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(verified.at / 1000)),
        },
    )


MAX_AUDIT_FIELD = 64 * 1024
"""Characters of a pasted checkpoint or key the audit page reads at most."""


async def audit_page(request: web.Request) -> web.Response:
    """The log's Merkle tree (size, root) and a form that checks a pasted signed checkpoint with a
    pasted verifier key (``durable-log verify --trusted``'s checks; a GET: it changes nothing)."""

    store = request.app[STORE]
    info = await asyncio.to_thread(stats, store.path)
    note = request.query.get("checkpoint", "").replace("\r\n", "\n")[:MAX_AUDIT_FIELD]
    vkey = request.query.get("vkey", "").strip()[:MAX_AUDIT_FIELD]
    report = error = None
    if note.strip() and vkey:
        if not note.endswith("\n"):
            note += "\n"
        try:
            report = await asyncio.to_thread(verify_trusted, store.path, note, vkey)
        except NoteError as refused:
            error = str(refused)
    elif note.strip() or vkey:
        error = "paste both the signed checkpoint and the verifier key"
    return render(
        request,
        "audit.html",
        {
            "title": "Audit",
            "tree": info.tree,
            "note": note,
            "vkey": vkey,
            "report": report,
            "error": error,
        },
    )


async def conversation_list(request: web.Request) -> web.Response:
    as_of, head = await as_of_point(request)
    reader = await request.app[STORE].reader(as_of)
    finder = request.app[FINDER]
    if as_of is None and "after" not in request.query and finder.ready:  # by newest activity
        skip = query_int(request, "skip") or 0
        rows, total = await search.active(finder, reader, skip, views.PAGE)
        if data.asked(request):
            return data.active(request, rows, skip, views.PAGE, total, head)
        return render(
            request,
            "active.html",
            {
                "title": "Conversations",
                "rows": rows,
                "total": total,
                "skip": skip,
                "per_page": views.PAGE,
                "as_of": as_of,
                "head": head,
            },
        )
    page = await views.conversations(reader, query_int(request, "after"))
    if data.asked(request):
        return data.by_cursor(request, page, as_of, head)
    return render(
        request,
        "conversations.html",
        {"title": "Conversations", "page": page, "as_of": as_of, "head": head},
    )


async def conversation_page(request: web.Request) -> web.Response:
    id = path_number(request, "id")
    as_of, head = await as_of_point(request)
    reader = await request.app[STORE].reader(as_of)
    found = await views.conversation(
        reader, id, query_int(request, "after"), query_int(request, "before")
    )
    if found is None:
        return missing(request, f"conversation {id}", as_of)
    if data.asked(request):
        return data.record(found)
    times = await timeline.entry_times(
        (await request.app[STORE].storage()).log, reader, found.nodes
    )
    paging = found.paging
    pages = {}
    if paging.older is not None:
        pages["first"] = data.link(request, after=None, before=None)
        pages["prev"] = data.link(request, after=None, before=paging.older)
    if paging.newer is not None:
        pages["next"] = data.link(request, after=paging.newer, before=None)
        pages["last"] = data.link(request, after=None, before=paging.newest)
    context = {
        "title": f"Conversation {id}",
        "c": found,
        "links": pages,
        "as_of": as_of,
        "head": head,
        "times": times,
        "steps": await steps.of_conversation(request.app[STORE], id, as_of, head),
    }
    return render(request, "conversation.html", context)


async def document_list(request: web.Request) -> web.Response:
    as_of, head = await as_of_point(request)
    reader = await request.app[STORE].reader(as_of)
    kind = request.query.get("kind", "").strip() or None
    scope = lists.scope_filter(request.query.get("scope"))
    page: lists.ListPage | lists.FilteredPage
    if kind is None and scope is None:
        page = await views.documents(reader, query_int(request, "after"))
    else:
        page = await lists.documents(reader, kind, scope, query_int(request, "after"))
    if data.asked(request):
        return data.by_cursor(request, page, as_of, head)
    return render(
        request,
        "documents.html",
        {"title": "Documents", "page": page, "as_of": as_of, "head": head},
    )


async def task_list(request: web.Request) -> web.Response:
    """Tasks by id with a facet per status (and a kind filter), now or ``?as_of=``."""

    as_of, head = await as_of_point(request)
    reader = await request.app[STORE].reader(as_of)
    status = lists.status_of(request.query.get("status"))
    kind = request.query.get("kind", "").strip() or None
    page = await lists.tasks(reader, status, kind, query_int(request, "after"))
    if data.asked(request):
        return data.by_cursor(request, page, as_of, head)
    facets = await lists.task_facets(reader, kind)
    return render(
        request,
        "tasks.html",
        {
            "title": "Tasks",
            "page": page,
            "facets": facets,
            "status": status,
            "kind": kind,
            "as_of": as_of,
            "head": head,
        },
    )


async def document_page(request: web.Request) -> web.Response:
    id = path_number(request, "id")
    as_of, head = await as_of_point(request)
    store = request.app[STORE]
    found = await views.document(await store.storage(), await store.reader(as_of), id, as_of)
    if found is None:
        return missing(request, f"document {id}", as_of)
    if data.asked(request):
        return data.record(found)
    shown, newer, older = lists.version_window(
        found.versions, found.picked, query_int(request, "versions")
    )
    window = {"shown": shown, "newer": newer, "older": older, "total": len(found.versions)}
    return render(
        request,
        "document.html",
        {
            "title": f"Document {id}",
            "d": found,
            "as_of": as_of,
            "head": head,
            "window": window,
            "steps": steps.between(found.changes, as_of, head),
        },
    )


def _filter(request: web.Request) -> TailFilter:
    return TailFilter(query_int(request, "conversation"), parameter(request.query, "kind"))


def _times(request: web.Request) -> tuple[int | None, int | None]:
    return parameter(request.query, "since"), parameter(request.query, "until")


class BatchLink(msgspec.Struct, frozen=True):
    text: str
    href: str


class BatchRow(msgspec.Struct, frozen=True):
    """One batch as the log page lists it and ``/log/events`` sends it (as JSON): its sequence,
    time, ``tail`` line and a link to each record it wrote."""

    seq: int
    when: str
    summary: str
    links: list[BatchLink]


def _batch(commit: Any, writes: list[Any]) -> BatchRow:
    summary = summarize(commit, writes).split("Z  ", 1)[-1]  # the line of ``tail``, after its time
    found = [
        BatchLink(text=link.text, href=link.href) for link in links.of_writes(commit.seq, writes)
    ]
    return BatchRow(
        seq=commit.seq, when=_when(commit.committed_at), summary=plain(summary), links=found
    )


async def log_page(request: web.Request) -> web.Response:
    store = request.app[STORE]
    filter = _filter(request)
    since, until = _times(request)
    before = query_int(request, "before")
    tail = Tail(store.path, filter)
    try:
        head = tail.head()
        first, last = seq_range(tail.log, None, before, since, until)
        batches = [
            _batch(commit, writes)
            for commit, writes in reversed(tail.last(views.PAGE, first, last))
        ]
    finally:
        tail.close()
    live = before is None and until is None
    older = batches[-1].seq - 1 if len(batches) == views.PAGE and batches[-1].seq > first else None
    if data.asked(request):
        next = None if older is None else data.link(request, before=older)
        return data.rows(request, batches, as_of=None, head=head, next=next)
    return render(
        request,
        "log.html",
        {
            "title": "Log",
            "batches": batches,
            "head": head,
            "live": live,
            "older": older,
            "kinds": filter.types or frozenset(),
            "keep": LIVE_ROWS,
        },
    )


async def log_events(request: web.Request) -> web.StreamResponse:
    """New batches as server-sent events: the head is looked at every ``POLL`` seconds (one
    short read), the new commits read and filtered as ``tail --follow`` filters them."""

    store = request.app[STORE]
    filter = _filter(request)
    after = query_int(request, "after")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    await response.prepare(request)
    tail = Tail(store.path, filter)
    try:
        seen = tail.head() if after is None else after
        quiet = 0.0
        while True:
            head = tail.head()
            if head > seen:
                while (
                    seen < head
                ):  # a chunk per read, the loop free between chunks (a long backlog)
                    last = min(head, seen + REPLAY_CHUNK)
                    commits: list[Any] = list(tail.log.read(seen + 1, last))
                    for commit in commits:
                        writes = tail.select(commit)
                        if writes:
                            data = utf8_safe(
                                json.dumps(msgspec.to_builtins(_batch(commit, writes)))
                            )
                            await response.write(
                                f"id: {commit.seq}\nevent: batch\ndata: {data}\n\n".encode()
                            )
                    seen = last
                    await asyncio.sleep(0)
                await response.write(f"event: head\ndata: {head}\n\n".encode())
                quiet = 0.0
            elif quiet >= HEARTBEAT:
                await response.write(b": still here\n\n")
                quiet = 0.0
            await asyncio.sleep(POLL)
            quiet += POLL
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        tail.close()
    return response


async def log_record(request: web.Request) -> web.Response:
    """One batch: a page with every record it wrote linked, for a browser; as ``tail --json``
    prints it for ``Accept: application/json`` or ``?format=json`` (or any client that does not
    ask for HTML)."""

    seq = path_number(request, "seq")
    tail = Tail(request.app[STORE].path)
    try:
        commit: Any = tail.log.get(seq) if seq >= 1 else None
        head = tail.head()
    finally:
        tail.close()
    html = _wants_html(request)
    if commit is None:
        if html:
            return render(
                request,
                "error.html",
                {
                    "title": "Not found",
                    "message": f"No log record {seq} (the log's head is {head}).",
                },
                status=404,
            )
        return as_json({"error": f"no log record {seq}"}, status=404)
    if not html:
        return as_json(commit_to_builtins(commit))
    writes = [
        (
            type(write).__struct_config__.tag,
            links.of_writes(seq, [write]),
            to_json(write_to_builtins(write)),
        )
        for write in commit.writes
    ]
    return render(
        request,
        "record.html",
        {
            "title": f"Log record {seq}",
            "seq": seq,
            "head": head,
            "when": _when(commit.committed_at),
            "writes": writes,
        },
    )


def _wants_html(request: web.Request) -> bool:
    """``?format=json`` or an ``Accept`` naming JSON before HTML: JSON; a browser's: HTML."""

    if data.asked(request):
        return False
    chosen = request.query.get("format", "").strip().lower()
    if chosen in ("json", "html"):
        return chosen == "html"
    accept = request.headers.get("Accept", "")
    if "text/html" not in accept:
        return False
    json_at = accept.find("application/json")
    return json_at < 0 or accept.find("text/html") < json_at


async def record_json(request: web.Request) -> web.Response:
    """One record as ``durable-log show --json`` prints it, now or ``?as_of=``."""

    kind, id = request.match_info["kind"], path_number(request, "id")
    if kind not in SHOW_KINDS:
        return as_json(
            {"error": f"unknown kind {kind!r}; one of {', '.join(SHOW_KINDS)}"}, status=404
        )
    as_of = await request.app[STORE].point(parameter(request.query, "as_of"))
    try:
        found, _ = await show(request.app[STORE].path, kind, id, as_of)
    except TypeError as error:
        return as_json({"error": f"{kind} {id}: {error}"}, status=400)
    if found is None:
        when = "" if as_of is None else f" as of log sequence {as_of}"
        return as_json({"error": f"no {kind} {id}{when}"}, status=404)
    return as_json(found)


LISTS: Final = {
    "/conversations": conversation_list,
    "/documents": document_list,
    "/tasks": task_list,
    "/log": log_page,
}
"""The list pages: each answers at its path, and as data at its path plus ``.json``/``.csv``."""
RECORDS: Final = {
    "/conversations/{id:[0-9]+}": conversation_page,
    "/documents/{id:[0-9]+}": document_page,
    "/log/{seq:[0-9]+}": log_record,
}
"""The record pages: each answers at its path, and as JSON at its path plus ``.json``."""


__all__ = ["make_app"]  # the handlers are its routes, reached through the app it makes
