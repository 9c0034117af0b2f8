"""``log.deflate``: what a writer deflates (level and memLevel by size, from a primed compressor's
copy) always inflates back with the one format's ``inflate``, and so does what earlier writers
stored (zlib's level 6, memLevel 8, a compressor made per value)."""

from __future__ import annotations

import threading
import zlib

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from pi_durable_lmdb.log.deflate import BIG, MIN_SAVING, MIN_SIZE, PRESET, deflate, inflate

_ALPHABET = 'abcdefghij klmnop"{}:,'
_TEXT = st.text(alphabet=_ALPHABET, min_size=0, max_size=3 * BIG).map(str.encode)
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
    st.text(max_size=BIG),
    st.sampled_from(["running", "waiting", "sleeping"]),
)
"""Batches shaped like the contract's: their keys and headers are matched in ``PRESET``."""
_VALUES = st.one_of(
    _BATCHES,
    _TEXT,
    st.binary(max_size=2 * BIG),
    st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=64), st.integers(1, 2000)),
)


@settings(max_examples=150, deadline=None)
@given(_VALUES)
def test_a_deflated_value_inflates_back_and_saves_bytes(data: bytes) -> None:
    out = deflate(data)
    if out is None:
        return
    assert len(data) >= MIN_SIZE and len(out) + MIN_SAVING <= len(data)
    assert inflate(out, len(data)) == data
    assert deflate(data) == out  # each value starts from a fresh copy: nothing carries over


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=_ALPHABET, min_size=MIN_SIZE, max_size=3 * BIG).map(str.encode))
def test_what_earlier_writers_stored_still_inflates(data: bytes) -> None:
    window = min(15, max(9, (len(data) + len(PRESET)).bit_length()))
    compressor = zlib.compressobj(6, zlib.DEFLATED, -window, 8, zlib.Z_DEFAULT_STRATEGY, PRESET)
    assert inflate(compressor.compress(data) + compressor.flush(), len(data)) == data


def test_threads_deflating_at_once_each_get_their_own_value() -> None:
    values = [(b"%d " % n) * (30 + 300 * (n % 20)) for n in range(40)]
    expected = [deflate(value) for value in values]
    results: dict[int, list[bytes | None]] = {}

    def work(index: int) -> None:
        results[index] = [deflate(value) for value in values for _ in range(5)][::5]

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result == expected for result in results.values())
    for value, out in zip(values, expected):
        assert out is not None and inflate(out, len(value)) == value
