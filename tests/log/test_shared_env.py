"""Handles on one store in one process share its LMDB environment; threads opening and closing
them never race each other into py-lmdb's "already open in this process" refusal."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pi_durable_lmdb.log import Environment, WriteLog

from ..support.log_helpers import commit


class _SlowClose:
    """An LMDB environment whose ``close`` waits until another thread has tried to open the same
    store (or a second has passed): the moment a last handle's closing is under way."""

    def __init__(self, env: Any, closing: threading.Event, tried: threading.Event) -> None:
        self._env, self._closing, self._tried = env, closing, tried

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def close(self) -> None:
        self._closing.set()
        self._tried.wait(1.0)
        self._env.close()


def test_an_open_while_the_last_handle_closes_on_another_thread_waits_for_the_close(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s"
    writer = Environment(path, durability="process")
    commit(writer, WriteLog(writer), [{"type": "entry", "value": 1}])
    writer.close()
    reader = Environment(path, readonly=True)
    closing, tried = threading.Event(), threading.Event()
    reader._shared.env = _SlowClose(reader._shared.env, closing, tried)
    closer = threading.Thread(target=reader.close)
    closer.start()
    try:
        assert closing.wait(10)
        try:
            again = Environment(path, readonly=True)
        finally:
            tried.set()
        try:
            assert WriteLog(again).head() == 1
        finally:
            again.close()
    finally:
        closer.join(10)
    assert not closer.is_alive()


def test_threads_opening_and_closing_handles_on_one_store_all_succeed(tmp_path: Path) -> None:
    path = tmp_path / "s"
    writer = Environment(path, durability="process")
    commit(writer, WriteLog(writer), [{"type": "entry", "value": 1}])
    writer.close()

    def churn() -> int:
        for _ in range(200):
            env = Environment(path, readonly=True)
            try:
                assert WriteLog(env).head() == 1
            finally:
                env.close()
        return 200

    with ThreadPoolExecutor(4) as pool:
        churning = [pool.submit(churn) for _ in range(4)]
        assert [done.result(60) for done in churning] == [200] * 4
