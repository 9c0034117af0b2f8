"""Batched direct gets (``$JS.API.DIRECT.GET``): a subject's next messages in one request.

No consumer is made: the server that answers sends up to ``batch`` messages of the subject after
a stream sequence back to back, each with its stream sequence and how many more follow in
headers, and ends with an end-of-batch status. Any server of the stream may answer (the stream
needs ``allow_direct``), so a lagging one may answer short; callers read on from where it ended.
Used for a snapshot's chunks (``objects``): few, large messages, where it reads about four times
as fast as nats-py's object store reader. (A store's records, many small messages, are read with
pull requests instead: ``JetStreamLink.fetch``; a direct get's six extra headers cost more
per message than they save.)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Final

from ...errors import NatsUnavailableError, ReplicationError
from .message import RawMessage

H_STREAM_SEQ: Final = "Nats-Sequence"
H_PENDING: Final = "Nats-Num-Pending"
"""How many messages of the subject follow this one."""


async def direct_batch(
    nc: Any, stream: str, subject: str, after: int, batch: int, max_bytes: int, timeout: float
) -> list[RawMessage]:
    """Up to ``batch`` messages (``max_bytes`` at most) of ``subject`` after stream sequence
    ``after``, in order; ``[]`` when the answering server holds none. No answer in ``timeout``
    seconds, or a 503: ``NatsUnavailableError``; any other refusal: ``ReplicationError``."""

    import nats.errors

    got: list[RawMessage] = []
    ended: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

    async def take(msg: Any) -> None:  # a callback: cheaper per message than next_msg()
        headers = msg.headers
        if not msg.data and headers and headers.get("Status"):
            if not ended.done():
                ended.set_result(headers)
            return
        seq, pending = (
            (headers.get(H_STREAM_SEQ, ""), headers.get(H_PENDING, "")) if headers else ("", "")
        )
        got.append(
            RawMessage(
                int(seq) if seq.isdigit() else 0,
                headers,
                msg.data,
                int(pending) if pending.isdigit() else 0,
            )
        )

    request = json.dumps(
        {"seq": after + 1, "next_by_subj": subject, "batch": batch, "max_bytes": max_bytes}
    )
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(
            inbox, cb=take, pending_msgs_limit=2 * batch + 16, pending_bytes_limit=4 * max_bytes
        )
        try:
            await nc.publish(f"$JS.API.DIRECT.GET.{stream}", request.encode(), reply=inbox)
            status = await asyncio.wait_for(ended, timeout)
        finally:
            await sub.unsubscribe()
    except (TimeoutError, nats.errors.Error) as error:
        raise NatsUnavailableError(
            f"NATS did not answer for a batch of {subject} after {after} ({type(error).__name__})"
        ) from None
    code = status.get("Status")
    if code not in ("204", "404"):  # end of batch; no message at or after that sequence
        description = status.get("Description", "")
        if code == "503":
            raise NatsUnavailableError(
                f"NATS could not answer for a batch of {subject}: {description} (503)"
            )
        raise ReplicationError(
            f"NATS refused a batch of {subject} after {after}: {code} {description}"
        )
    if any(message.stream_seq <= after for message in got):
        raise ReplicationError(
            f"NATS answered a batch of {subject} after {after} with a message without its sequence"
        )
    return got


__all__ = [
    "H_PENDING",
    "H_STREAM_SEQ",
    "direct_batch",
]
