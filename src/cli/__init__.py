"""durable-log: look at, check, copy, move and demonstrate a pi-durable-lmdb store.

The command line sits on top: nothing else in the package imports it (``tests/cli/test_layout.py``
checks the layers). One module per family of commands, each registering its own
sub-parsers: ``inspect`` (stats, show, tail, verify), ``move`` (export, import, backup, restore),
``operate`` (rebuild, replica, promote), ``transparency`` (keygen, checkpoint, prove), ``find`` (search), ``snapshot``,
``projections`` (list, retry, drop), ``demo``, ``serve`` (starts the web view of
``pi_durable_lmdb.web``, which needs the ``[web]`` extra). The functions the commands run are in
``pi_durable_lmdb.audit``; exit codes and shared helpers in ``common``.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence

from ..audit.access import require_access
from ..log.records import FORMAT_VERSION
from ..projections.tables import SCHEMA_VERSION
from . import demo, find, inspect, move, operate, projections, serve, snapshot, transparency
from .common import (
    DAMAGE,
    EPILOG,
    EXIT_BUG,
    EXIT_DAMAGE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    KNOWN_REFUSALS,
    Formatter,
    interruptible,
    say_interrupted,
)

__all__ = ["EXIT_BUG", "EXIT_DAMAGE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    with interruptible():
        try:
            return _run(args)
        except KeyboardInterrupt:  # each command has cleaned up on the way out
            say_interrupted()
            return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    try:
        if getattr(args, "reads_store", False) and args.path is not None:
            require_access(args.path)
        return int(args.run(args) or 0)
    except DAMAGE as error:
        print(f"durable-log: damage: {error}", file=sys.stderr)
        _debug(args)
        return EXIT_DAMAGE
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (``| head``): not an error
        return EXIT_OK
    except KNOWN_REFUSALS as error:
        print(f"durable-log: {str(error) or type(error).__name__}", file=sys.stderr)
        _debug(args)
        return EXIT_USAGE
    except Exception as error:
        if isinstance(error, ImportError) and "[nats]" in str(error):  # the extra is not installed
            print(f"durable-log: {error}", file=sys.stderr)
            _debug(args)
            return EXIT_USAGE
        print(
            "durable-log: unexpected error (a bug in durable-log: please report it with this traceback):",
            file=sys.stderr,
        )
        traceback.print_exc(file=sys.stderr)
        return EXIT_BUG


def _debug(args: argparse.Namespace) -> None:
    """``--debug``: the traceback of a known refusal too, for a report."""

    if getattr(args, "debug", False):
        traceback.print_exc(file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-log",
        description=__doc__.split("\n", 1)[0],
        epilog=EPILOG,
        formatter_class=Formatter,
    )
    parser.add_argument("--version", action=_Version, help="show program's version number and exit")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="print the traceback of any error, not only of an unexpected one",
    )
    commands = parser.add_subparsers(required=True, metavar="COMMAND", title="commands")
    demo.register(commands)
    inspect.register(commands)
    find.register(commands)
    move.register(commands)
    operate.register(commands)
    transparency.register(commands)
    snapshot.register(commands)
    projections.register(commands)
    serve.add_parser(commands)
    return parser


class _Version(argparse.Action):
    """``--version``: argparse's version action, with the version looked up only when asked for
    (the package metadata is slow to import, and every other start of the command goes without)."""

    def __init__(
        self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        sys.stdout.write(_version() + "\n")
        parser.exit()


def _version() -> str:
    from importlib import metadata

    try:
        version = metadata.version("pi-durable-lmdb")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return (
        f"durable-log {version} (log format {FORMAT_VERSION}, projection schema {SCHEMA_VERSION})"
    )
