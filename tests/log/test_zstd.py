"""``log.zstd``: what a writer compresses decompresses back with the format's ``decompress``, under
the same thresholds as deflate; a frame that says another size, or carries anything after it, is
refused before or instead of being decompressed; each thread has its own contexts."""

from __future__ import annotations

import threading
import tracemalloc

import msgspec
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable_lmdb.log.deflate import MIN_SAVING, MIN_SIZE, PRESET
from pi_durable_lmdb.log.zstd import (
    MAGIC,
    MAX_EXPANSION,
    compress,
    decompress,
    dense,
    frame_reader,
    unframe,
)

_BATCHES = st.builds(
    lambda id, text, status: msgspec.msgpack.encode(
        [
            {
                "type": "entry",
                "value": {"id": id, "conversationId": 1, "kind": "message", "text": text},
            },
            {
                "type": "task",
                "value": {"id": id + 1, "conversationId": 1, "state": {"status": status}},
            },
        ]
    ),
    st.integers(1, 2**53),
    st.text(max_size=4096),
    st.sampled_from(["running", "waiting", "sleeping"]),
)
_VALUES = st.one_of(
    _BATCHES,
    st.binary(max_size=8192),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=64), st.integers(1, 2000)),
)


@settings(max_examples=150, deadline=None)
@given(_VALUES)
def test_a_compressed_value_decompresses_back_and_saves_bytes(data: bytes) -> None:
    out = compress(data)
    if out is None:  # too short to try, or compressing would not save MIN_SAVING bytes
        dictionary = zstandard.ZstdCompressionDict(PRESET, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        frame = zstandard.ZstdCompressor(
            level=1,
            dict_data=dictionary,
            write_checksum=False,
            write_content_size=True,
            write_dict_id=False,
        ).compress(data)
        assert len(data) < MIN_SIZE or len(frame) + MIN_SAVING > len(data)
        return
    assert len(data) >= MIN_SIZE and len(out) + MIN_SAVING <= len(data)
    if dense(out, len(data)):  # a writer stores this one as format 2: a reader refuses the frame
        with pytest.raises(ValueError, match="times its size"):
            decompress(out, len(data))
    else:
        assert decompress(out, len(data)) == data
    assert compress(data) == out  # nothing carries over from one value to the next


def test_the_dictionary_does_the_work_on_a_contract_batch() -> None:
    batch = msgspec.msgpack.encode(
        [{"type": "entry", "value": {"id": 12, "conversationId": 1, "kind": "message"}}]
    )
    plain = zstandard.ZstdCompressor(
        level=1, write_checksum=False, write_content_size=True
    ).compress(batch)
    out = compress(batch)
    assert out is not None and len(out) < len(plain) - 16, (len(out), len(plain))


@pytest.mark.parametrize("size", [0, -1])
def test_a_size_that_is_not_positive_is_refused(size: int) -> None:
    with pytest.raises(ValueError, match="bytes"):
        decompress(b"", size)


def test_a_frame_without_its_content_size_is_refused_unread() -> None:
    dictionary = zstandard.ZstdCompressionDict(PRESET, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    frame = zstandard.ZstdCompressor(dict_data=dictionary, write_content_size=False).compress(
        b"x" * 500
    )
    with pytest.raises(ValueError, match="zstd frame of -1 bytes, not 500"):
        decompress(frame, 500)


def test_threads_compressing_at_once_each_get_their_own_value() -> None:
    values = [
        b" ".join(b"%d" % (n * k * k) for k in range(20 + 200 * (n % 20))) for n in range(1, 41)
    ]
    expected = [compress(value) for value in values]
    results: dict[int, list[bytes | None]] = {}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            got = [compress(value) for value in values for _ in range(5)][::5]
            for value, out in zip(values, got):
                assert out is not None and decompress(out, len(value)) == value
            results[index] = got
        except BaseException as error:  # noqa: BLE001 - a thread's failure fails the test below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and all(results[index] == expected for index in range(4))


def test_a_frame_denser_than_the_bound_is_refused_before_anything_is_reserved() -> None:
    """A run of one letter compresses far beyond ``MAX_EXPANSION``: such a frame is ``dense`` (a
    writer stores it another way) and ``decompress`` refuses it, as it refuses a small frame that
    claims a huge size (both numbers forged alike) or one no process could hold."""

    data = b"a" * 1_000_000
    frame = compress(data)
    assert frame is not None and len(data) > MAX_EXPANSION * len(frame) and dense(frame, len(data))
    with pytest.raises(ValueError, match=f"more than {MAX_EXPANSION} times"):
        decompress(frame, len(data))
    for claim in (2**40, 2**63, 2**64 + 5):
        with pytest.raises(ValueError, match="claims"):
            decompress(b"\x28\xb5\x2f\xfd" + bytes(21), claim)


@settings(max_examples=150, deadline=None)
@given(_VALUES)
def test_a_fast_frame_unframes_back_by_its_own_declared_size(data: bytes) -> None:
    """``compress(fast=True)``'s frames (entry rows) read back through ``unframe`` and through
    ``frame_reader``'s two steps alike, each frame starting with ``MAGIC``."""

    out = compress(data, fast=True)
    if out is None or dense(out, len(data)):  # stored as it is: never unframed
        return
    assert out[:4] == MAGIC
    assert unframe(out) == data
    claim, read = frame_reader()
    assert 0 < claim(out) <= MAX_EXPANSION * len(out) and read(out) == data


@pytest.mark.parametrize(
    ("frame", "named"),
    [
        (b"", "not a zstd frame"),
        (b"\x28\xb5\x2f\xfd", "not a zstd frame"),
        (b"\x28" + bytes(40), "not a zstd frame"),
        (zstandard.ZstdCompressor(write_content_size=False).compress(b"x" * 100), "no size"),
        (zstandard.ZstdCompressor(write_content_size=True).compress(b""), "0 bytes"),
        (zstandard.ZstdCompressor().compress(bytes(1 << 20)), "times its size"),
    ],
    ids=["empty", "magic alone", "garbage", "no size", "empty frame", "dense"],
)
def test_unframe_names_what_is_wrong_and_reserves_nothing_past_the_bound(
    frame: bytes, named: str
) -> None:
    """A frame ``unframe`` refuses raises ``ValueError`` naming why; a claim past
    ``MAX_EXPANSION`` is refused from the frame's header alone."""

    with pytest.raises(ValueError, match=named):
        unframe(frame)


def test_a_frame_whose_body_does_not_hold_its_claim_is_refused() -> None:
    """Cut short, or declaring more or fewer bytes than it holds: zstd writes exactly the
    declared size or fails, and ``unframe`` says so."""

    data = b"a model message of some length, with its usage and its data " * 12
    frame = compress(data, fast=True)
    assert frame is not None and frame[4] == 0x60  # single segment, a 2-byte size field

    def claiming(size: int) -> bytes:
        return frame[:5] + (size - 256).to_bytes(2, "little") + frame[7:]

    for damaged in (frame[:-5], claiming(len(data) - 10), claiming(len(data) + 10)):
        with pytest.raises(ValueError, match="zstd"):
            unframe(damaged)


def test_unframe_reserves_nothing_for_a_claim_past_the_bound() -> None:
    """A valid frame of a few hundred bytes that declares 64 MiB is refused from its header:
    the process never holds the 64 MiB zstd would otherwise reserve before decompressing."""

    size = 64 << 20
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(bytes(size))
    assert dense(frame, size) and len(frame) < 1 << 16
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match="times its size"):
            unframe(frame)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
