"""The partition log interface shared by the file log and the memory log.

A partition log is an append-only sequence of record batches with contiguous offsets
``[log_start_offset, log_end_offset)``. ``append`` assigns offsets; ``read`` returns
whole batches; retention only ever removes a prefix. Both implementations pass the same
conformance suite (tests/test_log_conformance.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from headwater.log import producer_state
from headwater.log.batch import MESSAGE_BYTES_DEFAULT, BatchHeader
from headwater.log.producer_state import ProducerStates
from headwater.shared.errors import ErrorCode, HeadwaterError


class FlushPolicy(enum.StrEnum):
    """When appended bytes are fsynced (fdatasync).

    ``os``: left to the operating system (Kafka's default); survives a process crash, not
    a machine crash. ``interval``: every ``flush_interval_ms`` by a background task.
    ``ack``: before an append returns, so an acknowledged batch survives a power loss.
    """

    OS = "os"
    INTERVAL = "interval"
    ACK = "ack"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-partition limits; validated by headwater.node.config (see docs/configuration.md)."""

    segment_bytes: int = 1 << 30
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    max_message_bytes: int = MESSAGE_BYTES_DEFAULT
    message_timestamp_after_max_ms: int = 3_600_000
    message_timestamp_before_max_ms: int = -1
    index_interval_bytes: int = 4096
    flush_policy: FlushPolicy = FlushPolicy.OS
    flush_interval_ms: int = 1000
    producer_id_expiration_ms: int = 24 * 3600 * 1000
    """Idempotent producers silent this long are forgotten (``producer_state.expire``)."""
    cleanup_policy: str = "delete"
    """"delete", "compact" or "compact,delete" (see docs/configuration.md)."""
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def deletes(self) -> bool:
        """Do retention_ms and retention_bytes delete old segments?"""
        return "delete" in self.cleanup_policy

    def timestamp_range(self, now_ms: int) -> tuple[int, int]:
        """The record timestamps a producer may send now: [now - before_max, now +
        after_max] (inclusive; the lower end is 0 when before_max is -1)."""
        low = (
            0
            if self.message_timestamp_before_max_ms < 0
            else now_ms - self.message_timestamp_before_max_ms
        )
        return low, now_ms + self.message_timestamp_after_max_ms


@dataclass(frozen=True, slots=True)
class AppendInfo:
    base_offset: int
    last_offset: int
    record_count: int
    log_start_offset: int
    duplicate: bool = False
    """The batch was a retry of one of its producer's last batches: nothing was written;
    the offsets are the original's."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Whole batches covering ``offset`` onwards; ``data`` may start before ``offset``
    (or after it, in a compacted log, where compaction removed the records at ``offset``).

    ``next_offset`` is one past the last record returned; with no data, the read's bound
    (no record lies between ``offset`` and it: ``offset`` itself, or the end of a gap
    compaction left that runs to the bound).
    """

    data: bytes
    next_offset: int


def answer_to_producer(
    states: ProducerStates, header: BatchHeader, log_start_offset: int
) -> AppendInfo | None:
    """What a log answers a batch before appending it (both logs, under their lock):
    None to append it; the original batch's offsets (``duplicate``) for a retry of one
    of its producer's last batches; and the refusal's error raised for a batch that
    breaks its producer's sequence (``producer_state.check``)."""
    if header.producer_id == producer_state.NO_PRODUCER:
        return None
    verdict = producer_state.check_header(states, header)
    if isinstance(verdict, producer_state.Duplicate):
        original = verdict.original
        return AppendInfo(
            original.first_offset,
            original.last_offset,
            header.record_count,
            log_start_offset,
            duplicate=True,
        )
    if isinstance(verdict, producer_state.Refused):
        raise producer_state.refusal_error(verdict)
    return None


def offset_out_of_range(offset: int, log_start_offset: int, log_end_offset: int) -> HeadwaterError:
    return HeadwaterError(
        ErrorCode.OFFSET_OUT_OF_RANGE,
        f"offset {offset} is outside the log; valid range is "
        f"[{log_start_offset}, {log_end_offset}] (log start offset to log end offset)",
    )


class PartitionLog(Protocol):
    """Thread-safety: every method may be called from any thread."""

    config: LogConfig
    """The topic's settings; replaced whole when the topic's settings are altered."""

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def size_bytes(self) -> int: ...

    @property
    def segment_count(self) -> int: ...

    @property
    def damage(self) -> str:
        """What recovery cut and set aside when the log was opened ("" when nothing)."""

    @property
    def producer_states(self) -> ProducerStates:
        """Idempotent producers' state as of log_end_offset (see ``producer_state``)."""

    def append(self, batch: bytes, leader_epoch: int, now_ms: int) -> AppendInfo:
        """Append one verified batch at log_end_offset (its base offset is rewritten).
        A batch with a producer id is first checked against the producer's sequence
        (``producer_state.check``): a duplicate of one of its last batches is answered
        with the original offsets (``duplicate``) and not written; a refused one raises
        the refusal's error (OUT_OF_ORDER_SEQUENCE_NUMBER and the others) and is not
        written either. The check and the append are one step under the log's lock."""

    def read(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> ReadResult:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (at least one
        batch), none at or past ``upper_bound`` (default log_end_offset). ``offset`` must be
        in [log_start_offset, log_end_offset], else OFFSET_OUT_OF_RANGE."""

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= timestamp_ms, or None."""

    def append_replicated(self, batch: bytes | memoryview, now_ms: int) -> AppendInfo:
        """Append a batch as its leader stored it (base offset and leader epoch kept); its
        base offset must be at least log_end_offset (past it where the leader's cleaner
        compacted records away), else OFFSET_OUT_OF_RANGE."""

    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Remove every batch holding an offset >= ``offset``; return the new log end
        offset (<= ``offset``). At or before the log start: empty, starting at ``offset``."""

    def reset_to(self, offset: int, now_ms: int) -> None:
        """Remove everything; the log restarts empty at ``offset``."""

    @property
    def latest_epoch(self) -> int:
        """The newest leader epoch in the leader-epoch cache (-1 when empty)."""

    def assign_epoch(self, epoch: int) -> None:
        """Record that leader epoch ``epoch`` begins at the current log end offset."""

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, the offset where it ends), or (-1, -1)."""

    def delete_expired(self, now_ms: int) -> int:
        """Apply retention; return the number of segments deleted."""

    def flush(self) -> None:
        """Make everything appended so far durable."""

    def close(self) -> None: ...
