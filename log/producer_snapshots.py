"""Snapshots of a file log's idempotent-producer state, and its rebuild from them.

Files: ``<offset:020d>.producers`` in the partition's folder, each the state as of that
offset (the log end when it was written) in ``producer_state.encode_snapshot``'s format,
which repeats the offset; written atomically (``checkpoint_files.write_atomically``). A
snapshot larger than PRODUCER_SNAPSHOT_BYTES_MAX, unreadable, or whose offset is not its
file name's is ignored (logged). The log writes one when a segment rolls (at the new
segment's base offset) and on close (at the log end), keeping the newest
PRODUCER_SNAPSHOTS_KEPT (a truncation below all of them replays the log).

Rebuild (``load_producers``), on open and after every truncation: snapshots above the
log end (a truncated tail's) are deleted, then the state is the newest readable snapshot
at or below the log end, followed by the batch headers after it (one pread per batch;
no snapshot: every batch of the log). Snapshots below the log start go with retention
(``delete_snapshots_below``), and all of them when the log starts over.

Invariant: the state rebuilt is always the one the log's batches give, which is what lets
a follower that becomes leader answer a retried batch with the offsets it was first
appended at, and never with offsets a truncation removed.

I/O; the caller holds the log's lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from headwater.log import producer_state
from headwater.log.checkpoint_files import write_atomically
from headwater.log.producer_state import ProducerEntry, ProducerStates
from headwater.log.segment import Segment, batch_headers_from

PRODUCER_SNAPSHOT_SUFFIX: Final = ".producers"
PRODUCER_SNAPSHOT_BYTES_MAX: Final = 256 << 20
PRODUCER_SNAPSHOTS_KEPT: Final = 3

_log = logging.getLogger(__name__)


def snapshot_files(directory: Path) -> list[tuple[int, Path]]:
    """(offset, path) of every producer snapshot file in ``directory``, in offset order."""
    return sorted(
        (int(path.stem), path)
        for path in directory.glob(f"*{PRODUCER_SNAPSHOT_SUFFIX}")
        if path.stem.isdigit()
    )


def write_snapshot(directory: Path, producers: ProducerStates, end_offset: int) -> None:
    """Snapshot ``producers``, the state as of ``end_offset`` (the log end); keep the
    newest PRODUCER_SNAPSHOTS_KEPT."""
    path = directory / f"{end_offset:020d}{PRODUCER_SNAPSHOT_SUFFIX}"
    write_atomically(path, producer_state.encode_snapshot(producers, end_offset))
    for _offset, old in snapshot_files(directory)[:-PRODUCER_SNAPSHOTS_KEPT]:
        old.unlink(missing_ok=True)


def delete_snapshots_below(directory: Path, offset: int) -> None:
    """Delete the snapshots of offsets below ``offset`` (the new log start)."""
    for snapshot_offset, path in snapshot_files(directory):
        if snapshot_offset < offset:
            path.unlink(missing_ok=True)


def delete_all_snapshots(directory: Path) -> None:
    """Delete every snapshot (the log starts over, empty)."""
    for _offset, path in snapshot_files(directory):
        path.unlink(missing_ok=True)


def read_snapshot(path: Path, offset: int) -> ProducerStates | None:
    """The state of the snapshot ``path`` (named for ``offset``), or None (logged) when it
    cannot be used."""
    directory = path.parent
    try:
        if path.stat().st_size > PRODUCER_SNAPSHOT_BYTES_MAX:
            raise producer_state.SnapshotError(f"larger than {PRODUCER_SNAPSHOT_BYTES_MAX} bytes")
        states, end = producer_state.decode_snapshot(path.read_bytes())
    except (OSError, producer_state.SnapshotError) as exc:
        _log.warning("log %s: producer snapshot %s ignored: %s", directory, path.name, exc)
        return None
    if end != offset:
        _log.warning(
            "log %s: producer snapshot %s says offset %d; ignored",
            directory,
            path.name,
            end,
        )
        return None
    return states


def load_producers(directory: Path, segments: Sequence[Segment]) -> dict[int, ProducerEntry]:
    """The producer state as of the end of the log of ``segments`` (in ``directory``):
    delete snapshots above it, take the newest readable one at or below it, and replay
    the batch headers after it."""
    end = segments[-1].next_offset
    states: ProducerStates = producer_state.EMPTY
    replay_from = segments[0].base_offset
    for offset, path in reversed(snapshot_files(directory)):
        if offset > end:
            path.unlink(missing_ok=True)
            continue
        loaded = read_snapshot(path, offset)
        if loaded is not None:
            states, replay_from = loaded, offset
            break
    producers = dict(states)
    for header in batch_headers_from(segments, replay_from):
        if header.producer_id != producer_state.NO_PRODUCER:
            producer_state.record_header(producers, header)
    return producers
