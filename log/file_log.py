"""A partition log on disk: a directory of segments, appends, reads, truncation,
retention and flushing (``FileLog``).

Directory layout (one directory per partition)::

    00000000000000000000.log        segments named by base offset (see segment.py)
    00000000000000000000.index
    00000000000000000000.timeindex
    recovery-point                  offset below which everything was fsynced (checked
                                    offset format: ``checkpoint_files``)
    clean-shutdown                  present only between a clean close and the next open
    leader-epoch-checkpoint         the leader-epoch cache (see leader_epochs.py)
    damaged/<time>/                 what recovery cut from the log (see log_loader.py)
    cleaner-offset                  compacted topics: offset below which the log is
                                    clean (checked offset format)
    compacted-below                 compacted topics: offsets below it may have gaps
                                    (``GapBound``; checked offset format)
    cleaning/                       a cleaning pass's output, being written
    swap/                           a finished pass's output, being swapped in
    00000000000000000000.producers  idempotent producers' state as of that offset
                                    (see producer_snapshots.py)

Who owns what: ``log_loader`` opens the directory (recovery, damaged tails, index
rebuilds, the recovery point and the clean-shutdown marker); ``producer_snapshots`` the
``.producers`` files and the producer state's rebuild; ``segment_swap`` the cleaner's
``cleaning/`` and ``swap/`` and the compaction offsets; ``checkpoint_files`` atomic
replacement and the checked offset format; ``segment`` one segment's files. This module
is the log that uses them.

The recovery point advances on every flush: before each ack (flush_policy ``ack``), every
flush_interval_ms (``interval``), when a segment rolls, and on close. Close writes the
clean-shutdown marker last, and only when everything was written; a log whose writes
failed, or whose reads found damage, closes without it, so the next open scans it.

Replication: a leader appends with ``append`` (offsets and its leader epoch are stamped
here); a follower appends the leader's batches unchanged with ``append_replicated``, and
cuts a divergent tail with ``truncate_to`` (or starts over at the leader's log start with
``reset_to``). The leader-epoch cache follows every append and truncation; its
checkpoint is rewritten (atomically) whenever it changes, which is once per leader
change, and rebuilt from the batch headers when missing or unreadable.

Idempotent producers: the log keeps their state (``producer_state``) as of its end,
checks every batch with a producer id against it in the same locked step as the append,
and updates it on every append, leader's and follower's alike. It is snapshotted when a
segment rolls and on close, and rebuilt on open and after every truncation
(``producer_snapshots``); retention deletes the snapshots below the log start.

Thread-safety: all public methods take the log's lock; appends and reads serialize per
partition (reads are one pread each, so the lock is held briefly).
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pyarrow.compute as pc

from headwater.log import batch as batch_format
from headwater.log import producer_state
from headwater.log.api import (
    AppendInfo,
    FlushPolicy,
    LogConfig,
    ReadResult,
    answer_to_producer,
    offset_out_of_range,
)
from headwater.log.checkpoint_files import (
    fsync_directory,
    write_atomically,
)
from headwater.log.compaction import cleanable_ratio
from headwater.log.kafka_records import decode_stored
from headwater.log.leader_epochs import LeaderEpochCache
from headwater.log.log_loader import (
    CLEAN_SHUTDOWN_FILE,
    load_log,
    write_epoch_checkpoint,
    write_recovery_point,
)
from headwater.log.producer_snapshots import (
    delete_all_snapshots,
    delete_snapshots_below,
    load_producers,
    write_snapshot,
)
from headwater.log.producer_state import ProducerStates
from headwater.log.retention import SegmentSummary, segments_to_delete
from headwater.log.segment import Segment, create_segment
from headwater.log.segment_swap import (
    CleaningAbortedError,
    CleanPlan,
    SegmentView,
    plan_cleaning,
    raise_gap_bound,
    swap_in,
    write_cleaned_offset,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

NO_DAMAGE: Final = 1 << 63
"""``_damaged_from`` while no read found damage."""

_log = logging.getLogger(__name__)


class _WritePath:
    """``FileLog._writing``'s context manager (a class: the append path takes one per
    batch, and a generator-based one costs a microsecond more)."""

    __slots__ = ("log", "what")

    def __init__(self, log: FileLog, what: str) -> None:
        self.log = log
        self.what = what

    def __enter__(self) -> None:
        self.log._check_writable()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object
    ) -> None:
        if isinstance(exc, OSError):
            raise self.log._fail(self.what, exc) from exc


class FileLog:
    """See the module docstring."""

    def __init__(self, directory: Path, config: LogConfig, now_ms: int) -> None:
        self.directory = directory
        self.config = config
        self._lock = threading.RLock()
        self._closed = False
        directory.mkdir(parents=True, exist_ok=True)
        self.failure = ""
        """Why the log stopped taking writes ("" while it takes them): a write to its
        files failed (see ``_fail``)."""
        self._append_path = _WritePath(self, "append")
        self.slow_append_s = 0.0
        """An append (with its fsync under flush policy ``ack``) that takes longer than
        this is reported to ``on_slow_append`` (0: appends are not timed)."""
        self.on_slow_append: Callable[[FileLog, float], None] | None = None
        """Called with the append's seconds, with the log's lock held: it must not block."""
        self.on_storage_failure: Callable[[FileLog, OSError], None] | None = None
        """Called once, with the log's lock held, when a write to its files fails (the
        node takes the folder offline); it must not block or take other logs' locks."""
        self._damaged_from = NO_DAMAGE
        self._last_flush_ms = now_ms
        with self._lock:  # the bounded set of sealed handles takes it before closing one
            loaded = load_log(directory, config.index_interval_bytes, self._lock, now_ms)
        self._segments = loaded.segments
        self._recovery_point = loaded.recovery_point
        self.damage = loaded.damage
        """What recovery cut and set aside at open ("" when nothing)."""
        self.gaps = loaded.gaps
        """Offsets below it may have gaps (compaction); contiguous elsewhere."""
        self._epochs = loaded.epochs
        self._producers = loaded.producers
        self._cleaned_offset = loaded.cleaned_offset

    def _new_segment(self, base_offset: int, now_ms: int) -> Segment:
        return create_segment(
            self.directory,
            base_offset,
            self.config.index_interval_bytes,
            self._lock,
            self.gaps,
            now_ms,
        )

    def _write_epochs(self) -> None:
        write_epoch_checkpoint(self.directory, self._epochs)

    def _write_recovery_point(self) -> None:
        write_recovery_point(self.directory, self._recovery_point)

    # ------------------------------------------------------------------ compaction

    def cleaning_plan(self, now_ms: int, upper_bound: int) -> CleanPlan | None:
        """The cleanable part of the log (see CleanPlan): closed segments wholly below
        ``upper_bound`` (the high watermark: nothing a truncation may cut) whose records
        are all older than min_compaction_lag_ms. None when there is none."""
        with self._lock:
            if self._closed:
                return None
            return plan_cleaning(
                self._segments,
                self._cleaned_offset,
                now_ms,
                upper_bound,
                self.config.min_compaction_lag_ms,
            )

    def cleanable_ratio(self, now_ms: int, upper_bound: int) -> float:
        """The dirty share of the cleanable bytes (0 when nothing is cleanable)."""
        plan = self.cleaning_plan(now_ms, upper_bound)
        if plan is None:
            return 0.0
        return cleanable_ratio(plan.clean_bytes, plan.dirty_bytes)

    @property
    def cleaned_offset(self) -> int:
        return self._cleaned_offset

    def holds_segment(self, segment: Segment) -> bool:
        """Whether ``segment`` (as a cleaning pass saw it) is still one of the log's: not
        removed by retention, a truncation, a cleaning swap or the log's deletion."""
        with self._lock:
            return self._holds(segment)

    def _holds(self, segment: Segment) -> bool:
        return not self._closed and any(s is segment for s in self._segments)

    def read_segment(self, view: SegmentView, position: int, size: int) -> bytes:
        """``size`` bytes of a closed segment from ``position`` (a cleaning pass's read);
        CleaningAbortedError once the segment is no longer the log's as the pass saw it."""
        with self._lock:
            if not self._holds(view.segment):
                raise CleaningAbortedError(f"segment {view.base_offset} left the log")
            data = os.pread(view.segment.fd, size, position)
        if len(data) != size:
            raise CleaningAbortedError(f"segment {view.base_offset} shrank")
        return data

    def swap_cleaned(
        self, cleaned: list[tuple[SegmentView, Segment]], cleaning_dir: Path, cleaned_offset: int
    ) -> bool:
        """Make the cleaned copies (written and fsynced in ``cleaning_dir``) the log's
        segments, atomically (``segment_swap.swap_in``), and record that the log is clean
        below ``cleaned_offset``. False, and nothing changed, when a segment cleaned is
        no longer the log's as the pass saw it (or the log is closed or failed)."""
        with self._lock:
            if self._closed or self.failure:
                return False
            try:
                swapped = swap_in(
                    self.directory,
                    self._segments,
                    cleaned,
                    cleaning_dir,
                    cleaned_offset,
                    self.gaps,
                    self.config.index_interval_bytes,
                    self._lock,
                )
                if swapped:
                    self._cleaned_offset = max(self._cleaned_offset, cleaned_offset)
                    write_cleaned_offset(self.directory, self._cleaned_offset)
                return swapped
            except OSError as exc:
                # A crash here would leave swap/ for the next open to finish: so does this.
                raise self._fail("cleaning swap", exc) from exc

    # ------------------------------------------------------------------ producers

    def _write_producer_snapshot(self) -> None:
        """Snapshot the producer state at the log end (``producer_snapshots``)."""
        write_snapshot(self.directory, self._producers, self.log_end_offset)

    def _load_producers(self) -> None:
        """Rebuild the producer state as of the log end (``producer_snapshots``)."""
        self._producers = load_producers(self.directory, self._segments)

    @property
    def producer_states(self) -> ProducerStates:
        with self._lock:
            return dict(self._producers)

    # ------------------------------------------------------------------ properties

    @property
    def log_start_offset(self) -> int:
        return self._segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def size_bytes(self) -> int:
        """The bytes of its segments and their indexes on disk, read without the log's
        lock, like ``log_end_offset`` (for metrics and descriptions: an append or a
        retention pass under way on another thread may or may not be counted; the
        event loop never waits for the lock to say how large a log is)."""
        return sum(s.disk_bytes for s in tuple(self._segments))

    @property
    def reserve_bytes(self) -> int:
        """Bytes of disk blocks reserved past the active segment's end, which closing the
        log gives back (0 once closed)."""
        with self._lock:
            return 0 if self._closed else sum(s.reserve_bytes for s in self._segments)

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
        with self._lock, self._writing("append"):
            base_offset = self.log_end_offset
            duplicate = answer_to_producer(self._producers, header, self.log_start_offset)
            if duplicate is not None:
                return duplicate
            prefix = batch_format.stamp_prefix(batch, base_offset, leader_epoch)
            self._maybe_roll(len(batch), now_ms)
            stamped = dataclasses.replace(
                header, base_offset=base_offset, leader_epoch=leader_epoch
            )
            return self._append_locked(prefix, batch, stamped)

    def append_replicated(self, batch: bytes | memoryview, now_ms: int) -> AppendInfo:
        """Append one batch exactly as the leader stored it (offsets and leader epoch
        included); its base offset must be log_end_offset."""
        header = batch_format.read_header(batch)
        if header.total_size != len(batch):
            raise batch_format.CorruptBatchError(
                f"payload is {len(batch)} bytes but the batch header says {header.total_size}"
            )
        with self._lock, self._writing("append"):
            end = self.log_end_offset
            if header.base_offset != end and not (
                self.config.compacted and header.base_offset > end
            ):
                raise HeadwaterError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"replicated batch starts at offset {header.base_offset} but the log ends "
                    f"at {end}"
                    + (
                        ""
                        if self.config.compacted
                        else " (a gap: never in a log that is not compacted)"
                    ),
                )
            if header.base_offset > end:
                # The leader compacted these offsets away: recorded before the append,
                # so that the gap is never taken for damage.
                raise_gap_bound(self.directory, self.gaps, header.base_offset)
            self._maybe_roll(len(batch), now_ms)
            return self._append_locked(bytes(batch[:16]), batch, header)

    def _append_locked(
        self, prefix: bytes, batch: bytes | memoryview, header: batch_format.BatchHeader
    ) -> AppendInfo:
        """Append to the active segment, then the epoch checkpoint and (flush policy
        ``ack``) the fsync: all or nothing. When a step after the segment's write fails,
        the segment is rolled back to its size before (``Segment.roll_back``) and the
        epoch cache restored, before the error is raised: nothing the caller is told
        failed stays in the log, so a retry never stores a batch twice."""
        began = time.monotonic() if self.slow_append_s else 0.0
        active = self._segments[-1]
        mark = active.append(prefix, batch, header)
        epochs_before = self._epochs.entries
        try:
            if self._epochs.assign(header.leader_epoch, header.base_offset):
                self._write_epochs()
            if self.config.flush_policy is FlushPolicy.ACK:
                self._flush_locked()
        except BaseException:
            self._epochs = LeaderEpochCache(epochs_before)
            active.roll_back(mark)
            self._recovery_point = min(self._recovery_point, self.log_end_offset)
            raise
        if header.producer_id != producer_state.NO_PRODUCER:
            producer_state.record_header(self._producers, header)
        if began and (took := time.monotonic() - began) > self.slow_append_s:
            listener = self.on_slow_append
            if listener is not None:
                listener(self, took)
        return AppendInfo(
            header.base_offset, header.last_offset, header.record_count, self.log_start_offset
        )

    # ------------------------------------------------------------------ storage failures

    def _writing(self, what: str) -> _WritePath:
        """Guard one write path (under the lock): refused with KAFKA_STORAGE_ERROR once
        the log has failed; an OSError inside fails the log (``_fail``) and is raised as
        KAFKA_STORAGE_ERROR naming the folder and the errno."""
        return self._append_path if what == "append" else _WritePath(self, what)

    def _check_writable(self) -> None:
        self._check_open()
        if self.failure:
            raise HeadwaterError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"log {self.directory} failed ({self.failure}); it takes no writes until "
                "the node opens it again",
            )

    def _fail(self, what: str, exc: OSError) -> HeadwaterError:
        """The log's files could not be written (or read back): it takes no more writes,
        writes no clean-shutdown marker, and tells ``on_storage_failure`` (the node
        takes its folder offline). What it holds is what its segments count: every
        write path rolled back before raising."""
        problem = f"{what} failed: {exc}"
        if not self.failure:
            self.failure = problem
            listener = self.on_storage_failure
            if listener is not None:
                listener(self, exc)
        return HeadwaterError(
            ErrorCode.KAFKA_STORAGE_ERROR, f"cannot write to log {self.directory}: {problem}"
        )

    # ------------------------------------------------------------------ replication

    @property
    def latest_epoch(self) -> int:
        return self._epochs.latest_epoch

    def assign_epoch(self, epoch: int) -> None:
        """A new leader's epoch begins at the current log end offset."""
        with self._lock, self._writing("leader epoch checkpoint"):
            before = self._epochs.entries
            if self._epochs.assign(epoch, self.log_end_offset):
                try:
                    self._write_epochs()
                except OSError:
                    self._epochs = LeaderEpochCache(before)
                    raise

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch``, where it ends): see LeaderEpochCache.end_offset_for."""
        with self._lock:
            return self._epochs.end_offset_for(epoch, self.log_end_offset)

    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Remove every batch that holds an offset >= ``offset``; return the new log end
        offset (``offset``, or less when ``offset`` falls inside a batch). An ``offset`` at
        or before the log start empties the log, which then starts at ``offset``."""
        with self._lock, self._writing("truncation"):
            if offset >= self.log_end_offset:
                # Nothing to cut, but an epoch this replica began without writing is gone.
                if self._epochs.truncate_from_end(self.log_end_offset):
                    self._write_epochs()
                return self.log_end_offset
            if offset <= self.log_start_offset:
                self._reset_locked(offset, now_ms)
                return offset
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                self._segments.pop().delete()
            self._segments[-1].unseal()
            self._segments[-1].truncate_at_offset(offset)
            fsync_directory(self.directory)
            _log.warning("log %s: truncated to offset %d", self.directory, self.log_end_offset)
            self._after_truncation()
            return self.log_end_offset

    def reset_to(self, offset: int, now_ms: int) -> None:
        """Delete every segment and start empty at ``offset`` (a follower behind its
        leader's log start offset)."""
        with self._lock, self._writing("reset"):
            self._reset_locked(offset, now_ms)

    def _reset_locked(self, offset: int, now_ms: int) -> None:
        for segment in self._segments:
            segment.delete()
        self._segments = [self._new_segment(offset, now_ms)]
        _log.warning("log %s: emptied, starting at offset %d", self.directory, offset)
        self._epochs = LeaderEpochCache()
        delete_all_snapshots(self.directory)
        self._after_truncation()

    def _after_truncation(self) -> None:
        if self._epochs.truncate_from_end(self.log_end_offset) or not self._epochs.entries:
            self._write_epochs()
        self._load_producers()
        self._recovery_point = min(self._recovery_point, self.log_end_offset)
        self._write_recovery_point()
        if not self.log_start_offset <= self._cleaned_offset <= self.log_end_offset:
            self._cleaned_offset = self.log_start_offset
            write_cleaned_offset(self.directory, self._cleaned_offset)

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
        self._segments[-2].release_reserve()
        self._segments[-2].flush()
        self._segments[-2].seal()
        self._recovery_point = self._segments[-1].base_offset
        self._write_recovery_point()
        self._write_producer_snapshot()

    def _flush_locked(self, closing: bool = False) -> None:
        """Write out every segment past the recovery point, then move it. ``closing``: a
        segment that cannot be opened again (KAFKA_STORAGE_ERROR: its file went away under
        the node) is noted as damaged and the others are still written out, so that the
        log closes; otherwise the error is raised (nothing is acknowledged on a flush that
        failed). The recovery point never passes noted damage."""
        if self._recovery_point == self.log_end_offset:
            return
        for segment in self._segments:
            if segment.next_offset > self._recovery_point:
                try:
                    segment.flush()
                except HeadwaterError as error:
                    if not closing or error.code is not ErrorCode.KAFKA_STORAGE_ERROR:
                        raise
                    self._note_damage(segment, error.message)
        self._recovery_point = min(self.log_end_offset, self._damaged_from)
        self._write_recovery_point()

    def flush(self) -> None:
        with self._lock, self._writing("flush"):
            self._flush_locked()

    def maybe_flush(self, now_ms: int) -> bool:
        """Flush if the policy is ``interval`` and flush_interval_ms has passed."""
        if self.config.flush_policy is not FlushPolicy.INTERVAL:
            return False
        with self._lock:
            if (
                self._closed
                or self.failure
                or now_ms - self._last_flush_ms < self.config.flush_interval_ms
            ):
                return False
            self._last_flush_ms = now_ms
            with self._writing("flush"):
                self._flush_locked()
            return True

    def delete_expired(self, now_ms: int) -> int:
        """Apply retention, and forget producers silent for producer_id_expiration_ms."""
        with self._lock, self._writing("retention"):
            self._producers = dict(
                producer_state.expire(
                    self._producers, now_ms, self.config.producer_id_expiration_ms
                )
            )
            if not self.config.deletes:
                return 0  # cleanup_policy "compact": only the cleaner removes records
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
            if self._epochs.truncate_from_start(self.log_start_offset):
                self._write_epochs()
            delete_snapshots_below(self.directory, self.log_start_offset)
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
            at = offset
            while True:
                segment = self._segment_for(at)
                try:
                    data, next_offset = segment.read_from(at, max_bytes, bound)
                except HeadwaterError as error:
                    if error.code is ErrorCode.KAFKA_STORAGE_ERROR:
                        self._note_damage(segment, error.message)
                    raise
                except OSError as exc:
                    raise self._fail("read", exc) from exc
                if data:
                    return ReadResult(data, next_offset)
                if segment is self._segments[-1]:
                    break
                # ``at`` is in a gap compaction left at the segment's end: the next one.
                at = self._segments[self._segments.index(segment) + 1].base_offset
                if at >= bound:
                    break
            # Nothing from ``offset`` below the bound: a gap compaction left runs to it
            # (offsets are contiguous elsewhere), so the reader may go on from the bound.
            return ReadResult(b"", bound)

    def _note_damage(self, segment: Segment, problem: str) -> None:
        """A read found ``segment`` damaged: the next open scans it and everything after
        (the recovery point stays below it, and no clean-shutdown marker is written), and
        recovery sets the damage aside."""
        if segment.base_offset < self._damaged_from:
            _log.error("log %s: %s", self.directory, problem)
            self._damaged_from = segment.base_offset
            self._recovery_point = min(self._recovery_point, segment.base_offset)
            try:
                self._write_recovery_point()
            except OSError as exc:
                # No clean-shutdown marker is written either: the next open scans past
                # the recovery point on disk, and reads find the damage again until then.
                _log.error("log %s: cannot record the damage: %s", self.directory, exc)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        with self._lock:
            self._check_open()
            for segment in self._segments:
                if segment.max_timestamp < timestamp_ms:
                    continue
                offset = segment.base_offset + segment.index.first_offset_at_or_after(timestamp_ms)
                while offset < segment.next_offset:
                    data, next_offset = segment.read_from(offset, 1, segment.next_offset)
                    if not data:
                        break
                    header = batch_format.read_header(data)
                    if header.max_timestamp >= timestamp_ms:
                        records = decode_stored(data).records
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
        """Flush everything, write the clean-shutdown marker and release the files. Every
        file is released even when writing fails (a full disk): the marker is then not
        written, so the next open recovers the log from its files (nothing is lost:
        every write path rolled back what it could not finish)."""
        with self._lock:
            if self._closed:
                return
            problem = self.failure or ("damaged" if self._damaged_from != NO_DAMAGE else "")
            try:
                if not self.failure:
                    self._flush_locked(closing=True)
                    # Sealed segments were flushed when they rolled; the active one holds
                    # the index entries written since.
                    self._segments[-1].flush()
            except OSError as exc:
                problem = f"flush failed: {exc}"
            if self._producers and not problem:
                try:
                    self._write_producer_snapshot()
                except OSError as exc:  # the next open replays the log instead
                    _log.warning("log %s: producer snapshot not written: %s", self.directory, exc)
            for segment in self._segments:
                try:
                    segment.close()
                except OSError as exc:
                    problem = problem or f"closing segment {segment.base_offset} failed: {exc}"
            self._closed = True
            if not problem:
                try:
                    write_atomically(self.directory / CLEAN_SHUTDOWN_FILE, b"")
                except OSError as exc:
                    problem = f"the clean-shutdown marker was not written: {exc}"
            if problem and problem != "damaged":
                _log.warning(
                    "log %s closed without a clean shutdown (%s): the next start recovers "
                    "it from its files",
                    self.directory,
                    problem,
                )

    def abandon(self) -> None:
        """Release the files without flushing or marking a clean shutdown (tests, deletion)."""
        with self._lock:
            if self._closed:
                return
            for segment in self._segments:
                segment.close()
            self._closed = True
