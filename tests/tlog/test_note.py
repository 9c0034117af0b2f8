"""C2SP signed notes and checkpoints: Go's sumdb/note test key and note (interoperability), key
text round trips, and every way a note, key or checkpoint can be wrong."""

from __future__ import annotations

import base64
import hashlib

import pytest
from pi_durable_lmdb import tlog
from pi_durable_lmdb.errors import NoteError, ProofError

# golang.org/x/mod/sumdb/note's own test key and note.
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_SIG = "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"


def test_go_sumdb_note_vectors() -> None:
    signer = tlog.parse_signer(GO_SKEY)
    assert signer.text() == GO_SKEY
    assert signer.verifier().text() == GO_VKEY
    assert tlog.parse_verifier(GO_VKEY).key_id == 0xC74F20A3
    assert tlog.sign_note(GO_TEXT, signer) == GO_TEXT + "\n" + GO_SIG
    assert tlog.open_note(GO_TEXT + "\n" + GO_SIG, [tlog.parse_verifier(GO_VKEY)]) == (
        GO_TEXT,
        ["PeterNeumann"],
    )


def test_key_id_is_the_specified_hash() -> None:
    verifier = tlog.parse_verifier(GO_VKEY)
    digest = hashlib.sha256(b"PeterNeumann\n\x01" + verifier.public).digest()
    assert verifier.key_id == int.from_bytes(digest[:4], "big")


def test_checkpoint_round_trip_and_verification() -> None:
    signer = tlog.generate_signer("audit.example.com/orders")
    root = hashlib.sha256(b"root").digest()
    note = tlog.sign_checkpoint(tlog.Checkpoint("audit.example.com/orders", 20852163, root), signer)
    lines = note.split("\n")
    assert lines[:4] == [
        "audit.example.com/orders",
        "20852163",
        base64.b64encode(root).decode(),
        "",
    ]
    assert lines[4].startswith("\u2014 audit.example.com/orders ")
    checkpoint = tlog.verify_checkpoint(note, signer.verifier().text())
    assert (checkpoint.origin, checkpoint.size, checkpoint.root) == (
        "audit.example.com/orders",
        20852163,
        root,
    )
    assert (
        tlog.verify_checkpoint(note.encode(), signer.verifier(), origin="audit.example.com/orders")
        == checkpoint
    )
    with pytest.raises(ProofError, match="origin"):
        tlog.verify_checkpoint(note, signer.verifier(), origin="elsewhere")


def _tampered(note: str, old: str, new: str) -> str:
    assert old in note
    return note.replace(old, new, 1)


def test_any_change_to_a_signed_checkpoint_fails() -> None:
    signer = tlog.generate_signer("log")
    root = hashlib.sha256(b"r").digest()
    note = tlog.sign_checkpoint(tlog.Checkpoint("log", 10, root), signer)
    vkey = signer.verifier()
    with pytest.raises(ProofError):
        tlog.verify_checkpoint(_tampered(note, "\n10\n", "\n11\n"), vkey)
    with pytest.raises(ProofError):
        tlog.verify_checkpoint(
            note, tlog.generate_signer("log").verifier()
        )  # another key of the same name
    with pytest.raises(ProofError):  # a signature line of a known key that does not verify
        body, sig = note.rsplit(" ", 1)
        raw = bytearray(base64.b64decode(sig))
        raw[-1] ^= 1
        tlog.verify_checkpoint(body + " " + base64.b64encode(bytes(raw)).decode() + "\n", vkey)
    other = tlog.generate_signer("witness.example")
    cosigned = (
        note + tlog.sign_note(tlog.Checkpoint("log", 10, root).text(), other).split("\n\n", 1)[1]
    )
    assert tlog.verify_checkpoint(cosigned, vkey).size == 10  # an unknown signer's line is ignored
    assert tlog.open_note(cosigned, [vkey, other.verifier()])[1] == ["log", "witness.example"]


@pytest.mark.parametrize(
    "note",
    [
        "log\n10\n",  # no signature block
        "log\n10\nAAAA\n\nsignature\n",  # not an em dash line
        "log\n10\nAAAA\n\n\u2014 log\n",  # no signature
        "log\n10\nAAAA\n\n\u2014 log not-base64!\n",
        "log\n10\nAAAA\n\n\u2014 log AAAA\n",  # too short
        "log\x0710\nAAAA\n\n\u2014 log AAAAAAAAAA==\n",  # a control character
        "log\n10\nAAAA\n\n\u2014 log AAAAAAAAAA==",  # no final newline
    ],
)
def test_malformed_notes_are_note_errors(note: str) -> None:
    with pytest.raises(NoteError):
        tlog.open_note(note, [tlog.parse_verifier(GO_VKEY)])


@pytest.mark.parametrize(
    "text",
    [
        "log\n10\n",
        "log\n010\n" + base64.b64encode(bytes(32)).decode() + "\n",
        "log\n-1\nAAAA\n",
        "log\n1\nAAAA\n",
        "log\n1\n" + base64.b64encode(bytes(32)).decode() + "\n\n",
        "\n1\n" + base64.b64encode(bytes(32)).decode() + "\n",
    ],
)
def test_malformed_checkpoints_are_note_errors(text: str) -> None:
    with pytest.raises(NoteError):
        tlog.parse_checkpoint(text)


@pytest.mark.parametrize(
    "key",
    [
        "PeterNeumann+c74f20a3",
        "PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # the ID of another key
        "Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        "PeterNeumann+c74f20a3+AhpC2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",  # type 0x02
        "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq",
        "PeterNeumann+zzzzzzzz+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ],
)
def test_malformed_verifier_keys_are_note_errors(key: str) -> None:
    with pytest.raises(NoteError):
        tlog.parse_verifier(key)


def test_signing_keys_need_their_prefix_and_never_print_the_seed() -> None:
    with pytest.raises(NoteError):
        tlog.parse_signer(GO_SKEY.removeprefix("PRIVATE+KEY+"))
    signer = tlog.parse_signer(GO_SKEY)
    assert "AYEKF" not in repr(signer)
    with pytest.raises(NoteError):
        tlog.generate_signer("bad+name")
