"""Every ``durable-log`` command, the module that registers it, and its one-line help.

Why a table: the top-level parser names every command (``durable-log --help``) without importing
the modules behind them, and only the module of the command that runs is imported, with the
engine it needs (LMDB, msgspec, pi-durable, the web view's aiohttp). ``--version`` and
``--help`` then start in a fraction of the time. ``tests/cli/test_layout.py`` checks that each
module registers exactly its commands here, with the same help.
"""

from __future__ import annotations

from types import ModuleType
from typing import Final

COMMANDS: Final = {
    "demo": ("demo", "run a small agent host on a store, then show what it wrote"),
    "stats": ("inspect", "head sequence, record counts, sizes, projections"),
    "show": ("inspect", "print one record as the store reads it, now or at an earlier point"),
    "tail": (
        "inspect",
        "print committed batches, one line each, of a store or of a NATS stream",
    ),
    "verify": ("inspect", "check the log and re-fold it against the projections"),
    "search": (
        "find",
        "find entries by their text, documents by their value, tasks by kind and state",
    ),
    "list": ("lists", "the records of one kind, filtered by fields"),
    "export": ("move", "the log as JSON Lines"),
    "import": (
        "move",
        "build a new store from an export, or from a pi-durable SQLite/JSONL store",
    ),
    "backup": ("move", "a consistent copy of a store, even while a writer commits"),
    "restore": (
        "move",
        "build a store from its NATS stream alone, to the end or to a point in time",
    ),
    "rebuild": (
        "operate",
        "fold the whole log into fresh projections beside the live ones, then swap",
    ),
    "compact": (
        "operate",
        "give the file's free pages back: LMDB's compacting copy swapped in place",
    ),
    "erase": (
        "operate",
        "erase a conversation from the log, the projections and the disk; proofs still hold",
    ),
    "trim": (
        "operate",
        "drop the log's records before a point, folded into its base; proofs still hold",
    ),
    "replica": ("operate", "keep a replica of a store level with its NATS stream, until Ctrl-C"),
    "promote": ("operate", "make a replica (or any copy) of a store the writer of its stream"),
    "keygen": ("transparency", "make an Ed25519 key that signs checkpoints"),
    "checkpoint": ("transparency", "print a signed checkpoint of the log's Merkle tree"),
    "prove": (
        "transparency",
        "prove a record is in the log, or that the log extends an earlier size",
    ),
    "verify-proof": ("transparency", "check a proof against a signed checkpoint, offline"),
    "snapshot": ("snapshot", "publish a snapshot of a store to its NATS stream's snapshot bucket"),
    "projections": (
        "projections",
        "list user projections; retry a failed one; drop a retired one",
    ),
    "serve": (
        "serve",
        "serve a read-only web view of a store (overview, conversations, documents, the live log)",
    ),
}
"""Command name -> (module of ``pi_durable_lmdb.cli`` that registers it, its one-line help), in
the order ``--help`` lists them."""


READS: Final = frozenset(
    {
        "stats",
        "show",
        "tail",
        "verify",
        "search",
        "list",
        "checkpoint",
        "prove",
        "verify-proof",
        "projections",
    }
)
"""The commands that read and report: each prints text by default and JSON with ``--json``, one
shape per command (docs/operations.md, "What --json prints"); ``tests/cli/test_surface.py``
holds each to it."""


def command_in(argv: list[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the top-level options
    take no value), when it is one of ``COMMANDS``."""

    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def family(module: str) -> ModuleType:
    """The module of ``COMMANDS`` named ``module``, imported now (each by a plain import
    statement: no module is imported by a name computed at run time)."""

    if module == "demo":
        from . import demo

        return demo
    if module == "inspect":
        from . import inspect

        return inspect
    if module == "find":
        from . import find

        return find
    if module == "lists":
        from . import lists

        return lists
    if module == "move":
        from . import move

        return move
    if module == "operate":
        from . import operate

        return operate
    if module == "transparency":
        from . import transparency

        return transparency
    if module == "snapshot":
        from . import snapshot

        return snapshot
    if module == "projections":
        from . import projections

        return projections
    if module == "serve":
        from . import serve

        return serve
    raise KeyError(f"no family of commands {module!r}")


__all__ = [
    "COMMANDS",
    "READS",
    "command_in",
    "family",
]
