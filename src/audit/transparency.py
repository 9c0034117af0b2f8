"""The audit functions of the log's Merkle tree (docs/audit.md): checkpoints, proofs, and checking
a store against a checkpoint an auditor kept (``durable-log checkpoint``, ``prove``,
``verify --trusted``). Each opens the store read-only, never blocking its writer."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec

from ..errors import DamageError, ProofError
from ..log import Environment, WriteLog
from ..log.tree import ConsistencyProof, InclusionProof
from ..tlog import merkle
from ..tlog.note import Checkpoint, Signer, Verifier, parse_verifier, verify_checkpoint
from .words import plural


@contextmanager
def _log(path: str | os.PathLike[str]) -> Iterator[WriteLog]:
    env = Environment(path, readonly=True)
    try:
        yield WriteLog(env)
    finally:
        env.close()


def checkpoint(
    path: str | os.PathLike[str],
    key: Signer | str,
    origin: str | None = None,
    size: int | None = None,
) -> str:
    """The signed checkpoint of the store's log (its first ``size`` records, default all)."""

    with _log(path) as log:
        return log.checkpoint(key, origin, size)


def prove(path: str | os.PathLike[str], seq: int, size: int | None = None) -> InclusionProof:
    """The inclusion proof of record ``seq`` in the tree of ``size`` records (default all)."""

    with _log(path) as log:
        return log.prove(seq, size)


def prove_consistency(
    path: str | os.PathLike[str], old: int, new: int | None = None
) -> ConsistencyProof:
    """The consistency proof from the tree of ``old`` records to that of ``new`` (default all)."""

    with _log(path) as log:
        return log.prove_consistency(old, new)


class TrustReport(msgspec.Struct):
    """What ``verify_trusted`` found: ``sound`` only if every step held."""

    checkpoint_size: int
    head: int
    problems: list[str]
    steps: list[str]
    seconds: float = 0.0

    @property
    def sound(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [f"  ok: {step}" for step in self.steps] + [
            f"  FAILED: {problem}" for problem in self.problems
        ]
        verdict = (
            f"the store extends the trusted checkpoint of {plural(self.checkpoint_size, 'record')}"
            if self.sound
            else "the store does NOT hold the history the trusted checkpoint signed"
        )
        return "\n".join([f"{verdict} (head {self.head}, {self.seconds:.1f} s):", *lines])


def verify_trusted(
    path: str | os.PathLike[str], note: str | bytes, verifier: Verifier | str
) -> TrustReport:
    """Check a store against a signed checkpoint an auditor kept: the signature is the trusted
    key's; the store's log extends the checkpoint's tree (a consistency proof from its size to the
    head, checked against the checkpoint's root); and the stored tree is the log's own (every
    stored hash recomputed from the records). Problems are reported, not raised; a malformed key
    or note raises ``NoteError``."""

    started = time.monotonic()
    key = parse_verifier(verifier) if isinstance(verifier, str) else verifier
    problems: list[str] = []
    steps: list[str] = []
    trusted: Checkpoint | None = None
    try:
        signed = verify_checkpoint(note, key)
    except ProofError as error:
        problems.append(f"signature: {error}")
    else:
        trusted = signed
        steps.append(
            f"the checkpoint is signed by {key.name}+{key.key_id:08x} ({signed.origin}, size {signed.size})"
        )
    with _log(path) as log:
        head = log.head()
        if trusted is not None:
            _check_extends(log, trusted, head, steps, problems)
        try:
            differences, total = log.tree.check(log, head, limit=5)
        except DamageError as error:
            problems.append(f"the log itself is damaged: {error}")
        else:
            if total:
                problems.append(
                    f"the stored tree does not match the log ({plural(total, 'difference')}): "
                    + "; ".join(differences)
                )
            else:
                steps.append(f"the stored tree matches the log's {plural(head, 'record')}")
    return TrustReport(
        0 if trusted is None else trusted.size, head, problems, steps, time.monotonic() - started
    )


def _check_extends(
    log: WriteLog, trusted: Checkpoint, head: int, steps: list[str], problems: list[str]
) -> None:
    if trusted.size > head:
        problems.append(
            f"consistency: the checkpoint covers {plural(trusted.size, 'record')}, the store holds only {head}"
        )
        return
    try:
        proof = log.prove_consistency(trusted.size, head)
        merkle.verify_consistency(
            trusted.size,
            head,
            trusted.root,
            bytes.fromhex(proof.new_root),
            [bytes.fromhex(value) for value in proof.consistency],
        )
    except ProofError as error:
        problems.append(
            f"consistency: {error}: the store's first {plural(trusted.size, 'record')} are not the ones signed"
        )
    except DamageError as error:
        problems.append(f"consistency: the log is damaged: {error}")
    else:
        steps.append(
            f"the store's log extends it: consistency proof from {trusted.size} to {head} verified"
        )


__all__ = [
    "TrustReport",
    "checkpoint",
    "prove",
    "prove_consistency",
    "verify_trusted",
]
