"""Iterating a PollResult: the fast path (``records_of``, columns turned into Python
objects at C speed) gives exactly the records the per-record path gave, for any batch
(Hypothesis), sliced at a position, with offset gaps, nulls and headers."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.client.consumer import (
    ConsumerRecord,
    FetchedBatch,
    PollResult,
    fetched_from,
    records_of,
)
from headwater.client.positions import TopicPartition
from headwater.log import batch as bf
from tests.test_batch import record_sets


def reference(fetched: FetchedBatch) -> list[tuple[Any, ...]]:
    """What iterating gave before the fast path: one row at a time from to_pylist."""
    rows = bf.rows_without_timestamps(fetched.records)
    stamps = bf.timestamps_ms(fetched.records)
    return [
        (
            fetched.topic,
            fetched.partition,
            row["offset"],
            stamp,
            row["key"],
            row["value"],
            [(h["key"], h["value"]) for h in row["headers"] or []],
        )
        for row, stamp in zip(rows, stamps, strict=True)
    ]


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(record_sets(), st.integers(min_value=0, max_value=50))
def test_iteration_gives_the_records_of_the_columns(case: dict[str, Any], skip: int) -> None:
    data = bf.encode_batch(**case)
    base = case["base_offset"]
    fetched, resume = fetched_from(TopicPartition("t", 3), data, base + skip, check_crcs=True)
    assert resume is None
    records = list(PollResult(fetched))
    assert [tuple(r) for r in records] == [row for f in fetched for row in reference(f)]
    assert all(type(r) is ConsumerRecord for r in records)
    if records:
        first = records[0]
        assert (first.topic, first.partition, first.offset) == ("t", 3, base + skip)


def test_offset_gaps_and_varying_timestamps_take_the_general_path() -> None:
    """A compacted log's fetch may hand a batch whose offsets are not consecutive (the
    columns are what they are): the offsets come from the column then."""
    records = pa.RecordBatch.from_arrays(
        [
            pa.array([5, 7, 8], type=pa.int64()),
            pa.array([10, 30, 20], type=pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            pa.array([b"a", None, b"c"], type=pa.binary()),
            pa.array([b"x", b"", None], type=pa.binary()),
            pa.array([[{"key": "h", "value": None}], None, []], type=bf.RECORD_SCHEMA[4].type),
        ],
        schema=bf.RECORD_SCHEMA,
    )
    got = [tuple(r) for r in records_of("t", 0, records)]
    assert got == reference(FetchedBatch("t", 0, records))
    assert [r[2] for r in got] == [5, 7, 8] and [r[3] for r in got] == [10, 30, 20]


def test_each_record_has_its_own_headers_list() -> None:
    data = bf.encode_batch([b"a", b"b"])
    first, second = PollResult(fetched_from(TopicPartition("t", 0), data, 0, True)[0])
    assert first.headers == second.headers == []
    assert first.headers is not second.headers
