from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from pi_durable.context import BACKGROUND_CONTEXT as CTX  # noqa: E402

from pi_durable_lmdb.metrics import register, register_path  # noqa: E402
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage  # noqa: E402
from tests.support.audit_writer_child import batch  # noqa: E402


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
