"""Log compaction's decisions (log/compaction.py) against an oracle: for any history of
keyed records and tombstones, passes with an offset map of any capacity keep exactly
the newest record of each key below the cleaned offset (tombstones until their
retention), with the original offsets and order, and touch nothing at or past it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.log.compaction import OffsetMap, RecordSummary, cleanable_ratio, survivors

HISTORIES = st.lists(
    st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e", None]), st.booleans()),
    min_size=1,
    max_size=60,
)


def clean(
    log: list[RecordSummary], cleanable_end: int, capacity: int, expired_below: int
) -> list[RecordSummary]:
    """Passes of the cleaner until the cleanable part is covered."""
    start = 0
    while start < cleanable_end:
        offset_map = OffsetMap(capacity, start)
        if offset_map.add(r for r in log if start <= r.offset < cleanable_end):
            offset_map.cover_to(cleanable_end)  # the whole cleanable part was read
        assert offset_map.end_offset > start  # every pass makes progress
        below = [r for r in log if r.offset < offset_map.end_offset]
        above = [r for r in log if r.offset >= offset_map.end_offset]
        log = survivors(below, offset_map, expired_below) + above
        start = offset_map.end_offset
    return log


@given(HISTORIES, st.data())
def test_compaction_keeps_the_newest_record_of_each_key(
    history: list[tuple[bytes | None, bool]], data: st.DataObject
) -> None:
    log = [RecordSummary(i, key, tombstone) for i, (key, tombstone) in enumerate(history)]
    cleanable_end = data.draw(st.integers(0, len(log)), label="cleanable end")
    capacity = data.draw(st.integers(1, 6), label="map capacity")
    expired_below = data.draw(st.integers(0, len(log)), label="tombstones expired below")
    cleaned = clean(log, cleanable_end, capacity, expired_below)
    newest: dict[bytes, int] = {}
    for record in log[:cleanable_end]:
        if record.key is not None:
            newest[record.key] = record.offset
    expected = [
        r
        for r in log[:cleanable_end]
        if r.key is None
        or (newest[r.key] == r.offset and not (r.tombstone and r.offset < expired_below))
    ] + log[cleanable_end:]
    assert cleaned == expected
    assert [r.offset for r in cleaned] == sorted(r.offset for r in cleaned)
    # Cleaning again changes nothing.
    assert clean(cleaned, cleanable_end, capacity, expired_below) == cleaned


def test_a_full_map_stops_where_the_next_key_would_not_fit() -> None:
    offset_map = OffsetMap(2, 10)
    records = [RecordSummary(10 + i, k, False) for i, k in enumerate([b"a", b"b", b"a", b"c"])]
    assert offset_map.add(records) is False
    assert offset_map.end_offset == 13 and offset_map.newest == {b"a": 12, b"b": 11}
    with pytest.raises(ValueError):
        OffsetMap(0, 0)


def test_cleanable_ratio() -> None:
    assert cleanable_ratio(0, 0) == 0.0
    assert cleanable_ratio(300, 100) == 0.25


def test_the_offset_map_is_bounded_by_key_bytes_too() -> None:
    offset_map = OffsetMap(capacity=100, start_offset=0, bytes_max=10)
    assert offset_map.add_keys([b"aaaa", b"bbbb"], 0)
    assert not offset_map.add_keys([b"cccc"], 2)  # 12 bytes of keys: full
    assert offset_map.end_offset == 2 and set(offset_map.newest) == {b"aaaa", b"bbbb"}
    assert offset_map.add_keys([b"aaaa"], 2)  # a key it holds costs nothing more
