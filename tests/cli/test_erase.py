"""``durable-log erase``: a writer command (refused while a writer holds the store); after it
``verify`` passes, ``prove`` says an erased record's content was erased, ``verify-proof --record``
still proves an original export line with a checkpoint signed after the erasure (and refuses a
tombstone's line as that proof), and an export with tombstones imports to the same export."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage

from tests.cli.test_transparency import NAME
from tests.storage.test_compact import WRITER
from tests.support.cli_call import call
from tests.support.workload import message


async def _store(path: Path) -> tuple[int, int]:
    storage = await LmdbStorage.open(path, durability="process")
    a, b, fork = [await storage.mint_id() for _ in range(3)]
    first = await storage.mint_id()
    await storage.commit(
        [{"type": "conversation", "value": {"id": id}} for id in (a, b)]
        + [message(first, a, "private words")],
        CTX,
    )
    for turn in range(20):  # mixed batches: a's and b's writes in one record
        await storage.commit(
            [
                message(await storage.mint_id(), a, f"a {turn}"),
                message(await storage.mint_id(), b, f"b {turn}"),
            ],
            CTX,
        )
    await storage.commit(
        [
            {
                "type": "conversation",
                "value": {"id": fork, "parent": {"conversationId": a, "at": first}},
            }
        ],
        CTX,
    )
    await storage.close()
    return a, fork


def test_erase_keeps_every_proof(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = tmp_path / "store"
    a, fork = asyncio.run(_store(store))
    code, original, err = call(capsys, "export", store, "--from", 2, "--to", 2)
    assert code == 0, err

    code, _, err = call(capsys, "erase", store, "--conversation", a, "--reason", "asked")
    assert code == 2
    assert f"{fork} (of {a})" in err and "--with-forks" in err

    holder = subprocess.Popen(  # another process's writer holds the store
        [sys.executable, "-c", WRITER, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        code, _, err = call(
            capsys, "erase", store, "--conversation", a, "--reason", "asked", "--with-forks"
        )
        assert code == 2, err
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)

    code, out, err = call(
        capsys,
        "erase",
        store,
        "--conversation",
        a,
        "--reason",
        "art. 17 request 12",
        "--by",
        "the DPO",
        "--with-forks",
    )
    assert code == 0, err
    assert f"erased conversations {a}, {fork}" in out
    code, out, err = call(capsys, "verify", store)
    assert code == 0, err + out
    code, out, err = call(capsys, "tail", store, "-n", 2)
    assert code == 0, err
    assert (
        f"erasure of conversation {a}, {fork}: 23 writes from 22 records ('art. 17 request 12')"
        in out
    )

    code, exported, err = call(capsys, "export", store)
    assert code == 0, err
    lines = [json.loads(line) for line in exported.splitlines() if line.strip()]
    erasure = lines[-1]
    assert erasure["erasure"]["reason"] == "art. 17 request 12"
    assert erasure["erasure"]["by"] == "the DPO"
    assert erasure["erasure"]["conversations"] == [a, fork]
    assert all(
        line["erased"]["erasure"] == erasure["seq"] for line in lines[:-1] if "erased" in line
    )
    assert "private words" not in exported and '"a 3"' not in exported
    assert sum(1 for line in lines if "erased" in line) == 22
    assert [w["value"]["message"]["content"] for w in lines[5]["writes"]] == ["b 4"]

    key = tmp_path / "orders.key"
    code, vkey, err = call(capsys, "keygen", NAME, "--out", key)
    assert code == 0, err
    (tmp_path / "orders.pub").write_text(vkey)
    code, note, err = call(capsys, "checkpoint", store, "--key", key)
    assert code == 0, err
    (tmp_path / "cp").write_text(note)
    code, proof, err = call(capsys, "prove", store, 2, "--json")
    assert code == 0, err
    assert json.loads(proof)["erased"] == erasure["seq"]
    code, text, err = call(capsys, "prove", store, 2)
    assert f"erased by erasure record {erasure['seq']}" in text
    (tmp_path / "proof").write_text(proof)
    (tmp_path / "original").write_text(original)
    (tmp_path / "tombstone").write_text(json.dumps(lines[1]) + "\n")
    check = ("verify-proof", tmp_path / "proof", "--checkpoint", tmp_path / "cp")
    check += ("--vkey", tmp_path / "orders.pub")
    code, out, err = call(capsys, *check, "--record", tmp_path / "original")
    assert code == 0, err + out
    assert "content was erased" in out and "hashes to the proof's leaf" in out
    code, out, err = call(capsys, *check, "--record", tmp_path / "tombstone")
    assert code == 2
    assert "is a tombstone" in err

    (tmp_path / "export").write_text(exported)
    code, out, err = call(capsys, "import", tmp_path / "export", tmp_path / "copy")
    assert code == 0, err
    code, again, err = call(capsys, "export", tmp_path / "copy")
    assert code == 0, err
    assert again == exported
    code, out, err = call(capsys, "verify", tmp_path / "copy")
    assert code == 0, err + out
