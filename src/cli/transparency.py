"""The log as a transparency log (docs/audit.md): ``keygen`` (an Ed25519 signing key in the C2SP
signed-note format), ``checkpoint`` (a signed tlog-checkpoint of a store), ``prove`` (inclusion and
consistency proofs, RFC 9162), ``verify --trusted`` (a store against a checkpoint kept earlier;
its options are added to ``verify``'s parser by ``trusted_options``), and ``tail --follow
--checkpoints N`` (``checkpoint_options``, ``print_checkpoints``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Callable

import msgspec

from ..audit.jsonlines import to_json
from ..audit.transparency import checkpoint, prove, prove_consistency, verify_trusted
from ..audit.witness import publish_checkpoint
from ..errors import CheckpointRefusedError, NoteError
from ..log import WriteLog
from ..tlog.note import Signer, Verifier, generate_signer, parse_signer, parse_verifier
from .common import (
    EXIT_DAMAGE,
    EXIT_OK,
    READ_ONLY,
    add_command,
    count,
    json_option,
    print_json,
    print_outcome,
    sequence,
    store_argument,
    usage,
)

VKEY_VARIABLE = "DURABLE_LOG_VKEY"
"""Where ``verify --trusted`` finds the verifier key when ``--vkey`` is not given."""
MAX_KEY_FILE = 64 * 1024


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_keygen(commands)
    _register_checkpoint(commands)
    _register_prove(commands)
    _register_verify_proof(commands)


# ── keygen ────────────────────────────────────────────────────────────────────


def _register_keygen(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "keygen",
        "make an Ed25519 key that signs checkpoints",
        "Write a new Ed25519 signing key named NAME (C2SP signed-note format, readable by Go's "
        "sumdb/note) to NAME.key (owner-only; '/' and ':' in NAME become '_') or --out FILE, and "
        "its verifier key, which auditors keep to check checkpoints, to NAME.pub beside it (FILE "
        "with .pub for .key); the verifier key is printed too. Name it after the store, e.g. "
        "audit.example.com/orders. Never overwrites a file.",
        example="durable-log keygen audit.example.com/demo",
    )
    sub.add_argument(
        "name",
        metavar="NAME",
        help="the key's name (no spaces, no '+'); checkpoints' origin by default",
    )
    sub.add_argument(
        "--out",
        metavar="FILE",
        help="where to write the signing key (default NAME.key); the verifier key goes beside it",
    )
    sub.set_defaults(run=_keygen)


def key_file_name(name: str) -> str:
    return re.sub(r"[/:\\]", "_", name) + ".key"


def verifier_file_name(key_file: str) -> str:
    """Where ``keygen`` writes the verifier key of the signing key it writes to ``key_file``."""

    return (key_file[: -len(".key")] if key_file.endswith(".key") else key_file) + ".pub"


def _keygen(args: argparse.Namespace) -> int:
    signer = generate_signer(args.name)
    out = args.out or key_file_name(args.name)
    public = verifier_file_name(out)
    for name in (out, public):
        if os.path.lexists(name):
            raise usage(f"{name} exists: keygen never overwrites a key (pass --out FILE)")
    _write_new(out, signer.text(), 0o600)
    try:
        _write_new(public, signer.verifier().text(), 0o644)
    except BaseException:
        os.unlink(out)  # both or neither: a signing key whose verifier key was not written
        raise
    print(
        f"wrote the signing key of {signer.name} to {out} and its verifier key to {public}:",
        file=sys.stderr,
    )
    print(signer.verifier().text())
    return EXIT_OK


def _write_new(name: str, line: str, mode: int) -> None:
    """Write ``line`` to a new file ``name`` (refused if it exists, by the system)."""

    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise usage(f"{name} exists: keygen never overwrites a key (pass --out FILE)") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(line + "\n")


def _read_key_text(value: str, what: str) -> str:
    """A key given as text, or the path of a file holding it."""

    if os.path.exists(value):
        with open(value, "rb") as handle:
            data = handle.read(MAX_KEY_FILE + 1)
        if len(data) > MAX_KEY_FILE:
            raise NoteError(f"{value} is too long for a {what}")
        try:
            return data.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise NoteError(f"{value} does not hold a {what} (not UTF-8)") from None
    if "+" not in value:  # a key's text is name+keyid+key: this was meant as a file
        raise usage(f"{value}: no such file or directory (nor a {what} given as text)")
    return value.strip()


# ── checkpoint ────────────────────────────────────────────────────────────────


def _register_checkpoint(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "checkpoint",
        "print a signed checkpoint of the log's Merkle tree",
        "Print a C2SP tlog-checkpoint of the store's log: origin, tree size, root hash, signed with "
        f"KEYFILE (from keygen). Keep it: verify --trusted proves later that the store still holds "
        f"this history; {READ_ONLY}.",
        example="durable-log checkpoint demo-store --key audit.example.com_demo.key > demo.checkpoint",
    )
    store_argument(sub)
    sub.add_argument(
        "--key", required=True, metavar="KEYFILE", help="the signing key file keygen wrote"
    )
    sub.add_argument(
        "--origin", metavar="ORIGIN", help="the checkpoint's origin line (default: the key's name)"
    )
    sub.add_argument(
        "--size",
        type=count,
        metavar="N",
        help="sign the tree of the first N records (default: all)",
    )
    sub.add_argument(
        "--publish",
        action="store_true",
        help="also put it in the JetStream key-value bucket S-checkpoints (key: the origin), only if the store "
        "extends the checkpoint there (exit 1 naming what does not hold); needs --nats and --stream",
    )
    sub.add_argument(
        "--nats",
        metavar="URL",
        help="with --publish: a NATS server URL, or several, comma-separated",
    )
    sub.add_argument(
        "--stream",
        metavar="S",
        help="with --publish: the stream whose bucket S-checkpoints witnesses it",
    )
    json_option(sub, '{"checkpoint": NOTE}, the note as text prints it')
    sub.set_defaults(run=_checkpoint)


def _checkpoint(args: argparse.Namespace) -> int:
    if len({args.publish, args.nats is not None, args.stream is not None}) > 1:
        raise usage("--publish goes with --nats URL and --stream S, all three or none")
    signer = parse_signer(_read_key_text(args.key, "signing key"))
    if not args.publish:
        note = checkpoint(args.path, signer, args.origin, args.size)
        if args.json:
            print_json({"checkpoint": note})
        else:
            sys.stdout.write(note)
        return EXIT_OK
    try:
        done = publish_checkpoint(args.path, signer, args.nats, args.stream, args.origin, args.size)
    except CheckpointRefusedError as error:
        print(f"{args.path}: {error}", file=sys.stderr)
        return EXIT_DAMAGE
    if args.json:
        print_json({"checkpoint": done.note})
    else:
        sys.stdout.write(done.note)
    what = "published" if done.published else "already there"
    print(
        f"{what}: {done.bucket} key {done.key} revision {done.revision} (tree size {done.tree_size})",
        file=sys.stderr,
    )
    return EXIT_OK


# ── prove ─────────────────────────────────────────────────────────────────────


def _register_prove(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "prove",
        "prove a record is in the log, or that the log extends an earlier size",
        "With SEQ: the inclusion proof of record SEQ in the tree of N records (RFC 9162 2.1.3). "
        "With --from OLD: the consistency proof from the tree of OLD records to that of NEW "
        f"(2.1.4). Hashes in lowercase hex; {READ_ONLY}.",
        example="durable-log prove demo-store 3 --json > proof.json",
    )
    store_argument(sub)
    sub.add_argument("seq", nargs="?", type=sequence, metavar="SEQ", help="the record to prove")
    sub.add_argument(
        "--size",
        type=count,
        metavar="N",
        help="the tree size of the inclusion proof (default: the head)",
    )
    sub.add_argument(
        "--from",
        dest="old",
        type=count,
        metavar="OLD",
        help="a consistency proof from this tree size",
    )
    sub.add_argument(
        "--to", dest="new", type=count, metavar="NEW", help="... to this one (default: the head)"
    )
    json_option(sub, "the proof, one object (what verify-proof reads)")
    sub.set_defaults(run=_prove)


def _prove(args: argparse.Namespace) -> int:
    if (args.seq is None) == (args.old is None):
        raise usage(
            "prove takes SEQ (an inclusion proof) or --from OLD (a consistency proof), one of them"
        )
    if args.seq is not None:
        if args.new is not None:
            raise usage("--to goes with --from; an inclusion proof takes --size")
        inclusion = prove(args.path, args.seq, args.size)
        if args.json:
            print_json(inclusion)
        else:
            print(
                f"record {inclusion.seq} is leaf {inclusion.leaf_index} of the tree of {inclusion.tree_size} records"
            )
            print(
                f"leaf hash {inclusion.leaf_hash}\nroot hash {inclusion.root_hash}\ninclusion proof:"
            )
            for value in inclusion.inclusion:
                print(f"  {value}")
            if inclusion.erased is not None:
                print(
                    f"record {inclusion.seq}'s content was erased by erasure record "
                    f"{inclusion.erased}: its leaf hash stays, the writes it named are gone"
                )
        return EXIT_OK
    if args.size is not None:
        raise usage("--size goes with SEQ; a consistency proof takes --from and --to")
    consistency = prove_consistency(args.path, args.old, args.new)
    if args.json:
        print_json(consistency)
    else:
        print(
            f"the tree of {consistency.new_size} records extends the tree of {consistency.old_size}"
        )
        print(
            f"old root {consistency.old_root}\nnew root {consistency.new_root}\nconsistency proof:"
        )
        for value in consistency.consistency:
            print(f"  {value}")
    return EXIT_OK


# ── verify-proof ──────────────────────────────────────────────────────────────


def _register_verify_proof(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sub = add_command(
        commands,
        "verify-proof",
        "check a proof against a signed checkpoint, offline",
        "Check PROOF_JSON, an inclusion or consistency proof as prove --json prints it ('-': "
        "stdin), against a signed checkpoint and its signer's verifier key, with no store: an "
        "inclusion proof must lead to the checkpoint's root in the tree of its size; a consistency "
        "proof must start or end at the checkpoint. With --record, the record line (as export "
        "prints it: export PATH --seq SEQ) must hash to the proof's leaf. Exit 0 when it holds, 1 "
        "naming what does not.",
        example="durable-log verify-proof proof.json --checkpoint demo.checkpoint "
        "--vkey audit.example.com_demo.pub",
    )
    sub.add_argument("proof", metavar="PROOF_JSON", help="the proof's file, or - for stdin")
    sub.add_argument(
        "--checkpoint", required=True, metavar="FILE", help="the signed checkpoint kept"
    )
    sub.add_argument(
        "--vkey",
        required=True,
        metavar="FILE",
        help="the verifier key keygen printed, or its file (NAME.pub)",
    )
    sub.add_argument(
        "--record",
        metavar="LINE_FILE",
        help="a file holding the proved record's line of an export (an inclusion proof)",
    )
    json_option(sub, '{"proof", "holds", "kind", "steps", "problems", "summary"}')
    sub.set_defaults(run=_verify_proof)


def _verify_proof(args: argparse.Namespace) -> int:
    from ..audit.proofs import check_proof, read_proof

    try:  # in the order of the command line: the proof first
        proof = read_proof(_read_input(args.proof, MAX_NOTE))
    except ValueError as error:
        raise usage(f"{args.proof}: {error}") from None
    note = _read_input(args.checkpoint, MAX_NOTE)
    verifier = parse_verifier(_read_key_text(args.vkey, "verifier key"))
    record = None if args.record is None else _record_line(args.record)
    report = check_proof(proof, note, verifier, record)
    result = None
    if args.json:
        result = ProofResult(
            args.proof, report.holds, report.kind, report.steps, report.problems, report.summary()
        )
    return print_outcome(args.proof, report.holds, report.summary(), result)


class ProofResult(msgspec.Struct):
    """What ``verify-proof --json`` prints: the checks of its text."""

    proof: str
    holds: bool
    kind: str
    steps: list[str]
    problems: list[str]
    summary: str


class TrustedResult(msgspec.Struct):
    """What ``verify --trusted --json`` prints: the checks of its text."""

    path: str
    sound: bool
    checkpointSize: int
    head: int
    steps: list[str]
    problems: list[str]
    seconds: float
    summary: str


MAX_NOTE = 1 << 20
"""Bytes a proof or checkpoint file may hold (a proof of a tree of 2**63 leaves is 5 KiB)."""


def _read_input(name: str, limit: int) -> bytes:
    """The bytes of file ``name`` (``-``: stdin), refused when longer than ``limit``."""

    if name == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        with open(name, "rb") as handle:
            data = handle.read(limit + 1)
    if len(data) > limit:
        raise usage(f"{name} is longer than {limit:,} bytes: not a proof or checkpoint")
    return data


def _record_line(name: str) -> bytes:
    """The one record line of file ``name``."""

    with open(name, "rb") as handle:
        lines = [line for line in handle if line.strip()]
    if len(lines) != 1:
        raise usage(
            f"{name} holds {len(lines)} lines, not the one line of the proved record "
            "(durable-log export PATH --seq SEQ prints it)"
        )
    return lines[0]


# ── verify --trusted ──────────────────────────────────────────────────────────


def trusted_options(sub: argparse.ArgumentParser) -> None:
    """``--trusted`` and ``--vkey`` on ``verify``'s parser."""

    sub.add_argument(
        "--trusted",
        metavar="CHECKPOINT_FILE",
        help="instead: check the store against a signed checkpoint kept earlier (signature, the log "
        "extends it, the tree matches the log); exit 1 naming what fails",
    )
    sub.add_argument(
        "--vkey",
        metavar="VERIFIER_KEY",
        help=f"the verifier key keygen printed, or a file holding it (default: ${VKEY_VARIABLE})",
    )


def verify_against(args: argparse.Namespace) -> int:
    """``verify PATH --trusted CHECKPOINT_FILE [--vkey KEY]``."""

    text = args.vkey if args.vkey is not None else os.environ.get(VKEY_VARIABLE)
    if not text:
        raise usage(
            f"verify --trusted needs the verifier key of the checkpoint's signer: --vkey KEY (or ${VKEY_VARIABLE})"
        )
    verifier: Verifier = parse_verifier(_read_key_text(text, "verifier key"))
    with open(args.trusted, "rb") as handle:
        note = handle.read(1 << 20)
    report = verify_trusted(args.path, note, verifier)
    checks = (report.checkpoint_size, report.head, report.steps, report.problems)
    result = None
    if getattr(args, "json", False):
        result = TrustedResult(
            args.path, report.sound, *checks, round(report.seconds, 3), report.summary()
        )
    return print_outcome(args.path, report.sound, report.summary(), result)


# ── tail --follow --checkpoints ───────────────────────────────────────────────

CHECKPOINT_POLL = 0.1
"""Seconds between looks at the log head while ``tail --follow --checkpoints`` waits."""


def checkpoint_options(sub: argparse.ArgumentParser) -> None:
    """``--checkpoints N`` and ``--key`` on ``tail``'s parser."""

    sub.add_argument(
        "--checkpoints",
        type=count,
        metavar="N",
        help="with --follow: also print a signed checkpoint each time the log reaches a multiple of N records "
        '(with --json as {"checkpoint": NOTE}), for an auditor\'s own copy (needs --key)',
    )
    sub.add_argument(
        "--key", metavar="KEYFILE", help="the signing key of --checkpoints (keygen writes one)"
    )


def checkpoint_signer(args: argparse.Namespace) -> Signer | None:
    """The signer of ``tail --checkpoints``, or None without it; refuses a bad combination."""

    if args.checkpoints is None:
        if args.key is not None:
            raise usage("--key signs the checkpoints of --checkpoints N")
        return None
    if not args.follow or args.checkpoints < 1 or args.key is None or args.nats is not None:
        raise usage(
            "--checkpoints N (N >= 1) goes with --follow and --key KEYFILE, on a store at PATH"
        )
    return parse_signer(_read_key_text(args.key, "signing key"))


async def print_checkpoints(
    log: WriteLog, every: int, signer: Signer, as_json: bool, write: Callable[[str], object]
) -> None:
    """Print a signed checkpoint of every size that is a multiple of ``every`` as the log reaches
    it, from the head when called, until cancelled."""

    next_size = (log.head() // every + 1) * every
    while True:
        head = log.head()
        while head >= next_size:
            note = log.checkpoint(signer, size=next_size)
            write((to_json({"checkpoint": note}) + "\n") if as_json else note + "\n")
            sys.stdout.flush()
            next_size += every
        await asyncio.sleep(CHECKPOINT_POLL)


__all__ = [
    "CHECKPOINT_POLL",
    "MAX_KEY_FILE",
    "VKEY_VARIABLE",
    "ProofResult",
    "TrustedResult",
    "checkpoint_options",
    "checkpoint_signer",
    "key_file_name",
    "print_checkpoints",
    "register",
    "trusted_options",
    "verifier_file_name",
    "verify_against",
]
