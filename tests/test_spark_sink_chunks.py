"""The Spark sink's chunks (pure): every chunk encodes to at most ``batchBytes`` (the
format's real per-record and per-batch costs, headers included), and never spans more
timestamps than the format's int32 deltas hold."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from headwater.log.batch import TIMESTAMP_DELTA_MAX, encode_batch
from headwater.sparkconnector.sink import (
    BATCH_OVERHEAD_BYTES,
    CHUNK_BYTES_MAX,
    chunk_bounds,
    record_sizes,
)

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def rows(seed: int, count: int, with_headers: bool) -> tuple[pa.Array, pa.Array, pa.Array | None]:
    rng = random.Random(seed)
    values = pa.array(
        [
            None if rng.random() < 0.05 else rng.randbytes(rng.choice([0, 3, 40, 900]))
            for _ in range(count)
        ],
        pa.binary(),
    )
    keys = pa.array(
        [None if rng.random() < 0.3 else b"k%d" % rng.randrange(99) for _ in range(count)]
    )
    headers = None
    if with_headers:
        headers = pa.array(
            [
                None
                if rng.random() < 0.2
                else [
                    {"key": f"h{j}", "value": rng.randbytes(rng.randrange(20))}
                    for j in range(rng.randrange(4))
                ]
                for _ in range(count)
            ],
            HEADERS_TYPE,
        )
    return values, keys, headers


def encoded_length(
    values: pa.Array,
    keys: pa.Array,
    headers: pa.Array | None,
    start: int,
    end: int,
    stamps: list[int],
) -> int:
    pairs = None
    if headers is not None:
        pairs = [
            [(h["key"], h["value"]) for h in (row or [])]
            for row in headers.slice(start, end - start).to_pylist()
        ]
    return len(
        encode_batch(
            values.slice(start, end - start),
            keys=keys.slice(start, end - start),
            headers=pairs,
            timestamps_ms=stamps[start:end],
        )
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("with_headers", [False, True])
def test_chunks_encode_within_batch_bytes(seed: int, with_headers: bool) -> None:
    """A chunk used to count 8 bytes a record besides its key and value, and no headers:
    with batchBytes near the topics' max_message_bytes and small records, a chunk
    encoded past it and the broker refused the write."""
    values, keys, headers = rows(seed, 6000, with_headers)
    stamps = [1_700_000_000_000 + i for i in range(len(values))]
    sizes = record_sizes(values, keys, headers)
    for chunk_bytes in (1024, 20_000, CHUNK_BYTES_MAX):
        bounds = chunk_bounds(sizes, stamps, chunk_bytes)
        assert [b for a, b in bounds][:-1] == [a for a, b in bounds][1:]  # in order, no gap
        assert (bounds[0][0], bounds[-1][1]) == (0, len(values))
        for start, end in bounds:
            length = encoded_length(values, keys, headers, start, end, stamps)
            assert length <= chunk_bytes or end - start == 1, (chunk_bytes, start, end, length)


def test_small_records_fill_a_max_chunk_without_passing_it() -> None:
    """300,000 five-byte records at the largest batchBytes: the old 8-byte estimate put
    them all in one chunk, which encodes to about 5.1 MB, past the topics' default
    max_message_bytes (4 MiB - 1 KiB)."""
    count = 300_000
    values = pa.array([b"v%04d" % (i % 10_000) for i in range(count)])
    sizes = record_sizes(values, None, None)
    bounds = chunk_bounds(sizes, 1_700_000_000_000, CHUNK_BYTES_MAX)
    assert len(bounds) == 2
    for start, end in bounds:
        encoded = encode_batch(values.slice(start, end - start), timestamps_ms=1_700_000_000_000)
        assert len(encoded) <= CHUNK_BYTES_MAX


def test_a_record_past_the_room_moves_to_the_next_chunk() -> None:
    sizes = pa.array([300, 300, 900, 50, 1500, 20], pa.int64())
    room = BATCH_OVERHEAD_BYTES + 1000
    assert chunk_bounds(sizes, 0, room) == [(0, 2), (2, 4), (4, 5), (5, 6)]


def test_timestamps_beyond_an_int32_delta_start_a_new_chunk() -> None:
    """A backfill of month-old events beside new ones: encode_batch refused the chunk
    (timestamp deltas are int32 ms, about 24.8 days), failing the task."""
    day = 86_400_000
    now = 1_700_000_000_000
    stamps = [now - 40 * day, now - 39 * day, now, now + 1, now - 30 * day, now - 30 * day]
    values = pa.array([b"x"] * len(stamps))
    sizes = record_sizes(values, None, None)
    bounds = chunk_bounds(sizes, stamps, 1 << 20)
    assert bounds == [(0, 2), (2, 4), (4, 6)]
    for start, end in bounds:
        window = stamps[start:end]
        assert max(window) - min(window) <= TIMESTAMP_DELTA_MAX
        encode_batch(values.slice(start, end - start), timestamps_ms=window)
