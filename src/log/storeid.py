"""A store's header and its id: written once when a store is created, the id naming the store
wherever its log travels (its subject on a NATS stream)."""

from __future__ import annotations

import re
import secrets
from typing import Final

import msgspec


class StoreHeader(msgspec.Struct):
    """Written once when a store is created; refuses stores of another format. ``store_id`` names
    the store wherever its log travels (its subject on a NATS stream); stores made before ids
    existed get one from their next writer."""

    format: int
    created_at: int
    store_id: str | None = None


STORE_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""A store id is one NATS subject token: no dots, no wildcards, no spaces."""


def new_store_id() -> str:
    """A fresh store id: 16 hex digits (64 random bits)."""

    return secrets.token_hex(8)


def check_store_id(value: object) -> str:
    if not isinstance(value, str) or not STORE_ID_PATTERN.fullmatch(value):
        raise ValueError(
            f"A store id is 1 to 64 letters, digits, '-' or '_' (one NATS subject token), not {value!r:.80}"
        )
    return value


_header_encoder: Final = msgspec.msgpack.Encoder()
_header_decoder: Final = msgspec.msgpack.Decoder(StoreHeader)


def encode_header(header: StoreHeader) -> bytes:
    return _header_encoder.encode(header)


def decode_header(raw: bytes) -> StoreHeader:
    """A stored header, validated (``msgspec.ValidationError`` or ``DecodeError`` otherwise)."""

    return _header_decoder.decode(raw)


__all__ = [
    "STORE_ID_PATTERN",
    "StoreHeader",
    "check_store_id",
    "decode_header",
    "encode_header",
    "new_store_id",
]
