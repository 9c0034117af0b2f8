"""Lossless, strict JSON on msgpack.

msgspec encodes the common case in C, but it cannot encode lone surrogates (``"\\ud800"``) or
integers outside 64 bits, both of which the Storage contract must keep. Such a value takes a slow
path that wraps only the offending parts in msgpack extension types, so ordinary values pay
nothing and every value decodes back to exactly what was written (a surrogate pair held as two
code points stays two code points).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar, cast

import msgspec

EXT_STR: Final = 1
"""A str that is not valid UTF-8 (it holds surrogates); the payload is UTF-8 with surrogatepass."""
EXT_INT: Final = 2
"""An int outside msgpack's 64-bit range as decimal ASCII digits (read only: Python limits how
many digits a process converts, so ``EXT_BIG_INT`` replaced it)."""
EXT_BIG_INT: Final = 4
"""An int outside msgpack's 64-bit range; the payload is its big-endian two's complement."""
EXT_OBJECT: Final = 3
"""An object with a key that needs EXT_STR; the payload is a flat msgpack array k1, v1, k2, v2."""

MAX_DEPTH: Final = 1_000
"""Deeper values are refused: the reference backends overflow Python's stack at about this depth.
The store's own limit, the same on every Python: ``check_json`` refuses a deeper commit and
``decode_bounded`` a deeper stored record, neither leaning on where an interpreter's stack ends."""

_DEEP_STACK: Final = 4 * MAX_DEPTH + 2_000
"""Frames enough for every recursive step here on a value ``MAX_DEPTH`` deep."""

T = TypeVar("T")

_INT_MIN: Final = -(2**63)
_INT_MAX: Final = 2**64 - 1

try:  # pi-durable hands out frozen records; they are strict JSON too. It is not a dependency.
    from pi_durable.json import FrozenDict as _FrozenDict
    from pi_durable.json import FrozenList as _FrozenList

    _OBJECT_TYPES: frozenset[type] = frozenset((dict, _FrozenDict))
    _ARRAY_TYPES: frozenset[type] = frozenset((list, _FrozenList))
except ImportError:  # pragma: no cover - exercised only without pi-durable installed
    _OBJECT_TYPES = frozenset({dict})
    _ARRAY_TYPES = frozenset({list})


class _Deferred:
    """An ``EXT_OBJECT`` met while decoding another one's payload: its bytes, decoded later by
    the same loop (``_object``), so nested objects never decode through nested calls."""

    __slots__ = ("data",)
    __hash__ = None  # type: ignore[assignment]  # as a map key it is refused, like the object it stands for

    def __init__(self, data: bytes) -> None:
        self.data = data


def _scalar_ext(code: int, data: memoryview) -> Any:
    if code == EXT_STR:
        return bytes(data).decode("utf-8", "surrogatepass")
    if code == EXT_BIG_INT:
        return int.from_bytes(data, "big", signed=True)
    if code == EXT_INT:
        return int(bytes(data))
    raise ValueError(f"unknown msgpack extension type {code}")


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_OBJECT:
        return _object(bytes(data))
    return _scalar_ext(code, data)


def _deferring_hook(code: int, data: memoryview) -> Any:
    if code == EXT_OBJECT:
        return _Deferred(bytes(data))
    return _scalar_ext(code, data)


_encoder: Final = msgspec.msgpack.Encoder()
_any_decoder: Final = msgspec.msgpack.Decoder(ext_hook=_ext_hook)
_flat_decoder: Final = msgspec.msgpack.Decoder(ext_hook=_deferring_hook)


def _object(data: bytes) -> dict[str, Any]:
    """The object an ``EXT_OBJECT`` payload holds, with every object nested in it, built by one
    loop: each level costs no Python frame (the interpreters differ in how many they allow).

    A payload that is not a flat array of string keys and values, or that nests objects deeper
    than ``MAX_DEPTH``, raises ``ValueError``: nothing this store writes is either."""

    root = _pairs(data)
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        container, depth = stack.pop()
        slots: Iterable[Any] = (
            container.items() if type(container) is dict else enumerate(container)
        )
        for slot, item in slots:
            if type(item) is _Deferred:
                item = container[slot] = _pairs(item.data)
            elif type(item) is not dict and type(item) is not list:
                continue
            if depth >= MAX_DEPTH:
                raise ValueError(_TOO_DEEP)
            stack.append((item, depth + 1))
    return root


def _pairs(data: bytes) -> dict[str, Any]:
    """One ``EXT_OBJECT`` level: its flat array as a dict (nested ones left ``_Deferred``)."""

    items = deep(_flat_decoder.decode, data)
    if type(items) is not list or len(items) % 2:
        raise ValueError(
            f"an object with surrogate keys holds {_kind(items)}, not a flat array of keys and values"
        )
    keys = items[::2]
    for key in keys:
        if type(key) is not str:
            raise ValueError(
                f"an object with surrogate keys has a key that is {_kind(key)}, not a string"
            )
    return dict(zip(keys, items[1::2]))


def _kind(value: Any) -> str:
    if type(value) is list:
        return f"an array of {len(value)} items"
    if type(value) is _Deferred:
        return "an object"
    return f"a value of type {type(value).__name__}"


_TOO_DEEP: Final = f"a stored value nests deeper than {MAX_DEPTH} levels; the store is damaged"


def decoder(type: Any = Any) -> msgspec.msgpack.Decoder[Any]:
    """A decoder for ``type`` that restores the slow path's extension values."""

    return msgspec.msgpack.Decoder(type, ext_hook=_ext_hook)


def deep(work: Callable[..., T], *args: Any) -> T:
    """Run ``work``; if a deep (but accepted) value overflows the default stack, run it again
    with room for ``MAX_DEPTH`` levels. Ordinary values never pay for this."""

    try:
        return work(*args)
    except RecursionError:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, _DEEP_STACK))
        try:
            return work(*args)
        finally:
            sys.setrecursionlimit(limit)


def encode(value: Any) -> bytes:
    """Encode an already checked value losslessly."""

    try:
        return _encoder.encode(value)
    except (UnicodeEncodeError, OverflowError, RecursionError):
        return deep(_encode_escaped, value)


def _encode_escaped(value: Any) -> bytes:
    try:
        return _encoder.encode(value)
    except (UnicodeEncodeError, OverflowError):
        return _encoder.encode(_escape(value))


def decode(data: bytes | memoryview) -> Any:
    return decode_with(_any_decoder, data)


def decode_with(decoder: msgspec.msgpack.Decoder[T], data: bytes | memoryview) -> T:
    """``decoder.decode(data)``, also for values nested past the default stack (up to
    ``MAX_DEPTH``, as deep as a commit may nest)."""

    try:
        return decoder.decode(data)
    except RecursionError:
        return decode_deep(decoder, data)


def decode_deep(decoder: msgspec.msgpack.Decoder[T], data: bytes | memoryview) -> T:
    """Decode what overflowed the default stack; refuse (``ValueError``) anything nested deeper
    than ``MAX_DEPTH`` levels, which nothing this store writes can be."""

    try:
        value = deep(decoder.decode, data)
    except RecursionError:
        raise ValueError(_TOO_DEEP) from None
    if _deeper_than(value, MAX_DEPTH):
        raise ValueError(_TOO_DEEP)
    return value


def decode_bounded(
    data: bytes | memoryview, decoder: msgspec.msgpack.Decoder[Any] = _any_decoder
) -> Any:
    """``decode_with`` for bytes that must hold what a commit wrote: ``ValueError`` for a value
    nesting deeper than ``MAX_DEPTH`` (checked here, the same on every Python, not left to where
    the interpreter's stack runs out) or holding what JSON cannot (binary, a key that is not a
    string).

    The walk over the decoded value is paid only by a payload that could hold either: one with
    more bytes that could open a container than ``MAX_DEPTH``, or with a byte that could open
    a binary value."""

    value = decode_with(decoder, data)
    raw = bytes(data)
    suspect = raw.translate(None, _INNOCENT)
    if (
        len(suspect) > MAX_DEPTH
        or len(suspect.translate(None, _NOT_BINARY))
        or _NON_FINITE.search(raw)
    ):
        problem = _not_stored_json(value)
        if problem is not None:
            raise ValueError(problem)
    return value


_CONTAINERS: Final = frozenset(
    [*range(0x80, 0xA0), *range(0xDC, 0xE0), *range(0xC7, 0xCA), *range(0xD4, 0xD9)]
)
"""msgpack's map, array and extension headers (fixmap, fixarray, array and map 16/32, fixext and
ext 8/16/32): a value nests at most as deep as it has bytes among these."""
_BINARY: Final = frozenset((0xC4, 0xC5, 0xC6))
"""msgpack's bin 8/16/32 headers: nothing a commit writes holds one."""
_NON_FINITE: Final = re.compile(rb"[\xca\xcb][\x7f\xff]", re.DOTALL)
"""A float 32/64 header whose exponent may be all ones (an infinity or a NaN, which no commit
writes: strict JSON): found by a scan in C, so only such payloads pay for the walk."""
_INNOCENT: Final = bytes(code for code in range(256) if code not in _CONTAINERS | _BINARY)
_NOT_BINARY: Final = bytes(code for code in range(256) if code not in _BINARY)


def _not_stored_json(value: Any) -> str | None:
    """What makes ``value`` something no commit wrote, or None; level by level, without
    recursion (a Struct counts as one container)."""

    level, depth = [value], 1
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is float:
                if not math.isfinite(item):
                    return "a stored value holds a number JSON cannot (infinite or NaN); the store is damaged"
                continue
            if kind in _LEAVES:
                continue
            if kind is dict:
                if not _STR_ONLY.issuperset(map(type, item)):  # the keys' types, in C
                    return "a stored object has a key that is not a string; the store is damaged"
                below.extend(item.values())
            elif kind is list or kind is tuple:
                below.extend(item)
            elif kind is bytes:
                return "a stored value holds binary data; the store is damaged"
            elif isinstance(item, msgspec.Struct):
                below.extend(msgspec.structs.astuple(item))
            else:
                continue
            if depth > MAX_DEPTH:
                return _TOO_DEEP
        level, depth = below, depth + 1
    return None


_LEAVES: Final = frozenset((str, int, float, bool, type(None)))
_STR_ONLY: Final = frozenset((str,))


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` containers (a Struct counts as one), found
    without recursion."""

    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, msgspec.Struct):
            item = msgspec.structs.astuple(item)
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _needs_escape(value: str) -> bool:
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _escape(value: Any) -> Any:
    """Replace what msgpack cannot hold with extension values (the rare, slow path)."""

    kind = type(value)
    if kind in _OBJECT_TYPES:
        if any(_needs_escape(key) for key in value):
            flat: list[Any] = []
            for key, item in value.items():
                flat.append(_escape(key))
                flat.append(_escape(item))
            return msgspec.msgpack.Ext(EXT_OBJECT, _encoder.encode(flat))
        return {key: _escape(item) for key, item in value.items()}
    if kind in _ARRAY_TYPES:
        return [_escape(item) for item in value]
    if isinstance(value, str):
        if _needs_escape(value):
            return msgspec.msgpack.Ext(EXT_STR, value.encode("utf-8", "surrogatepass"))
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value < _INT_MIN or value > _INT_MAX:
            number = int(value)
            size = (number.bit_length() + 8) // 8
            return msgspec.msgpack.Ext(EXT_BIG_INT, number.to_bytes(size, "big", signed=True))
        return value
    if isinstance(value, msgspec.Struct):  # a row around JSON values: same wire as its builtins
        return _escape(msgspec.to_builtins(value))
    if isinstance(value, (list, tuple)):  # the batch envelope itself, never a JSON value
        return [_escape(item) for item in value]
    if isinstance(value, dict):
        return {key: _escape(item) for key, item in value.items()}
    return value


def check_json(value: object) -> None:
    """Raise ``TypeError`` (saying "strict JSON") unless ``value`` is strict JSON.

    The messages are those of pi-durable's ``copy_json``. Cycles are found by depth alone, so the
    common path keeps no set of ancestors.
    """

    check_json_at(value, 0)


def check_json_at(value: object, depth: int) -> None:
    """``check_json`` for a value that will sit ``depth`` levels into a commit (a document's
    value under the batch, its write and its content: 3): its containers count from there, so
    one nesting past ``MAX_DEPTH`` raises what a commit of it would."""

    try:
        deep(_check, value, depth)
    except _TooDeep:
        if _has_cycle(value, set()):
            raise TypeError("Value contains cycles and is not strict JSON") from None
        raise TypeError(
            f"Value nests deeper than {MAX_DEPTH} levels and is not strict JSON"
        ) from None


class _TooDeep(Exception):
    pass


_PLAIN: Final = frozenset({str, int, bool, type(None)})


def _check(value: object, depth: int) -> None:
    # Containers first (the only kinds this is called for besides floats and subclasses: callers
    # skip plain leaves), each level's depth computed once for all its items.
    kind = type(value)
    if kind in _OBJECT_TYPES:
        if depth >= MAX_DEPTH:
            raise _TooDeep
        depth += 1
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str and not isinstance(key, str):
                raise TypeError("Value must contain strict JSON string keys")
            if type(item) not in _PLAIN:
                _check(item, depth)
        return
    if kind in _ARRAY_TYPES:
        if depth >= MAX_DEPTH:
            raise _TooDeep
        depth += 1
        for item in value:  # type: ignore[attr-defined]
            if type(item) not in _PLAIN:
                _check(item, depth)
        return
    if kind in _PLAIN:
        return
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise TypeError("Value contains a non-finite number and is not strict JSON")
        return
    if isinstance(value, (str, int)):  # subclasses such as StrEnum, IntEnum
        return
    if isinstance(value, float):
        _check(float(value), depth)
        return
    raise TypeError(f"Value contains a non-JSON {kind.__name__}; expected strict JSON")


def _has_cycle(value: object, ancestors: set[int]) -> bool:
    stack: list[tuple[object, bool]] = [(value, False)]
    while stack:
        item, leaving = stack.pop()
        if leaving:
            ancestors.discard(id(item))
            continue
        kind = type(item)
        if kind in _OBJECT_TYPES or kind in _ARRAY_TYPES:
            if id(item) in ancestors:
                return True
            ancestors.add(id(item))
            stack.append((item, True))
            children: Iterable[Any] = (
                cast("dict[Any, Any]", item).values()
                if kind in _OBJECT_TYPES
                else cast("list[Any]", item)
            )
            stack.extend((child, False) for child in children)
    return False


__all__ = [
    "EXT_BIG_INT",
    "EXT_INT",
    "EXT_OBJECT",
    "EXT_STR",
    "MAX_DEPTH",
    "check_json",
    "check_json_at",
    "decode",
    "decode_bounded",
    "decode_deep",
    "decode_with",
    "decoder",
    "deep",
    "encode",
]
