"""``durable-log serve``: the read-only web view, registered into the CLI's sub-commands."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import ipaddress
import os
import signal
import sys
from typing import Final

from ..audit.numbers import MAX_LAG, PORT, argument
from ..audit.stats import require_store
from .common import READ_ONLY, SERVE_MODULES, add_command, serve_missing, store_argument, usage

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8470
TOKEN_ENV: Final = "DURABLE_LOG_TOKEN"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        subparsers,
        "serve",
        "serve a read-only web view of a store (overview, conversations, documents, the live log)",
        f"Serve a read-only web view of a store over HTTP: overview, search (the view builds and keeps "
        f"the store's word index, PATH/search.index, its only write), conversations drawn as trees, tasks, "
        f"documents with their versions, the log (live), any page as of an earlier point and as data "
        f"(.json, .csv), /healthz and /metrics; {READ_ONLY}. "
        f"It binds to loopback; another address needs --token, which every request must then carry "
        f"(Authorization: Bearer T, or ?token=T once); put it behind a TLS reverse proxy to serve "
        f"it to others (docs/operations.md, Web view).",
        example="durable-log serve demo-store",
    )
    store_argument(sub)
    sub.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}; any other needs --token)",
    )
    sub.add_argument(
        "--port",
        type=argument(PORT),
        default=DEFAULT_PORT,
        help=f"port to bind (default {DEFAULT_PORT}; 0: any free one)",
    )
    sub.add_argument(
        "--token",
        help=f"the secret every request must carry (or the environment variable {TOKEN_ENV})",
    )
    sub.add_argument(
        "--nats",
        metavar="URL",
        help="also read the store's stream, for /healthz and /metrics (with --stream)",
    )
    sub.add_argument(
        "--stream", metavar="S", help="the stream that carries the store's log (with --nats)"
    )
    sub.add_argument(
        "--max-lag",
        type=argument(MAX_LAG),
        default=None,
        metavar="N",
        help="records behind the stream at which /healthz says stale (default 1000)",
    )
    sub.set_defaults(run=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    for name in SERVE_MODULES:  # the [web] extra: said before anything else, never a traceback
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise serve_missing(name)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback(args.host) and token is None:
        raise usage(
            f"serve binds {args.host!r}, which is not a loopback address: anyone who reaches it could read "
            "the store; give --token T (every request must then carry it) or bind 127.0.0.1"
        )
    if (args.nats is None) != (args.stream is None):
        raise usage("--nats and --stream go together")
    require_store(args.path)
    return asyncio.run(_serve(args, token))


async def _serve(args: argparse.Namespace, token: str | None) -> int:
    from aiohttp import web

    from ..web.access import OPTIONS
    from ..web.app import make_app

    app = make_app(args.path, token=token, nats=args.nats, stream=args.stream)
    app[OPTIONS]["max_lag"] = args.max_lag
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        site = web.TCPSite(runner, args.host, args.port)
        await site.start()
        port = _bound_port(runner.addresses, args.port)
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(
            f"durable-log: serving {os.path.abspath(args.path)} read-only at http://{shown}:{port}/ (Ctrl-C stops)",
            file=sys.stderr,
            flush=True,
        )
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def _bound_port(addresses: list[object], asked: int) -> int:
    """The port bound (``--port 0`` asks the system for a free one)."""

    for address in addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "TOKEN_ENV",
    "add_parser",
    "is_loopback",
    "run",
]
