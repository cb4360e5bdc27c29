"""The log cleaner's side of a file log: what a pass sees of it, and how its output
replaces the original segments (``headwater.log.cleaner`` runs the pass).

Files in the partition's folder::

    cleaning/         a cleaning pass's output, being written
    swap/             a finished pass's output, being swapped in
    cleaner-offset    offset below which the log is clean (checked offset format,
                      ``checkpoint_files``)
    compacted-below   offsets below it may have gaps (``GapBound``; checked offset format)

The swap (``swap_in``): a pass writes cleaned copies of segments into ``cleaning/``;
the gap bound is raised to the pass's cleaned offset, then ``cleaning/`` is renamed to
``swap/`` (the commit point, after every file was fsynced), each file moved over the
original of the same name, and ``swap/`` removed. Opening a log first finishes a
``swap/`` left by a crash and deletes a ``cleaning/`` (``finish_swap``): a crash at any
point leaves either the original segments or the cleaned ones, never a mix, and loses
nothing.

Cleaned segments keep their base offsets (a segment the cleaner emptied is deleted, but
the first); their batches keep their offsets, with gaps where records were removed (base
offsets grow along a segment, by one batch's records or more; a segment may end before
the next one's base offset, and the first may hold nothing at all). Gaps lie below the
gap bound, the larger of the two offset files (either may be lost): ``compacted-below``
is raised before each swap and before a follower appends a batch past a gap its
leader's cleaner left; ``cleaner-offset`` is written after each swap, and set back to
the log start when a truncation leaves it outside the log. The active segment is never
cleaned, and a segment is swapped only while it is still the log's, unchanged, as the
pass saw it (``SegmentView``); otherwise the pass is dropped whole.

I/O; every function runs under the log's lock.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from headwater.log.checkpoint_files import (
    fsync_directory,
    read_checked_offset,
    write_checked_offset,
)
from headwater.log.segment import GapBound, Segment

CLEANING_DIR: Final = "cleaning"
SWAP_DIR: Final = "swap"
CLEANER_OFFSET_FILE: Final = "cleaner-offset"
GAP_BOUND_FILE: Final = "compacted-below"

_log = logging.getLogger(__name__)


class CleaningAbortedError(Exception):
    """The log changed under a cleaning pass (retention, truncation, deletion)."""


@dataclass(frozen=True, slots=True)
class SegmentView:
    """A closed segment as a cleaning pass saw it."""

    segment: Segment
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@dataclass(frozen=True, slots=True)
class CleanPlan:
    """The cleanable part of a log: ``segments`` (closed, below the bound, past the
    compaction lag), from the log start to ``end_offset``; ``first_dirty``: where the
    last pass stopped."""

    segments: tuple[SegmentView, ...]
    log_start_offset: int
    first_dirty: int
    end_offset: int

    @property
    def clean_bytes(self) -> int:
        return sum(v.size for v in self.segments if v.next_offset <= self.first_dirty)

    @property
    def dirty_bytes(self) -> int:
        return sum(v.size for v in self.segments if v.next_offset > self.first_dirty)


def plan_cleaning(
    segments: Sequence[Segment],
    cleaned_offset: int,
    now_ms: int,
    upper_bound: int,
    min_compaction_lag_ms: int,
) -> CleanPlan | None:
    """The cleanable part of the log of ``segments`` (see CleanPlan): closed segments
    wholly below ``upper_bound`` whose records are all older than
    ``min_compaction_lag_ms``. None when there is none."""
    lag_cut = now_ms - min_compaction_lag_ms
    views = []
    for segment in segments[:-1]:
        if segment.next_offset > upper_bound or segment.max_timestamp > lag_cut:
            break
        views.append(
            SegmentView(
                segment,
                segment.base_offset,
                segment.next_offset,
                segment.size,
                segment.max_timestamp,
            )
        )
    if not views:
        return None
    start = segments[0].base_offset
    first_dirty = min(max(cleaned_offset, start), views[-1].next_offset)
    return CleanPlan(tuple(views), start, first_dirty, views[-1].next_offset)


# ---------------------------------------------------------------------------- offsets


def read_gap_bound(directory: Path) -> GapBound:
    """The log's gap bound: gaps go below the offset the cleaner reached, and below the
    bound raised before each swap and each copied gap (either file may be lost: the
    larger counts)."""
    return GapBound(
        max(
            read_checked_offset(directory / GAP_BOUND_FILE) or 0,
            read_checked_offset(directory / CLEANER_OFFSET_FILE) or 0,
        )
    )


def raise_gap_bound(directory: Path, gaps: GapBound, offset: int) -> None:
    """Move the gap bound up to ``offset`` (its file first); nothing when it is there."""
    if offset > gaps.offset:
        write_checked_offset(directory / GAP_BOUND_FILE, offset)
        gaps.offset = offset


def read_cleaned_offset(directory: Path, log_start_offset: int, log_end_offset: int) -> int:
    """The offset below which the log is clean, within [log start, log end] (the log
    start when unknown)."""
    found = read_checked_offset(directory / CLEANER_OFFSET_FILE)
    return min(max(found or 0, log_start_offset), log_end_offset)


def write_cleaned_offset(directory: Path, offset: int) -> None:
    """Record that the log is clean below ``offset`` (``cleaner-offset``)."""
    write_checked_offset(directory / CLEANER_OFFSET_FILE, offset)


# ---------------------------------------------------------------------------- the swap


def finish_swap(directory: Path) -> None:
    """Complete a swap a crash interrupted (``swap/`` is whole: move what is left of
    it), and drop an unfinished pass (``cleaning/``)."""
    swap = directory / SWAP_DIR
    if swap.is_dir():
        for path in sorted(swap.iterdir()):
            os.replace(path, directory / path.name)
        fsync_directory(directory)
        swap.rmdir()
        fsync_directory(directory)
        _log.info("log %s: swapped in cleaned segments", directory)
    shutil.rmtree(directory / CLEANING_DIR, ignore_errors=True)


def _places(segments: Sequence[Segment], views: Sequence[SegmentView]) -> list[int] | None:
    """Where each view's segment is in ``segments``; None when one is gone, is the active
    segment, or changed size since the pass saw it."""
    places = []
    for view in views:
        place = next((i for i, s in enumerate(segments) if s is view.segment), None)
        if place is None or place == len(segments) - 1 or view.segment.size != view.size:
            return None
        places.append(place)
    return places


def swap_in(
    directory: Path,
    segments: list[Segment],
    cleaned: Sequence[tuple[SegmentView, Segment]],
    cleaning_dir: Path,
    cleaned_offset: int,
    gaps: GapBound,
    index_interval_bytes: int,
    owner_lock: threading.RLock,
) -> bool:
    """Make the cleaned copies (written and fsynced in ``cleaning_dir``) the segments of
    the log in ``directory``, atomically (see the module docstring), replacing the
    originals in ``segments`` (the log's list, changed in place). False, and nothing
    changed, when a segment cleaned is no longer the log's as the pass saw it. The caller
    then records ``cleaned_offset`` (``write_cleaned_offset``)."""
    places = _places(segments, [view for view, _output in cleaned])
    if places is None:
        return False
    raise_gap_bound(directory, gaps, cleaned_offset)
    os.rename(cleaning_dir, directory / SWAP_DIR)
    fsync_directory(directory)
    finish_swap(directory)
    for place, (view, _output) in zip(places, cleaned, strict=True):
        original = segments[place]
        replacement = Segment(directory, view.base_offset, index_interval_bytes, owner_lock, gaps)
        replacement.created_ms = original.created_ms
        replacement.load(trust_index=True)
        replacement.next_offset = original.next_offset  # it covers its gap
        original.close()  # its files were replaced; the old handle goes
        replacement.seal()
        segments[place] = replacement
    # A segment the cleaner emptied goes (but the first: it holds the log start offset);
    # the one before it covers its offsets.
    for place in sorted(places, reverse=True):
        emptied = segments[place]
        if place > 0 and emptied.size == 0:
            segments[place - 1].next_offset = emptied.next_offset
            emptied.delete()
            del segments[place]
    fsync_directory(directory)
    return True
