"""durable-log: look at, check, copy, move and demonstrate a pi-durable-lmdb store.

The command line sits on top: nothing else in the package imports it (``tests/test_layout.py``
checks the layers). One module per family of commands, each registering its own
sub-parsers: ``inspect`` (stats, show, tail, verify), ``move`` (export, import, backup, restore),
``operate`` (rebuild, replica, promote), ``transparency`` (keygen, checkpoint, prove, verify-proof),
``find`` (search), ``lists`` (list), ``snapshot``,
``projections`` (list, retry, drop), ``demo``, ``serve`` (starts the web view of
``pi_durable_lmdb.web``, which needs the ``[web]`` extra). The functions the commands run are in
``pi_durable_lmdb.audit``; exit codes in ``status``, shared helpers in ``common``; which module
registers which command in ``commands``, so that only the module of the command that runs is
imported.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from .commands import COMMANDS, command_in, family
from .status import (
    EPILOG,
    EXIT_BUG,
    EXIT_DAMAGE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Formatter,
)

__all__ = ["EXIT_BUG", "EXIT_DAMAGE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(words)
    args = _parse(parser, words)
    from .common import interruptible, say_interrupted  # the engine loads once a command runs

    with interruptible():
        try:
            return _run(args)
        except KeyboardInterrupt:  # each command has cleaned up on the way out
            say_interrupted()
            return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    from ..audit.access import require_access
    from .common import DAMAGE, KNOWN_REFUSALS, refusal, usage

    try:
        if getattr(args, "reads_store", False) and args.path is not None:
            require_access(args.path)
            if os.path.exists(args.path) and not os.path.isdir(args.path):
                raise usage(f"{args.path} is a file, not a store (a store is a directory)")
        return int(args.run(args) or 0)
    except DAMAGE as error:
        print(f"durable-log: damage: {error}", file=sys.stderr)
        _debug(args)
        return EXIT_DAMAGE
    except BrokenPipeError:
        sys.stderr.close()  # the reader went away (``| head``): not an error
        return EXIT_OK
    except KNOWN_REFUSALS as error:
        print(f"durable-log: {refusal(error)}", file=sys.stderr)
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


def _parse(parser: argparse.ArgumentParser, words: list[str]) -> argparse.Namespace:
    """``words`` parsed; a usage error is said by the parser it belongs to: an argument the
    command does not take by the command's own (its usage line, ``durable-log verify: error:
    ...``), a word before the command, or no command, by the top-level one."""

    args, extra = parser.parse_known_args(words)
    name = getattr(args, "command", None)
    if name is None:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.error("a COMMAND is required (durable-log --help lists them)")
    if extra:
        before = words.index(name) if name in words else len(words)
        if extra[0] in words[:before]:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.parsers[name].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _debug(args: argparse.Namespace) -> None:
    """``--debug``: the traceback of a known refusal too, for a report."""

    if getattr(args, "debug", False):
        traceback.print_exc(file=sys.stderr)


def _parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of ``durable-log``: with the real sub-parser of the command ``argv`` names (its
    module imported) and a bare one, its help alone, of each other (``commands.COMMANDS``);
    without ``argv``, every command's real sub-parser."""

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
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    parser.set_defaults(parsers=commands.choices)  # whose usage a usage error prints
    wanted = None if argv is None else command_in(list(argv))
    family = None if wanted is None else COMMANDS[wanted][0]
    for name, (module, help) in COMMANDS.items():
        if name in commands.choices:
            continue
        if argv is None or module == family:
            register_family(commands, module)
        else:
            commands.add_parser(name, help=help)
    return parser


def register_family(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], module: str
) -> None:
    """Import the module of a family of commands and register its sub-parsers."""

    found = family(module)
    (getattr(found, "register", None) or found.add_parser)(commands)


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

    from ..formats import FORMAT_VERSION, SCHEMA_VERSION

    try:
        version = metadata.version("pi-durable-lmdb")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return (
        f"durable-log {version} (log format {FORMAT_VERSION}, projection schema {SCHEMA_VERSION})"
    )
