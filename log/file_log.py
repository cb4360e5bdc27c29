"""A partition log on disk: a directory of segments, recovery, retention and flushing.

Directory layout (one directory per partition)::

    00000000000000000000.log        segments named by base offset (see segment.py)
    00000000000000000000.index
    00000000000000000000.timeindex
    recovery-point                  decimal offset below which everything was fsynced
    clean-shutdown                  present only between a clean close and the next open

Opening: without the clean-shutdown marker, every segment that may hold data past the
recovery point is scanned with CRC checks; the first torn or corrupt batch and everything
after it is truncated (loudly, in the log), later segments are deleted, and the index
files of scanned segments are rebuilt. Segments wholly below the recovery point, and all
segments after a clean shutdown, are trusted: their index files are loaded (rebuilt if
missing or inconsistent) and only the tail after the last index entry is walked.

The recovery point advances on every flush: before each ack (flush_policy ``ack``), every
flush_interval_ms (``interval``), when a segment rolls, and on close.

Thread-safety: all public methods take the log's lock; appends and reads serialize per
partition (reads are one pread each, so the lock is held briefly).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import threading
from pathlib import Path
from typing import Final

import pyarrow.compute as pc

from headwater.errors import ErrorCode, HeadwaterError
from headwater.log import batch as batch_format
from headwater.log.api import (
    AppendInfo,
    FlushPolicy,
    LogConfig,
    ReadResult,
    offset_out_of_range,
)
from headwater.log.retention import SegmentSummary, segments_to_delete
from headwater.log.segment import LOG_SUFFIX, Segment

RECOVERY_POINT_FILE: Final = "recovery-point"
CLEAN_SHUTDOWN_FILE: Final = "clean-shutdown"

_log = logging.getLogger(__name__)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write a temporary file, fsync it, rename, fsync dir."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileLog:
    """See the module docstring."""

    def __init__(self, directory: Path, config: LogConfig, now_ms: int) -> None:
        self.directory = directory
        self.config = config
        self._lock = threading.RLock()
        self._closed = False
        directory.mkdir(parents=True, exist_ok=True)
        self._segments: list[Segment] = []
        self._recovery_point = 0
        self._last_flush_ms = now_ms
        self._load(now_ms)

    # ------------------------------------------------------------------ opening

    def _read_recovery_point(self) -> int:
        try:
            return int((self.directory / RECOVERY_POINT_FILE).read_text().strip())
        except (OSError, ValueError):
            return 0

    def _load(self, now_ms: int) -> None:
        for stray in self.directory.glob("*.tmp"):
            stray.unlink()
        marker = self.directory / CLEAN_SHUTDOWN_FILE
        clean = marker.exists()
        recovery_point = self._read_recovery_point() if not clean else None
        bases = sorted(
            int(p.stem) for p in self.directory.glob(f"*{LOG_SUFFIX}") if p.stem.isdigit()
        )
        for orphan in self.directory.glob("*.index"):
            if orphan.stem.isdigit() and int(orphan.stem) not in bases:
                orphan.unlink()
                orphan.with_suffix(".timeindex").unlink(missing_ok=True)
        for i, base in enumerate(bases):
            segment = Segment(self.directory, base, self.config.index_interval_bytes)
            segment.created_ms = now_ms
            next_base = bases[i + 1] if i + 1 < len(bases) else None
            trusted = clean or (
                recovery_point is not None and next_base is not None and next_base <= recovery_point
            )
            result = segment.load(trust_index=trusted)
            self._segments.append(segment)
            expected_next = next_base if next_base is not None else result.next_offset
            if result.problem is None and result.next_offset == expected_next:
                continue
            problem = result.problem or (
                f"segment {base} ends at offset {result.next_offset} but the next segment "
                f"starts at {next_base}"
            )
            _log.warning(
                "log %s: truncating segment %d at byte %d (of %d) and deleting %d later "
                "segment(s): %s",
                self.directory,
                base,
                result.valid_bytes,
                segment.size,
                len(bases) - i - 1,
                problem,
            )
            segment.truncate(result.valid_bytes)
            segment.next_offset = result.next_offset
            for later in bases[i + 1 :]:
                Segment(self.directory, later, self.config.index_interval_bytes).delete()
            break
        if not self._segments:
            start = self._read_recovery_point() if not bases else 0
            self._segments.append(self._new_segment(start, now_ms))
        if clean:
            marker.unlink()
            fsync_directory(self.directory)
        self._recovery_point = min(
            self.log_end_offset,
            recovery_point if recovery_point is not None else self.log_end_offset,
        )

    def _new_segment(self, base_offset: int, now_ms: int) -> Segment:
        segment = Segment(self.directory, base_offset, self.config.index_interval_bytes)
        segment.created_ms = now_ms
        segment.next_offset = base_offset
        fsync_directory(self.directory)
        return segment

    # ------------------------------------------------------------------ properties

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return sum(s.disk_bytes for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    # ------------------------------------------------------------------ writing

    def append(self, batch: bytes, leader_epoch: int, now_ms: int) -> AppendInfo:
        header = batch_format.read_header(batch)
        if header.total_size != len(batch):
            raise batch_format.CorruptBatchError(
                f"payload is {len(batch)} bytes but the batch header says {header.total_size}"
            )
        with self._lock:
            self._check_open()
            base_offset = self.log_end_offset
            prefix = batch_format.stamp_prefix(batch, base_offset, leader_epoch)
            self._maybe_roll(len(batch), now_ms)
            active = self._segments[-1]
            stamped = dataclasses.replace(
                header, base_offset=base_offset, leader_epoch=leader_epoch
            )
            try:
                active.append(prefix, batch, stamped)
            except OSError as exc:
                raise HeadwaterError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"cannot write to {active.log_path}: {exc.strerror}",
                ) from exc
            if self.config.flush_policy is FlushPolicy.ACK:
                self._flush_locked()
            return AppendInfo(
                base_offset, stamped.last_offset, stamped.record_count, self.log_start_offset
            )

    def _maybe_roll(self, incoming_bytes: int, now_ms: int) -> None:
        active = self._segments[-1]
        if active.size == 0:
            return
        full = active.size + incoming_bytes > self.config.segment_bytes
        old = now_ms - active.created_ms >= self.config.segment_ms
        if full or old:
            self._roll(now_ms)

    def _roll(self, now_ms: int) -> None:
        """Start a new active segment at log_end_offset; fsync the old one (Kafka flushes a
        rolled segment too, which is what lets the recovery point advance)."""
        self._segments.append(self._new_segment(self.log_end_offset, now_ms))
        self._segments[-2].flush()
        self._recovery_point = self._segments[-1].base_offset
        self._write_recovery_point()

    def _write_recovery_point(self) -> None:
        write_atomically(self.directory / RECOVERY_POINT_FILE, str(self._recovery_point).encode())

    def _flush_locked(self) -> None:
        if self._recovery_point == self.log_end_offset:
            return
        for segment in self._segments:
            if segment.next_offset > self._recovery_point:
                segment.flush()
        self._recovery_point = self.log_end_offset
        self._write_recovery_point()

    def flush(self) -> None:
        with self._lock:
            self._check_open()
            self._flush_locked()

    def maybe_flush(self, now_ms: int) -> bool:
        """Flush if the policy is ``interval`` and flush_interval_ms has passed."""
        if self.config.flush_policy is not FlushPolicy.INTERVAL:
            return False
        with self._lock:
            if self._closed or now_ms - self._last_flush_ms < self.config.flush_interval_ms:
                return False
            self._last_flush_ms = now_ms
            self._flush_locked()
            return True

    def delete_expired(self, now_ms: int) -> int:
        with self._lock:
            self._check_open()
            summaries = [
                SegmentSummary(
                    s.base_offset, s.size, s.max_timestamp, s.next_offset - s.base_offset
                )
                for s in self._segments
            ]
            count = segments_to_delete(
                summaries, now_ms, self.config.retention_ms, self.config.retention_bytes
            )
            if count == 0:
                return 0
            if count == len(self._segments):
                self._roll(now_ms)
            for segment in self._segments[:count]:
                _log.info(
                    "log %s: retention deletes segment %d (offsets [%d, %d))",
                    self.directory,
                    segment.base_offset,
                    segment.base_offset,
                    segment.next_offset,
                )
                segment.delete()
            del self._segments[:count]
            fsync_directory(self.directory)
            return count

    # ------------------------------------------------------------------ reading

    def _segment_for(self, offset: int) -> Segment:
        bases = [s.base_offset for s in self._segments]
        return self._segments[max(bisect.bisect_right(bases, offset) - 1, 0)]

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> ReadResult:
        assert max_bytes > 0
        with self._lock:
            self._check_open()
            start, end = self.log_start_offset, self.log_end_offset
            if not start <= offset <= end:
                raise offset_out_of_range(offset, start, end)
            bound = end if upper_bound is None else min(upper_bound, end)
            if offset >= bound:
                return ReadResult(b"", offset)
            segment = self._segment_for(offset)
            data, next_offset = segment.read_from(offset, max_bytes, bound)
            return ReadResult(data, next_offset if data else offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        with self._lock:
            self._check_open()
            for segment in self._segments:
                if segment.max_timestamp < timestamp_ms:
                    continue
                offset = segment.base_offset + segment.index.first_offset_at_or_after(timestamp_ms)
                while offset < segment.next_offset:
                    data, next_offset = segment.read_from(offset, 1, segment.next_offset)
                    header = batch_format.read_header(data)
                    if header.max_timestamp >= timestamp_ms:
                        records = batch_format.decode_batch(data).records
                        stamps = records.column("timestamp").cast("int64")
                        hits = pc.greater_equal(stamps, timestamp_ms)
                        i = pc.index(hits, True).as_py()
                        return header.base_offset + i, stamps[i].as_py()
                    offset = next_offset
            return None

    # ------------------------------------------------------------------ closing

    def _check_open(self) -> None:
        if self._closed:
            raise HeadwaterError(ErrorCode.KAFKA_STORAGE_ERROR, f"log {self.directory} is closed")

    def close(self) -> None:
        """Flush everything, write the clean-shutdown marker and release the files."""
        with self._lock:
            if self._closed:
                return
            self._flush_locked()
            for segment in self._segments:
                segment.flush()
                segment.close()
            write_atomically(self.directory / CLEAN_SHUTDOWN_FILE, b"")
            self._closed = True

    def abandon(self) -> None:
        """Release the files without flushing or marking a clean shutdown (tests, deletion)."""
        with self._lock:
            if self._closed:
                return
            for segment in self._segments:
                segment.close()
            self._closed = True
