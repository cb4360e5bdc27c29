"""The log cleaner of a compacted partition: one cleaning pass over a FileLog (I/O; the
decisions are ``headwater.log.compaction``'s).

A pass (``clean``):

1. asks the log for its cleanable part (``FileLog.cleaning_plan``): the closed segments
   below the high watermark whose records are all older than ``min_compaction_lag_ms``;
   the active segment is never cleaned;
2. builds the offset map (key -> newest offset) over the dirty segments, those from the
   log's cleaned offset on, up to ``keys_max`` keys (a pass that fills it covers part of
   the dirty log; the next pass the rest);
3. rewrites every cleanable segment below the map's end into ``cleaning/`` in the
   partition folder: each batch whose records are all kept is copied byte for byte; the
   records kept from any other batch are re-encoded, one batch per run of consecutive
   offsets, with their offsets, timestamps, keys, values and headers, the batch's codec,
   leader epoch and producer (id, epoch, and each run's own first sequence), so offsets
   never change, order is kept, and a replica rebuilding producer state from the log
   still knows the producer (compaction leaves gaps between batches, never inside one).
   A tombstone (null value) is dropped once its segment is wholly older than
   ``delete_retention_ms``;
4. hands the rewritten segments to ``FileLog.swap_cleaned``, which replaces the
   originals atomically (``headwater.log.segment_swap``) unless the log changed
   meanwhile (retention, a truncation, deletion), in which case the pass is dropped
   whole.

A batch that cannot be decoded drops the pass with DamagedSegmentError, naming the
segment; the caller (``LogManager``) leaves the log uncleaned while that segment is in it.

I/O is bounded by a ``Throttle`` shared by the node's passes (bytes read plus written a
second); memory by ``keys_max`` and by one segment chunk and one batch at a time.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pyarrow as pa

from headwater.log import batch as batch_format
from headwater.log.compaction import OffsetMap, kept
from headwater.log.kafka_records import decode_stored
from headwater.log.segment import GapBound, Segment
from headwater.log.segment_swap import CLEANING_DIR, CleanPlan, SegmentView
from headwater.shared.errors import HeadwaterError

if TYPE_CHECKING:
    from headwater.log.file_log import FileLog

CHUNK_BYTES: Final = 1 << 20
KEY_BYTES_MAX: Final = 256 << 20
"""Most bytes of keys one pass's map holds (with ``keys_max`` keys, its memory bound)."""


class CleaningStoppedError(Exception):
    """The node is stopping: the pass was dropped (nothing changed)."""


class DamagedSegmentError(Exception):
    """A batch of the segment [``base_offset``, ``next_offset``) cannot be read or decoded
    (bit rot, or damage that the open's recovery, which checks only the unflushed tail,
    did not see): the pass was dropped (nothing changed), and no pass can clean the log
    while the segment is in it. Readers of those offsets get CORRUPT_MESSAGE."""

    def __init__(self, view: SegmentView, cause: HeadwaterError) -> None:
        super().__init__(f"segment {view.base_offset}: {cause.message}")
        self.segment = view.segment
        self.base_offset = view.base_offset
        self.next_offset = view.next_offset


@contextmanager
def _reading(view: SegmentView) -> Iterator[None]:
    """Decoding errors of ``view``'s batches raise DamagedSegmentError."""
    try:
        yield
    except (batch_format.CorruptBatchError, batch_format.UnsupportedCompressionError) as exc:
        raise DamagedSegmentError(view, exc) from exc


class Throttle:
    """At most ``bytes_per_s`` over time, shared by threads: ``take`` sleeps as long as
    the bytes taken so far are ahead of the rate, and raises CleaningStoppedError once
    ``stop`` is set."""

    def __init__(self, bytes_per_s: int, stop: threading.Event | None = None) -> None:
        self.bytes_per_s = bytes_per_s
        self.stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._start = time.monotonic()
        self._taken = 0

    def take(self, count: int) -> None:
        with self._lock:
            self._taken += count
            due_s = self._start + self._taken / self.bytes_per_s
            now = time.monotonic()
            if due_s < now - 1.0:  # idle for a while: no credit for the past
                self._start, self._taken = now, count
                due_s = now + count / self.bytes_per_s
        delay_s = due_s - time.monotonic()
        if self.stop.wait(max(delay_s, 0.0)):
            raise CleaningStoppedError("the node is stopping")


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What a pass did: the offsets it cleaned up to, bytes before and after, records
    removed."""

    cleaned_offset: int
    bytes_before: int
    bytes_after: int
    records_removed: int
    segments: int


def _batches(
    log: FileLog, view: SegmentView, throttle: Throttle
) -> Iterator[tuple[batch_format.BatchHeader, bytes]]:
    """Every batch of the segment, in order, read a chunk at a time (under the log's
    lock, through ``FileLog.read_segment``)."""
    position = 0
    pending = b""
    while position < view.size or pending:
        if position < view.size:
            chunk = log.read_segment(view, position, min(CHUNK_BYTES, view.size - position))
            throttle.take(len(chunk))
            position += len(chunk)
            pending += chunk
        cursor = 0
        while len(pending) - cursor >= batch_format.HEADER_BYTES:
            total = (
                int.from_bytes(pending[cursor + 8 : cursor + 12], "little", signed=True)
                + batch_format.LENGTH_PREFIX_BYTES
            )
            if total >= batch_format.HEADER_BYTES and cursor + total > len(pending):
                break  # the rest of the batch is in the next chunk
            header = batch_format.read_header(pending, cursor)
            yield header, pending[cursor : cursor + header.total_size]
            cursor += header.total_size
        pending = pending[cursor:]
        if position >= view.size and pending:
            raise batch_format.CorruptBatchError(
                f"segment {view.base_offset} ends inside a batch ({len(pending)} bytes left)"
            )


def _keys_and_tombstones(data: bytes) -> tuple[list[bytes | None], list[bool] | None]:
    """A batch's keys, and which records are tombstones (None when there is none)."""
    records = decode_stored(data).records
    values = records.column("value")
    tombstones = values.is_null().to_pylist() if values.null_count else None
    return records.column("key").to_pylist(), tombstones


def _kept(
    header: batch_format.BatchHeader,
    data: bytes,
    offset_map: OffsetMap,
    tombstones_expired_below: int,
) -> list[bool]:
    """Which records of the batch a pass keeps (``compaction.kept``)."""
    keys, tombstones = _keys_and_tombstones(data)
    offsets = range(header.base_offset, header.base_offset + len(keys))
    return kept(offsets, keys, tombstones, offset_map, tombstones_expired_below)


def _runs(kept: list[bool]) -> Iterator[tuple[int, int]]:
    """(start, end) index ranges of consecutive True."""
    start = None
    for i, flag in enumerate(kept):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            yield start, i
            start = None
    if start is not None:
        yield start, len(kept)


def _rewrite(header: batch_format.BatchHeader, data: bytes, kept: list[bool]) -> list[bytes]:
    """The batches holding the kept records of one batch: one per run of consecutive
    offsets (more for a run whose timestamps lie too far apart for one batch: a Kafka
    batch's may), with the batch's codec (a Kafka batch's as it transcodes) and leader
    epoch."""
    decoded = decode_stored(data)
    records = decoded.records
    stamps = batch_format.timestamps_ms(records)
    out = []
    pieces = [
        piece
        for run_start, run_end in _runs(kept)
        for piece in batch_format.split_by_timestamp_span(stamps, run_start, run_end)
    ]
    for start, end in pieces:
        part = records.slice(start, end - start)
        headers = [
            None if pairs is None else [(pair["key"], pair["value"]) for pair in pairs]
            for pairs in part.column("headers").to_pylist()
        ]
        keys: pa.Array = part.column("key")
        out.append(
            batch_format.encode_batch(
                part.column("value"),
                keys=keys,  # no key section when every key is null
                headers=headers,
                timestamps_ms=stamps[start:end],
                compression=decoded.header.compression,
                base_offset=header.base_offset + start,
                leader_epoch=header.leader_epoch,
                # The producer's fields, its sequences as they were, so that a replica
                # rebuilding producer state from the log still knows the producer.
                producer_id=header.producer_id,
                producer_epoch=header.producer_epoch,
                base_sequence=batch_format.sequence_after(header.base_sequence, start)
                if header.producer_id >= 0
                else -1,
            )
        )
    return out


def clean(
    log: FileLog, now_ms: int, upper_bound: int, keys_max: int, throttle: Throttle
) -> CleanResult | None:
    """One pass over ``log`` (see the module docstring); None when nothing is dirty."""
    plan = log.cleaning_plan(now_ms, upper_bound)
    if plan is None or plan.first_dirty >= plan.end_offset:
        return None
    cleaning_dir = log.directory / CLEANING_DIR
    shutil.rmtree(cleaning_dir, ignore_errors=True)
    cleaning_dir.mkdir()  # a pass under way (an open deletes what a crash leaves)
    rewritten: list[tuple[SegmentView, Segment]] = []
    before = after = removed = 0
    try:
        offset_map = _offset_map(log, plan, keys_max, throttle)
        config = log.config
        retention_cut = now_ms - config.delete_retention_ms
        tombstones_expired_below = plan.log_start_offset
        for view in plan.segments:
            if view.max_timestamp >= retention_cut:
                break
            tombstones_expired_below = view.next_offset
        for view in plan.segments:
            if view.base_offset >= offset_map.end_offset:
                break
            output = Segment(
                cleaning_dir,
                view.base_offset,
                config.index_interval_bytes,
                # The copy keeps the gaps the segment has (a follower's, copied from
                # its leader, may lie past this pass's end) and makes new ones below it.
                gaps=GapBound(max(log.gaps.offset, offset_map.end_offset)),
            )
            rewritten.append((view, output))
            with _reading(view):
                for header, data in _batches(log, view, throttle):
                    kept = _kept(header, data, offset_map, tombstones_expired_below)
                    if all(kept):
                        pieces = [data]
                    else:
                        removed += kept.count(False)
                        pieces = _rewrite(header, data, kept) if any(kept) else []
                    for piece in pieces:
                        output.append(piece[:16], piece, batch_format.read_header(piece))
                        throttle.take(len(piece))
            before += view.size
            after += output.size
            output.rewrite_index_files()
            output.close()
            for path in (output.log_path, output.index_path, output.time_index_path):
                _fsync(path)
        swapped = log.swap_cleaned(
            [(view, output) for view, output in rewritten], cleaning_dir, offset_map.end_offset
        )
    finally:
        for _view, output in rewritten:
            output.close()
        shutil.rmtree(cleaning_dir, ignore_errors=True)
    if not swapped:
        return None
    return CleanResult(offset_map.end_offset, before, after, removed, len(rewritten))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _offset_map(log: FileLog, plan: CleanPlan, keys_max: int, throttle: Throttle) -> OffsetMap:
    """The newest offset of each key in the dirty segments, up to ``keys_max`` keys."""
    offset_map = OffsetMap(keys_max, plan.first_dirty, bytes_max=KEY_BYTES_MAX)
    for view in plan.segments:
        if view.next_offset <= plan.first_dirty:
            continue
        with _reading(view):
            for header, data in _batches(log, view, throttle):
                if header.next_offset <= plan.first_dirty:
                    continue
                keys, _tombstones = _keys_and_tombstones(data)
                if not offset_map.add_keys(keys, header.base_offset):
                    return offset_map
        offset_map.cover_to(view.next_offset)
    return offset_map
