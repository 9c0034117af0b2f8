"""A lease that lapses and is taken again while a group is being written.

The lease is renewed on the link's event loop; a group is written on the writer's thread. The
regained lease used to set the writer's epoch (and its pending fence) from the loop thread at
once: a group that had already settled then published its records under the new epoch, without
that epoch's fence before them (seen in ``test_randomized_failover``: "record 6335 is of epoch 7,
though the last fence before it is of epoch 6"), and the next group found that record and deposed
its own writer. Now a group whose lease was taken again after it settled publishes nothing: its
callers get ``LeaseLapsedError`` (the lease did lapse while they waited), and the next group takes
the new epoch and fences first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage
from pi_durable_lmdb.errors import LeaseLapsedError

from ..support.failover_helpers import STREAM, check_linear, read_subject
from ..support.natsserver import NatsNode, nats_server  # noqa: F401  (fixture)
from ..support.polling import until

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("commits_after", [1, 3])
async def test_lease_regained_inside_a_group(
    tmp_path: Path, nats_server: NatsNode, commits_after: int
) -> None:
    storage = await LmdbStorage.open(
        tmp_path / "w",
        durability="replicated",
        nats=nats_server.url,
        stream=STREAM,
        store="regain",
        lease_ttl=3,
    )
    writer: Any = storage.replication
    lease = writer.lease
    first_epoch = lease.epoch
    original = writer.check_size
    armed = [True]

    def lapse_and_regain_meanwhile(payload: bytes) -> None:
        """Runs on the writer thread, after the group settled, before it publishes: the lease
        lapses and the renewer (on the loop) takes it again with a new epoch."""

        if armed[0]:
            armed[0] = False
            lease.valid_until = 0.0
            until(
                lambda: lease.epoch > first_epoch,
                timeout=10,
                what="lease taken again",
                interval=0.02,
            )
        original(payload)

    try:
        assert await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX) == 1
        writer.check_size = lapse_and_regain_meanwhile
        with pytest.raises(LeaseLapsedError, match="taken again"):
            await storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
        assert storage.log.head() == 1
        for n in range(commits_after):
            assert (
                await storage.commit([{"type": "conversation", "value": {"id": 3 + n}}], CTX)
                == 2 + n
            )
        assert writer.epoch == lease.epoch > first_epoch
    finally:
        await storage.close()
    messages = await read_subject(SimpleNamespace(url_list=[nats_server.url]), "regain")  # type: ignore[arg-type]
    records = check_linear(messages, "regain")
    assert [r["cid"] for r in records] == [1, *range(3, 3 + commits_after)]
    fences = [m["epoch"] for m in messages if m["kind"] == "fence"]
    assert fences == [first_epoch, lease.epoch], fences
