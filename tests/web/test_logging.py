from __future__ import annotations

import logging
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.errors import ProjectionFailed
from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

from tests.projections.test_projections import Exploding


async def test_a_failing_user_projection_is_logged_with_its_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="pi_durable_lmdb")
    storage = await LmdbStorage.open(tmp_path / "store", projections=[Exploding()])
    try:
        for id in range(1, 10):
            await storage.commit([{"type": "conversation", "value": {"id": id}}], CTX)
        with pytest.raises(ProjectionFailed, match="exploding"):
            await storage.projections.wait(storage.log.head())
    finally:
        await storage.close()
    records = [
        r for r in caplog.records if r.name == "pi_durable_lmdb" and "exploding" in r.getMessage()
    ]
    assert len(records) == 1
    assert records[0].levelno == logging.ERROR
    assert records[0].exc_info is not None
    assert 'raise RuntimeError("boom")' in caplog.text, "the traceback names the failing line"
