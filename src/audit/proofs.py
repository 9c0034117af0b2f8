"""Checking a proof offline (``durable-log verify-proof``, docs/audit.md): an inclusion or
consistency proof as ``prove --json`` prints it, against a signed checkpoint and its signer's
verifier key, and optionally against the exported line of the record it proves. Nothing here
opens a store: an auditor holding a checkpoint, a proof and a record checks them anywhere.

Only what the checkpoint signs is trusted: the proof's own root hashes count for nothing until
they are the checkpoint's, and the record's leaf hash is recomputed from its exported line
(``tlog.leaf``: the writes encoded as the log encodes them)."""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from ..errors import ProofError
from ..log.records import encode_batch
from ..log.tree import ConsistencyProof, InclusionProof
from ..tlog import merkle
from ..tlog.leaf import record_leaf_hash
from ..tlog.note import Checkpoint, Verifier, verify_checkpoint
from .jsonlines import from_json
from .migrate import decode_line, parse_batch
from .words import plural

Proof = InclusionProof | ConsistencyProof

_HEX: Final = re.compile("[0-9a-f]{64}")
_SHAPES: Final = (
    (InclusionProof, ("seq", "leafIndex", "treeSize", "leafHash", "inclusion", "rootHash")),
    (ConsistencyProof, ("oldSize", "newSize", "oldRoot", "newRoot", "consistency")),
)


class ProofCheck(msgspec.Struct):
    """What ``check_proof`` found: the proof ``holds`` only if every step did."""

    kind: str
    """``inclusion`` or ``consistency``."""
    steps: list[str]
    problems: list[str]

    @property
    def holds(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        verdict = (
            f"the {self.kind} proof holds against the signed checkpoint"
            if self.holds
            else f"the {self.kind} proof does NOT hold against the signed checkpoint"
        )
        lines = [f"  ok: {step}" for step in self.steps]
        lines += [f"  FAILED: {problem}" for problem in self.problems]
        return "\n".join([f"{verdict}:", *lines])


def read_proof(text: str | bytes) -> Proof:
    """The proof ``prove --json`` printed; ``ValueError`` naming what is not as it prints one
    (a missing or extra field, a value of the wrong type, a hash that is not 64 hex digits)."""

    def refuse(why: str) -> ValueError:
        return ValueError(f"not a proof as `durable-log prove --json` prints it: {why}")

    try:
        value = from_json(text.decode("utf-8") if isinstance(text, bytes) else text)
    except (ValueError, RecursionError) as error:
        raise refuse(f"not JSON ({error})") from None
    if not isinstance(value, dict):
        raise refuse(f"a JSON {type(value).__name__}, not an object")
    for shape, fields in _SHAPES:
        if fields[0] not in value:
            continue
        optional = ["erased"] if shape is InclusionProof else []
        if sorted(set(value) - set(optional)) != sorted(fields):
            raise refuse(f"its fields are {sorted(value)}, not {list(fields)}")
        try:
            proof = msgspec.convert(value, shape)
        except msgspec.ValidationError as error:
            raise refuse(str(error)) from None
        assert isinstance(proof, InclusionProof | ConsistencyProof)
        _check_hex(proof, refuse)
        return proof
    raise refuse(
        f"neither an inclusion proof (with {'seq'!r}) nor a consistency proof (with {'oldSize'!r})"
    )


def _check_hex(proof: Proof, refuse: Any) -> None:
    if isinstance(proof, InclusionProof):
        named = {"leafHash": [proof.leaf_hash], "rootHash": [proof.root_hash]}
        named["inclusion"] = proof.inclusion
    else:
        named = {"oldRoot": [proof.old_root], "newRoot": [proof.new_root]}
        named["consistency"] = proof.consistency
    for name, values in named.items():
        for value in values:
            if not _HEX.fullmatch(value):
                raise refuse(f"{name}: {value[:80]!r} is not a hash (64 lowercase hex digits)")


def record_leaf(line: str | bytes) -> tuple[int, bytes]:
    """``(seq, leaf hash)`` of one exported record line (``export``'s ``{"seq", "committedAt",
    "writes"}``); ``ValueError`` naming what is not a record line."""

    text = decode_line(1, line)
    seq, committed_at, writes = parse_batch(1, text)
    if '"erased"' in text and "erased" in from_json(text):
        raise ValueError(
            f"the record line of {seq} is a tombstone (its content was erased): only a line "
            "exported before the erasure hashes to its leaf"
        )
    try:
        payload = encode_batch(writes).payload
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"the record line's writes are not a batch the log holds: {error}"
        ) from None
    return seq, record_leaf_hash(seq, committed_at, payload)


def check_proof(
    proof: Proof, note: str | bytes, verifier: Verifier, record: str | bytes | None = None
) -> ProofCheck:
    """Check ``proof`` against the checkpoint ``note`` signed by ``verifier``'s key, and (an
    inclusion proof) that its leaf is the record of the exported line ``record``. What does not
    hold is reported, not raised; a malformed note raises ``NoteError``, a record line that is not
    one ``ValueError``."""

    kind = "inclusion" if isinstance(proof, InclusionProof) else "consistency"
    if record is not None and not isinstance(proof, InclusionProof):
        raise ValueError("a record line goes with an inclusion proof, not a consistency proof")
    leaf = None if record is None else record_leaf(record)
    done = ProofCheck(kind, [], [])
    try:
        signed = verify_checkpoint(note, verifier)
    except ProofError as error:
        done.problems.append(f"signature: {error}")
        return done
    done.steps.append(
        f"the checkpoint is signed by {verifier.name}+{verifier.key_id:08x} "
        f"({signed.origin}, {plural(signed.size, 'record')}, root {signed.root.hex()})"
    )
    if isinstance(proof, InclusionProof):
        _inclusion(proof, signed, leaf, done)
    else:
        _consistency(proof, signed, done)
    return done


def _inclusion(
    proof: InclusionProof, signed: Checkpoint, leaf: tuple[int, bytes] | None, done: ProofCheck
) -> None:
    fits = True
    if proof.tree_size != signed.size:
        fits = False
        done.problems.append(
            f"tree size: the proof is in the tree of {plural(proof.tree_size, 'record')}, the "
            f"checkpoint signs {signed.size} (prove SEQ --size {signed.size} gives one in it)"
        )
    elif proof.root_hash != signed.root.hex():
        done.problems.append(f"root: the proof's root {proof.root_hash} is not the checkpoint's")
    if proof.leaf_index != proof.seq - 1:
        fits = False
        done.problems.append(
            f"leaf index: record {proof.seq} is leaf {proof.seq - 1}, not {proof.leaf_index}"
        )
    if fits:
        try:
            merkle.verify_inclusion(
                bytes.fromhex(proof.leaf_hash),
                proof.leaf_index,
                signed.size,
                [bytes.fromhex(value) for value in proof.inclusion],
                signed.root,
            )
        except ProofError as error:
            done.problems.append(f"inclusion: {error}")
        else:
            done.steps.append(
                f"leaf {proof.leaf_hash} is record {proof.seq} of the signed tree (inclusion "
                f"proof of {plural(len(proof.inclusion), 'hash', 'hashes')} verified)"
            )
    if proof.erased is not None:
        done.steps.append(
            f"record {proof.seq}'s content was erased (erasure record {proof.erased}): its leaf "
            "hash stays in the tree, and only a line kept from before the erasure hashes to it"
        )
    if leaf is not None:
        seq, hashed = leaf
        if seq != proof.seq:
            done.problems.append(f"record: the line is record {seq}, the proof is of {proof.seq}")
        elif hashed.hex() != proof.leaf_hash:
            done.problems.append(
                f"record: the line's leaf hash is {hashed.hex()}, not the proof's: the record was altered"
            )
        else:
            done.steps.append(f"the record line of {seq} hashes to the proof's leaf")


def _consistency(proof: ConsistencyProof, signed: Checkpoint, done: ProofCheck) -> None:
    if signed.size not in (proof.old_size, proof.new_size):
        done.problems.append(
            f"tree size: the proof runs from {proof.old_size} to {proof.new_size} records, the "
            f"checkpoint signs {signed.size} (prove --from {signed.size} gives one from it)"
        )
        return
    end, root = (
        ("old", proof.old_root) if signed.size == proof.old_size else ("new", proof.new_root)
    )
    if root != signed.root.hex():
        done.problems.append(f"root: the proof's {end} root {root} is not the checkpoint's")
        return
    try:
        merkle.verify_consistency(
            proof.old_size,
            proof.new_size,
            bytes.fromhex(proof.old_root),
            bytes.fromhex(proof.new_root),
            [bytes.fromhex(value) for value in proof.consistency],
        )
    except ProofError as error:
        done.problems.append(f"consistency: {error}")
        return
    done.steps.append(
        f"the tree of {plural(proof.new_size, 'record')} (root {proof.new_root}) extends the tree "
        f"of {proof.old_size} (root {proof.old_root}); the checkpoint signs the {end} one"
    )


__all__ = [
    "Proof",
    "ProofCheck",
    "check_proof",
    "read_proof",
    "record_leaf",
]
