"""The options of ``LmdbStorage.open`` that decide how a store links to a NATS stream, checked
together in one place before anything is opened or made."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ..log import Durability
from ..log.stream.jetstream import link_for
from ..log.stream.link import StreamLink


@dataclass(frozen=True)
class OpenOptions:
    """``open``'s durability and stream options; a contradictory set raises ``ValueError``
    naming the first problem (in the order of the checks below)."""

    durability: Durability = "power"
    readonly: bool = False
    nats: str | Sequence[str] | StreamLink | None = None
    stream: str | None = None
    replicas: int = 1
    take_over: bool | Literal["force"] = False
    keep_history: int | None = None
    """The last records a writer's log keeps (``storage.trim``); ``None``: all."""

    def __post_init__(self) -> None:
        durability, nats = self.durability, self.nats
        if durability not in ("power", "process", "replicated"):
            raise ValueError(
                f"durability must be 'power', 'process' or 'replicated', not {durability!r}"
            )
        if (nats is None) != (self.stream is None):
            raise ValueError(
                "nats= and stream= go together: the NATS servers and the stream that carries the log"
            )
        if durability == "replicated" and nats is None:
            raise ValueError(
                "durability='replicated' needs nats= (the servers) and stream= (the stream)"
            )
        if nats is not None and self.readonly:
            raise ValueError(
                "A read-only open does not ship its log: open_replica() follows a stream"
            )
        if self.take_over and durability != "replicated":
            raise ValueError(
                "take_over= is for durability='replicated' writers (the lease guards the stream)"
            )
        if self.keep_history is not None and (self.readonly or nats is not None):
            raise ValueError(
                "keep_history= is for a writer without a stream: a trim needs a local writer"
            )
        if type(self.replicas) is not int or not 1 <= self.replicas <= 5:
            raise ValueError(
                f"replicas must be an int from 1 to 5 (JetStream's limit), not {self.replicas!r}"
            )

    @property
    def replicated(self) -> bool:
        """Whether a commit returns only once the stream holds it (under the store's lease)."""

        return self.durability == "replicated"

    def link(self) -> StreamLink | None:
        """A new link to the stream (not connected yet), or ``None`` for a store without one."""

        return (
            None if self.nats is None or self.stream is None else link_for(self.nats, self.stream)
        )


__all__ = [
    "OpenOptions",
]
