"""The file log on a disk that fills up: every write path completes or is rolled back.

Real file systems (a small tmpfs, an ext4 loop device) that the tests fill with a
ballast file: nothing here fakes an error. Needs root to mount; skipped otherwise.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from headwater.log import batch as bf
from headwater.log.api import FlushPolicy, LogConfig
from headwater.log.file_log import FileLog
from headwater.log.log_loader import CLEAN_SHUTDOWN_FILE
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests.disk_faults import ext4_filesystem, fill, free_bytes, small_filesystem
from tests.test_log_conformance import read_all

PAGE = 4096


def batch_of(n: int, size: int, epoch_ms: int = 1_000) -> bytes:
    return bf.encode_batch([f"b{n}-".encode().ljust(size, b".")], timestamps_ms=epoch_ms)


def stored_batches(log: FileLog) -> list[bytes]:
    return [bytes(value) for _, value in read_all(log, log.log_start_offset)]


class Failures:
    """The storage-failure listener: what it was told."""

    def __init__(self) -> None:
        self.errors: list[OSError] = []

    def __call__(self, _log: FileLog, exc: OSError) -> None:
        self.errors.append(exc)


@pytest.mark.parametrize(
    ("flush_policy", "index_interval_bytes", "leave_bytes", "seed"),
    [
        (FlushPolicy.OS, 4096, 0, 1),
        (FlushPolicy.OS, 1, 3 * PAGE + 100, 2),
        (FlushPolicy.ACK, 1, 40 * PAGE, 3),
        (FlushPolicy.OS, 64, 200 * PAGE, 4),
    ],
)
def test_a_disk_filling_mid_stream_keeps_each_acknowledged_batch_once(
    tmp_path: Path,
    flush_policy: FlushPolicy,
    index_interval_bytes: int,
    leave_bytes: int,
    seed: int,
) -> None:
    config = LogConfig(
        segment_bytes=256 << 10,
        index_interval_bytes=index_interval_bytes,
        flush_policy=flush_policy,
    )
    rng = random.Random(seed)
    with small_filesystem(tmp_path / "fs", 8 << 20) as fs:
        log = FileLog(fs / "log", config, now_ms=0)
        failures = Failures()
        log.on_storage_failure = failures
        acknowledged: list[bytes] = []
        ballast = fs / "ballast"
        error: HeadwaterError | None = None
        for n in range(100_000):
            if n == 40:
                fill(ballast, leave_bytes)
            value = f"b{n}-".encode().ljust(rng.randrange(20, 6000), b".")
            try:
                log.append(bf.encode_batch([value], timestamps_ms=1_000 + n), 0, now_ms=n)
            except HeadwaterError as exc:
                error = exc
                break
            acknowledged.append(value)
        assert error is not None and error.code is ErrorCode.KAFKA_STORAGE_ERROR
        assert "No space left on device" in error.message
        assert len(failures.errors) == 1 and log.failure
        assert stored_batches(log) == acknowledged
        with pytest.raises(HeadwaterError) as refused:
            log.append(batch_of(0, 10), 0, now_ms=0)
        assert refused.value.code is ErrorCode.KAFKA_STORAGE_ERROR
        log.close()  # on the full disk: releases everything, raises nothing
        assert not (fs / "log" / CLEAN_SHUTDOWN_FILE).exists()
        ballast.unlink()
        reopened = FileLog(fs / "log", config, now_ms=0)
        assert reopened.damage == ""
        assert stored_batches(reopened) == acknowledged
        info = reopened.append(batch_of(1, 10), 0, now_ms=0)
        assert info.base_offset == len(acknowledged)
        reopened.close()


def test_buffered_index_entries_that_cannot_be_written_leave_no_batch_behind(
    tmp_path: Path,
) -> None:
    """Index entries wait in memory and are written before a later append's log write: on
    a full disk that write fails, and the append is refused with nothing written (the
    index files cut back to their last whole entry)."""
    config = LogConfig(index_interval_bytes=1)
    with small_filesystem(tmp_path / "fs", 8 << 20) as fs:
        log = FileLog(fs / "log", config, now_ms=0)
        log.on_storage_failure = Failures()
        for n in range(PAGE // 8):  # one 8-byte offset index entry each: a page, buffered
            log.append(batch_of(n, 20), 0, now_ms=0)
        segment = next((fs / "log").glob("*.log"))
        index = segment.with_suffix(".index")
        log_size = segment.stat().st_size
        assert log_size % PAGE + 200 < PAGE  # the next batch would fit the log's last page
        fill(fs / "ballast")
        with pytest.raises(HeadwaterError) as failed:
            log.append(batch_of(PAGE, 20), 0, now_ms=0)
        assert failed.value.code is ErrorCode.KAFKA_STORAGE_ERROR
        assert segment.stat().st_size == log_size
        assert not index.exists() or index.stat().st_size % 8 == 0
        assert log.log_end_offset == PAGE // 8
        assert len(stored_batches(log)) == PAGE // 8
        log.close()
        reopened = FileLog(fs / "log", config, now_ms=0)
        assert reopened.log_end_offset == PAGE // 8 and reopened.damage == ""
        assert len(stored_batches(reopened)) == PAGE // 8
        reopened.close()


def test_a_failed_epoch_checkpoint_rolls_the_append_back(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "fs", 8 << 20) as fs:
        log = FileLog(fs / "log", LogConfig(), now_ms=0)
        log.on_storage_failure = Failures()
        log.append(batch_of(0, 20), 0, now_ms=0)  # reserves blocks for the next appends
        fill(fs / "ballast")
        with pytest.raises(HeadwaterError) as failed:
            log.append(batch_of(1, 20), 5, now_ms=0)  # a new leader epoch: a checkpoint
        assert failed.value.code is ErrorCode.KAFKA_STORAGE_ERROR
        assert "leader-epoch-checkpoint" in failed.value.message or "Errno 28" in (
            failed.value.message
        )
        assert log.log_end_offset == 1
        assert log.latest_epoch == 0
        assert log.end_offset_for_epoch(5) == (0, 1)
        log.close()
        (fs / "ballast").unlink()
        reopened = FileLog(fs / "log", LogConfig(), now_ms=0)
        assert reopened.log_end_offset == 1 and reopened.latest_epoch == 0
        reopened.close()


def test_a_failed_reservation_gives_its_blocks_back(tmp_path: Path) -> None:
    """ext4 keeps what a failing fallocate allocated: the segment gives it back at once,
    so a full disk holds data, not a reserve past a segment's end."""
    config = LogConfig(segment_bytes=1 << 30)
    with ext4_filesystem(tmp_path / "fs", 64 << 20) as fs:
        log = FileLog(fs / "log", config, now_ms=0)
        log.on_storage_failure = Failures()
        big = [b"x" * (1 << 20)]
        for _ in range(12):  # a 12 MiB segment: its next reservation asks for 12 MiB
            log.append(bf.encode_batch(big), 0, now_ms=0)
        log.close()  # gives the reserve back: the next append reserves again
        log = FileLog(fs / "log", config, now_ms=0)
        fill(fs / "ballast", leave_bytes=6 << 20)  # less than the reservation asks for
        before = free_bytes(fs)
        log.append(bf.encode_batch([b"small"]), 0, now_ms=0)
        assert free_bytes(fs) > before - (1 << 20)
        log.close()


def test_close_on_a_full_disk_releases_the_log_and_reopens_it_whole(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=64 << 10, index_interval_bytes=1)
    with small_filesystem(tmp_path / "fs", 4 << 20) as fs:
        log = FileLog(fs / "log", config, now_ms=0)
        values = [bytes(v) for v in (f"{n}".encode().ljust(500, b"-") for n in range(300))]
        for value in values:
            log.append(bf.encode_batch([value]), 0, now_ms=0)
        fill(fs / "ballast")
        log.close()
        (fs / "ballast").unlink()
        reopened = FileLog(fs / "log", config, now_ms=0)
        assert stored_batches(reopened) == values and reopened.damage == ""
        reopened.close()
