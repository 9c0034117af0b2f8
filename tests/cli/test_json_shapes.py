"""The JSON the operator tools print keeps its keys, their order and their value types:
``durable-log stats --json`` and ``projections --json``, the web view's ``/healthz`` and the
file side of ``/metrics``. Scripts and dashboards read these by name."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_call import call
from tests.support.served import build_store, get, serve

Shape = Any


def shape(value: Any) -> Shape:
    """``value`` with every scalar replaced by its JSON type's name and every object by its
    ``(key, shape)`` pairs in the order written (so a reordering shows)."""

    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [shape(item) for item in value]
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]


DATABASE = [
    ("entries", "int"),
    ("depth", "int"),
    ("branchPages", "int"),
    ("leafPages", "int"),
    ("overflowPages", "int"),
    ("bytes", "int"),
    ("bytesPerEntry", "float"),
]
PROJECTION = [
    ("version", "int"),
    ("foldedSeq", "int"),
    ("failedSeq", "null"),
    ("error", "null"),
    ("building", "null"),
]
STATS = [
    ("path", "str"),
    ("storeId", "str"),
    ("formatVersion", "int"),
    ("headSeq", "int"),
    ("records", "int"),
    ("firstCommittedAt", "int"),
    ("lastCommittedAt", "int"),
    ("fileBytes", "int"),
    ("logBytes", "int"),
    ("projectionBytes", "int"),
    (
        "footprint",
        [
            ("pageSize", "int"),
            ("usedPages", "int"),
            ("pagesUpToLastUsed", "int"),
            ("freePages", "int"),
            ("freeBytes", "int"),
            ("freeShare", "float"),
            ("logBytesPerRecord", "float"),
            ("databases", "DATABASES"),
        ],
    ),
    (
        "counts",
        [
            ("conversations", "int"),
            ("entries", "int"),
            ("tasks", "int"),
            ("submissions", "int"),
            ("documents", "int"),
        ],
    ),
    ("liveDocuments", "int"),
    ("tree", [("size", "int"), ("storedLeaves", "int"), ("rootHash", "str")]),
    (
        "projections",
        [
            ("core", [("generation", "int"), ("schemaVersion", "int"), ("foldedSeq", "int")]),
            (
                "user",
                [
                    (
                        "exploding",
                        [
                            ("version", "int"),
                            ("foldedSeq", "int"),
                            ("failedSeq", "int"),
                            ("error", "str"),
                            ("building", "null"),
                        ],
                    ),
                    ("task_outcomes", PROJECTION),
                ],
            ),
        ],
    ),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "store"
    build_store(path)
    return path


def _stats(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[str, dict[str, Any]]:
    code, out, err = call(capsys, "stats", *args, "--json")
    assert code == 0, err
    assert out.endswith("}\n") and out.count("\n") == 1, "one line"
    return out, json.loads(out)


def _without_databases(found: Shape) -> tuple[Shape, Shape]:
    """The stats shape with the footprint's per-database part cut out, and that part."""

    top = dict(found)
    foot = dict(top["footprint"])
    databases = foot["databases"]
    top["footprint"] = [
        (key, "DATABASES" if key == "databases" else item) for key, item in top["footprint"]
    ]
    return [(key, top[key]) for key, _ in found], databases


def test_stats_json_keeps_its_keys_order_and_types(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, info = _stats(capsys, store)
    found, databases = _without_databases(shape(info))
    assert found == STATS
    names = [name for name, _ in databases]
    assert names == sorted(names) and {"log", "meta"} <= set(names)
    for _, database in databases:
        assert [key for key, _ in database] == [key for key, _ in DATABASE]
    assert out == json.dumps(info, separators=(",", ":"), ensure_ascii=False) + "\n", (
        "compact, UTF-8, in this order"
    )
    assert info["headSeq"] == info["records"] == info["tree"]["size"]
    assert info["path"] == os.path.abspath(store)


def test_stats_json_shows_a_stopped_shipper_last(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pi_durable_lmdb.log.stream.shipper import STOPPED_FILE

    stopped = os.path.join(store, STOPPED_FILE)
    with open(stopped, "w", encoding="utf-8") as file:
        json.dump({"reason": "record 2 is bigger than the server's max_payload"}, file)
    try:
        _, info = _stats(capsys, store)
        assert list(info)[-1] == "shipping"
        assert shape(info["shipping"]) == [("stopped", "bool"), ("reason", "str")]
        assert info["shipping"] == {
            "stopped": True,
            "reason": "record 2 is bigger than the server's max_payload",
        }
        code, text, _ = call(capsys, "stats", store)
        assert code == 0 and "shipping         STOPPED: record 2 is bigger" in text
    finally:
        os.unlink(stopped)


def test_projections_json_keeps_its_keys(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = call(capsys, "projections", store, "--json")
    assert code == 1, err  # exploding is failed
    found = shape(json.loads(out))
    assert [name for name, _ in found] == ["exploding", "task_outcomes"]
    assert dict(found)["task_outcomes"] == [
        ("version", "int"),
        ("foldedSeq", "int"),
        ("lag", "int"),
        ("state", "str"),
        ("failedSeq", "null"),
        ("error", "null"),
        ("building", "null"),
    ]


def test_healthz_and_metrics_keep_their_keys(store: Path) -> None:
    with serve(store) as served:
        status, body, headers = get(served.url + "/healthz")
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        assert shape(json.loads(body)) == [
            ("status", "str"),
            ("headSeq", "int"),
            ("storeId", "str"),
            ("warnings", ["str"]),
        ]
        assert body == json.dumps(json.loads(body)), "json.dumps's spacing, ASCII escapes"
        assert json.loads(body)["warnings"][0].startswith(
            "projection exploding stopped at sequence 7: RuntimeError"
        )
        status, text, _ = get(served.url + "/metrics")
        assert status == 200
    names = sorted(
        {
            line.split("{")[0].split(" ")[0]
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
    )
    assert names == [
        "pi_durable_lmdb_log_bytes",
        "pi_durable_lmdb_log_head_seq",
        "pi_durable_lmdb_log_records",
        "pi_durable_lmdb_log_tree_size",
        "pi_durable_lmdb_log_tree_stored_leaves",
        "pi_durable_lmdb_projection_lag_records",
        "pi_durable_lmdb_store_bytes",
        "pi_durable_lmdb_up",
    ]
    lags = sorted(
        line.split(" ")[0]
        for line in text.splitlines()
        if line.startswith("pi_durable_lmdb_projection_lag_records{")
    )
    assert lags == [
        'pi_durable_lmdb_projection_lag_records{projection="core"}',
        'pi_durable_lmdb_projection_lag_records{projection="exploding"}',
        'pi_durable_lmdb_projection_lag_records{projection="task_outcomes"}',
    ]


def test_healthz_of_a_missing_store_says_unavailable_and_why(store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(store, copy)
    with serve(copy) as served:
        assert get(served.url + "/healthz")[0] == 200
        copy.rename(tmp_path / "moved")
        status, body, _ = get(served.url + "/healthz")
    assert status == 503
    assert shape(json.loads(body)) == [("status", "str"), ("reason", "str")]
    assert json.loads(body)["status"] == "unavailable"


def test_replication_status_keeps_its_keys(tmp_path: Path) -> None:
    """``storage.replication.status()`` in each mode, as ``msgspec.to_builtins`` gives it (the
    documented keys, in this order)."""

    import asyncio

    import msgspec
    from pi_durable.context import BACKGROUND_CONTEXT as CTX
    from pi_durable_lmdb.log.stream.memory import MemoryLink, MemoryStream
    from pi_durable_lmdb.storage.lmdb_storage import LmdbStorage

    from tests.support.audit_writer_child import batch

    async def run() -> list[Shape]:
        server = MemoryStream("M")
        shipping = await LmdbStorage.open(
            tmp_path / "s", durability="process", nats=MemoryLink(server), stream="M", store="s"
        )
        writer = await LmdbStorage.open(
            tmp_path / "w", durability="replicated", nats=MemoryLink(server), stream="M", store="w"
        )
        try:
            await shipping.commit(batch(0), CTX)
            await writer.commit(batch(0), CTX)
            replica = await LmdbStorage.open_replica(
                tmp_path / "r", nats=MemoryLink(server), stream="M", store="w"
            )
            try:
                await replica.wait(1, 10)
                handles = [shipping, writer, replica]
                return [
                    shape(msgspec.to_builtins(handle.replication.status())) for handle in handles
                ]  # type: ignore[union-attr]
            finally:
                await replica.close()
        finally:
            await shipping.close()
            await writer.close()

    shipper, replicated, replica = asyncio.run(run())
    common = [("stream", "str"), ("subject", "str")]
    assert shipper == [
        ("mode", "str"),
        *common,
        ("shippedSeq", "int"),
        ("lagRecords", "int"),
        ("lagMs", "float"),
        ("lastError", "null"),
        ("stopped", "bool"),
        ("errors", "int"),
    ]
    assert replicated == [
        ("mode", "str"),
        *common,
        ("shippedSeq", "int"),
        ("lagRecords", "int"),
        ("lagMs", "float"),
        ("lastError", "null"),
        ("epoch", "int"),
        (
            "lease",
            [
                ("holder", "str"),
                ("epoch", "int"),
                ("ttl", "int"),
                ("expiresIn", "float"),
                ("lost", "null"),
            ],
        ),
        ("failed", "null"),
    ]
    assert replica == [
        ("mode", "str"),
        *common,
        ("appliedSeq", "int"),
        ("streamSeq", "int"),
        ("lagRecords", "int"),
        ("lagMs", "float"),
        ("lastError", "null"),
        ("stopped", "bool"),
        ("transactions", "int"),
    ]


def test_live_log_events_keep_their_keys(store: Path) -> None:
    """``/log/events``: each batch's ``data:`` line, as the live log page reads it."""

    import urllib.request

    with serve(store) as served:
        with urllib.request.urlopen(served.url + "/log/events?after=0", timeout=60) as stream:
            for raw in stream:
                if raw.startswith(b"data: "):
                    data = raw[len(b"data: ") :].decode().rstrip("\n")
                    break
    found = json.loads(data)
    assert data == json.dumps(found), "json.dumps's spacing, ASCII escapes"
    assert found["seq"] == 1
    links = [("text", "str"), ("href", "str")]
    assert shape(found) == [
        ("seq", "int"),
        ("when", "str"),
        ("summary", "str"),
        ("links", [links] * len(found["links"])),
    ]
    assert found["links"], "the first batch wrote a record"
