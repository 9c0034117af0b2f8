"""``durable-log import --from-pi-durable`` carries every live document its source serves: of the
session, of a conversation or task the source holds (or holds no record of: the contract allows
it), and names each document the source itself cannot read (a committed change fails to apply)
instead of failing. The report counts what was read and what the new store serves, per kind."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb.storage import LmdbStorage

from tests.support.cli_call import call

CONVERSATION = {"kind": "conversation", "conversationId": 1}
SCOPES: dict[int, dict[str, Any]] = {
    4: {"kind": "session"},
    5: CONVERSATION,
    6: {"kind": "task", "taskId": 99},  # no task 99
    7: {"kind": "conversation", "conversationId": 98},  # no conversation 98
    8: {"kind": "task", "taskId": 3},  # 3 is an entry's id
    9: CONVERSATION,  # fails to apply: the source cannot read it
    10: {"kind": "task", "taskId": 97},  # fails too, and nothing else is of its scope
}
UNREADABLE = (9, 10)


def _create(id: int) -> dict[str, Any]:
    return {
        "type": "document.create",
        "record": {"id": id, "kind": f"kind{id}", "scope": SCOPES[id], "key": "k"},
        "content": {"kind": "base", "version": 2, "value": {"text": f"value of {id}"}},
    }


def _change(id: int, ops: list[Any]) -> dict[str, Any]:
    return {
        "type": "document.change",
        "id": id,
        "content": {"kind": "delta", "version": 2, "ops": ops},
    }


async def _write(source: Any, ids: list[int]) -> None:
    await source.commit(
        [
            {"type": "conversation", "value": {"id": 1}},
            {"type": "entry", "value": {"id": 3, "conversationId": 1, "kind": "note"}},
        ],
        CTX,
    )
    await source.commit([_create(id) for id in ids], CTX)
    await source.commit([_change(5, [["s", ["more"], 1]])], CTX)
    failing = [id for id in UNREADABLE if id in ids]
    if failing:
        await source.commit([_change(id, [["a", ["nope"], "x"]]) for id in failing], CTX)
    for id in failing:
        with pytest.raises(Exception, match="unresolvable path"):
            await source.document(id, "current", CTX)


async def _sqlite(tmp_path: Path, ids: list[int]) -> Path:
    from pi_durable.storage.sqlite.posix import open_posix_sqlite_storage

    file = tmp_path / "source.sqlite"
    source = await open_posix_sqlite_storage(str(file))
    try:
        await _write(source, ids)
    finally:
        await source.close(CTX)
    return file


async def _jsonl(tmp_path: Path, ids: list[int]) -> Path:
    from pi_durable.env.posix import PosixExecutionEnv
    from pi_durable.storage.jsonl import JsonlStorage

    directory = tmp_path / "source.jsonl"
    source = await JsonlStorage.open(str(directory), PosixExecutionEnv(), CTX)
    try:
        await _write(source, ids)
    finally:
        await source.close(CTX)
    return directory


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_a_pi_durable_source_holding_one_imports_the_rest(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = asyncio.run((_sqlite if kind == "sqlite" else _jsonl)(tmp_path, list(SCOPES)))
    new = tmp_path / "new"
    code, out, err = call(capsys, "import", "--from-pi-durable", source, new)
    assert code == 0, err
    readable = [id for id in SCOPES if id not in UNREADABLE]
    assert f"{len(readable)} documents" in out, out
    assert (
        f"read 1 conversation, 1 entry, 0 tasks, 0 submissions, {len(readable)} documents "
        "from the source; the new store serves as many of each"
    ) in out, out
    assert "2 live documents the source itself cannot read" in out, out
    assert "document 9: PathError: unresolvable path: ['nope']" in out, out
    assert "document 10: " in out, out

    asyncio.run(_holds(new, readable))
    code, out, _ = call(capsys, "verify", new)
    assert code == 0 and "cannot be read" not in out, out
    code, out, _ = call(capsys, "stats", new, "--json")
    assert json.loads(out)["liveDocuments"] == len(readable), out


@pytest.mark.parametrize("kind", ["sqlite", "jsonl"])
def test_documents_whose_owner_has_no_record_arrive(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    readable = [id for id in SCOPES if id not in UNREADABLE]
    source = asyncio.run((_sqlite if kind == "sqlite" else _jsonl)(tmp_path, readable))
    code, out, err = call(capsys, "import", "--from-pi-durable", source, tmp_path / "new")
    assert code == 0, err
    assert f"{len(readable)} documents from the source" in out, out
    assert "cannot read" not in out, out
    asyncio.run(_holds(tmp_path / "new", readable))


async def _holds(new: Path, readable: list[int]) -> None:
    """The new store serves each readable document as the source did, and none of the others."""

    storage = await LmdbStorage.open(new, readonly=True)
    try:
        for id in readable:
            stored = await storage.document(id, "current", CTX)
            assert stored is not None, id
            assert stored["record"]["scope"] == SCOPES[id]
            assert stored["version"] == 2
            expected = {"text": f"value of {id}", **({"more": 1} if id == 5 else {})}
            assert stored["value"] == expected
            assert (
                await storage.find_document(
                    {"kind": f"kind{id}", "scope": SCOPES[id], "key": "k"}, "current", CTX
                )
                == stored["record"]
            )
        for id in UNREADABLE:
            assert await storage.document(id, "current", CTX) is None
    finally:
        await storage.close()
