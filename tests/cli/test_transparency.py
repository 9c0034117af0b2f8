"""``durable-log keygen``, ``checkpoint``, ``prove`` and ``verify --trusted``: a checkpoint kept
before a change catches a store rebuilt from an altered export and a record rewritten in place
(checksum recomputed, projections and tree rebuilt), both of which plain ``verify`` accepts."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import pytest
from pi_durable.context import BACKGROUND_CONTEXT as CTX
from pi_durable_lmdb import LmdbStorage, tlog
from pi_durable_lmdb.log import Environment, WriteLog, seq_key
from pi_durable_lmdb.log.records import decode_record_builtins, encode_batch, encode_record

from tests.support.cli_call import call

NAME = "audit.example.com/orders"


async def _store(path: Path, records: int = 40) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    await storage.commit([{"type": "conversation", "value": {"id": 1}}], CTX)
    for n in range(records - 1):
        await storage.commit(
            [
                {
                    "type": "entry",
                    "value": {"id": 100 + n, "conversationId": 1, "text": f"turn {n}", "amount": n},
                }
            ],
            CTX,
        )
    await storage.close()


async def _grow(path: Path) -> None:
    storage = await LmdbStorage.open(path, durability="process")
    await storage.commit([{"type": "conversation", "value": {"id": 2}}], CTX)
    await storage.close()


def _keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[Path, str]:
    key_file = tmp_path / "orders.key"
    code, out, err = call(capsys, "keygen", NAME, "--out", key_file)
    assert code == 0, err
    assert key_file.stat().st_mode & 0o777 == 0o600
    return key_file, out.strip()


def _checkpoint(capsys: pytest.CaptureFixture[str], path: Path, key_file: Path, at: Path) -> Path:
    code, out, err = call(capsys, "checkpoint", path, "--key", key_file)
    assert code == 0, err
    at.write_text(out)
    return at


def test_keygen_checkpoint_prove_and_verify_a_sound_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "store"
    asyncio.run(_store(path))
    key_file, vkey = _keys(capsys, tmp_path)
    assert key_file.read_text().startswith(f"PRIVATE+KEY+{NAME}+")
    assert call(capsys, "keygen", NAME, "--out", key_file)[0] == 2  # never overwrites
    trusted = _checkpoint(capsys, path, key_file, tmp_path / "cp")
    checkpoint = tlog.verify_checkpoint(trusted.read_text(), vkey)
    assert (checkpoint.origin, checkpoint.size) == (NAME, 40)

    code, out, _ = call(capsys, "prove", path, 7, "--size", 20, "--json")
    proof = json.loads(out)
    assert code == 0 and list(proof) == [
        "seq",
        "leafIndex",
        "treeSize",
        "leafHash",
        "inclusion",
        "rootHash",
    ]
    assert (proof["seq"], proof["leafIndex"], proof["treeSize"]) == (7, 6, 20)
    assert all(
        value == value.lower() and len(value) == 64
        for value in proof["inclusion"] + [proof["leafHash"], proof["rootHash"]]
    )
    tlog.verify_inclusion(
        bytes.fromhex(proof["leafHash"]),
        6,
        20,
        [bytes.fromhex(value) for value in proof["inclusion"]],
        bytes.fromhex(proof["rootHash"]),
    )
    code, out, _ = call(capsys, "prove", path, "--from", 13, "--json")
    proof = json.loads(out)
    assert code == 0 and list(proof) == ["oldSize", "newSize", "oldRoot", "newRoot", "consistency"]
    assert bytes.fromhex(proof["newRoot"]) == checkpoint.root
    tlog.verify_consistency(
        13,
        40,
        bytes.fromhex(proof["oldRoot"]),
        checkpoint.root,
        [bytes.fromhex(v) for v in proof["consistency"]],
    )

    asyncio.run(_grow(path))  # the store grows: it still extends the checkpoint
    code, out, err = call(capsys, "verify", path, "--trusted", trusted, "--vkey", vkey)
    assert code == 0, err
    assert "extends the trusted checkpoint of 40 records (head 41" in out

    code, out, _ = call(capsys, "stats", path, "--json")
    tree = json.loads(out)["tree"]
    assert tree == {
        "size": 41,
        "storedLeaves": 32,
        "rootHash": json.loads(call(capsys, "prove", path, "--from", 0, "--json")[1])["newRoot"],
    }
    assert f"merkle tree      41 records, root {tree['rootHash']}" in call(capsys, "stats", path)[1]

    vkey_file = tmp_path / "orders.pub"
    vkey_file.write_text(vkey + "\n")
    assert call(capsys, "verify", path, "--trusted", trusted, "--vkey", vkey_file)[0] == 0


def test_a_store_rebuilt_from_an_altered_export_fails_against_the_earlier_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "store"
    asyncio.run(_store(path))
    key_file, vkey = _keys(capsys, tmp_path)
    trusted = _checkpoint(capsys, path, key_file, tmp_path / "cp")
    export = tmp_path / "export.jsonl"
    code, out, _ = call(capsys, "export", path)
    assert code == 0
    lines = out.splitlines()
    export.write_text(out)

    faithful = tmp_path / "faithful"
    assert call(capsys, "import", export, faithful)[0] == 0
    assert (
        call(capsys, "verify", faithful, "--trusted", trusted, "--vkey", vkey)[0] == 0
    )  # the control

    assert '"amount":17' in lines[18]
    lines[18] = lines[18].replace('"amount":17', '"amount":1700')  # one figure of one record
    export.write_text("\n".join(lines) + "\n")
    altered = tmp_path / "altered"
    assert call(capsys, "import", export, altered)[0] == 0
    code, _, _ = call(capsys, "verify", altered)
    assert code == 0  # checksums and projections: all consistent with the altered log
    code, out, err = call(capsys, "verify", altered, "--trusted", trusted, "--vkey", vkey)
    assert code == 1 and out == ""
    assert "does NOT hold the history" in err
    assert (
        "FAILED: consistency: two different roots for the same size 40: the store's first 40 records are not the ones signed"
        in err
    )
    assert "ok: the stored tree matches the log's 40 records" in err


def _rewrite_in_place(path: Path, seq: int) -> None:
    """What an attacker with the files does: a record's writes changed, its checksum recomputed."""

    env = Environment(path, durability="process")
    try:
        log = WriteLog(env)
        with env.read() as txn:
            record = decode_record_builtins(seq, bytes(txn.get(seq_key(seq), db=log.db)))
        record["writes"][0]["value"]["text"] = "never said"
        data = encode_record(encode_batch(record["writes"]).payload, record["committedAt"])
        env.write(lambda txn: txn.put(seq_key(seq), data, db=log.db))
    finally:
        env.close()


@pytest.mark.parametrize("rebuilt", [True, False], ids=["tree-rebuilt", "tree-left"])
def test_a_record_rewritten_in_place_fails_against_the_earlier_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rebuilt: bool
) -> None:
    path = tmp_path / "store"
    asyncio.run(_store(path))
    key_file, vkey = _keys(capsys, tmp_path)
    trusted = _checkpoint(capsys, path, key_file, tmp_path / "cp")
    _rewrite_in_place(path, 9)
    if rebuilt:
        assert (
            call(capsys, "rebuild", path)[0] == 0
        )  # projections and tree folded from the rewritten log
        code, _out, err = call(capsys, "verify", path)
        assert code == 0, err  # checksums and projections cannot tell
    code, _out, err = call(capsys, "verify", path, "--trusted", trusted, "--vkey", vkey)
    assert code == 1
    if rebuilt:
        assert "FAILED: consistency" in err and "ok: the stored tree matches" in err
    else:
        assert (
            "ok: the store's log extends it" in err
        )  # the stored tree still holds the signed history ...
        assert (
            "FAILED: the stored tree does not match the log (2 differences): the log tree's tile of records 1 to 16"
            in err
        )


def test_verify_trusted_refuses_a_forged_or_foreign_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "store"
    asyncio.run(_store(path, 20))
    key_file, vkey = _keys(capsys, tmp_path)
    trusted = _checkpoint(capsys, path, key_file, tmp_path / "cp")
    forged = tmp_path / "forged"
    forged.write_text(trusted.read_text().replace("\n20\n", "\n19\n"))
    code, _, err = call(capsys, "verify", path, "--trusted", forged, "--vkey", vkey)
    assert code == 1 and "FAILED: signature: The signature of 'audit.example.com/orders'" in err
    other_key, other_vkey = tmp_path / "other.key", tlog.generate_signer(NAME)
    code, _, err = call(
        capsys, "verify", path, "--trusted", trusted, "--vkey", other_vkey.verifier().text()
    )
    assert code == 1 and "no signature by a trusted key" in err
    longer = tmp_path / "longer"
    signer = tlog.parse_signer(key_file.read_text())
    longer.write_text(tlog.sign_checkpoint(tlog.Checkpoint(NAME, 25, bytes(32)), signer))
    code, _, err = call(capsys, "verify", path, "--trusted", longer, "--vkey", vkey)
    assert code == 1 and "the checkpoint covers 25 records, the store holds only 20" in err
    assert not other_key.exists()


def test_bad_input_is_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "store"
    asyncio.run(_store(path, 5))
    key_file, vkey = _keys(capsys, tmp_path)
    trusted = _checkpoint(capsys, path, key_file, tmp_path / "cp")
    monkeypatch.delenv("DURABLE_LOG_VKEY", raising=False)
    cases = [
        (("verify", path, "--trusted", trusted), "needs the verifier key"),
        (
            ("verify", path, "--trusted", trusted, "--vkey", "nonsense"),
            "nonsense: no such file or directory (nor a verifier key given as text)",
        ),
        (("verify", path, "--trusted", trusted, "--vkey", "a+b"), "three fields"),
        (("verify", path, "--trusted", key_file, "--vkey", vkey), "signed note"),
        (("checkpoint", path, "--key", trusted), "PRIVATE+KEY+"),
        (("prove", path), "SEQ"),
        (("prove", path, 9), "not in the tree of 5 records"),
        (("prove", path, "--from", 9), "the old size must be from 0 to 5"),
        (("prove", path, 2, "--from", 1), "one of them"),
        (("keygen", "two words"), "no space"),
        (("prove", tmp_path / "nothing", 1), ""),
    ]
    for args, message in cases:
        code, _, err = call(capsys, *args)
        assert code == 2, (args, err)
        assert message in err and "Traceback" not in err, (args, err)
    monkeypatch.setenv("DURABLE_LOG_VKEY", vkey)
    assert call(capsys, "verify", path, "--trusted", trusted)[0] == 0
    assert msgspec.json.decode(call(capsys, "prove", path, 5, "--json")[1])["treeSize"] == 5


def test_import_checks_the_root_an_export_ends_with(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "store"
    asyncio.run(_store(path, 20))
    code, out, _ = call(capsys, "export", path, "--root")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 21
    trailer = json.loads(lines[-1])
    assert list(trailer) == ["treeSize", "rootHash"] and trailer["treeSize"] == 20
    assert (
        trailer["rootHash"]
        == json.loads(call(capsys, "prove", path, "--from", 20, "--json")[1])["newRoot"]
    )

    export = tmp_path / "export.jsonl"
    export.write_text(out)
    code, out, err = call(capsys, "import", export, tmp_path / "faithful")
    assert code == 0, err
    assert f"have the exporter's root {trailer['rootHash']}" in out + err

    altered = list(lines)
    altered[4] = altered[4].replace('"turn 3"', '"turn three"')
    for name, text, words in [
        ("altered", altered, "do not have the exporter's root"),
        ("cut", lines[:10] + lines[-1:], "the root of 20 records, the export holds 10"),
        ("after", lines + lines[-1:], "follows its root line 21"),
        ("bad", lines[:-1] + ['{"treeSize": 20, "rootHash": "xyz"}'], "not a root line"),
    ]:
        bad = tmp_path / f"{name}.jsonl"
        bad.write_text("\n".join(text) + "\n")
        code, _, err = call(capsys, "import", bad, tmp_path / name)
        assert code == 2 and words in err, (name, err)
        assert not (tmp_path / name).exists()
    assert call(capsys, "export", path, "--root", "--from", 2)[0] == 2


def test_tail_follow_prints_a_signed_checkpoint_every_n_records(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tests.audit.test_audit import DURABLE_LOG, Proc, write_store

    path = tmp_path / "store"
    assert write_store(path, 0, 7) == 7
    key_file, vkey = _keys(capsys, tmp_path)
    tail = Proc(
        [
            *DURABLE_LOG,
            "tail",
            str(path),
            "--follow",
            "--json",
            "--checkpoints",
            "5",
            "--key",
            str(key_file),
        ]
    )
    try:
        assert [line["seq"] for line in tail.json_until(7)] == list(
            range(1, 8)
        )  # following from here
        assert write_store(path, 7, 9) == 16  # sizes 10 and 15 reached
        notes: list[str] = []
        seqs: list[int] = []
        while len(notes) < 2 or len(seqs) < 9:
            line = tail.lines.get(timeout=30)
            assert line is not None, tail.stderr
            value = json.loads(line)
            if "checkpoint" in value:
                notes.append(value["checkpoint"])
            else:
                seqs.append(value["seq"])
        assert seqs == list(range(8, 17))
        sizes = [tlog.verify_checkpoint(note, vkey).size for note in notes]
        assert sizes == [10, 15]
        assert tail.terminate() == 0, tail.stderr
    finally:
        tail.kill()
    for args in (
        ["--checkpoints", "5"],
        ["--follow", "--checkpoints", "5"],
        ["--key", str(key_file)],
        ["--follow", "--checkpoints", "0", "--key", str(key_file)],
    ):
        code, _, err = call(capsys, "tail", path, *args)
        assert code == 2 and ("--checkpoints" in err or "--key" in err), (args, err)


def test_the_web_view_shows_the_tree_and_checks_a_pasted_checkpoint(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("aiohttp")
    import html
    import urllib.parse

    from tests.support.served import get, serve

    path = tmp_path / "store"
    asyncio.run(_store(path, 20))
    key_file, vkey = _keys(capsys, tmp_path)
    note = _checkpoint(capsys, path, key_file, tmp_path / "cp").read_text()
    root = json.loads(call(capsys, "prove", path, "--from", 0, "--json")[1])["newRoot"]
    with serve(path) as served:
        status, body, _ = get(served.url + "/audit")
        assert status == 200 and f'<code id="root">{root}</code>' in body and "20 records" in body
        query = urllib.parse.urlencode({"checkpoint": note.replace("\n", "\r\n"), "vkey": vkey})
        status, body, _ = get(served.url + "/audit?" + query)
        assert status == 200 and 'class="good">sound: the store extends the checkpoint' in body, (
            body
        )
        forged = urllib.parse.urlencode(
            {"checkpoint": note.replace("\n20\n", "\n19\n"), "vkey": vkey}
        )
        status, body, _ = get(served.url + "/audit?" + forged)
        assert status == 200 and "NOT sound" in body and "FAILED: signature" in html.unescape(body)
        status, body, _ = get(
            served.url
            + "/audit?"
            + urllib.parse.urlencode({"checkpoint": note, "vkey": "nonsense"})
        )
        assert status == 200 and "three fields" in body
