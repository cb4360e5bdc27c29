"""The partition log interface held in memory: each batch is its own "segment".

Used by the conformance suite (the same tests as the file log) and by simulations.
Retention applies the same pure decision (``retention.segments_to_delete``) with one
segment per batch, so it deletes at batch rather than segment granularity.
"""

from __future__ import annotations

import bisect
import threading

import pyarrow.compute as pc

from headwater.log import batch as batch_format
from headwater.log import producer_state
from headwater.log.api import (
    AppendInfo,
    LogConfig,
    ReadResult,
    answer_to_producer,
    offset_out_of_range,
)
from headwater.log.kafka_records import decode_stored
from headwater.log.leader_epochs import LeaderEpochCache
from headwater.log.producer_state import ProducerEntry, ProducerStates
from headwater.log.retention import SegmentSummary, segments_to_delete
from headwater.shared.errors import ErrorCode, HeadwaterError


class MemoryLog:
    def __init__(self, config: LogConfig | None = None, log_start_offset: int = 0) -> None:
        self.config = config or LogConfig()
        self._lock = threading.Lock()
        self._bases: list[int] = []
        self._batches: list[bytes] = []
        self._headers: list[batch_format.BatchHeader] = []
        self._start = log_start_offset
        self._end = log_start_offset
        self._epochs = LeaderEpochCache()
        self._producers: dict[int, ProducerEntry] = {}

    @property
    def producer_states(self) -> ProducerStates:
        with self._lock:
            return dict(self._producers)

    @property
    def log_start_offset(self) -> int:
        return self._start

    @property
    def log_end_offset(self) -> int:
        return self._end

    @property
    def size_bytes(self) -> int:
        return sum(map(len, self._batches))

    @property
    def segment_count(self) -> int:
        return max(len(self._batches), 1)

    @property
    def damage(self) -> str:
        return ""  # nothing on disk to damage

    def append(self, batch: bytes, leader_epoch: int, now_ms: int) -> AppendInfo:  # noqa: ARG002
        header = batch_format.read_header(batch)
        if header.total_size != len(batch):
            raise batch_format.CorruptBatchError(
                f"payload is {len(batch)} bytes but the batch header says {header.total_size}"
            )
        with self._lock:
            duplicate = answer_to_producer(self._producers, header, self._start)
            if duplicate is not None:
                return duplicate
            return self._append_locked(batch_format.set_base_offset(batch, self._end, leader_epoch))

    def append_replicated(self, batch: bytes | memoryview, now_ms: int) -> AppendInfo:  # noqa: ARG002
        header = batch_format.read_header(batch)
        if header.total_size != len(batch):
            raise batch_format.CorruptBatchError(
                f"payload is {len(batch)} bytes but the batch header says {header.total_size}"
            )
        with self._lock:
            if header.base_offset != self._end and not (
                self.config.compacted and header.base_offset > self._end
            ):
                raise HeadwaterError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"replicated batch starts at offset {header.base_offset} but the log ends "
                    f"at {self._end}",
                )
            return self._append_locked(bytes(batch))

    def _append_locked(self, data: bytes) -> AppendInfo:
        stamped = batch_format.read_header(data)
        self._bases.append(stamped.base_offset)
        self._batches.append(data)
        self._headers.append(stamped)
        self._end = stamped.next_offset
        self._epochs.assign(stamped.leader_epoch, stamped.base_offset)
        if stamped.producer_id != producer_state.NO_PRODUCER:
            producer_state.record_header(self._producers, stamped)
        return AppendInfo(
            stamped.base_offset, stamped.last_offset, stamped.record_count, self._start
        )

    @property
    def latest_epoch(self) -> int:
        return self._epochs.latest_epoch

    def assign_epoch(self, epoch: int) -> None:
        with self._lock:
            self._epochs.assign(epoch, self._end)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        with self._lock:
            return self._epochs.end_offset_for(epoch, self._end)

    def truncate_to(self, offset: int, now_ms: int) -> int:  # noqa: ARG002
        with self._lock:
            if offset >= self._end:
                self._epochs.truncate_from_end(self._end)
                return self._end
            if offset <= self._start:
                self._reset_locked(offset)
                return offset
            # The batch holding `offset` (start < offset < end) goes, and all after it.
            cut = bisect.bisect_right(self._bases, offset) - 1
            del self._bases[cut:], self._batches[cut:], self._headers[cut:]
            self._end = self._headers[-1].next_offset if self._headers else self._start
            self._epochs.truncate_from_end(self._end)
            self._producers = {}  # rebuilt from the batches kept
            for header in self._headers:
                if header.producer_id != producer_state.NO_PRODUCER:
                    producer_state.record_header(self._producers, header)
            return self._end

    def reset_to(self, offset: int, now_ms: int) -> None:  # noqa: ARG002
        with self._lock:
            self._reset_locked(offset)

    def _reset_locked(self, offset: int) -> None:
        self._bases, self._batches, self._headers = [], [], []
        self._start = self._end = offset
        self._epochs = LeaderEpochCache()
        self._producers = {}

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> ReadResult:
        assert max_bytes > 0
        with self._lock:
            if not self._start <= offset <= self._end:
                raise offset_out_of_range(offset, self._start, self._end)
            bound = self._end if upper_bound is None else min(upper_bound, self._end)
            if offset >= bound:
                return ReadResult(b"", offset)
            i = max(bisect.bisect_right(self._bases, offset) - 1, 0)
            if i < len(self._headers) and self._headers[i].next_offset <= offset:
                i += 1  # ``offset`` is in a gap compaction left: the next batch
            parts: list[bytes] = []
            size = 0
            next_offset = offset
            while 0 <= i < len(self._batches) and self._bases[i] < bound:
                data = self._batches[i]
                if parts and size + len(data) > max_bytes:
                    break
                parts.append(data)
                size += len(data)
                next_offset = self._headers[i].next_offset
                i += 1
            return ReadResult(b"".join(parts), next_offset if parts else bound)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        with self._lock:
            for data, header in zip(self._batches, self._headers, strict=True):
                if header.max_timestamp >= timestamp_ms:
                    stamps = decode_stored(data).records.column("timestamp").cast("int64")
                    i = pc.index(pc.greater_equal(stamps, timestamp_ms), True).as_py()
                    return header.base_offset + i, stamps[i].as_py()
            return None

    def delete_expired(self, now_ms: int) -> int:
        with self._lock:
            self._producers = dict(
                producer_state.expire(
                    self._producers, now_ms, self.config.producer_id_expiration_ms
                )
            )
            if not self.config.deletes:
                return 0  # cleanup_policy "compact": only the cleaner removes records
            summaries = [
                SegmentSummary(h.base_offset, len(d), h.max_timestamp, h.record_count)
                for d, h in zip(self._batches, self._headers, strict=True)
            ]
            count = segments_to_delete(
                summaries, now_ms, self.config.retention_ms, self.config.retention_bytes
            )
            del self._bases[:count], self._batches[:count], self._headers[:count]
            self._start = self._bases[0] if self._bases else self._end
            self._epochs.truncate_from_start(self._start)
            return count

    def flush(self) -> None:
        """Nothing to do: memory is as durable as this log gets."""

    def close(self) -> None:
        """Nothing to release."""
