"""Counts and sizes in words, as every report of the engine and the command line says them."""

from __future__ import annotations


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 op``, ``2 ops``: every count a person reads goes through here."""

    return f"{count} {one if count == 1 else (many or one + 's')}"


def format_bytes(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return str(size)


__all__ = [
    "format_bytes",
    "plural",
]
