"""Sparse offset index and time index of one segment: entry formats and lookups (pure).

On disk (``{base_offset:020d}.index``), an offset index entry is 8 bytes, little-endian::

    uint32 relative_offset   offset - segment base offset, of the first record of a batch
    uint32 position          byte position of that batch in the segment's .log file

and a time index entry (``.timeindex``) is 12 bytes::

    int64  timestamp         largest record timestamp seen in the segment up to this batch
    uint32 relative_offset   first offset of the batch where that maximum was reached

An entry is added when at least ``index_interval_bytes`` of log were written since the
previous one (and for the first batch of a segment). Both files are append-only and
can always be rebuilt from the .log file; entries are strictly increasing in both
fields (timestamps in the time index are non-decreasing), which ``check_entries``
verifies when a file is loaded.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from dataclasses import dataclass, field
from typing import Final

OFFSET_ENTRY: Final = struct.Struct("<II")
TIME_ENTRY: Final = struct.Struct("<qI")


@dataclass(slots=True)
class SegmentIndex:
    """In-memory copy of one segment's offset and time index.

    ``relative_offsets[i]`` is at byte ``positions[i]``; ``timestamps[j]`` is the largest
    timestamp up to ``time_offsets[j]``. Thread-safety: owned by the segment's lock.
    """

    relative_offsets: array[int] = field(default_factory=lambda: array("q"))
    positions: array[int] = field(default_factory=lambda: array("q"))
    timestamps: array[int] = field(default_factory=lambda: array("q"))
    time_offsets: array[int] = field(default_factory=lambda: array("q"))

    def floor_position(self, relative_offset: int) -> int:
        """Byte position of the last indexed batch starting at or before ``relative_offset``."""
        return self.floor_entry(relative_offset)[1]

    def floor_entry(self, relative_offset: int) -> tuple[int, int]:
        """(relative offset, byte position) of the last indexed batch starting at or before
        ``relative_offset``; (0, 0), the segment's first batch, when there is none."""
        i = bisect.bisect_right(self.relative_offsets, relative_offset) - 1
        return (self.relative_offsets[i], self.positions[i]) if i >= 0 else (0, 0)

    def first_offset_at_or_after(self, timestamp: int) -> int:
        """Relative offset from which to scan for the first record with ts >= timestamp:
        that of the last entry whose max timestamp is < ``timestamp`` (the record sought
        comes after it), or 0 when there is none. The scan may run past the last entry."""
        i = bisect.bisect_left(self.timestamps, timestamp)
        if i == 0:
            return 0
        return self.time_offsets[i - 1]

    def maybe_add_offset(self, relative_offset: int, position: int) -> bytes:
        """Add an offset entry; return the bytes to append to the .index file."""
        assert not self.relative_offsets or relative_offset > self.relative_offsets[-1]
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)
        return OFFSET_ENTRY.pack(relative_offset, position)

    def maybe_add_time(self, max_timestamp: int, relative_offset: int) -> bytes:
        """Add a time entry if ``max_timestamp`` grew; return the bytes to append (or b"")."""
        if self.timestamps and max_timestamp <= self.timestamps[-1]:
            return b""
        self.timestamps.append(max_timestamp)
        self.time_offsets.append(relative_offset)
        return TIME_ENTRY.pack(max_timestamp, relative_offset)

    def truncate_to_position(self, position: int) -> None:
        """Drop offset entries at or past ``position`` and time entries past them."""
        keep = bisect.bisect_left(self.positions, position)
        del self.relative_offsets[keep:]
        del self.positions[keep:]
        limit = self.relative_offsets[-1] if keep else -1
        keep_time = bisect.bisect_right(self.time_offsets, limit)
        del self.timestamps[keep_time:]
        del self.time_offsets[keep_time:]

    def offset_file_bytes(self) -> bytes:
        return b"".join(
            OFFSET_ENTRY.pack(o, p)
            for o, p in zip(self.relative_offsets, self.positions, strict=True)
        )

    def time_file_bytes(self) -> bytes:
        return b"".join(
            TIME_ENTRY.pack(t, o) for t, o in zip(self.timestamps, self.time_offsets, strict=True)
        )


class IndexCorruptError(ValueError):
    """An index file failed a consistency check; it is rebuilt from the log."""


def parse_index_files(offset_bytes: bytes, time_bytes: bytes, log_size: int) -> SegmentIndex:
    """Load both index files, checking every invariant; raise IndexCorrupt on any failure."""
    if len(offset_bytes) % OFFSET_ENTRY.size or len(time_bytes) % TIME_ENTRY.size:
        raise IndexCorruptError(
            f"index sizes {len(offset_bytes)}/{len(time_bytes)} are not multiples of "
            f"{OFFSET_ENTRY.size}/{TIME_ENTRY.size}"
        )
    index = SegmentIndex()
    for relative_offset, position in OFFSET_ENTRY.iter_unpack(offset_bytes):
        index.relative_offsets.append(relative_offset)
        index.positions.append(position)
    for timestamp, relative_offset in TIME_ENTRY.iter_unpack(time_bytes):
        index.timestamps.append(timestamp)
        index.time_offsets.append(relative_offset)
    check_entries(index, log_size)
    return index


def check_entries(index: SegmentIndex, log_size: int) -> None:
    offsets, positions = index.relative_offsets, index.positions
    for i in range(1, len(offsets)):
        if offsets[i] <= offsets[i - 1] or positions[i] <= positions[i - 1]:
            raise IndexCorruptError(f"offset index entry {i} does not increase")
    if positions and positions[-1] >= max(log_size, 1):
        raise IndexCorruptError(f"offset index points at {positions[-1]}, log has {log_size} bytes")
    if positions and positions[0] != 0:
        # Its relative offset may be past 0: compaction removed the segment's first records.
        raise IndexCorruptError("offset index does not start at the segment's first batch")
    stamps = index.timestamps
    for i in range(1, len(stamps)):
        if stamps[i] < stamps[i - 1] or index.time_offsets[i] <= index.time_offsets[i - 1]:
            raise IndexCorruptError(f"time index entry {i} goes backwards")
    if index.time_offsets and offsets and index.time_offsets[-1] > offsets[-1]:
        raise IndexCorruptError("time index points past the last offset index entry")
