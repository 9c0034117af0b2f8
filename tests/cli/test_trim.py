"""``durable-log trim``: a writer command (refused while a writer holds the store) that drops the
log's records before a point and compacts the file; afterwards ``verify`` passes, proofs from a
checkpoint signed before the trim still verify, reading commands given a trimmed ``--as-of``
exit 2 with one line (the web view answers 400), and ``export`` of the trimmed range is
refused."""

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
from tests.support.served import get, serve
from tests.support.workload import message


async def _store(path: Path) -> int:
    storage = await LmdbStorage.open(path, durability="process")
    conversation = await storage.mint_id()
    await storage.commit([{"type": "conversation", "value": {"id": conversation}}], CTX)
    for turn in range(199):
        words = f"turn {turn} " + "padding " * 40
        await storage.commit([message(await storage.mint_id(), conversation, words)], CTX)
    await storage.close()
    return conversation


@pytest.mark.slow  # a writer process, a web server process and a dozen commands
def test_trim_drops_the_prefix_and_keeps_every_proof(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    conversation = asyncio.run(_store(store))
    key = tmp_path / "orders.key"
    code, vkey, err = call(capsys, "keygen", NAME, "--out", key)
    assert code == 0, err
    (tmp_path / "orders.pub").write_text(vkey)
    code, note, err = call(capsys, "checkpoint", store, "--key", key)
    assert code == 0, err
    (tmp_path / "cp").write_text(note)
    code, before_list, err = call(capsys, "list", store, "entries", "--json")
    assert code == 0, err
    code, as_of_before, err = call(capsys, "list", store, "entries", "--as-of", 170, "--json")
    assert code == 0, err
    size = (store / "data.mdb").stat().st_size
    code, consistency, err = call(capsys, "prove", store, "--from", 10, "--to", 200, "--json")
    assert code == 0 and json.loads(consistency)["oldSize"] == 10, err

    holder = subprocess.Popen(  # another process's writer holds the store
        [sys.executable, "-c", WRITER, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"open\n"
        code, _, err = call(capsys, "trim", store, "--before", 150)
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)

    code, out, err = call(capsys, "trim", store, "--before", 150)
    assert code == 0, err
    assert "trimmed 144 records before sequence 145" in out and "compacted" in out
    assert (store / "data.mdb").stat().st_size < size
    code, out, err = call(capsys, "verify", store)
    assert code == 0, err + out
    code, out, err = call(capsys, "stats", store, "--json")
    assert code == 0 and json.loads(out)["trimmedBefore"] == 145, err

    code, out, err = call(capsys, "list", store, "entries", "--json")
    assert (code, out) == (0, before_list), err
    code, out, err = call(capsys, "list", store, "entries", "--as-of", 170, "--json")
    assert (code, out) == (0, as_of_before), err
    for command in (
        ("list", store, "entries", "--as-of", 100),
        ("show", store, "conversation", conversation, "--as-of", 3),
        ("list", store, "entries", "--as-of", "2000-01-01T00:00:00Z"),
    ):
        code, out, err = call(capsys, *command)
        assert code == 2, err
        assert err.count("\n") == 1 and "history before sequence 145 was trimmed" in err, err

    code, out, err = call(capsys, "export", store)
    assert code == 2
    assert err.count("\n") == 1 and "export from sequence 145 on" in err
    code, out, err = call(capsys, "export", store, "--seq", 3)
    assert code == 2 and err.count("\n") == 1 and "export from sequence 145 on" in err
    code, out, err = call(capsys, "export", store, "--from", 145)
    assert code == 0, err
    assert len(out.splitlines()) == 200 - 144

    # A proof from the checkpoint signed before the trim, of a trimmed record and of a kept one.
    for seq in (3, 180):
        code, proof, err = call(capsys, "prove", store, seq, "--size", 200, "--json")
        assert code == 0, err
        (tmp_path / "proof").write_text(proof)
        code, out, err = call(
            capsys,
            "verify-proof",
            tmp_path / "proof",
            "--checkpoint",
            tmp_path / "cp",
            "--vkey",
            tmp_path / "orders.pub",
        )
        assert code == 0, err + out
    code, proof, err = call(capsys, "prove", store, "--from", 10, "--to", 200, "--json")
    assert (code, proof) == (0, consistency), err

    with serve(store) as served:  # the web view: the request's fault, a 400 naming the point
        status, body, _ = get(served.url + "/index.json?as_of=100")
        assert status == 400 and "history before sequence 145 was trimmed" in body, body
        status, body, _ = get(served.url + "/index.json?as_of=145")
        assert status == 200, body

    code, out, err = call(capsys, "trim", store, "--before", 100)
    assert code == 0, err
    assert "nothing to trim before 100" in out
    code, out, err = call(capsys, "trim", store, "--before", "x")
    assert code == 2
    code, out, err = call(capsys, "trim", tmp_path / "none", "--before", 10)
    assert code == 2 and not (tmp_path / "none").exists()
