"""Signed notes and checkpoints in the C2SP formats (c2sp.org/signed-note, c2sp.org/tlog-checkpoint).

A checkpoint is the note text ``origin\\n<tree size>\\n<base64 root>\\n``, then a blank line, then
one signature line per signer: ``— <key name> <base64(key ID || Ed25519 signature)>``. The key ID
is the first four bytes of ``SHA-256(key name || 0x0A || 0x01 || public key)``. Keys are written as
Go's ``golang.org/x/mod/sumdb/note`` writes them, so its tools read them and the reverse:

- signing key: ``PRIVATE+KEY+<name>+<key ID, 8 hex digits>+<base64(0x01 || 32-byte seed)>``
- verifier key: ``<name>+<key ID, 8 hex digits>+<base64(0x01 || 32-byte public key)>``

Ed25519 comes from ``cryptography`` (the ``[audit]`` extra), imported only when a key is made,
used or checked: the tree and its proofs need nothing beyond ``hashlib``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ..errors import NoteError, ProofError, install_hint

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

ED25519: Final = 0x01
"""The signature type byte of Ed25519 (signed-note's registry)."""
MAX_SIGNATURES: Final = 100
"""Signature lines read from one note at most (the spec asks for at least 16)."""
MAX_NOTE: Final = 1 << 20
"""Bytes of a note read at most: a checkpoint is a few hundred."""
_DASH: Final = "\u2014 "
MISSING: Final = (
    "Signing and verifying checkpoints needs the cryptography package (the [audit] extra): "
    + install_hint("audit")
)


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the [audit] extra is missing
        raise NoteError(MISSING) from None
    return ed25519


def check_key_name(name: str) -> str:
    """``name`` if it is a valid key name: non-empty, no Unicode space, no ``+``, no control character."""

    if not isinstance(name, str) or not name:
        raise NoteError("A key name must be a non-empty string")
    if any(char.isspace() or char == "+" or ord(char) < 0x20 or char == "\x7f" for char in name):
        raise NoteError(f"A key name may hold no space, '+' or control character: {name!r}")
    return name


def key_id(name: str, public: bytes) -> int:
    """The 32-bit key ID of an Ed25519 key."""

    digest = hashlib.sha256(name.encode() + b"\n" + bytes([ED25519]) + public).digest()
    return int.from_bytes(digest[:4], "big")


class Verifier:
    """An Ed25519 verifier key of a signed note."""

    def __init__(self, name: str, public: bytes) -> None:
        self.name = check_key_name(name)
        if len(public) != 32:
            raise NoteError("An Ed25519 public key is 32 bytes")
        self.public = bytes(public)
        self.key_id = key_id(name, self.public)
        self._key: Ed25519PublicKey = _ed25519().Ed25519PublicKey.from_public_bytes(self.public)

    def verify(self, message: bytes, signature: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def text(self) -> str:
        """The verifier key as text: ``name+keyid+base64(0x01 || public key)``."""

        encoded = base64.b64encode(bytes([ED25519]) + self.public).decode()
        return f"{self.name}+{self.key_id:08x}+{encoded}"


class Signer:
    """An Ed25519 signing key of a signed note."""

    def __init__(self, name: str, seed: bytes) -> None:
        self.name = check_key_name(name)
        if len(seed) != 32:
            raise NoteError("An Ed25519 private key (seed) is 32 bytes")
        self._key: Ed25519PrivateKey = _ed25519().Ed25519PrivateKey.from_private_bytes(bytes(seed))
        self.public = self._key.public_key().public_bytes_raw()
        self.key_id = key_id(name, self.public)
        self._seed = bytes(seed)

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def verifier(self) -> Verifier:
        return Verifier(self.name, self.public)

    def text(self) -> str:
        """The signing key as text: ``PRIVATE+KEY+name+keyid+base64(0x01 || seed)``."""

        encoded = base64.b64encode(bytes([ED25519]) + self._seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.key_id:08x}+{encoded}"

    def __repr__(self) -> str:  # never the seed
        return f"Signer({self.name!r}, key ID {self.key_id:08x})"


def generate_signer(name: str) -> Signer:
    """A new random Ed25519 signing key named ``name``."""

    check_key_name(name)
    key = _ed25519().Ed25519PrivateKey.generate()
    return Signer(name, key.private_bytes_raw())


def _key_parts(text: str, what: str) -> tuple[str, int, bytes]:
    parts = text.strip().split("+", 2)
    if len(parts) != 3:
        raise NoteError(
            f"A {what} is name+keyid+key (three fields joined by '+'), not {len(parts)} fields"
        )
    name, hex_id, encoded = parts
    check_key_name(name)
    if len(hex_id) != 8 or any(char not in "0123456789abcdefABCDEF" for char in hex_id):
        raise NoteError(f"The key ID of a {what} is 8 hex digits, not {hex_id!r:.20}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError(f"The key of a {what} is not base64") from None
    if len(raw) != 33 or raw[0] != ED25519:
        raise NoteError(f"A {what} must be an Ed25519 key (type 0x01 and 32 bytes)")
    return name, int(hex_id, 16), raw[1:]


def parse_verifier(text: str) -> Verifier:
    """A verifier key from its text; ``NoteError`` when malformed or its key ID does not match."""

    name, wanted, public = _key_parts(text, "verifier key")
    verifier = Verifier(name, public)
    if verifier.key_id != wanted:
        raise NoteError(
            f"The verifier key's ID {wanted:08x} is not its key's ({verifier.key_id:08x})"
        )
    return verifier


def parse_signer(text: str) -> Signer:
    """A signing key from its text; ``NoteError`` when malformed or its key ID does not match."""

    text = text.strip()
    if not text.startswith("PRIVATE+KEY+"):
        raise NoteError("A signing key starts with PRIVATE+KEY+")
    name, wanted, seed = _key_parts(text[len("PRIVATE+KEY+") :], "signing key")
    signer = Signer(name, seed)
    if signer.key_id != wanted:
        raise NoteError(f"The signing key's ID {wanted:08x} is not its key's ({signer.key_id:08x})")
    return signer


# ── notes ─────────────────────────────────────────────────────────────────────


def _check_text(text: str) -> None:
    if not text.endswith("\n"):
        raise NoteError("A note's text must end with a newline")
    if any(ord(char) < 0x20 and char != "\n" for char in text):
        raise NoteError("A note may hold no control character but newline")


def sign_note(text: str, signer: Signer) -> str:
    """``text`` (ending in a newline) signed by ``signer``: the text, a blank line, the signature line."""

    _check_text(text)
    signature = signer.sign(text.encode())
    encoded = base64.b64encode(signer.key_id.to_bytes(4, "big") + signature).decode()
    return f"{text}\n{_DASH}{signer.name} {encoded}\n"


def open_note(note: str | bytes, verifiers: list[Verifier]) -> tuple[str, list[str]]:
    """The text of a signed note and the names of the known keys whose signatures verify.

    Signatures by unknown keys are ignored; one by a known key that fails, or none verifying,
    raises ``ProofError``; a note that is not well formed raises ``NoteError``."""

    if isinstance(note, bytes):
        if len(note) > MAX_NOTE:
            raise NoteError(f"A note is at most {MAX_NOTE} bytes")
        try:
            note = note.decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("A note must be UTF-8") from None
    if len(note) > MAX_NOTE:
        raise NoteError(f"A note is at most {MAX_NOTE} bytes")
    at = note.rfind("\n\n")
    if at < 0 or not note.endswith("\n"):
        raise NoteError("A signed note is its text, a blank line, then signature lines")
    text, lines = note[: at + 1], note[at + 2 : -1].split("\n")
    _check_text(text)
    if any(ord(char) < 0x20 and char != "\n" for char in note):
        raise NoteError("A note may hold no control character but newline")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"A note may carry at most {MAX_SIGNATURES} signatures")
    known = {(verifier.name, verifier.key_id): verifier for verifier in verifiers}
    verified: list[str] = []
    message = text.encode()
    for line in lines:
        if not line.startswith(_DASH):
            raise NoteError(f"A signature line starts with an em dash and a space: {line[:40]!r}")
        name, space, encoded = line[len(_DASH) :].partition(" ")
        if not space or " " in encoded:
            raise NoteError(f"A signature line is '— name signature': {line[:40]!r}")
        check_key_name(name)
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise NoteError(f"The signature of {name!r} is not base64") from None
        if len(raw) < 5:
            raise NoteError(f"The signature of {name!r} is too short")
        verifier = known.get((name, int.from_bytes(raw[:4], "big")))
        if verifier is None:
            continue  # an unknown key (a witness, a rotated key): ignored, as the spec says
        if not verifier.verify(message, raw[4:]):
            raise ProofError(
                f"The signature of {name!r} (key ID {verifier.key_id:08x}) does not verify"
            )
        verified.append(name)
    if not verified:
        names = (
            ", ".join(f"{verifier.name}+{verifier.key_id:08x}" for verifier in verifiers) or "none"
        )
        raise ProofError(f"The note has no signature by a trusted key (trusted: {names})")
    return text, verified


# ── checkpoints ───────────────────────────────────────────────────────────────


class Checkpoint(msgspec.Struct, frozen=True):
    """The tree head a checkpoint names: its origin, its size and the root of that size."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def text(self) -> str:
        """The checkpoint's note text."""

        if (
            not self.origin
            or "\n" in self.origin
            or any(not line or "\n" in line for line in self.extensions)
        ):
            raise NoteError("A checkpoint's origin and extension lines are non-empty single lines")
        if len(self.root) != 32 or self.size < 0:
            raise NoteError("A checkpoint names a tree size of 0 or more and a 32-byte root")
        lines = [
            self.origin,
            str(self.size),
            base64.b64encode(self.root).decode(),
            *self.extensions,
        ]
        return "".join(line + "\n" for line in lines)


def parse_checkpoint(text: str) -> Checkpoint:
    """The checkpoint a note text holds; ``NoteError`` when it is not one."""

    if not text.endswith("\n"):
        raise NoteError("A checkpoint's text ends with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or any(not line for line in lines):
        raise NoteError(
            "A checkpoint is at least three non-empty lines: origin, tree size, root hash"
        )
    origin, size_text, root_text, *extensions = lines
    if (
        not size_text.isascii()
        or not size_text.isdigit()
        or (size_text != "0" and size_text.startswith("0"))
    ):
        raise NoteError(
            f"A checkpoint's tree size is a decimal number without leading zeros, not {size_text[:30]!r}"
        )
    try:
        root = base64.b64decode(root_text, validate=True)
    except (binascii.Error, ValueError):
        raise NoteError("A checkpoint's root hash is not base64") from None
    if len(root) != 32:
        raise NoteError(f"A checkpoint's root hash is 32 bytes, not {len(root)}")
    return Checkpoint(origin, int(size_text), root, tuple(extensions))


def sign_checkpoint(checkpoint: Checkpoint, signer: Signer) -> str:
    """The signed note of ``checkpoint``."""

    return sign_note(checkpoint.text(), signer)


def verify_checkpoint(
    note: str | bytes, verifier: Verifier | str, origin: str | None = None
) -> Checkpoint:
    """The checkpoint of a signed note, once ``verifier`` (a ``Verifier`` or its text) signed it
    and, when given, its origin is ``origin``; ``ProofError`` or ``NoteError`` otherwise."""

    key = parse_verifier(verifier) if isinstance(verifier, str) else verifier
    text, _ = open_note(note, [key])
    checkpoint = parse_checkpoint(text)
    if origin is not None and checkpoint.origin != origin:
        raise ProofError(f"The checkpoint's origin is {checkpoint.origin!r}, not {origin!r}")
    return checkpoint


def note_key_names(note: str) -> list[str]:
    """The key names a signed note's signature lines give (unverified: to find a key to use)."""

    at = note.rfind("\n\n")
    if at < 0:
        return []
    return [
        line[len(_DASH) :].split(" ", 1)[0]
        for line in note[at + 2 :].splitlines()
        if line.startswith(_DASH)
    ]


__all__ = [
    "ED25519",
    "MAX_NOTE",
    "MAX_SIGNATURES",
    "MISSING",
    "Checkpoint",
    "Signer",
    "Verifier",
    "check_key_name",
    "generate_signer",
    "key_id",
    "note_key_names",
    "open_note",
    "parse_checkpoint",
    "parse_signer",
    "parse_verifier",
    "sign_checkpoint",
    "sign_note",
    "verify_checkpoint",
]
