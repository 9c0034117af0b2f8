"""The ``durable-log`` command's entry point: Ctrl-C is answered from its first instruction on.

Importing the package and its command line takes a moment, and a SIGINT then would print a Python
traceback (Python's own handler raises ``KeyboardInterrupt`` wherever the import is). This module
is a package beside the package (typed, like it), not in it, so that loading it imports nothing of it: it installs a
handler that exits 130 with the command's one line (nothing has been written yet), then imports
and runs ``pi_durable_lmdb.cli.main``, whose own handler takes over while a command runs and
hands back to this one when it ends. A plain ``import pi_durable_lmdb`` installs nothing.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

EXIT_INTERRUPTED = 130
"""``pi_durable_lmdb.cli.status.EXIT_INTERRUPTED``, which this module cannot import yet."""


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C while starting or ending: the one line, and out at once (no ``KeyboardInterrupt``,
    which an import lock's callback or a ``__del__`` would swallow)."""

    try:
        os.write(2, b"durable-log: interrupted\n")
    except OSError:
        pass
    os._exit(EXIT_INTERRUPTED)


def main() -> int:
    """Run ``durable-log`` with Ctrl-C handled before the package is imported."""

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored: ``cmd &``
        signal.signal(signal.SIGINT, _interrupted)
    from pi_durable_lmdb.cli import main as run  # type: ignore[import-not-found, unused-ignore]

    status = int(run())
    for stream in (sys.stdout, sys.stderr):  # what the command printed, before Python ends
        try:
            stream.flush()
        except (OSError, ValueError):  # closed (``| head``): nothing more to say
            pass
    return status
