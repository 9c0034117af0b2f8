"""``LmdbStorage.open`` refuses a contradictory set of options before it touches the disk or the
network, with a message naming what is wrong (checked in the order shown: the first problem
found is the one named), and ``mint_id`` stops at the end of the safe-integer id space."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.projections.readmodel import MAX_SAFE_INTEGER
from pi_durable_lmdb.storage import LmdbStorage

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "unknown durability": (
        {"durability": "disk"},
        "durability must be 'power', 'process' or 'replicated', not 'disk'",
    ),
    "durability before the rest": (
        {"durability": "fast", "nats": "nats://127.0.0.1:1", "replicas": 9},
        "durability must be 'power', 'process' or 'replicated', not 'fast'",
    ),
    "nats without stream": (
        {"nats": "nats://127.0.0.1:1"},
        "nats= and stream= go together: the NATS servers and the stream that carries the log",
    ),
    "stream without nats": (
        {"stream": "s"},
        "nats= and stream= go together: the NATS servers and the stream that carries the log",
    ),
    "pairing before replicated": (
        {"durability": "replicated", "stream": "s"},
        "nats= and stream= go together: the NATS servers and the stream that carries the log",
    ),
    "replicated without a stream": (
        {"durability": "replicated"},
        "durability='replicated' needs nats= (the servers) and stream= (the stream)",
    ),
    "read-only shipping": (
        {"nats": "nats://127.0.0.1:1", "stream": "s", "readonly": True},
        "A read-only open does not ship its log: open_replica() follows a stream",
    ),
    "take over without replication": (
        {"take_over": True},
        "take_over= is for durability='replicated' writers (the lease guards the stream)",
    ),
    "forced take over without replication": (
        {"take_over": "force", "durability": "process"},
        "take_over= is for durability='replicated' writers (the lease guards the stream)",
    ),
    "no replicas": (
        {"replicas": 0},
        "replicas must be an int from 1 to 5 (JetStream's limit), not 0",
    ),
    "too many replicas": (
        {"replicas": 6},
        "replicas must be an int from 1 to 5 (JetStream's limit), not 6",
    ),
    "replicas not an int": (
        {"replicas": 3.0},
        "replicas must be an int from 1 to 5 (JetStream's limit), not 3.0",
    ),
    "replicas a bool": (
        {"replicas": True},
        "replicas must be an int from 1 to 5 (JetStream's limit), not True",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
async def test_contradictory_open_options_are_refused_before_anything_is_made(
    tmp_path: Path, name: str
) -> None:
    options, message = REFUSED[name]
    path = tmp_path / "store"
    with pytest.raises(ValueError) as refused:
        await LmdbStorage.open(path, **options)
    assert str(refused.value) == message
    assert type(refused.value) is ValueError
    assert not path.exists()


async def test_the_options_refused_alone_are_accepted_together(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(tmp_path / "store", durability="process", replicas=5)
    try:
        assert storage.replication is None
        assert await storage.mint_id() >= 2
    finally:
        await storage.close()


async def test_minting_stops_at_the_end_of_the_safe_id_space(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        value = {"id": MAX_SAFE_INTEGER, "conversationId": 1, "kind": "message"}
        await storage.commit([{"type": "entry", "value": value}], CTX)  # type: ignore[list-item]
        with pytest.raises(ValueError, match=r"^ID space is exhausted$"):
            await storage.mint_id()
    finally:
        await storage.close()


async def test_minted_ids_stay_above_every_reserved_block_across_reopen(tmp_path: Path) -> None:
    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        first = [await storage.mint_id() for _ in range(3)]
    finally:
        await storage.close()
    assert first == [2, 3, 4]
    storage = await LmdbStorage.open(tmp_path / "store", durability="process")
    try:
        again = await storage.mint_id()
    finally:
        await storage.close()
    assert (
        again > max(first) and again == 2 + 4096
    )  # the block reserved before is never handed out again
