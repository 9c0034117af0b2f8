from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from pi_durable.context import BACKGROUND_CONTEXT as CTX  # noqa: E402
from pi_durable_lmdb.metrics import register, register_path  # noqa: E402
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from tests.support.audit_writer_child import batch  # noqa: E402
from tests.support.polling import until_async  # noqa: E402


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_follow_the_head(tmp_path: Path) -> None:
    path = tmp_path / "store"

    async def run() -> None:
        storage = await LmdbStorage.open(str(path), durability="process")
        try:
            registry = CollectorRegistry()
            register(storage, registry)
            before = samples(registry)[("pi_durable_lmdb_log_head_seq", ())]
            await storage.commit(batch(0), CTX)
            await storage.commit(batch(1), CTX)
            after = samples(registry)
            assert after[("pi_durable_lmdb_up", ())] == 1
            assert after[("pi_durable_lmdb_log_head_seq", ())] == before + 2 == 2
            assert after[("pi_durable_lmdb_store_bytes", ())] > 0
            assert ("pi_durable_lmdb_projection_lag_records", (("projection", "core"),)) in after
        finally:
            await storage.close()

    asyncio.run(run())


def test_missing_store_reports_down(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    register_path(tmp_path / "nowhere", registry)
    assert samples(registry)[("pi_durable_lmdb_up", ())] == 0


@pytest.mark.parametrize("durability", ["process", "power"])
def test_handle_counts_commits_groups_flushes_and_failures(tmp_path: Path, durability: str) -> None:
    """The handle's counters, as scraped: every acknowledged commit once, a refused one as a
    failure, groups and flushes as histograms whose counts add up (a journaled power writer's
    flush is its journal frame's)."""

    async def run() -> None:
        storage = await LmdbStorage.open(str(tmp_path / "store"), durability=durability)  # type: ignore[arg-type]
        try:
            registry = CollectorRegistry()
            register(storage, registry)
            await asyncio.gather(*(storage.commit(batch(k), CTX) for k in range(20)))
            with pytest.raises(ValueError, match="conversationId"):
                await storage.commit(
                    [{"type": "entry", "value": {"id": 1}}], CTX
                )  # refused by the checks
            got = samples(registry)
            assert got[("pi_durable_lmdb_commits_total", ())] == 20
            assert got[("pi_durable_lmdb_commit_failures_total", ())] == 1
            assert got[("pi_durable_lmdb_commit_seconds_count", ())] == 20
            assert got[("pi_durable_lmdb_commit_seconds_bucket", (("le", "+Inf"),))] == 20
            assert got[("pi_durable_lmdb_commit_seconds_sum", ())] > 0
            assert (
                got[("pi_durable_lmdb_group_batches_sum", ())] == 20
            )  # every batch in exactly one transaction
            transactions = got[("pi_durable_lmdb_group_batches_count", ())]
            assert 1 <= transactions <= 20
            assert got[("pi_durable_lmdb_flush_seconds_count", ())] >= transactions
            assert ("pi_durable_lmdb_replication_lag_records", ()) not in got
            # Which path the commits took and what a power writer flushed (the first commit
            # of a loop's turn may run directly, the others beside it are grouped).
            assert 0 <= got[("pi_durable_lmdb_direct_commits_total", ())] <= 20
            flushes = got[("pi_durable_lmdb_device_flushes_total", ())]
            checkpoints = got[("pi_durable_lmdb_checkpoints_total", ())]
            if durability == "power":
                assert flushes >= transactions + 2 * checkpoints and checkpoints >= 1
            else:
                assert flushes == checkpoints == 0
        finally:
            await storage.close()

    asyncio.run(run())


def test_handle_reports_shipping_and_the_lease(tmp_path: Path) -> None:
    from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryStream

    async def run() -> None:
        server = MemoryStream("M")
        shipping = await LmdbStorage.open(
            str(tmp_path / "s"),
            durability="process",
            nats=MemoryLink(server),
            stream="M",
            store="s",
        )
        writer = await LmdbStorage.open(
            str(tmp_path / "w"),
            durability="replicated",
            nats=MemoryLink(server),
            stream="M",
            store="w",
        )
        try:
            ship_registry, write_registry = CollectorRegistry(), CollectorRegistry()
            register(shipping, ship_registry)
            register(writer, write_registry)
            server.down = True
            await shipping.commit(batch(0), CTX)
            await until_async(
                lambda: samples(ship_registry)[("pi_durable_lmdb_shipping_errors_total", ())] >= 1,
                timeout=30,
                what="shipping error counted",
            )
            assert samples(ship_registry)[("pi_durable_lmdb_replication_lag_records", ())] == 1
            server.down = False
            assert await shipping._link.arun(shipping.replication.drain(10))  # type: ignore[union-attr]
            got = samples(ship_registry)
            assert got[("pi_durable_lmdb_replication_lag_records", ())] == 0
            assert got[("pi_durable_lmdb_replication_shipped_seq", ())] == 1
            await writer.commit(batch(0), CTX)
            got = samples(write_registry)
            assert got[("pi_durable_lmdb_lease_held", ())] == 1
            assert got[("pi_durable_lmdb_lease_holder_epoch", ())] == 1
            assert got[("pi_durable_lmdb_replication_shipped_seq", ())] == 1
        finally:
            await shipping.close()
            await writer.close()

    asyncio.run(run())


def test_metrics_export_the_log_trees_size(tmp_path: Path) -> None:
    path = tmp_path / "store"

    async def run() -> None:
        storage = await LmdbStorage.open(str(path), durability="process")
        try:
            registry = CollectorRegistry()
            register_path(path, registry)
            for n in range(18):
                await storage.commit(batch(n), CTX)
            found = samples(registry)
            assert found[("pi_durable_lmdb_log_tree_size", ())] == storage.log.head() == 18
            assert (
                found[("pi_durable_lmdb_log_tree_stored_leaves", ())] == 0
            )  # a running writer stores tiles 512 records at a time
        finally:
            await storage.close()
        found = samples(registry)
        assert found[("pi_durable_lmdb_log_tree_size", ())] == 18
        assert (
            found[("pi_durable_lmdb_log_tree_stored_leaves", ())] == 16
        )  # a close stores every whole tile of 16

    asyncio.run(run())
