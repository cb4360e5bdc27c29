"""Retention decisions (pure): which whole segments to delete.

A segment is deleted when (a) every record in it is older than ``retention_ms``
(its largest timestamp < now_ms - retention_ms), or (b) the log would still hold at
least ``retention_bytes`` without it. Deletion only ever takes a prefix of the segment
list, so the log start offset only moves forward. ``-1`` disables either limit (as in
Kafka). The active (last) segment is only considered when it holds data; the caller
rolls it first so that the log keeps a segment to append to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentSummary:
    base_offset: int
    size_bytes: int
    max_timestamp: int  # -1 for an empty segment
    record_count: int


def segments_to_delete(
    segments: Sequence[SegmentSummary], now_ms: int, retention_ms: int, retention_bytes: int
) -> int:
    """Number of leading segments to delete (a prefix of ``segments``)."""
    total_bytes = sum(s.size_bytes for s in segments)
    count = 0
    for segment in segments:
        if segment.record_count == 0:
            break
        expired = retention_ms >= 0 and segment.max_timestamp < now_ms - retention_ms
        oversize = retention_bytes >= 0 and total_bytes - segment.size_bytes >= retention_bytes
        if not (expired or oversize):
            break
        total_bytes -= segment.size_bytes
        count += 1
    return count
