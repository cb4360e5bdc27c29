"""One log segment on disk: ``{base_offset:020d}.log`` with its ``.index`` and ``.timeindex``.

The .log file is a plain concatenation of v1 record batches (docs/record-batch-format.md)
with contiguous offsets from ``base_offset``, except below the log's ``GapBound``: there
the log cleaner of a compacted topic removed records, leaving gaps (a follower copies
them as they are); anywhere else a gap means the file changed on disk. The index formats
are in
``headwater.log.index``. A segment never holds more than ``segment_bytes`` (a batch
larger than that gets a segment of its own) and positions fit in uint32.

Preallocation: an active segment reserves disk blocks ahead of its end with
``fallocate(FALLOC_FL_KEEP_SIZE)``, in chunks that grow with the segment (1 MiB up to 64
MiB), so that appends write into blocks already allocated: on ext4 here that makes large
appends ~8x faster (0.7 GB/s -> 6 GB/s). The file size stays the logical end, so readers
and recovery never see the reserve; closing, rolling and opening a segment give unused
blocks back (``release_reserve``), so an idle partition holds at most a few MiB.

Appends are all or nothing: ``append`` writes the batch, and its index entries go to a
buffer in memory (written to the index files, at most INDEX_PENDING_BYTES_MAX at a time,
before a later append's log write, and on flush, seal and close: never after a log
write, so their failure can never leave a batch behind). When a write of an append fails
(ENOSPC, EIO), the segment cuts its files back to their sizes before the append
(``AppendMark``, ``roll_back``) and restores the in-memory index before it raises; a
failed write of buffered index entries cuts the index files back to their last whole
entry and keeps the entries buffered. A failed preallocation is released at once (on
ext4 a failing fallocate keeps the blocks it took). So a segment never holds a batch, or
an index entry, that its ``size`` and ``next_offset`` do not count; the index files may
lag the in-memory index (recovery walks the log after their last entry).

Open files: the active segment holds its ``.log`` and both index files open. A sealed
segment (``seal``: no longer written) closes its index files, and its ``.log`` handle
joins ``headwater.log.sealed_files.SEALED_FILES``, a bounded set that closes the least
recently used handles and lets the next read open them again; so a log's open files do
not grow with its segment count.

Thread-safety: none of its own; every use holds the owning FileLog's lock
(``owner_lock``), which the bounded set also takes before it closes a handle.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from headwater.log import batch as batch_format
from headwater.log import preallocation
from headwater.log.checkpoint_files import fsync_directory
from headwater.log.index import IndexCorruptError, SegmentIndex, parse_index_files
from headwater.log.sealed_files import SEALED_FILES
from headwater.shared.errors import ErrorCode, HeadwaterError

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"
SCAN_CHUNK_BYTES: Final = 8 << 20
INDEX_PENDING_BYTES_MAX: Final = 4096
"""Index entries buffered in memory before they are written (512 offset entries)."""
RESERVE_BYTES_MIN: Final = 1 << 20
RESERVE_BYTES_MAX: Final = 64 << 20


_log = logging.getLogger(__name__)


def write_all(fd: int, parts: list[memoryview]) -> None:
    """Write every part, in order, with as few writev calls as the kernel allows."""
    while parts:
        written = os.writev(fd, parts)
        while parts and written >= len(parts[0]):
            written -= len(parts[0])
            parts.pop(0)
        if parts and written:
            parts[0] = parts[0][written:]


def following_size(chunk: bytes, position: int) -> int:
    """Total size of the batch at ``position`` per its length prefix (0 if unreadable)."""
    if position + batch_format.LENGTH_PREFIX_BYTES > len(chunk):
        return len(chunk) + 1
    return int.from_bytes(chunk[position + 8 : position + 12], "little", signed=True) + 12


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class GapBound:
    """Offsets below ``offset`` may have gaps (records compaction removed); at and above
    it, and in every log that was never compacted (0), a log's offsets are contiguous.
    One per log, shared by its segments; it only grows."""

    __slots__ = ("offset",)

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def allows(self, expected: int, found: int) -> bool:
        """May a batch start at ``found`` where ``expected`` was next?"""
        return found == expected or expected < found <= self.offset


@dataclass(frozen=True, slots=True)
class AppendMark:
    """A segment's state before an append: what ``Segment.roll_back`` restores. The index
    byte counts are of each index's entries, written and buffered together."""

    size: int
    next_offset: int
    max_timestamp: int
    last_indexed_position: int
    index_bytes: int
    time_index_bytes: int


@dataclass(frozen=True, slots=True)
class ScanResult:
    """Outcome of scanning a segment's .log: valid bytes, next offset, max timestamp, and
    the reason the scan stopped early (None when the whole file was valid)."""

    valid_bytes: int
    next_offset: int
    max_timestamp: int
    problem: str | None


class Segment:
    def __init__(
        self,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        owner_lock: threading.RLock | None = None,
        gaps: GapBound | None = None,
    ) -> None:
        self.directory = directory
        self.gaps = gaps if gaps is not None else GapBound()
        """Where this segment's offsets may have gaps (its log's bound)."""
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.owner_lock = owner_lock if owner_lock is not None else threading.RLock()
        """The lock every use of the ``.log`` handle holds (the owning FileLog's)."""
        stem = directory / segment_name(base_offset)
        self.log_path = stem.with_suffix(LOG_SUFFIX)
        self.index_path = stem.with_suffix(INDEX_SUFFIX)
        self.time_index_path = stem.with_suffix(TIME_INDEX_SUFFIX)
        self.sealed = False
        """No longer written: no index writers, and a handle from the bounded set."""
        self._fd: int | None = os.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self._fd).st_size
        # Blocks reserved up to this byte (past ``size`` only while the segment is active).
        self._reserved = self.size
        self.release_reserve()  # a crash may have left a reserve behind
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.index = SegmentIndex()
        # Opened by the first index entries written (see _index_fds), with the files'
        # sizes, and the entries not written yet.
        self._index_fd: int | None = None
        self._time_fd: int | None = None
        self._index_file_bytes = 0
        self._time_file_bytes = 0
        self._index_pending = bytearray()
        self._time_pending = bytearray()
        self._last_indexed_position = -1
        self.created_ms = 0

    # ------------------------------------------------------------------ open files

    @property
    def fd(self) -> int:
        """The ``.log`` handle, opened again if the bounded set closed it."""
        fd = self._fd
        if fd is None:
            try:
                fd = self._fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND)
            except OSError as exc:
                raise HeadwaterError(
                    ErrorCode.KAFKA_STORAGE_ERROR,
                    f"cannot open segment {self.log_path} again: {exc.strerror or exc}",
                ) from exc
            if self.sealed:
                SEALED_FILES.opened(self)
        elif self.sealed:
            SEALED_FILES.touched(self)
        return fd

    def drop_handle(self) -> None:
        """Close the ``.log`` handle of a sealed segment (the bounded set's eviction)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _index_fds(self) -> tuple[int, int]:
        """The index files, opened for appending (their sizes in ``_index_file_bytes``,
        ``_time_file_bytes``)."""
        if self._index_fd is None or self._time_fd is None:
            self._close_index_files()
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
            index_fd = os.open(self.index_path, flags, 0o644)
            try:
                time_fd = os.open(self.time_index_path, flags, 0o644)
            except OSError:
                os.close(index_fd)
                raise
            self._index_fd, self._time_fd = index_fd, time_fd
            self._index_file_bytes = os.fstat(index_fd).st_size
            self._time_file_bytes = os.fstat(time_fd).st_size
        return self._index_fd, self._time_fd

    def _close_index_files(self) -> None:
        for fd in (self._index_fd, self._time_fd):
            if fd is not None:
                os.close(fd)
        self._index_fd = self._time_fd = None

    def seal(self) -> None:
        """The segment will not be written again (a later one is active): give back its
        reserve, close its index files, and let its ``.log`` handle join the bounded set."""
        if self.sealed:
            return
        self.release_reserve()
        self.write_index_entries()
        self._close_index_files()
        self.sealed = True
        if self._fd is not None:
            SEALED_FILES.opened(self)

    def unseal(self) -> None:
        """The segment is the active one again (a truncation removed the later ones)."""
        if self.sealed:
            self.sealed = False
            SEALED_FILES.forget(self)

    # ------------------------------------------------------------------ loading

    def _batch_at(self, position: int, chunk: bytes, chunk_start: int) -> tuple[bytes, int]:
        """Return a chunk (and its file position) that holds the whole batch at ``position``,
        re-reading from ``position`` when the current chunk ends inside it."""
        cursor = position - chunk_start
        if cursor + batch_format.LENGTH_PREFIX_BYTES <= len(chunk):
            total = int.from_bytes(chunk[cursor + 8 : cursor + 12], "little", signed=True) + 12
            if total >= batch_format.HEADER_BYTES and cursor + total <= len(chunk):
                return chunk, chunk_start
        else:
            total = batch_format.HEADER_BYTES
        want = min(max(SCAN_CHUNK_BYTES, total), self.size - position)
        return os.pread(self.fd, want, position), position

    def scan(
        self, verify_crc: bool, start_position: int = 0, start_offset: int | None = None
    ) -> ScanResult:
        """Walk the batches from ``start_position``: check headers, contiguity (and CRCs),
        stop at the first bad or torn batch, and add index entries for the batches walked
        to the in-memory index (the caller writes the files)."""
        position = start_position
        next_offset = self.base_offset if start_offset is None else start_offset
        max_timestamp = self.max_timestamp
        chunk, chunk_start = b"", position
        while position < self.size:
            chunk, chunk_start = self._batch_at(position, chunk, chunk_start)
            cursor = position - chunk_start
            try:
                header = (
                    batch_format.verify_batch(chunk, cursor)
                    if verify_crc
                    else batch_format.read_header(chunk, cursor)
                )
            except HeadwaterError as exc:
                problem = f"{exc.message} (segment {self.base_offset}, byte {position})"
                return ScanResult(position, next_offset, max_timestamp, problem)
            if not self.gaps.allows(next_offset, header.base_offset):
                problem = (
                    f"batch at byte {position} of segment {self.base_offset} has base offset "
                    f"{header.base_offset}, expected {next_offset}"
                )
                return ScanResult(position, next_offset, max_timestamp, problem)
            self._maybe_index(position, header)
            next_offset = header.next_offset
            max_timestamp = max(max_timestamp, header.max_timestamp)
            position += header.total_size
        return ScanResult(position, next_offset, max_timestamp, None)

    def load(self, trust_index: bool) -> ScanResult:
        """Open an existing segment: use its index files if ``trust_index`` and they are
        sound (scanning only the tail after the last entry), else rebuild them with a full
        CRC scan. The caller truncates to ``valid_bytes`` when ``problem`` is set."""
        if trust_index:
            try:
                offset_bytes = self.index_path.read_bytes()
                time_bytes = self.time_index_path.read_bytes()
                self.index = parse_index_files(offset_bytes, time_bytes, self.size)
                self._index_file_bytes, self._time_file_bytes = len(offset_bytes), len(time_bytes)
            except FileNotFoundError as exc:
                if self.size == 0:
                    # An empty segment never had an entry to write: no files is its index.
                    return ScanResult(0, self.base_offset, -1, None)
                _log.warning("rebuilding index of segment %s: %s", self.log_path, exc)
            except (OSError, IndexCorruptError) as exc:
                _log.warning("rebuilding index of segment %s: %s", self.log_path, exc)
            else:
                if self.index.positions:
                    self._last_indexed_position = self.index.positions[-1]
                    if self.index.timestamps:
                        self.max_timestamp = self.index.timestamps[-1]
                    start = self.index.positions[-1]
                    entries_before = len(self.index.positions), len(self.index.timestamps)
                    # The tail scan re-adds nothing before `start`; index only what follows.
                    result = self.scan(
                        verify_crc=False,
                        start_position=start,
                        start_offset=self.base_offset + self.index.relative_offsets[-1],
                    )
                    if result.problem is None:
                        self.next_offset, self.max_timestamp = (
                            result.next_offset,
                            result.max_timestamp,
                        )
                        if entries_before != (
                            len(self.index.positions),
                            len(self.index.timestamps),
                        ):
                            self.rewrite_index_files()
                        return result
                    _log.warning(
                        "rebuilding index of segment %s: %s", self.log_path, result.problem
                    )
                elif self.size == 0:
                    return ScanResult(0, self.base_offset, -1, None)
        self.reset_index()
        result = self.scan(verify_crc=True)
        self.next_offset, self.max_timestamp = result.next_offset, result.max_timestamp
        self.rewrite_index_files()
        return result

    def reset_index(self) -> None:
        self.index = SegmentIndex()
        self._last_indexed_position = -1
        self.max_timestamp = -1

    def _maybe_index(
        self, position: int, header: batch_format.BatchHeader
    ) -> tuple[bytes, bytes] | None:
        """Add the batch at ``position`` to the in-memory index when it is due an entry;
        return the bytes of its entries (offset, time: b"" when the maximum timestamp did
        not grow) for the files, or None when it is due none."""
        if position <= self._last_indexed_position:
            return None
        if (
            self._last_indexed_position >= 0
            and position - self._last_indexed_position < self.index_interval_bytes
        ):
            return None
        self._last_indexed_position = position
        relative = header.base_offset - self.base_offset
        entry = self.index.maybe_add_offset(relative, position)
        time_entry = self.index.maybe_add_time(
            max(self.max_timestamp, header.max_timestamp), relative
        )
        return entry, time_entry

    def write_index_entries(self) -> None:
        """Write the buffered index entries to the files. On an OSError the files are cut
        back to their last whole entry and the entries stay buffered (raised)."""
        if not self._index_pending and not self._time_pending:
            return
        index_fd, time_fd = self._index_fds()
        try:
            # Copies (at most a few KiB): a view would pin the buffers' size.
            if self._index_pending:
                write_all(index_fd, [memoryview(bytes(self._index_pending))])
            if self._time_pending:
                write_all(time_fd, [memoryview(bytes(self._time_pending))])
        except OSError:
            with contextlib.suppress(OSError):  # a failing device: recovery checks them
                os.ftruncate(index_fd, self._index_file_bytes)
                os.ftruncate(time_fd, self._time_file_bytes)
            raise
        self._index_file_bytes += len(self._index_pending)
        self._time_file_bytes += len(self._time_pending)
        self._index_pending.clear()
        self._time_pending.clear()

    def rewrite_index_files(self) -> None:
        self._close_index_files()
        offset_bytes, time_bytes = self.index.offset_file_bytes(), self.index.time_file_bytes()
        self._index_pending.clear()
        self._time_pending.clear()
        self._index_file_bytes = self._time_file_bytes = 0  # until both are written whole
        self.index_path.write_bytes(offset_bytes)
        self.time_index_path.write_bytes(time_bytes)
        self._index_file_bytes, self._time_file_bytes = len(offset_bytes), len(time_bytes)

    # ------------------------------------------------------------------ writing

    def append(
        self, prefix: bytes, batch: bytes | memoryview, header: batch_format.BatchHeader
    ) -> AppendMark:
        """Append one batch at the end: ``prefix`` (its stamped first 16 bytes, see
        batch.stamp_prefix) then ``batch[16:]``, in one writev and without copying, then
        its index entries. Returns the state before it, for the caller to ``roll_back``
        to when a later step of its append fails. On an OSError the segment is already
        back at that state (see the module doc) when it is raised."""
        if not self.gaps.allows(self.next_offset, header.base_offset):
            raise HeadwaterError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"batch at offset {header.base_offset} cannot follow offset "
                f"{self.next_offset} in segment {self.log_path} (a gap above {self.gaps.offset}, "
                "where offsets must be contiguous)",
            )
        if len(self._index_pending) >= INDEX_PENDING_BYTES_MAX:
            self.write_index_entries()  # before the log write: nothing to undo if it fails
        mark = self.mark()
        total = len(batch)
        self._maybe_reserve(total)
        try:
            write_all(self.fd, [memoryview(prefix), memoryview(batch)[16:]])
        except OSError:
            self.roll_back(mark)
            raise
        entries = self._maybe_index(mark.size, header)
        if entries is not None:
            self._index_pending += entries[0]
            self._time_pending += entries[1]
        self.size += total
        self.next_offset = header.next_offset
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        return mark

    def mark(self) -> AppendMark:
        """The segment's state now (see ``roll_back``)."""
        return AppendMark(
            self.size,
            self.next_offset,
            self.max_timestamp,
            self._last_indexed_position,
            self._index_file_bytes + len(self._index_pending),
            self._time_file_bytes + len(self._time_pending),
        )

    def roll_back(self, mark: AppendMark) -> None:
        """Undo every append since ``mark`` (taken on this segment, which no truncation
        or roll has changed since): the in-memory state is restored, and the files, and
        the buffered index entries, are cut back to what they held then. Cutting a file
        short needs no free space, so this holds on a full disk; an OSError here (the
        device failed) is raised, and the caller must then stop using the log (its files
        may hold a partial batch past ``size``, which the next open's recovery cuts)."""
        self.index.truncate_to_position(mark.size)
        self.size = mark.size
        self.next_offset = mark.next_offset
        self.max_timestamp = mark.max_timestamp
        self._last_indexed_position = mark.last_indexed_position
        for pending, written, kept, fd in (
            (self._index_pending, self._index_file_bytes, mark.index_bytes, self._index_fd),
            (self._time_pending, self._time_file_bytes, mark.time_index_bytes, self._time_fd),
        ):
            if kept >= written:
                del pending[kept - written :]
            else:  # written since the mark (a flush): cut the file
                pending.clear()
                assert fd is not None
                os.ftruncate(fd, kept)
        self._index_file_bytes = min(self._index_file_bytes, mark.index_bytes)
        self._time_file_bytes = min(self._time_file_bytes, mark.time_index_bytes)
        os.ftruncate(self.fd, mark.size)
        self._reserved = mark.size

    def _maybe_reserve(self, incoming_bytes: int) -> None:
        """Reserve blocks for the next append and a chunk beyond it (see the module doc).
        A reservation that fails takes nothing: what a failing fallocate allocated before
        it stopped (ext4 keeps it) is given back at once."""
        needed = self.size + incoming_bytes
        if needed <= self._reserved or not preallocation.AVAILABLE:
            return
        chunk = min(max(self.size, RESERVE_BYTES_MIN), RESERVE_BYTES_MAX)
        target = needed + chunk
        grow = target - self._reserved
        if preallocation.fallocate(self.fd, preallocation.KEEP_SIZE, self._reserved, grow) == 0:
            self._reserved = target
            return
        with contextlib.suppress(OSError):  # the append's own write reports a failure
            os.ftruncate(self.fd, self.size)
        self._reserved = self.size  # no reserve (unsupported, or the disk is full)

    @property
    def reserve_bytes(self) -> int:
        """Bytes of blocks reserved past the end (0 unless the segment is active)."""
        return self._reserved - self.size if self._fd is not None else 0

    def release_reserve(self) -> None:
        """Give reserved blocks past the end back to the file system."""
        if self._fd is None:
            return  # a sealed segment's handle, closed: it holds no reserve
        os.ftruncate(self._fd, self.size)
        self._reserved = self.size

    def truncate(self, valid_bytes: int) -> None:
        """Cut the .log at ``valid_bytes`` (a batch boundary) and drop index entries past it."""
        os.ftruncate(self.fd, valid_bytes)
        self.size = valid_bytes
        self._reserved = valid_bytes
        self.index.truncate_to_position(valid_bytes)
        self._last_indexed_position = self.index.positions[-1] if self.index.positions else -1
        self.rewrite_index_files()

    def truncate_at_offset(self, offset: int) -> None:
        """Cut the segment before the first batch that holds an offset >= ``offset``."""
        position = self.index.floor_position(max(offset - self.base_offset, 0))
        chunk, chunk_start = b"", position
        walked_max_timestamp = -1
        while position < self.size:
            chunk, chunk_start = self._batch_at(position, chunk, chunk_start)
            header = batch_format.read_header(chunk, position - chunk_start)
            if header.next_offset > offset:
                self.truncate(position)
                self.next_offset = header.base_offset
                indexed = self.index.timestamps[-1] if self.index.timestamps else -1
                self.max_timestamp = max(indexed, walked_max_timestamp)
                return
            walked_max_timestamp = max(walked_max_timestamp, header.max_timestamp)
            position += header.total_size

    def flush(self) -> None:
        """fsync the log, and write and fsync the buffered index entries."""
        os.fdatasync(self.fd)
        self.write_index_entries()
        for fd in (self._index_fd, self._time_fd):
            if fd is not None:
                os.fdatasync(fd)

    # ------------------------------------------------------------------ reading

    def _check_base_offset(
        self, base_offset: int, expected: int, position: int, exact: bool
    ) -> None:
        """A batch at an index entry has exactly the entry's base offset; every other one
        starts where the batch before it ends (or after it, below the gap bound, where
        compaction left a gap). A batch that breaks this has changed on disk (the base
        offset lies outside the CRC), and its records must not be served at offsets they
        were never given."""
        if base_offset != expected if exact else not self.gaps.allows(expected, base_offset):
            raise HeadwaterError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"segment {self.log_path} is damaged: the batch at byte {position} has base "
                f"offset {base_offset}, expected {expected}; this replica cannot serve "
                "these offsets (restart the node to set the damage aside)",
            )

    def read_from(self, offset: int, max_bytes: int, upper_bound: int) -> tuple[bytes, int]:
        """Whole batches starting with the one that holds ``offset`` (or the first after
        it, in a gap left by compaction): (bytes, next offset); (b"", ``offset``) when no
        batch of the segment ends after ``offset``.

        Reads one chunk from the floor index entry (which lies less than
        index_interval_bytes before the batch holding ``offset``) and cuts it at whole
        batches: at most ``max_bytes``, but always the first batch; none at or past
        ``upper_bound``.
        """
        index = self.index
        relative, position = index.floor_entry(offset - self.base_offset)
        if index.positions and offset - self.base_offset < index.relative_offsets[0]:
            # Before the first entry (the segment's first batch, which compaction may have
            # moved past the segment's base offset).
            relative, position = index.relative_offsets[0], index.positions[0]
        expected = self.base_offset + relative
        chunk_start = position
        want = min(
            self.size - position, max_bytes + self.index_interval_bytes + batch_format.HEADER_BYTES
        )
        chunk = os.pread(self.fd, want, position)
        exact = bool(index.positions)  # the batch at the index entry
        while True:
            if position >= self.size:
                return b"", offset  # in a gap compaction left at the segment's end
            chunk, chunk_start = self._batch_at(position, chunk, chunk_start)
            header = batch_format.read_header(chunk, position - chunk_start)
            self._check_base_offset(header.base_offset, expected, position, exact)
            exact = False
            if header.next_offset > offset:
                break
            expected = header.next_offset
            position += header.total_size
        if header.base_offset >= upper_bound:
            return b"", offset
        first = position - chunk_start
        end = first + header.total_size
        next_offset = header.next_offset
        while end + batch_format.HEADER_BYTES <= len(chunk):
            if end + following_size(chunk, end) > len(chunk):
                break
            # The batches after the first are walked by their spans (no header object:
            # a read of 10,000 small batches is made on the event loop).
            base_offset, size, after = batch_format.read_span(chunk, end)
            self._check_base_offset(base_offset, next_offset, chunk_start + end, exact=False)
            if base_offset >= upper_bound or end + size - first > max_bytes:
                break
            end += size
            next_offset = after
        if first == 0 and end == len(chunk):
            return chunk, next_offset
        return chunk[first:end], next_offset

    def close(self) -> None:
        """Release the files (every handle is closed even when giving back the reserve
        fails: it is then given back when the segment is next opened)."""
        SEALED_FILES.forget(self)
        try:
            self.release_reserve()
            self.write_index_entries()  # else the next open walks the log past the files
        finally:
            self._close_index_files()
            self.drop_handle()

    def delete(self) -> None:
        self._index_pending.clear()  # the files go: nothing to write
        self._time_pending.clear()
        self.close()
        for path in (self.log_path, self.index_path, self.time_index_path):
            path.unlink(missing_ok=True)

    @property
    def disk_bytes(self) -> int:
        return self.size + 8 * len(self.index.positions) + 12 * len(self.index.timestamps)


def create_segment(
    directory: Path,
    base_offset: int,
    index_interval_bytes: int,
    owner_lock: threading.RLock,
    gaps: GapBound,
    now_ms: int,
) -> Segment:
    """A new, empty segment at ``base_offset``, created at ``now_ms``, whose directory
    entry is durable (``directory`` fsynced)."""
    segment = Segment(directory, base_offset, index_interval_bytes, owner_lock, gaps)
    segment.created_ms = now_ms
    fsync_directory(directory)
    return segment


def batch_headers_from(
    segments: Sequence[Segment], offset: int
) -> Iterator[batch_format.BatchHeader]:
    """The header of every batch of ``segments`` (a log's, in offset order) that starts at
    or after ``offset``: one pread per batch. The segments passed recovery, so their
    headers are sound."""
    for segment in segments:
        if segment.next_offset <= offset:
            continue
        position = 0
        while position < segment.size:
            header = batch_format.BatchHeader(
                *batch_format.HEADER_STRUCT.unpack(
                    os.pread(segment.fd, batch_format.HEADER_BYTES, position)
                )
            )
            if header.base_offset >= offset:
                yield header
            position += header.total_size
