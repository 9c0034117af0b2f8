"""Older shapes of a store's projections, made from a current store: a log's base rewritten as a
base of an earlier projections schema, and the core projections marked as of an earlier schema
(the next writer's open then rebuilds them)."""

from __future__ import annotations

from collections.abc import Callable

from pi_durable_lmdb.log import Environment
from pi_durable_lmdb.log import base as log_base
from pi_durable_lmdb.projections import rebuild as projections_rebuild
from pi_durable_lmdb.projections import tables as t

Row = tuple[str, bytes, bytes]


def rewrite_base(
    env: Environment, shape: int, convert: Callable[[str, bytes, bytes], bytes] | None = None
) -> list[Row]:
    """Write the log's base of ``env`` again as one of projections schema ``shape``, each row's
    sealed value through ``convert(table, key, value)``; returns the rows written."""

    db = log_base.base_db(env)
    assert db is not None
    with env.read() as txn:
        header = log_base.read_header(db, txn)
    assert header is not None and header.shape == t.SCHEMA_VERSION
    rows = [
        (name, key, value if convert is None else convert(name, key, value))
        for chunk in log_base.rows(env, header)
        for name, key, value in chunk
    ]
    chunks = list(log_base.chunked(rows))
    env.write(
        lambda txn: log_base.write(
            db,
            txn,
            header.point,
            chunks,
            header.rows,
            header.committed_at,
            header.trimmed_at,
            shape,
        )
    )
    return rows


def mark_core_schema(env: Environment, schema: int) -> None:
    """Mark the core projections of ``env`` as schema ``schema``'s: the next writer's open
    rebuilds them."""

    header = projections_rebuild.read_header(env)
    assert header is not None and header.schema_version == t.SCHEMA_VERSION
    registry = env.db(projections_rebuild.REGISTRY_DB)
    marked = t.encode_state(t.CoreHeader(header.generation, schema))
    env.write(lambda txn: txn.put(projections_rebuild.CORE_KEY, marked, db=registry))
