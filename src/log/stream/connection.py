"""What JetStream's roles share: the link's one NATS connection (``jetstream.JetStreamLink``).

The stream (``jetstream``), the key-value (``buckets``) and the snapshot store (``objects``) are
objects of their own over this connection, each run on the link's loop; they see it through this
Protocol so none of them imports the link.
"""

from __future__ import annotations

from typing import Any, Protocol


class NatsConnection(Protocol):
    """A connected link: the stream it serves, its request timeout, nats-py's client and
    JetStream context (``None`` until ``connect``), and the last error it noted."""

    stream: str
    timeout: float
    last_error: str | None

    @property
    def nc(self) -> Any: ...

    @property
    def js(self) -> Any: ...


__all__ = ["NatsConnection"]
