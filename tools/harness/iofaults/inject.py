"""Failing one os call of a kind, at the seam the journal calls through (``os.open``,
``os.pwrite``, ``os.fsync``, ``os.fdatasync``, ``os.rename``), for one process.

Nothing of the package is replaced: the ``os`` functions are wrapped, each call is classified by
what it does to which file, and the Nth call of the chosen kind raises ``OSError(errno)`` before
it reaches the kernel (as a full disk or a failing device would answer it); every other call,
and every later call of that kind, goes through. The kinds:

``create``      ``open(O_CREAT)`` of a journal segment
``zero-fill``   a write of zeros into a segment being made (before its header)
``header``      the write of a segment's header (a new or a recycled one)
``rename``      a released segment renamed to its new number (recycling)
``segsync``     ``fsync`` of a segment (its header, before any frame)
``dirsync``     ``fsync`` of a directory (a segment's or a marker's name)
``frame``       the write of a frame (one transaction's records)
``unmake``      the write of zeros over a frame whose transaction failed
``flush``       ``fdatasync`` of a segment (a frame's flush, or an unmade frame's)
``checkpoint``  the write or ``fdatasync`` of a checkpoint record
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any, Final

KINDS: Final = (
    "create",
    "zero-fill",
    "header",
    "rename",
    "segsync",
    "dirsync",
    "frame",
    "unmake",
    "flush",
    "checkpoint",
)

_SEGMENT_MAGIC: Final = b"PIDLJSEG"
_FRAME_MAGIC: Final = (0x504A4652).to_bytes(4, "big")


class Injector:
    """Counts the calls of each kind; raises ``OSError(error)`` at the ``nth`` of ``kind``
    (``nth`` 0: none) and the ``burst - 1`` calls of that kind after it (a fault that lasts:
    the call that would unmake a failed frame fails too). ``failed`` says whether it fired.
    ``observe``, if given, is called with each call's kind before it goes on (on the calling
    thread: a test can tell which thread flushes)."""

    def __init__(
        self,
        kind: str,
        nth: int,
        error: int,
        burst: int = 1,
        observe: Callable[[str], None] | None = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        self.kind, self.nth, self.error, self.burst = kind, nth, error, burst
        self.counts = dict.fromkeys(KINDS, 0)
        self.failed = False
        self._files: dict[int, str] = {}  # fd -> "segment", "filling", "checkpoint", "directory"
        self._saved: dict[str, Any] = {}
        self._observe = observe

    def _call(self, kind: str, what: str) -> None:
        self.counts[kind] += 1
        if self._observe is not None:
            self._observe(kind)
        if kind == self.kind and self.nth and self.nth <= self.counts[kind] < self.nth + self.burst:
            self.failed = True
            raise OSError(
                self.error, f"{os.strerror(self.error)} (injected: {kind} call {self.nth})", what
            )

    def install(self) -> None:
        real_open, real_pwrite = os.open, os.pwrite
        real_fsync, real_fdatasync, real_rename, real_close = (
            os.fsync,
            os.fdatasync,
            os.rename,
            os.close,
        )
        self._saved = {
            "open": real_open,
            "pwrite": real_pwrite,
            "fsync": real_fsync,
            "fdatasync": real_fdatasync,
            "rename": real_rename,
            "close": real_close,
        }
        files = self._files

        def role_of(fd: int) -> str | None:
            if fd not in files:  # opened before the injector was installed
                try:
                    name = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    name = ""
                files[fd] = (
                    "segment"
                    if name.endswith(".seg")
                    else "checkpoint"
                    if os.path.basename(name).startswith("checkpoint.")
                    else "directory"
                    if _is_directory(fd)
                    else "other"
                )
            return files[fd]

        def open_(path: Any, flags: int, mode: int = 0o777, *args: Any, **kwargs: Any) -> int:
            name = os.fspath(path)
            name = name.decode() if isinstance(name, bytes) else name
            segment = name.endswith(".seg")
            if segment and flags & os.O_CREAT:
                self._call("create", name)
            fd = real_open(path, flags, mode, *args, **kwargs)
            if segment:
                files[fd] = "filling" if flags & os.O_CREAT else "segment"
            elif os.path.basename(name).startswith("checkpoint."):
                files[fd] = "checkpoint"
            elif flags & getattr(os, "O_DIRECTORY", 0) or _is_directory(fd):
                files[fd] = "directory"
            return fd

        def pwrite(fd: int, data: Any, offset: int) -> int:
            role = role_of(fd)
            if role in ("segment", "filling"):
                head = bytes(data[:8])
                if offset == 0 and head == _SEGMENT_MAGIC:
                    self._call("header", "segment header")
                    files[fd] = "segment"
                elif head[:4] == _FRAME_MAGIC:
                    self._call("frame", "frame")
                elif role == "filling":
                    self._call("zero-fill", "zeros")
                else:
                    self._call("unmake", "zeros over a frame")
            elif role == "checkpoint":
                self._call("checkpoint", "checkpoint write")
            return real_pwrite(fd, data, offset)

        def fsync(fd: int) -> None:
            role = role_of(fd)
            if role == "directory":
                self._call("dirsync", "directory")
            elif role in ("segment", "filling"):
                self._call("segsync", "segment")
            return real_fsync(fd)

        def fdatasync(fd: int) -> None:
            role = role_of(fd)
            if role in ("segment", "filling"):
                self._call("flush", "segment")
            elif role == "checkpoint":
                self._call("checkpoint", "checkpoint flush")
            return real_fdatasync(fd)

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if os.fspath(dst).endswith(".seg" if isinstance(os.fspath(dst), str) else b".seg"):
                self._call("rename", os.fspath(dst))
            return real_rename(src, dst, *args, **kwargs)

        def close(fd: int) -> None:
            files.pop(fd, None)
            return real_close(fd)

        os.open, os.pwrite, os.fsync, os.fdatasync, os.rename, os.close = (
            open_,
            pwrite,
            fsync,
            fdatasync,
            rename,
            close,
        )  # type: ignore[assignment]

    def uninstall(self) -> None:
        for name, function in self._saved.items():
            setattr(os, name, function)
        self._saved = {}

    def __enter__(self) -> Injector:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def _is_directory(fd: int) -> bool:
    try:
        return stat.S_ISDIR(os.fstat(fd).st_mode)
    except OSError:
        return False
