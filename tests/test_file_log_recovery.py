"""The file log on disk: rolling, recovery from torn and corrupt tails, index rebuilds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headwater.log import batch as bf
from headwater.log.api import FlushPolicy, LogConfig
from headwater.log.checkpoint_files import read_checked_offset, write_checked_offset
from headwater.log.file_log import FileLog
from headwater.log.index import SegmentIndex
from headwater.log.log_loader import (
    CLEAN_SHUTDOWN_FILE,
    DAMAGED_DIR,
    EPOCH_CHECKPOINT_FILE,
    RECOVERY_POINT_FILE,
)
from headwater.log.memory_log import MemoryLog
from headwater.node.replicas.partition import HIGH_WATERMARK_FILE, Partition
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests.test_log_conformance import read_all

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=256)


def fill(log: FileLog, batches: int, per_batch: int = 3, size: int = 40) -> list[bytes]:
    values = []
    for i in range(batches):
        chunk = [f"{i}-{j}".encode().ljust(size, b".") for j in range(per_batch)]
        log.append(bf.encode_batch(chunk, timestamps_ms=i), 0, 0)
        values += chunk
    return values


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def test_segments_roll_by_size_and_by_time(tmp_path: Path) -> None:
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    fill(log, 60)
    assert log.segment_count > 3
    assert all(p.stat().st_size <= CONFIG.segment_bytes for p in segments(tmp_path))
    names = [int(p.stem) for p in segments(tmp_path)]
    assert names[0] == 0 and names == sorted(names)
    timed = FileLog(tmp_path / "timed", LogConfig(segment_ms=1000), now_ms=0)
    timed.append(bf.encode_batch([b"a"]), 0, now_ms=10)
    timed.append(bf.encode_batch([b"b"]), 0, now_ms=999)
    assert timed.segment_count == 1
    timed.append(bf.encode_batch([b"c"]), 0, now_ms=1_000)
    assert timed.segment_count == 2
    log.close()
    timed.close()


def test_clean_reopen_keeps_everything(tmp_path: Path) -> None:
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    values = fill(log, 50)
    log.close()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    reopened = FileLog(tmp_path, CONFIG, now_ms=0)
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is unclean
    assert [v for _, v in read_all(reopened, 0)] == values
    assert reopened.append(bf.encode_batch([b"next"]), 0, 0).base_offset == len(values)
    reopened.close()


def test_an_empty_log_reopens_without_rebuilding_anything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A segment that never held a batch never had an index entry, so it has no index
    files: reopened after a clean close, that is its whole index, not damage to log."""
    FileLog(tmp_path, CONFIG, now_ms=0).close()
    with caplog.at_level("WARNING"):
        reopened = FileLog(tmp_path, CONFIG, now_ms=0)
    assert not [r.getMessage() for r in caplog.records if r.levelname != "INFO"]
    assert reopened.append(bf.encode_batch([b"first"]), 0, 0).base_offset == 0
    reopened.close()
    assert [v for _, v in read_all(FileLog(tmp_path, CONFIG, now_ms=0), 0)] == [b"first"]


@pytest.mark.parametrize("cut", [1, 7, 50, 79, 81])
def test_torn_tail_is_truncated_to_the_last_whole_batch(tmp_path: Path, cut: int) -> None:
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    values = fill(log, 10)
    log.abandon()  # as after SIGKILL: no marker
    last = segments(tmp_path)[-1]
    with open(last, "r+b") as f:
        f.truncate(last.stat().st_size - cut)
    recovered = FileLog(tmp_path, CONFIG, now_ms=0)
    kept = [v for _, v in read_all(recovered, 0)]
    assert kept == values[: len(kept)] and len(values) - 3 <= len(kept) < len(values)
    # Appends continue right after the recovered end, and survive another reopen.
    recovered.append(bf.encode_batch([b"after"]), 0, 0)
    recovered.close()
    again = FileLog(tmp_path, CONFIG, now_ms=0)
    assert [v for _, v in read_all(again, 0)] == [*kept, b"after"]
    again.close()


def _aside(directory: Path) -> list[Path]:
    return sorted((directory / DAMAGED_DIR).glob("*/*.log"))


def test_a_corrupt_batch_cuts_the_log_and_sets_the_rest_aside(tmp_path: Path) -> None:
    """Issue 11: recovery truncated the damaged segment and deleted every later one,
    intact ones included (39 of 40 acknowledged records gone, with only a warning)."""
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    values = fill(log, 60)
    log.abandon()
    (tmp_path / RECOVERY_POINT_FILE).write_text("0")  # force a scan from the start
    before = sum(p.stat().st_size for p in segments(tmp_path))
    later = [p.name for p in segments(tmp_path)[2:]]
    victim = segments(tmp_path)[1]
    data = bytearray(victim.read_bytes())
    data[200] ^= 0xFF  # inside a batch of the second segment
    victim.write_bytes(bytes(data))
    recovered = FileLog(tmp_path, CONFIG, now_ms=0)
    kept = [v for _, v in read_all(recovered, 0)]
    assert kept == values[: len(kept)]
    assert len(segments(tmp_path)) == 2
    assert recovered.log_end_offset == len(kept) < len(values)
    # Nothing was deleted: the damaged tail and every later segment are set aside whole.
    aside = _aside(tmp_path)
    assert [p.name for p in aside if "-from-byte-" not in p.name] == later
    assert sum(p.stat().st_size for p in [*segments(tmp_path), *aside]) == before
    assert "cut at offset" in recovered.damage and "CRC32C mismatch" in recovered.damage
    # What was set aside still decodes, from the first intact batch after the damage on.
    intact = [
        v
        for p in aside[1:]
        for d in bf.decode_batches(p.read_bytes())
        for v in d.records.column("value").to_pylist()
    ]
    assert intact == values[len(values) - len(intact) :] and intact
    recovered.close()


def test_a_changed_base_offset_is_never_served_and_is_set_aside_on_restart(
    tmp_path: Path,
) -> None:
    """Issue 11: a byte flip in a batch's base offset (outside the CRC) served records at
    wrong, overlapping offsets without any error."""
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    values = fill(log, 20)
    log.close()  # clean: the segments are trusted at the next open
    first = segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    second_batch = bf.read_header(bytes(data)).total_size
    data[second_batch] ^= 0x01  # base offset 3 becomes 2
    first.write_bytes(bytes(data))
    reopened = FileLog(tmp_path, CONFIG, now_ms=0)
    with pytest.raises(HeadwaterError) as info:
        read_all(reopened, 0)
    assert info.value.code is ErrorCode.KAFKA_STORAGE_ERROR
    assert "base offset 2, expected 3" in info.value.message
    first_batch = bf.decode_batches(reopened.read(0, 1).data)  # before the damage: served
    assert first_batch[0].records.column("value").to_pylist() == values[:3]
    reopened.close()
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    recovered = FileLog(tmp_path, CONFIG, now_ms=0)
    assert [v for _, v in read_all(recovered, 0)] == values[:3]
    assert "base offset 2, expected 3" in recovered.damage
    assert _aside(tmp_path)
    recovered.close()


def test_garbage_appended_to_the_log_is_cut_off(tmp_path: Path) -> None:
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    values = fill(log, 5)
    log.abandon()
    with open(segments(tmp_path)[-1], "ab") as f:
        f.write(os.urandom(333))
    recovered = FileLog(tmp_path, CONFIG, now_ms=0)
    assert [v for _, v in read_all(recovered, 0)] == values
    recovered.close()


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated", "points-past-end"])
def test_bad_index_files_are_rebuilt(tmp_path: Path, damage: str, suffix: str) -> None:
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    values = fill(log, 60)
    stamps = [log.offset_for_timestamp(t) for t in (0, 1_000, 10**13)]
    log.close()  # clean: indexes would be trusted
    first = segments(tmp_path)[0]
    index = first.with_suffix(suffix)
    good_index = index.read_bytes()
    if damage == "missing":
        index.unlink()
    elif damage == "garbage":
        index.write_bytes(os.urandom(len(good_index)))
    elif damage == "truncated":
        index.write_bytes(good_index[:-3])
    elif suffix == ".index":  # an entry past the segment's end
        index.write_bytes(good_index + (1).to_bytes(4, "little") + (10**6).to_bytes(4, "little"))
    else:  # an entry for an offset the segment does not hold
        index.write_bytes(
            good_index + (10**13).to_bytes(8, "little") + (10**6).to_bytes(4, "little")
        )
    reopened = FileLog(tmp_path, CONFIG, now_ms=0)
    assert [v for _, v in read_all(reopened, 0)] == values
    for offset in range(0, len(values), 7):
        result = reopened.read(offset, 1)
        first_header = bf.read_header(result.data)
        assert first_header.base_offset <= offset < first_header.next_offset
    assert [reopened.offset_for_timestamp(t) for t in (0, 1_000, 10**13)] == stamps
    reopened.close()
    assert first.with_suffix(suffix).read_bytes() == good_index


def test_only_segments_past_the_recovery_point_are_scanned(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=4096, index_interval_bytes=256, flush_policy=FlushPolicy.OS)
    log = FileLog(tmp_path, config, now_ms=0)
    fill(log, 60)
    rolled_to = int(segments(tmp_path)[-1].stem)
    assert log.recovery_point == rolled_to  # each roll fsyncs the old segment
    log.abandon()
    # Damage in a trusted segment's body (not its index) is not looked at on open...
    trusted = segments(tmp_path)[0]
    data = bytearray(trusted.read_bytes())
    data[-20] ^= 0xFF
    trusted.write_bytes(bytes(data))
    reopened = FileLog(tmp_path, config, now_ms=0)
    assert reopened.log_end_offset > 0 and len(segments(tmp_path)) >= 4
    reopened.abandon()
    # ...while the same damage past the recovery point is found and cut.
    (tmp_path / RECOVERY_POINT_FILE).write_text("0")
    rescanned = FileLog(tmp_path, config, now_ms=0)
    assert len(segments(tmp_path)) == 1
    rescanned.close()


def test_offset_checkpoints_carry_a_checksum_and_a_damaged_one_is_ignored(
    tmp_path: Path,
) -> None:
    """Issue 11: the recovery point and high watermark files were bare numbers, so one
    flipped digit raised them silently: a raised recovery point skips the scan of
    unflushed data, and a raised high watermark shows uncommitted records as committed
    and forbids truncating a divergent tail."""
    path = tmp_path / "checkpoint"
    write_checked_offset(path, 123456)
    assert read_checked_offset(path) == 123456
    good = path.read_bytes()
    for flipped in (good.replace(b"3", b"9", 1), good[:-3] + b"00\n", b"x", b"1 2 3", b""):
        path.write_bytes(flipped)
        assert read_checked_offset(path) is None, flipped
    path.write_bytes(b"77\n")  # the format before checksums
    assert read_checked_offset(path) == 77
    assert read_checked_offset(tmp_path / "missing") is None


def test_a_damaged_recovery_point_means_a_full_scan(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=4096, index_interval_bytes=256, flush_policy=FlushPolicy.OS)
    log = FileLog(tmp_path, config, now_ms=0)
    fill(log, 60)
    assert log.recovery_point > 0
    log.abandon()
    first = segments(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[-20] ^= 0xFF  # below the recovery point: trusted while the checkpoint is sound
    first.write_bytes(bytes(data))
    point = tmp_path / RECOVERY_POINT_FILE
    point.write_bytes(point.read_bytes().replace(b" ", b"1 ", 1))  # a digit more
    rescanned = FileLog(tmp_path, config, now_ms=0)
    assert len(segments(tmp_path)) == 1 and "CRC32C mismatch" in rescanned.damage
    rescanned.close()


def test_a_damaged_high_watermark_checkpoint_counts_as_unknown(tmp_path: Path) -> None:
    log = MemoryLog()
    for _ in range(5):
        log.append(bf.encode_batch([b"x"]), 0, 0)
    partition = Partition("t", 0, log, CONFIG, directory=tmp_path)
    partition.follower_high_watermark(4)
    partition.maybe_checkpoint_high_watermark()
    assert Partition("t", 0, log, CONFIG, directory=tmp_path).high_watermark == 4
    checkpoint = tmp_path / HIGH_WATERMARK_FILE
    checkpoint.write_bytes(checkpoint.read_bytes().replace(b"4", b"5", 1))
    assert Partition("t", 0, log, CONFIG, directory=tmp_path).high_watermark == 0


def test_flush_policy_ack_advances_the_recovery_point_on_every_append(tmp_path: Path) -> None:
    log = FileLog(tmp_path, LogConfig(flush_policy=FlushPolicy.ACK), now_ms=0)
    for i in range(5):
        log.append(bf.encode_batch([b"x"]), 0, 0)
        assert log.recovery_point == i + 1
        assert read_checked_offset(tmp_path / RECOVERY_POINT_FILE) == i + 1
    log.close()


def test_interval_flush(tmp_path: Path) -> None:
    log = FileLog(
        tmp_path, LogConfig(flush_policy=FlushPolicy.INTERVAL, flush_interval_ms=100), now_ms=0
    )
    log.append(bf.encode_batch([b"x"]), 0, 0)
    assert not log.maybe_flush(now_ms=50)
    assert log.maybe_flush(now_ms=100)
    assert log.recovery_point == 1
    log.close()


def test_segment_index_lookups_against_an_oracle() -> None:
    index = SegmentIndex()
    entries = [(0, 0), (5, 300), (9, 700), (20, 1500)]
    for offset, position in entries:
        index.maybe_add_offset(offset, position)
    for target in range(25):
        expected = max(p for o, p in entries if o <= target)
        assert index.floor_position(target) == expected
    index.truncate_to_position(700)
    assert list(index.positions) == [0, 300]


def test_write_all_survives_short_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from headwater.log import segment as segment_module

    real_writev = os.writev
    monkeypatch.setattr(
        segment_module.os, "writev", lambda fd, parts: real_writev(fd, [bytes(parts[0][:3])])
    )
    log = FileLog(tmp_path, CONFIG, now_ms=0)
    values = fill(log, 3)
    assert [v for _, v in read_all(log, 0)] == values
    log.close()


def test_leader_epoch_checkpoint_survives_restart_and_is_rebuilt_when_lost(tmp_path: Path) -> None:
    log = FileLog(tmp_path / "p", LogConfig(segment_bytes=1024), now_ms=0)
    for epoch in (0, 0, 3, 3, 4):
        log.assign_epoch(epoch)
        log.append(bf.encode_batch([b"v" * 100] * 3), leader_epoch=epoch, now_ms=0)
    expected = [log.end_offset_for_epoch(e) for e in range(6)]
    log.close()
    reopened = FileLog(tmp_path / "p", LogConfig(segment_bytes=1024), now_ms=0)
    assert [reopened.end_offset_for_epoch(e) for e in range(6)] == expected
    reopened.abandon()
    (tmp_path / "p" / EPOCH_CHECKPOINT_FILE).write_text("garbage")
    rebuilt = FileLog(tmp_path / "p", LogConfig(segment_bytes=1024), now_ms=0)
    assert [rebuilt.end_offset_for_epoch(e) for e in range(6)] == expected
    assert rebuilt.latest_epoch == 4
    rebuilt.close()
