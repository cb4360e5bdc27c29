"""Opening a file log's directory: recovery of its segments, its leader-epoch cache, its
producer state and its cleaner offset (``load_log``).

Files read here (the log writes them; checked offset format: ``checkpoint_files``)::

    recovery-point            offset below which everything was fsynced (checked offset)
    clean-shutdown            present only between a clean close and the next open
    leader-epoch-checkpoint   the leader-epoch cache (format: ``leader_epochs``)
    damaged/<time>/           what recovery set aside: never deleted by the node

Steps, in order: finish a cleaning swap a crash interrupted (``segment_swap``); delete
``*.tmp`` files and index files without a ``.log``; load the segments; load the
leader-epoch cache; rebuild the producer state (``producer_snapshots``); read the cleaner
offset. On any error every segment opened is closed before the error is raised.

Segments: without the clean-shutdown marker, every segment that may hold data past the
recovery point is scanned with CRC checks and base-offset contiguity; at the first torn
or corrupt batch, or a gap or overlap of offsets (outside the gaps compaction left below
the gap bound), the log is cut: the bytes from there, and every later segment, are moved
(never deleted) into ``damaged/<time>/`` in the partition's folder and reported at
ERROR, and the index files of scanned segments are rebuilt. A follower then fetches what
it lost from its leader; an operator can read what was set aside with
``headwater.log.batch`` (the files are segments as written). Segments wholly below the
recovery point, and all segments after a clean shutdown, are trusted: their index files
are loaded (rebuilt if missing or inconsistent) and only the tail after the last index
entry is walked; a read checks the base offset of every batch it walks or returns
(``Segment.read_from``), so a batch whose base offset changed on disk (outside the CRC)
is refused with KAFKA_STORAGE_ERROR, never served at a wrong offset. The clean-shutdown
marker is removed once the segments are loaded; the recovery point is then at most the
log end (the log end after a clean shutdown). A directory without segments gets an
empty one at its recovery point.

Leader epochs: the checkpoint is cut to the log's offsets [log start, log end] (and
rewritten when that changed); when it is missing or unreadable, the cache is rebuilt
from the batch headers and written.

I/O; the caller holds the log's lock (the bounded set of sealed handles takes it before
closing one).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from headwater.log.checkpoint_files import (
    fsync_directory,
    read_checked_offset,
    write_atomically,
    write_checked_offset,
)
from headwater.log.leader_epochs import EpochCheckpointError, LeaderEpochCache
from headwater.log.producer_snapshots import load_producers
from headwater.log.producer_state import ProducerEntry
from headwater.log.segment import (
    LOG_SUFFIX,
    GapBound,
    ScanResult,
    Segment,
    batch_headers_from,
    create_segment,
)
from headwater.log.segment_swap import finish_swap, read_cleaned_offset, read_gap_bound

RECOVERY_POINT_FILE: Final = "recovery-point"
CLEAN_SHUTDOWN_FILE: Final = "clean-shutdown"
EPOCH_CHECKPOINT_FILE: Final = "leader-epoch-checkpoint"
DAMAGED_DIR: Final = "damaged"
"""Where recovery sets aside what it cannot keep in the log: never deleted by the node."""

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedLog:
    """A log as opening found it: its segments (in offset order, the last one active),
    and the state the log keeps beside them."""

    segments: list[Segment]
    gaps: GapBound
    recovery_point: int
    damage: str
    """What recovery cut and set aside ("" when nothing)."""
    epochs: LeaderEpochCache
    producers: dict[int, ProducerEntry]
    cleaned_offset: int


def load_log(
    directory: Path, index_interval_bytes: int, owner_lock: threading.RLock, now_ms: int
) -> LoadedLog:
    """Open the log in ``directory`` (see the module docstring); the caller holds
    ``owner_lock``, the log's."""
    gaps = read_gap_bound(directory)
    segments: list[Segment] = []
    try:
        finish_swap(directory)
        recovery_point, damage = _load_segments(
            directory, index_interval_bytes, owner_lock, gaps, now_ms, segments
        )
        start, end = segments[0].base_offset, segments[-1].next_offset
        epochs = load_epochs(directory, segments)
        producers = load_producers(directory, segments)
        cleaned_offset = read_cleaned_offset(directory, start, end)
    except BaseException:
        for segment in segments:
            segment.close()
        raise
    return LoadedLog(segments, gaps, recovery_point, damage, epochs, producers, cleaned_offset)


def read_recovery_point(directory: Path) -> int:
    """0 when unknown: everything is scanned again."""
    found = read_checked_offset(directory / RECOVERY_POINT_FILE)
    return 0 if found is None else found


def write_recovery_point(directory: Path, offset: int) -> None:
    write_checked_offset(directory / RECOVERY_POINT_FILE, offset)


def write_epoch_checkpoint(directory: Path, epochs: LeaderEpochCache) -> None:
    write_atomically(directory / EPOCH_CHECKPOINT_FILE, epochs.to_text().encode())


# ---------------------------------------------------------------------------- segments


def _segment_bases(directory: Path) -> list[int]:
    """The base offsets of the segments in ``directory``, in order, once the temporary
    files and the index files without a ``.log`` are deleted."""
    for stray in directory.glob("*.tmp"):
        stray.unlink()
    bases = sorted(int(p.stem) for p in directory.glob(f"*{LOG_SUFFIX}") if p.stem.isdigit())
    for orphan in directory.glob("*.index"):
        if orphan.stem.isdigit() and int(orphan.stem) not in bases:
            orphan.unlink()
            orphan.with_suffix(".timeindex").unlink(missing_ok=True)
    return bases


def _load_segments(
    directory: Path,
    index_interval_bytes: int,
    owner_lock: threading.RLock,
    gaps: GapBound,
    now_ms: int,
    segments: list[Segment],
) -> tuple[int, str]:
    """Open the segments of ``directory`` into ``segments`` (so that the caller closes
    them on an error), cutting at the first damage; return the recovery point and what
    was cut ("" when nothing)."""
    bases = _segment_bases(directory)
    marker = directory / CLEAN_SHUTDOWN_FILE
    clean = marker.exists()
    recovery_point = read_recovery_point(directory) if not clean else None
    damage = ""
    for i, base in enumerate(bases):
        segment = Segment(directory, base, index_interval_bytes, owner_lock, gaps)
        segment.created_ms = now_ms
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        trusted = clean or (
            recovery_point is not None and next_base is not None and next_base <= recovery_point
        )
        result = segment.load(trust_index=trusted)
        if segments:
            # Sealed as soon as a later one is open: opening a log of many segments never
            # holds more than two of their files open at once, and the handles go to the
            # bounded set.
            segments[-1].seal()
        segments.append(segment)
        # A segment ends at the next one's base (before it, below the gap bound, when
        # compaction removed its last records).
        expected_next = next_base if next_base is not None else result.next_offset
        if result.problem is None and gaps.allows(result.next_offset, expected_next):
            if next_base is not None:
                segment.next_offset = next_base
            continue
        damage = _cut(directory, segment, result, next_base, bases[i + 1 :], now_ms)
        break
    if not segments:
        start = read_recovery_point(directory) if not bases else 0
        segments.append(
            create_segment(directory, start, index_interval_bytes, owner_lock, gaps, now_ms)
        )
    if clean:
        marker.unlink()
        fsync_directory(directory)
    end = segments[-1].next_offset
    return min(end, recovery_point if recovery_point is not None else end), damage


def _cut(
    directory: Path,
    segment: Segment,
    result: ScanResult,
    next_base: int | None,
    later_bases: Sequence[int],
    now_ms: int,
) -> str:
    """Cut the log inside ``segment``, where its scan (``result``) stopped or where it
    ends before ``next_base``: set aside its tail and the ``later_bases`` segments, and
    report it; return the damage's description."""
    problem = result.problem or (
        f"segment {segment.base_offset} ends at offset {result.next_offset} but the next "
        f"segment starts at {next_base}"
    )
    aside = set_aside(directory, segment, result.valid_bytes, later_bases, now_ms)
    _log.error(
        "log %s: cut at offset %d (segment %d, byte %d of %d); the rest of that "
        "segment and %d later segment(s) are set aside in %s: %s",
        directory,
        result.next_offset,
        segment.base_offset,
        result.valid_bytes,
        segment.size,
        len(later_bases),
        aside,
        problem,
    )
    segment.truncate(result.valid_bytes)
    segment.next_offset = result.next_offset
    return f"cut at offset {result.next_offset}: {problem}; set aside in {aside}"


def set_aside(
    directory: Path,
    segment: Segment,
    valid_bytes: int,
    later_bases: Sequence[int],
    now_ms: int,
) -> Path:
    """Copy ``segment``'s bytes from ``valid_bytes`` on, and move every later segment's
    files, into a new folder under ``damaged/``; return it. (Only the copy's tail is
    then truncated from the live segment.)"""
    aside = directory / DAMAGED_DIR / str(now_ms)
    suffix = 0
    while aside.exists():
        suffix += 1
        aside = directory / DAMAGED_DIR / f"{now_ms}-{suffix}"
    aside.mkdir(parents=True)
    if valid_bytes < segment.size:
        tail = os.pread(segment.fd, segment.size - valid_bytes, valid_bytes)
        name = f"{segment.base_offset:020d}-from-byte-{valid_bytes}{LOG_SUFFIX}"
        write_atomically(aside / name, tail)
    for base in later_bases:
        for path in directory.glob(f"{base:020d}.*"):
            path.rename(aside / path.name)
    fsync_directory(aside)
    fsync_directory(directory)
    return aside


# ---------------------------------------------------------------------------- epochs


def load_epochs(directory: Path, segments: Sequence[Segment]) -> LeaderEpochCache:
    """The leader-epoch cache of the log of ``segments``: its checkpoint cut to the log's
    offsets, or, when the checkpoint is missing or unreadable, the cache rebuilt from
    every batch header (one pread per batch). The checkpoint is rewritten when it
    changed."""
    start, end = segments[0].base_offset, segments[-1].next_offset
    path = directory / EPOCH_CHECKPOINT_FILE
    try:
        epochs = LeaderEpochCache.from_text(path.read_text())
    except (OSError, EpochCheckpointError) as exc:
        if end > start:
            _log.warning("log %s: rebuilding the leader-epoch cache: %s", directory, exc)
        epochs = LeaderEpochCache()
        for header in batch_headers_from(segments, start):
            epochs.assign(header.leader_epoch, header.base_offset)
        write_epoch_checkpoint(directory, epochs)
        return epochs
    changed = epochs.truncate_from_end(end)
    changed |= epochs.truncate_from_start(start)
    if changed:
        write_epoch_checkpoint(directory, epochs)
    return epochs
