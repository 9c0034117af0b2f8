"""Every bytes-to-value path raises only its documented error, whatever a writer of the file (or of
the stream) put there: valid records, frames, rows, messages and export lines are decoded,
mutated in their structure (a node swapped for another type, wrapped in more nesting, cut,
extended, an extension's payload replaced), re-encoded with their checksums recomputed so that
the check passes, and decoded again.

The documented errors: ``CorruptRecordError`` naming the sequence for a log record of each
format (``decode_record``, ``decode_record_builtins``, ``decode_batch``'s ``ValueError``);
journal frames stop at the first frame that does not hold (``read_frames`` never raises) and
their records then decode as log records; a stream message raises ``ForeignMessageError``; a
projected row's decoder ``ValueError`` or msgspec's ``DecodeError``/``ValidationError`` (the read
model turns them into ``CorruptProjectionError``); an export line ``ValueError`` naming the line.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import msgspec
import pytest
import xxhash
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext
from pi_durable_lmdb.audit.jsonlines import from_json, to_json
from pi_durable_lmdb.audit.migrate import parse_batch
from pi_durable_lmdb.errors import CorruptRecordError, ForeignMessageError
from pi_durable_lmdb.log import codec
from pi_durable_lmdb.log.deflate import PRESET
from pi_durable_lmdb.log.journal import HEADER_SIZE, encode_frame, read_frames
from pi_durable_lmdb.log.records import (
    LogRecord,
    RawRecord,
    decode_batch,
    decode_record,
    decode_record_builtins,
    encode_batch,
    write_to_builtins,
)
from pi_durable_lmdb.log.stream.message import parse_message, record_headers
from pi_durable_lmdb.projections import tables as t

SEQ = 7
EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SEED_BATCHES: list[list[dict[str, Any]]] = [
    [
        {
            "type": "conversation",
            "value": {"id": 1, "title": "t", "meta": {"\ud800k": [1, {"\udc00": 2**70}]}},
        }
    ],
    [
        {
            "type": "entry",
            "value": {"id": 2, "conversationId": 1, "content": ["a", {"b": None}], "n": -(2**65)},
        },
        {"type": "task", "value": {"id": 3, "state": {"status": "pending"}, "x": 1.5}},
    ],
    [
        {
            "type": "document.create",
            "record": {"id": 4},
            "content": {"kind": "base", "version": 1, "value": {"k": "v"}},
        },
        {
            "type": "document.change",
            "id": 4,
            "content": {"kind": "delta", "version": 2, "ops": [{"\udfffx": {"\ud800": [3]}}]},
        },
        {"type": "document.copy", "record": {"id": 5}, "source": {"id": 4, "at": "current"}},
        {"type": "document.retire", "id": 5},
    ],
    [
        {
            "type": "submission",
            "value": {"id": 6, "text": "x" * 300, "deep": [[[{"a": [[{"\ud801": "\udc37"}]]}]]]},
        }
    ],
]
SEED_PAYLOADS = [encode_batch(batch).payload for batch in SEED_BATCHES]

_tree_decoder = msgspec.msgpack.Decoder(ext_hook=lambda code, data: Ext(code, bytes(data)))
"""MessagePack as a tree that keeps every extension as it is stored (its payload undecoded)."""


# ── the structure-aware mutator ─────────────────────────────────────────────

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.sampled_from(
        ["type", "entry", "value", "kind", "base", "delta", "version", "ops", "id", "at", "current"]
    ),
)


def _ext_payloads(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Ext]:
    """What an extension might hold: random bytes, or any MessagePack value (a flat array of keys
    and values is what an object with surrogate keys holds; anything else is damage)."""

    packed = inner.map(msgspec.msgpack.encode)
    return st.builds(
        Ext,
        st.sampled_from(
            [codec.EXT_STR, codec.EXT_INT, codec.EXT_OBJECT, codec.EXT_BIG_INT, 0, 5, 127]
        ),
        st.one_of(st.binary(max_size=12), packed),
    )


NODES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        _ext_payloads(inner),
    ),
    max_leaves=8,
)


def _children(node: Any) -> list[tuple[Any, Any]]:
    if isinstance(node, list):
        return list(enumerate(node))
    if isinstance(node, dict):
        return list(node.items())
    if isinstance(node, Ext) and node.code == codec.EXT_OBJECT:
        try:
            return [(None, _tree_decoder.decode(node.data))]
        except (
            msgspec.DecodeError,
            RecursionError,
        ):  # not MessagePack, or too deep for this helper
            return []
    return []


def _rebuild(parent: Any, slot: Any, child: Any) -> Any:
    if isinstance(parent, Ext):
        return Ext(parent.code, codec.encode(child))
    parent[slot] = child
    return parent


def mutate(data: st.DataObject, node: Any, depth: int = 0) -> Any:
    """``node`` with one place in it changed; the path down is drawn, extension payloads included."""

    children = _children(node)
    if children and depth < 40 and data.draw(st.booleans(), label="descend"):
        slot, child = data.draw(st.sampled_from(children), label="into")
        return _rebuild(node, slot, mutate(data, child, depth + 1))
    how = data.draw(
        st.sampled_from(["swap", "nest", "cut", "extend", "ext", "surrogate-object", "deep"]),
        label="how",
    )
    if how == "swap":
        return data.draw(NODES, label="swap for")
    if how == "nest":
        wrap = data.draw(st.sampled_from(["list", "dict", "object"]), label="wrap")
        if wrap == "list":
            return [node]
        if wrap == "dict":
            return {"k": node}
        return Ext(codec.EXT_OBJECT, codec.encode([Ext(codec.EXT_STR, b"\xed\xa0\x80"), node]))
    if how == "cut":
        if isinstance(node, list):
            return node[: data.draw(st.integers(0, max(0, len(node) - 1)))]
        if isinstance(node, dict):
            return dict(list(node.items())[: data.draw(st.integers(0, max(0, len(node) - 1)))])
        if isinstance(node, (str, bytes)):
            return node[: len(node) // 2]
        if isinstance(node, Ext):
            return Ext(node.code, node.data[: data.draw(st.integers(0, len(node.data)))])
        return None
    if how == "extend":
        extra = data.draw(NODES, label="extra")
        if isinstance(node, list):
            return [*node, extra]
        if isinstance(node, dict):
            return {**node, data.draw(st.text(max_size=4)): extra}
        if isinstance(node, Ext):
            return Ext(node.code, node.data + msgspec.msgpack.encode(extra))
        return [node, extra]
    if how == "ext":
        return data.draw(_ext_payloads(NODES), label="ext")
    if (
        how == "surrogate-object"
    ):  # an object with surrogate keys around something that is not a flat array
        return Ext(codec.EXT_OBJECT, msgspec.msgpack.encode(data.draw(NODES, label="held")))
    levels = data.draw(st.sampled_from([990, 1_001, 1_200, 3_000]), label="levels")
    return _deep(node, levels, data.draw(st.booleans(), label="as objects"))


def _deep(leaf: Any, levels: int, objects: bool) -> msgspec.Raw:
    """``leaf`` under ``levels`` arrays or objects with a surrogate key, already encoded (a tree
    that deep would overflow the encoder's own stack)."""

    packed = codec.encode(leaf)
    if not objects:
        return msgspec.Raw(b"\x91" * levels + packed)
    key = msgspec.msgpack.encode(Ext(codec.EXT_STR, b"\xed\xb0\x80"))
    for _ in range(levels):
        packed = msgspec.msgpack.encode(Ext(codec.EXT_OBJECT, b"\x92" + key + packed))
    return msgspec.Raw(packed)


def mutated_payload(data: st.DataObject) -> bytes:
    tree = _tree_decoder.decode(data.draw(st.sampled_from(SEED_PAYLOADS), label="seed"))
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        tree = mutate(data, tree)
    try:
        return codec.deep(msgspec.msgpack.encode, tree)
    except RecursionError:  # a mutation nested deeper than the encoder's stack: store it unchanged
        return msgspec.msgpack.encode(_tree_decoder.decode(SEED_PAYLOADS[0]))


# ── records of each format, checksums recomputed ───────────────────────────

_ZSTD = zstandard.ZstdCompressor(
    level=1,
    dict_data=zstandard.ZstdCompressionDict(PRESET, dict_type=zstandard.DICT_TYPE_RAWCONTENT),
    write_checksum=False,
    write_content_size=True,
    write_dict_id=False,
)


def _deflated(payload: bytes) -> bytes:
    compressor = zlib.compressobj(1, zlib.DEFLATED, -15, 8, zlib.Z_DEFAULT_STRATEGY, PRESET)
    return compressor.compress(payload) + compressor.flush()


def _crc(committed_at: int, stored: bytes) -> int:
    return zlib.crc32(stored, zlib.crc32(committed_at.to_bytes(8, "big", signed=True)))


def record_bytes(
    payload: bytes, record_format: int, committed_at: int = 1_700_000_000_000
) -> bytes:
    """A record of ``record_format`` around ``payload``, with the checksum it must carry."""

    if record_format == 1:
        return msgspec.msgpack.encode(
            RawRecord(1, committed_at, _crc(committed_at, payload), payload)
        )
    stored = _deflated(payload) if record_format == 2 else _ZSTD.compress(payload)
    return msgspec.msgpack.encode(
        LogRecord(record_format, committed_at, _crc(committed_at, stored), stored, len(payload))
    )


def assert_record_decodes_or_is_corrupt(data: bytes, seq: int = SEQ) -> None:
    """The documented outcome of every log-record reader: a value, or ``CorruptRecordError(seq)``."""

    try:
        commit = decode_record(seq, data)
    except CorruptRecordError as error:
        assert error.seq == seq and f"Log record {seq} is corrupt" in str(error)
    else:
        for write in commit.writes:
            write_to_builtins(write)
    try:
        batch = decode_record_builtins(seq, data)
    except CorruptRecordError as error:
        assert error.seq == seq
    else:
        to_json(batch)  # the export line and ``tail --json`` of it


@pytest.mark.parametrize("record_format", [1, 2, 3], ids=["raw", "deflate", "zstd"])
@EXAMPLES
@given(data=st.data())
def test_a_mutated_record_with_a_valid_checksum_decodes_or_is_corrupt(
    record_format: int, data: st.DataObject
) -> None:
    payload = mutated_payload(data)
    assert_record_decodes_or_is_corrupt(record_bytes(payload, record_format))
    try:
        decode_batch(payload)
    except ValueError:
        pass
    except msgspec.DecodeError:
        pass


@EXAMPLES
@given(data=st.data())
def test_a_mutated_record_header_with_a_valid_checksum_decodes_or_is_corrupt(
    data: st.DataObject,
) -> None:
    """The header's own fields swapped, cut, extended: format, commit time, size."""

    payload = data.draw(st.sampled_from(SEED_PAYLOADS))
    record_format = data.draw(st.sampled_from([1, 2, 3]))
    header = _tree_decoder.decode(record_bytes(payload, record_format))
    header = mutate(data, header)
    if (
        (
            isinstance(header, list)
            and len(header) >= 4
            and isinstance(header[1], int)
            and isinstance(header[3], bytes)
        )
        and -(2**63) <= header[1] < 2**63
        and data.draw(st.booleans(), label="recompute checksum")
    ):
        header[2] = _crc(header[1], header[3])
    assert_record_decodes_or_is_corrupt(msgspec.msgpack.encode(header))


@pytest.mark.parametrize(
    "held",
    [
        5,
        "k",
        {"k": 1},
        [[1], 2],
        [{"a": 1}, 2],
        ["odd"],
        [Ext(codec.EXT_OBJECT, msgspec.msgpack.encode(["a", 1])), 1],
    ],
    ids=["int", "str", "map", "array-key", "map-key", "odd-length", "object-key"],
)
@pytest.mark.parametrize("record_format", [1, 2, 3], ids=["raw", "deflate", "zstd"])
def test_an_object_with_surrogate_keys_holding_no_flat_array_is_a_corrupt_record(
    record_format: int, held: Any
) -> None:
    """It raised TypeError ("unhashable type" for a key that is an array or a map) in every
    record format, and ``tail`` died with a traceback."""

    value = Ext(codec.EXT_OBJECT, msgspec.msgpack.encode(held))
    payload = msgspec.msgpack.encode([{"type": "entry", "value": {"id": 1, "x": value}}])
    data = record_bytes(payload, record_format)
    with pytest.raises(CorruptRecordError, match=f"Log record {SEQ} is corrupt") as caught:
        decode_record(SEQ, data)
    assert caught.value.seq == SEQ
    with pytest.raises(CorruptRecordError, match=f"Log record {SEQ} is corrupt"):
        decode_record_builtins(SEQ, data)


def test_objects_with_surrogate_keys_nested_to_the_limit_read_back_and_one_more_is_corrupt() -> (
    None
):
    """Nested objects with surrogate keys decode without a Python frame per level, on every
    Python; one level past ``MAX_DEPTH`` is damage, not a value."""

    key = Ext(codec.EXT_STR, b"\xed\xa0\x80")
    for levels, ok in ((codec.MAX_DEPTH - 2, True), (codec.MAX_DEPTH - 1, False), (50_000, False)):
        value: Any = 1
        for _ in range(levels):
            value = Ext(codec.EXT_OBJECT, msgspec.msgpack.encode([key, value]))
        payload = msgspec.msgpack.encode([{"type": "entry", "value": value}])
        if ok:
            (write,) = decode_record(SEQ, record_bytes(payload, 1)).writes
            depth, node = 0, write.value  # type: ignore[union-attr]
            while isinstance(node, dict):
                depth, node = depth + 1, node["\ud800"]
            assert depth == levels and node == 1
        else:
            with pytest.raises(CorruptRecordError, match="nests deeper than 1000 levels"):
                decode_record(SEQ, record_bytes(payload, 1))


# ── journal frames ──────────────────────────────────────────────────────────


@EXAMPLES
@given(data=st.data())
def test_a_mutated_journal_frame_is_read_or_stops_and_its_records_decode_or_are_corrupt(
    data: st.DataObject,
) -> None:
    number, salt = 3, data.draw(st.integers(0, 2**64 - 1))
    records = [
        record_bytes(mutated_payload(data), data.draw(st.sampled_from([1, 2, 3])))
        for _ in range(data.draw(st.integers(1, 3)))
    ]
    frame = bytearray(encode_frame(number, salt, SEQ, records))
    if data.draw(st.booleans(), label="forge the frame's fields"):
        field = data.draw(
            st.sampled_from([4, 8, 12, 16, 24]), label="field"
        )  # length, count, reserved, segment, first
        width = 8 if field >= 16 else 4
        frame[field : field + width] = data.draw(st.integers(0, 2 ** (8 * width) - 1)).to_bytes(
            width, "big"
        )
        if data.draw(st.booleans(), label="cut"):
            del frame[data.draw(st.integers(0, len(frame))) :]
        head = bytes(frame[:32])
        frame[32:40] = xxhash.xxh3_64_intdigest(head + bytes(frame[40:]), seed=salt).to_bytes(
            8, "big"
        )
    for first, found in read_frames(bytes(HEADER_SIZE) + bytes(frame), number, salt):
        for offset, record in enumerate(found):
            assert_record_decodes_or_is_corrupt(
                record, first + offset if first + offset > 0 else SEQ
            )


# ── stream messages ─────────────────────────────────────────────────────────


@EXAMPLES
@given(data=st.data())
def test_a_mutated_stream_message_is_taken_or_refused_as_foreign(data: st.DataObject) -> None:
    store = "s" * 8
    kind = data.draw(st.sampled_from(["record", "fence", "ids"]))
    headers = record_headers(store, SEQ, 1)
    if kind == "record":
        body = record_bytes(mutated_payload(data), data.draw(st.sampled_from([1, 2, 3])))
    else:
        headers["Pd-Kind"] = kind
        control = (
            {"type": "fence", "epoch": 1, "holder": "h"}
            if kind == "fence"
            else {"type": "ids", "epoch": 1, "upto": 9}
        )
        body = codec.deep(msgspec.msgpack.encode, mutate(data, control))
    if data.draw(st.booleans(), label="forge a header"):
        name = data.draw(st.sampled_from(sorted(headers)))
        headers[name] = data.draw(
            st.one_of(st.text(max_size=6), st.sampled_from(["²", "٣", "-1", "0", "9" * 5_000]))
        )
    try:
        message = parse_message("stream", 1, headers, body, store)
    except ForeignMessageError:
        return
    if message.kind != "record":
        _ = message.control  # a control message's fields decode on access


@pytest.mark.parametrize(
    "seq", ["9" * 5_000, str(2**64), "²", ""], ids=["5000-digits", "2**64", "superscript", "empty"]
)
def test_a_stream_message_with_a_sequence_no_log_holds_is_foreign(seq: str) -> None:
    """Digits past Python's 4,300-digit conversion limit raised ValueError from the parser."""

    headers = record_headers("s" * 8, SEQ, 1)
    headers["Pd-Seq"] = seq
    with pytest.raises(ForeignMessageError, match="is not a log sequence"):
        parse_message("stream", 1, headers, record_bytes(SEED_PAYLOADS[0], 1), "s" * 8)


# ── projected rows ──────────────────────────────────────────────────────────

ROW_DECODERS = {
    "entry": t.entry_decoder,
    "revision": t.revision_decoder,
    "current": t.current_decoder,
    "any": None,
}


@pytest.mark.parametrize("row", list(ROW_DECODERS))
@EXAMPLES
@given(data=st.data())
def test_a_mutated_projected_row_decodes_or_raises_a_decode_error(
    row: str, data: st.DataObject
) -> None:
    value = {"id": 1, "meta": {"\ud800": [2**70, "\udc00"]}, "text": "x"}
    seeds = {
        "entry": t.EntryRow(3, value),
        "revision": t.Revision("base", 2, value),
        "current": t.CurrentValue(2, 0, value),
        "any": value,
    }
    tree = _tree_decoder.decode(codec.encode(seeds[row]))
    raw = codec.deep(msgspec.msgpack.encode, mutate(data, tree))
    decoder = ROW_DECODERS[row]
    try:
        codec.decode(raw) if decoder is None else codec.decode_with(decoder, raw)
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        pass


# ── export lines ────────────────────────────────────────────────────────────


@EXAMPLES
@given(data=st.data())
def test_a_mutated_export_line_is_a_batch_or_refused_naming_the_line(data: st.DataObject) -> None:
    batch = {"seq": SEQ, "committedAt": 1, "writes": data.draw(st.sampled_from(SEED_BATCHES))}
    tree = _json_mutate(data, to_json(batch))
    line = to_json(tree) if not isinstance(tree, str) else tree
    if data.draw(st.booleans(), label="damage the text"):
        at = data.draw(st.integers(0, len(line)))
        line = (
            line[:at]
            + data.draw(
                st.sampled_from(
                    [
                        "",
                        "[",
                        "{",
                        '"',
                        "\\u",
                        "\\ud800",
                        "]]",
                        "1e999999",
                        "9" * 5_000,
                        "\x00",
                        "[" * 1_200,
                        '{"a":' * 3_000,
                    ]
                )
            )
            + line[at + data.draw(st.integers(0, 3)) :]
        )
    try:
        parse_batch(4, line)
    except ValueError as error:
        assert str(error).startswith("Line 4 of the export")


def _json_mutate(data: st.DataObject, line: str) -> Any:
    """The mutator over the JSON value of ``line``: what JSON cannot hold (bytes, extensions,
    NaN) becomes text."""

    try:
        return codec.deep(_jsonable, mutate(data, from_json(line)))
    except (
        RecursionError
    ):  # a mutation too deep for this helper: the text damage below nests deep too
        return from_json(line)


def _jsonable(node: Any) -> Any:
    if isinstance(node, msgspec.Raw):
        return _jsonable(codec.deep(_tree_decoder.decode, node))
    if isinstance(node, list):
        return [_jsonable(item) for item in node]
    if isinstance(node, dict):
        return {key: _jsonable(item) for key, item in node.items()}
    if isinstance(node, (bytes, Ext)) or (isinstance(node, float) and not math.isfinite(node)):
        return repr(node)
    return node


HUGE = "9" * 5_000
"""An integer past the interpreter's digit limit (4,300): it has no ``repr``."""


@pytest.mark.parametrize(
    "line",
    [
        f'{{"seq": {SEQ}, "committedAt": 1, "writes": {HUGE}}}',
        f'{{"seq": {SEQ}, "committedAt": 1, "writes": {{"a": [{HUGE}]}}}}',
        f'{{"seq": {SEQ}, "committedAt": {HUGE}, "writes": []}}',
        f'{{"seq": [{HUGE}], "committedAt": 1, "writes": []}}',
    ],
    ids=["writes", "writes holding it", "committedAt", "seq holding it"],
)
def test_an_export_line_holding_an_integer_past_the_digit_limit_is_refused_naming_the_line(
    line: str,
) -> None:
    with pytest.raises(ValueError, match=r"^Line 4 of the export is not a batch: ") as refused:
        parse_batch(4, line)
    assert len(str(refused.value)) < 300


@pytest.mark.parametrize("number", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("record_format", [1, 2, 3], ids=["raw", "deflate", "zstd"])
def test_a_record_holding_a_number_json_cannot_is_corrupt(
    record_format: int, number: float
) -> None:
    """No commit writes an infinity or a NaN (strict JSON), so a record holding one, with its
    checksum recomputed, is damage: it decoded, and the export of it then failed with
    ``ValueError: Out of range float values are not JSON compliant``."""

    payload = msgspec.msgpack.encode(
        [{"type": "conversation", "value": {"id": 1, "meta": {"k": [1, number]}}}]
    )
    data = record_bytes(payload, record_format)
    with pytest.raises(CorruptRecordError, match=f"Log record {SEQ} is corrupt.*infinite or NaN"):
        decode_record(SEQ, data)
    with pytest.raises(CorruptRecordError, match="infinite or NaN"):
        decode_record_builtins(SEQ, data)
