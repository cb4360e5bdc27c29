"""One conformance suite for every PartitionLog implementation: memory and file.

Each test runs against both and compares them with a dumb oracle (a list of records).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.log import batch as bf
from headwater.log.api import LogConfig, PartitionLog
from headwater.log.file_log import FileLog
from headwater.log.memory_log import MemoryLog
from headwater.shared.errors import ErrorCode, HeadwaterError

Factory = Callable[[LogConfig], PartitionLog]
SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=256)


@pytest.fixture(params=["memory", "file"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    """Logs made by a test are closed when it ends (closing twice is harmless)."""
    counter = iter(range(1_000_000))
    made: list[PartitionLog] = []

    def make(config: LogConfig) -> PartitionLog:
        log: PartitionLog = (
            MemoryLog(config)
            if request.param == "memory"
            else FileLog(tmp_path / f"log-{next(counter)}", config, now_ms=0)
        )
        made.append(log)
        return log

    yield make
    for log in made:
        log.close()


def read_all(
    log: PartitionLog, start: int, max_bytes: int = 1 << 20
) -> list[tuple[int, bytes | None]]:
    """Every record from ``start`` to the end, via repeated reads (skipping earlier records)."""
    out: list[tuple[int, bytes | None]] = []
    offset = start
    while offset < log.log_end_offset:
        result = log.read(offset, max_bytes)
        assert result.data, f"no data at {offset} below the end {log.log_end_offset}"
        for decoded in bf.decode_batches(result.data):
            out.extend(
                (row["offset"], row["value"])
                for row in decoded.records.to_pylist()
                if row["offset"] >= offset
            )
        assert result.next_offset > offset
        offset = result.next_offset
    return out


def test_append_assigns_contiguous_offsets(make_log: Factory) -> None:
    log = make_log(SMALL)
    infos = [log.append(bf.encode_batch([b"r"] * n), leader_epoch=0, now_ms=0) for n in (1, 5, 2)]
    assert [(i.base_offset, i.last_offset, i.record_count) for i in infos] == [
        (0, 0, 1),
        (1, 5, 5),
        (6, 7, 2),
    ]
    assert (log.log_start_offset, log.log_end_offset) == (0, 8)
    log.close()


def test_read_returns_whole_batches_covering_the_offset(make_log: Factory) -> None:
    log = make_log(SMALL)
    log.append(bf.encode_batch([b"a", b"b", b"c"]), 0, 0)
    log.append(bf.encode_batch([b"d"]), 0, 0)
    result = log.read(1, max_bytes=1)  # inside the first batch; max_bytes below one batch
    headers = [h for _, h in bf.iter_headers(result.data)]
    assert [h.base_offset for h in headers] == [0]  # whole batch, starting before the offset
    assert result.next_offset == 3
    assert log.read(4, 100).data == b"" and log.read(4, 100).next_offset == 4
    log.close()


def test_read_respects_upper_bound(make_log: Factory) -> None:
    log = make_log(SMALL)
    for _ in range(3):
        log.append(bf.encode_batch([b"x", b"y"]), 0, 0)
    result = log.read(0, 1 << 20, upper_bound=4)
    assert [h.base_offset for _, h in bf.iter_headers(result.data)] == [0, 2]
    assert log.read(4, 1 << 20, upper_bound=4).data == b""
    log.close()


def test_out_of_range_names_the_valid_range(make_log: Factory) -> None:
    log = make_log(SMALL)
    log.append(bf.encode_batch([b"x"] * 3), 0, 0)
    for offset in (-1, 4):
        with pytest.raises(HeadwaterError) as info:
            log.read(offset, 100)
        assert info.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
        assert "[0, 3]" in info.value.message
    log.close()


def test_offset_for_timestamp(make_log: Factory) -> None:
    log = make_log(SMALL)
    for i in range(40):
        log.append(
            bf.encode_batch([b"v" * 50, b"w" * 50], timestamps_ms=[100 * i, 100 * i + 50]), 0, 0
        )
    assert log.offset_for_timestamp(0) == (0, 0)
    assert log.offset_for_timestamp(1_001) == (21, 1_050)
    assert log.offset_for_timestamp(3_950) == (79, 3_950)
    assert log.offset_for_timestamp(3_951) is None
    log.close()


def test_retention_by_bytes_and_time_moves_the_start_forward(make_log: Factory) -> None:
    log = make_log(
        LogConfig(
            segment_bytes=1024, retention_bytes=3000, retention_ms=10_000, index_interval_bytes=128
        )
    )
    for i in range(60):
        log.append(bf.encode_batch([b"z" * 100], timestamps_ms=i), 0, now_ms=0)
    assert log.delete_expired(now_ms=0) > 0
    start = log.log_start_offset
    assert 0 < start < 60 and log.log_end_offset == 60
    assert [o for o, _ in read_all(log, start)] == list(range(start, 60))
    with pytest.raises(HeadwaterError):
        log.read(start - 1, 100)
    # Time: everything older than retention_ms goes; the log stays appendable.
    log.delete_expired(now_ms=1_000_000)
    assert log.log_start_offset == log.log_end_offset == 60
    assert log.append(bf.encode_batch([b"after"]), 0, 1_000_000).base_offset == 60
    assert read_all(log, 60) == [(60, b"after")]
    log.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(
        st.lists(st.binary(max_size=300), min_size=1, max_size=20), min_size=1, max_size=30
    ),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_random_appends_and_reads_match_an_oracle(
    make_log: Factory, batches: list[list[bytes]], seed: int
) -> None:
    rng = random.Random(seed)
    log = make_log(SMALL)
    oracle: list[bytes] = []
    for values in batches:
        log.append(bf.encode_batch(values), 0, 0)
        oracle.extend(values)
    assert log.log_end_offset == len(oracle)
    for _ in range(10):
        start = rng.randrange(len(oracle))
        got = read_all(log, start, max_bytes=rng.choice([1, 200, 5000, 1 << 20]))
        assert got == list(enumerate(oracle))[start:]
    log.close()


# --------------------------------------------------------------------------- replication


def leader_log_with_epochs(make_log: Factory) -> PartitionLog:
    """Epoch 0: offsets [0, 6); epoch 2: [6, 10); epoch 3: [10, 13)."""
    log = make_log(SMALL)
    for epoch, sizes in ((0, (2, 4)), (2, (1, 3)), (3, (3,))):
        log.assign_epoch(epoch)
        for n in sizes:
            log.append(bf.encode_batch([b"e%d" % epoch] * n), leader_epoch=epoch, now_ms=0)
    return log


def test_leader_epochs_answer_where_each_epoch_ends(make_log: Factory) -> None:
    log = leader_log_with_epochs(make_log)
    assert log.latest_epoch == 3
    assert log.end_offset_for_epoch(0) == (0, 6)
    assert log.end_offset_for_epoch(1) == (0, 6)  # epoch 1 never wrote: 0 is the latest <= 1
    assert log.end_offset_for_epoch(2) == (2, 10)
    assert log.end_offset_for_epoch(3) == (3, 13)
    assert log.end_offset_for_epoch(9) == (3, 13)
    assert log.end_offset_for_epoch(-5) == (-1, -1)


def test_follower_copies_batches_unchanged_and_refuses_gaps(make_log: Factory) -> None:
    leader = leader_log_with_epochs(make_log)
    follower = make_log(SMALL)
    data = leader.read(0, 1 << 20).data
    for decoded in bf.decode_batches(data):
        piece = leader.read(decoded.header.base_offset, 1).data
        follower.append_replicated(piece, now_ms=0)
    assert follower.read(0, 1 << 20).data == data
    assert follower.log_end_offset == 13 and follower.latest_epoch == 3
    assert follower.end_offset_for_epoch(2) == (2, 10)
    gap = leader.read(10, 1).data
    with pytest.raises(HeadwaterError) as info:
        follower.append_replicated(gap, now_ms=0)
    assert info.value.code is ErrorCode.OFFSET_OUT_OF_RANGE


@pytest.mark.parametrize(
    ("cut", "end", "epoch"),
    [(10, 10, 2), (8, 7, 2), (7, 7, 2), (6, 6, 0), (4, 2, 0), (13, 13, 3), (50, 13, 3)],
)
def test_truncate_to_cuts_whole_batches_and_epochs(
    make_log: Factory, cut: int, end: int, epoch: int
) -> None:
    log = leader_log_with_epochs(make_log)
    before = read_all(log, 0)
    assert log.truncate_to(cut, now_ms=0) == end
    assert log.log_end_offset == end and log.latest_epoch == epoch
    assert read_all(log, 0) == before[:end]
    # The log keeps working after the cut.
    info = log.append(bf.encode_batch([b"after"]), leader_epoch=7, now_ms=0)
    assert info.base_offset == end
    assert log.end_offset_for_epoch(epoch) == (epoch, end)


def test_truncate_to_the_start_or_reset_empties_the_log(make_log: Factory) -> None:
    log = leader_log_with_epochs(make_log)
    assert log.truncate_to(0, now_ms=0) == 0
    assert (log.log_start_offset, log.log_end_offset, log.latest_epoch) == (0, 0, -1)
    log = leader_log_with_epochs(make_log)
    log.reset_to(100, now_ms=0)
    assert (log.log_start_offset, log.log_end_offset, log.latest_epoch) == (100, 100, -1)
    assert log.append(bf.encode_batch([b"x"]), leader_epoch=4, now_ms=0).base_offset == 100


def test_an_epoch_begun_without_writes_is_dropped_by_a_follower_truncation(
    make_log: Factory,
) -> None:
    log = leader_log_with_epochs(make_log)
    log.assign_epoch(5)  # led briefly at epoch 5, wrote nothing
    assert log.latest_epoch == 5
    assert log.truncate_to(log.log_end_offset, now_ms=0) == 13
    assert log.latest_epoch == 3
