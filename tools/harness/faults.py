"""Failures injected into a commit after its checks, for the tests and the harnesses: in its
work (``failing``), and at LMDB's commit (``commit_fails``). Only the failure is injected: the
store, its transaction and its effects run as they do."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import lmdb
from pi_durable_lmdb.log import Environment


@contextmanager
def failing(
    target: Any, name: str, fails: Callable[..., bool], error: BaseException
) -> Iterator[None]:
    """``target.name`` runs as before, then raises ``error`` when ``fails(*args)`` says so."""

    original = getattr(target, name)

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if fails(*args):
            raise error
        return result

    setattr(target, name, wrapped)
    try:
        yield
    finally:
        setattr(target, name, original)


class _CommitFails:
    """LMDB's transaction, whose commit aborts it and raises an I/O error instead."""

    def __init__(self, txn: lmdb.Transaction[bytes]) -> None:
        self._txn = txn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def commit(self) -> None:
        self._txn.abort()
        raise lmdb.Error("mdb_txn_commit: Input/output error")


class _FailingEnv:
    """LMDB's environment, whose next write transaction fails at its commit."""

    def __init__(self, env: lmdb.Environment) -> None:
        self.real = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def begin(self, **kwargs: Any) -> Any:
        txn = self.real.begin(**kwargs)
        if kwargs.get("write"):
            return _CommitFails(txn)
        return txn


@contextmanager
def commit_fails(env: Environment) -> Iterator[None]:
    """Within: every write transaction of ``env`` (a handle's environment) fails at LMDB's
    commit, as a full disk or an I/O error makes it."""

    proxy = _FailingEnv(env.env)
    env.env = proxy  # type: ignore[assignment]
    try:
        yield
    finally:
        env.env = proxy.real


__all__ = ["commit_fails", "failing"]
