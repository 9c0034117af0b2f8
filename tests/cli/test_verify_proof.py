"""``durable-log verify-proof``: a proof as ``prove --json`` prints it, checked offline against a
signed checkpoint (the store removed first), holds (exit 0); a proof of another tree, a changed
hash, a forged checkpoint or an altered record line does not (exit 1, naming what failed); input
that is not a proof, key or record line is refused (exit 2) with a message."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.cli.test_transparency import NAME, _checkpoint, _grow, _keys, _store
from tests.support.cli_call import call


@pytest.fixture
def audited(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> dict[str, Path]:
    """An auditor's files: a checkpoint of 40 records, proofs and record lines taken from the
    store, and the verifier key; the store then grows by a record and is removed."""

    store = tmp_path / "store"
    asyncio.run(_store(store))
    key_file, vkey = _keys(capsys, tmp_path)
    files = {
        "vkey": tmp_path / "orders.pub",
        "cp": _checkpoint(capsys, store, key_file, tmp_path / "cp"),
    }
    files["vkey"].write_text(vkey + "\n")
    asyncio.run(_grow(store))
    commands = {
        "in40": ("prove", store, 7, "--size", 40, "--json"),
        "in20": ("prove", store, 7, "--size", 20, "--json"),
        "from40": ("prove", store, "--from", 40, "--json"),
        "to40": ("prove", store, "--from", 13, "--to", 40, "--json"),
        "to41": ("prove", store, "--from", 13, "--json"),
        "line7": ("export", store, "--from", 7, "--to", 7),
        "line8": ("export", store, "--from", 8, "--to", 8),
    }
    for name, args in commands.items():
        code, out, err = call(capsys, *args)
        assert code == 0, err
        files[name] = tmp_path / name
        files[name].write_text(out)
    shutil.rmtree(store)  # offline: no store from here on
    return files


def _check(
    capsys: pytest.CaptureFixture[str],
    files: dict[str, Path],
    proof: str | Path,
    *more: object,
    vkey: Path | None = None,
) -> tuple[int, str, str]:
    return call(
        capsys,
        "verify-proof",
        files.get(str(proof), proof),
        "--checkpoint",
        files["cp"],
        "--vkey",
        vkey or files["vkey"],
        *more,
    )


def test_proofs_that_hold_exit_0(
    capsys: pytest.CaptureFixture[str], audited: dict[str, Path]
) -> None:
    code, out, err = _check(capsys, audited, "in40", "--record", audited["line7"])
    assert code == 0, err
    assert "the inclusion proof holds against the signed checkpoint" in out
    assert f"signed by {NAME}+" in out and "is record 7 of the signed tree" in out
    assert "the record line of 7 hashes to the proof's leaf" in out
    for proof, end in (("from40", "old"), ("to40", "new")):
        code, out, err = _check(capsys, audited, proof)
        assert code == 0, err
        assert f"the checkpoint signs the {end} one" in out


def _altered(tmp_path: Path, source: Path, change: dict[str, object]) -> Path:
    value = json.loads(source.read_text())
    value.update(change)
    target = tmp_path / f"altered-{len(list(tmp_path.iterdir()))}"
    target.write_text(json.dumps(value))
    return target


def test_proofs_that_do_not_hold_exit_1_naming_what_failed(
    capsys: pytest.CaptureFixture[str], audited: dict[str, Path], tmp_path: Path
) -> None:
    proof = json.loads(audited["in40"].read_text())
    flipped = proof["inclusion"][0][:-1] + ("0" if proof["inclusion"][0][-1] != "0" else "1")
    record = json.loads(audited["line7"].read_text())
    record["writes"][0]["value"]["text"] = "turn 5, rewritten"
    (tmp_path / "forged7").write_text(json.dumps(record) + "\n")
    cases: list[tuple[tuple[object, ...], str]] = [
        (("in20",), "tree size: the proof is in the tree of 20 records, the checkpoint signs 40"),
        (
            (
                _altered(
                    tmp_path, audited["in40"], {"inclusion": [flipped, *proof["inclusion"][1:]]}
                ),
            ),
            "inclusion: ",
        ),
        (
            (_altered(tmp_path, audited["in40"], {"leafIndex": 5}),),
            "leaf index: record 7 is leaf 6, not 5",
        ),
        ((_altered(tmp_path, audited["in40"], {"rootHash": "ab" * 32}),), "root: the proof's root"),
        (("in40", "--record", tmp_path / "forged7"), "the record was altered"),
        (("in40", "--record", audited["line8"]), "record: the line is record 8, the proof is of 7"),
        (("to41",), "tree size: the proof runs from 13 to 41 records, the checkpoint signs 40"),
        ((_altered(tmp_path, audited["to40"], {"oldRoot": "cd" * 32}),), "consistency: "),
    ]
    for args, says in cases:
        code, out, err = _check(capsys, audited, *args)
        assert code == 1 and out == "", (args, code, out, err)
        assert "proof does NOT hold" in err and says in err, (args, err)


def test_a_checkpoint_of_another_key_does_not_hold(
    capsys: pytest.CaptureFixture[str], audited: dict[str, Path], tmp_path: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    _, other_vkey = _keys(capsys, other)
    (other / "orders.pub").write_text(other_vkey)
    code, _, err = _check(capsys, audited, "in40", vkey=other / "orders.pub")
    assert code == 1 and "signature: " in err, err


def test_bad_input_is_exit_2_with_a_message_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], audited: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "garbage").write_text("not json\n")
    (tmp_path / "array").write_text("[1, 2]\n")
    (tmp_path / "two").write_text(audited["line7"].read_text() + audited["line8"].read_text())
    extra = _altered(tmp_path, audited["in40"], {"extra": 1})
    short = _altered(tmp_path, audited["in40"], {"leafHash": "abc"})
    typed = _altered(tmp_path, audited["in40"], {"treeSize": "40"})
    (tmp_path / "bad.pub").write_text("not a key\n")
    before = sorted(tmp_path.iterdir())
    cases: list[tuple[tuple[object, ...], str]] = [
        ((tmp_path / "garbage",), "not a proof as `durable-log prove --json` prints it: not JSON"),
        ((tmp_path / "array",), "a JSON list, not an object"),
        ((extra,), "its fields are"),
        ((short,), "leafHash: 'abc' is not a hash (64 lowercase hex digits)"),
        ((typed,), "Expected `int`, got `str` - at `$.treeSize`"),
        ((tmp_path / "missing",), "missing: no such file or directory"),
        (("in40", "--record", tmp_path / "two"), "holds 2 lines, not the one line"),
        (("in40", "--record", tmp_path / "garbage"), "is not a batch: not JSON"),
        (("to40", "--record", audited["line7"]), "a record line goes with an inclusion proof"),
    ]
    for args, says in cases:
        code, out, err = _check(capsys, audited, *args)
        assert code == 2 and out == "" and says in err, (args, code, err)
    code, _, err = _check(capsys, audited, "in40", vkey=tmp_path / "bad.pub")
    assert code == 2 and "verifier key" in err, err
    code, _, err = call(capsys, "verify-proof", audited["in40"], "--vkey", audited["vkey"])
    assert code == 2 and "--checkpoint" in err, err
    assert sorted(tmp_path.iterdir()) == before, "a refusal writes nothing"
