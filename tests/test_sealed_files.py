"""Open files of a log with many segments: opened lazily, through a bounded cache, so a
node with many partitions stays within its open-file limit.

Each segment used to keep three files open for as long as its log was open, so a node's
open files grew with segments, not partitions: 100 partitions of 300 segments each took
90,000 files. Now a sealed segment keeps its index in memory and its ``.log`` handle in
the process's bounded set (``headwater.log.sealed_files``).
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

import pytest

from headwater.log import batch as batch_format
from headwater.log import sealed_files
from headwater.log.api import LogConfig
from headwater.log.file_log import FileLog
from headwater.log.log_loader import CLEAN_SHUTDOWN_FILE
from headwater.shared.errors import ErrorCode, HeadwaterError

SEGMENTS = 120
CAPACITY = 4


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def small_set(monkeypatch: pytest.MonkeyPatch) -> sealed_files.SealedFiles:
    files = sealed_files.SealedFiles(CAPACITY)
    monkeypatch.setattr(sealed_files, "SEALED_FILES", files)
    monkeypatch.setattr("headwater.log.segment.SEALED_FILES", files)
    return files


def many_segments(directory: Path) -> FileLog:
    """A log whose every batch rolls a segment (SEGMENTS segments of one record)."""
    log = FileLog(directory, LogConfig(segment_bytes=1024), now_ms=0)
    for i in range(SEGMENTS):
        log.append(batch_format.encode_batch([b"v%d" % i + b"x" * 900]), 1, now_ms=i)
    assert log.segment_count == SEGMENTS
    return log


def values(log: FileLog, offset: int) -> list[bytes]:
    data = log.read(offset, 1 << 20).data
    return [
        v for d in batch_format.decode_batches(data) for v in d.records.column("value").to_pylist()
    ]


def test_a_log_of_many_segments_keeps_few_files_open(
    tmp_path: Path, small_set: sealed_files.SealedFiles
) -> None:
    before = open_files()
    log = many_segments(tmp_path / "log")
    # The active segment's three files, and at most CAPACITY sealed handles.
    assert open_files() - before <= 3 + CAPACITY
    for offset in range(SEGMENTS):  # every sealed segment reads, handles come and go
        assert values(log, offset)[0].startswith(b"v%d" % offset)
    assert open_files() - before <= 3 + CAPACITY
    assert small_set.closed_total >= SEGMENTS - CAPACITY
    log.close()
    assert open_files() == before and len(small_set) == 0
    # Reopened (a clean start), it is the same log, and as frugal.
    again = FileLog(tmp_path / "log", LogConfig(segment_bytes=1024), now_ms=0)
    assert open_files() - before <= 3 + CAPACITY
    assert values(again, 57)[0].startswith(b"v57")
    # Truncating into a sealed segment makes it the active one again, written as before.
    again.truncate_to(30, now_ms=0)
    again.append(batch_format.encode_batch([b"after"]), 2, now_ms=0)
    assert values(again, 30) == [b"after"]
    again.close()
    assert open_files() == before


def test_handles_are_never_closed_under_a_read_in_another_thread(
    tmp_path: Path, small_set: sealed_files.SealedFiles
) -> None:
    logs = [many_segments(tmp_path / f"log{i}") for i in range(3)]
    failures: list[BaseException] = []

    def reader(log: FileLog, seed: int) -> None:
        try:
            for step in range(600):
                offset = (step * 37 + seed) % SEGMENTS
                assert values(log, offset)[0].startswith(b"v%d" % offset)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [
        threading.Thread(target=reader, args=(log, seed))
        for seed, log in enumerate(logs * 2)  # two readers per log
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures[:3]
    assert small_set.closed_total > 0
    for log in logs:
        log.close()


def test_opening_a_log_of_many_segments_fits_in_a_few_files(
    tmp_path: Path, small_set: sealed_files.SealedFiles
) -> None:
    """Opening held every segment's handle until the last one was loaded: a node sized
    by its partition capacity ran out of files at start-up on a log of many segments."""
    many_segments(tmp_path / "log").close()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = open_files() + 3 + CAPACITY + 8
    resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
    try:
        log = FileLog(tmp_path / "log", LogConfig(segment_bytes=1024), now_ms=0)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert log.segment_count == SEGMENTS
    assert values(log, 3)[0].startswith(b"v3")
    log.close()


def test_a_segment_that_cannot_be_opened_again_is_refused_and_noted(
    tmp_path: Path, small_set: sealed_files.SealedFiles
) -> None:
    """A sealed segment whose handle the bounded set closed is opened again on the next
    read. When its file is gone (deleted or moved under the node), the read is refused
    with KAFKA_STORAGE_ERROR naming the file, never served from another segment, and the
    log notes the damage so that its next open recovers from there."""
    log = many_segments(tmp_path / "log")
    victim = log._segment_for(3)
    victim.drop_handle()  # as the bounded set's eviction does
    victim.log_path.rename(victim.log_path.with_suffix(".moved"))
    with pytest.raises(HeadwaterError) as refused:
        log.read(3, 1 << 20)
    assert refused.value.code is ErrorCode.KAFKA_STORAGE_ERROR
    assert str(victim.log_path) in refused.value.message
    assert "cannot open segment" in refused.value.message
    assert values(log, 10)[0].startswith(b"v10")  # the other segments still serve
    assert log._damaged_from <= victim.base_offset
    log.close()  # closes (the unflushed segment cannot be written out: noted, not raised)
    assert not (tmp_path / "log" / CLEAN_SHUTDOWN_FILE).exists()  # the next open recovers
