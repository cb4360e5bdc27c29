"""Replica comparison: the hash a node computes over its replica (node.admin_service's
``hash_log_range``, on the memory and the file log) and the pure comparison of the
answers (headwater.tools.chaos.replicas)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from headwater.client import ReplicaLogDescription
from headwater.log.api import LogConfig, PartitionLog
from headwater.log.batch import encode_batch
from headwater.log.file_log import FileLog
from headwater.log.memory_log import MemoryLog
from headwater.node.rpc.admin_service import ReplicaHash, hash_log_range
from headwater.tools.chaos.replicas import (
    MetadataView,
    ReplicaView,
    common_range,
    differences,
    fold_pages,
    metadata_differences,
)

LogFactory = Callable[[str], PartitionLog]


def hash_range(log: PartitionLog, start: int, end: int) -> ReplicaHash:
    return hash_log_range(log, start, end, 1 << 30)


@pytest.fixture(params=["memory", "file"])
def new_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogFactory]:
    logs: list[PartitionLog] = []

    def make(name: str) -> PartitionLog:
        log: PartitionLog
        if request.param == "memory":
            log = MemoryLog()
        else:
            log = FileLog(tmp_path / name, LogConfig(index_interval_bytes=64), now_ms=0)
        logs.append(log)
        return log

    yield make
    for log in logs:
        log.close()


def fill(log: PartitionLog, batches: list[list[bytes]], epoch: int = 1) -> None:
    for values in batches:
        log.append(encode_batch(values, timestamps_ms=1000), leader_epoch=epoch, now_ms=0)


BATCHES = [[b"a", b"b"], [b"c"], [b"d", b"e", b"f"], [b"g"]]


def test_equal_logs_hash_equal_and_ranges_are_whole_batches(new_log: LogFactory) -> None:
    one, two = new_log("one"), new_log("two")
    fill(one, BATCHES)
    fill(two, BATCHES)
    whole = hash_range(one, 0, 7)
    assert whole == hash_range(two, 0, 7)
    assert (whole.covered_start_offset, whole.covered_end_offset, whole.batch_count) == (0, 7, 4)
    assert whole.size_bytes == sum(len(encode_batch(v, timestamps_ms=1000)) for v in BATCHES)
    # A range that starts and ends inside batches covers those whole batches.
    inner = hash_range(one, 1, 4)
    assert (inner.covered_start_offset, inner.covered_end_offset, inner.batch_count) == (0, 6, 3)
    # Cut to the log: nothing past its end, nothing before its start.
    assert hash_range(one, -5, 100) == whole


def test_a_capped_hash_stops_at_the_same_batch_and_the_pages_fold_into_one_view(
    new_log: LogFactory,
) -> None:
    one, two = new_log("one"), new_log("two")
    fill(one, BATCHES)
    fill(two, BATCHES)
    first = hash_log_range(one, 0, 7, 1)
    assert first == hash_log_range(two, 0, 7, 1)
    assert (first.covered_start_offset, first.covered_end_offset, first.batch_count) == (0, 2, 1)
    pages = []
    offset = 0
    while offset < 7:
        page = hash_log_range(one, offset, 7, 1)
        pages.append(page)
        offset = page.covered_end_offset
    assert len(pages) == 4
    answers = [
        ReplicaLogDescription(
            node_id=1,
            log_start_offset=0,
            high_watermark=7,
            log_end_offset=7,
            leader_epoch=1,
            is_leader=True,
            covered_start_offset=p.covered_start_offset,
            covered_end_offset=p.covered_end_offset,
            batch_count=p.batch_count,
            size_bytes=p.size_bytes,
            sha256=p.sha256,
            damage="",
        )
        for p in pages
    ]
    folded = fold_pages(answers)
    whole = hash_range(one, 0, 7)
    assert (folded.covered_start_offset, folded.covered_end_offset) == (0, 7)
    assert (folded.batch_count, folded.size_bytes) == (whole.batch_count, whole.size_bytes)
    assert fold_pages(answers[:1]).sha256 == pages[0].sha256.hex()
    assert folded.sha256 != fold_pages(answers[:3]).sha256


def test_an_empty_range_hashes_nothing(new_log: LogFactory) -> None:
    log = new_log("log")
    fill(log, BATCHES)
    empty = hash_range(log, 3, 3)
    assert (empty.covered_start_offset, empty.covered_end_offset, empty.batch_count) == (-1, -1, 0)
    assert empty == hash_range(new_log("other"), 0, 10)


def test_different_bytes_or_epochs_hash_differently(new_log: LogFactory) -> None:
    base, other_value, other_epoch = new_log("a"), new_log("b"), new_log("c")
    fill(base, BATCHES)
    fill(other_value, [*BATCHES[:2], [b"d", b"E", b"f"], BATCHES[3]])
    fill(other_epoch, BATCHES, epoch=2)
    digests = {hash_range(log, 0, 7).sha256 for log in (base, other_value, other_epoch)}
    assert len(digests) == 3


def view(node_id: int, digest: str = "aa", end: int = 7, hw: int = 7) -> ReplicaView:
    return ReplicaView(node_id, 0, hw, hw, 3, node_id == 1, 0, end, 4, 100, digest)


def test_identical_views_have_no_differences() -> None:
    assert differences([view(1), view(2), view(3)]) == ()
    assert differences([view(1)]) == ()
    assert differences([]) == ()


def test_differences_name_each_group_largest_first() -> None:
    lines = differences([view(1), view(2, "bb"), view(3)])
    assert lines == (
        "node(s) 1,3: offsets [0, 7), 4 batches, 100 bytes, sha256 aa",
        "node(s) 2: offsets [0, 7), 4 batches, 100 bytes, sha256 bb",
    )
    assert len(differences([view(1), view(2, end=6)])) == 2


def test_common_range_is_the_largest_start_to_the_smallest_high_watermark() -> None:
    assert common_range([(0, 10), (2, 8), (1, 12)]) == (2, 8)


def test_metadata_at_one_offset_and_digest_has_no_differences() -> None:
    views = [MetadataView(n, 40, "ab" * 32) for n in (1, 2, 3)]
    assert metadata_differences(views) == ()


def test_metadata_behind_is_named_and_another_image_at_one_offset_is_diverged() -> None:
    behind = [MetadataView(1, 40, "aa"), MetadataView(2, 40, "aa"), MetadataView(3, 39, "bb")]
    lines = metadata_differences(behind)
    assert lines[0].startswith("node(s) 1,2: metadata offset 40")
    assert "DIVERGED" not in " ".join(lines)
    diverged = [MetadataView(1, 40, "aa"), MetadataView(2, 40, "aa"), MetadataView(3, 40, "cc")]
    assert "node(s) 3: metadata offset 40, sha256 cc (DIVERGED" in metadata_differences(diverged)[1]
