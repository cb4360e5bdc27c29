"""Log compaction's decisions (pure): what the cleaner of a compacted topic keeps.

A compacted partition keeps, for every key, its newest record; older records of a key
are removed, offsets are never changed and order is kept. A record with a null value (a
tombstone) says "the key is deleted": it is kept, so that consumers learn of the
deletion, until ``delete_retention_ms`` after it became cleanable, then removed too.

The cleaner works in passes over the **cleanable** part of the log: every closed
segment whose records are all older than ``min_compaction_lag_ms``; the active segment
is never cleaned. A pass:

1. builds an ``OffsetMap`` (key -> newest offset) over the dirty part, from the first
   offset after the last pass, holding at most ``capacity`` keys (bounded memory): the
   pass covers the dirty records up to ``OffsetMap.end_offset`` and the next pass the
   rest;
2. rewrites every cleanable segment below that end, keeping the records ``kept`` says to
   keep (``survivors`` for a segment's).

Invariant (tests/test_compaction.py, against an oracle): after passes that together
cover the cleanable part, a record below the cleaned offset is kept exactly when it is
the newest record of its key below that offset and is not a tombstone past its
retention; the kept records keep their offsets, in order, and records at or past the
cleaned offset are untouched (a key's newer record in the active segment removes the
older ones once its segment is cleaned in turn). Records without a key are
kept (a compacted topic refuses them on produce; older ones are left as they were).

``cleanable_ratio`` is Kafka's dirty ratio: the share of the cleanable bytes written
since the last pass; a partition is cleaned once it reaches ``min_cleanable_dirty_ratio``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RecordSummary:
    """What the cleaner needs of one record."""

    offset: int
    key: bytes | None
    tombstone: bool  # a null value


@dataclass(slots=True)
class OffsetMap:
    """key -> the newest offset of that key among the records added, up to ``capacity``
    keys; ``end_offset`` is one past the last record it covers."""

    capacity: int
    start_offset: int
    end_offset: int = -1
    newest: dict[bytes, int] = field(default_factory=dict)
    bytes_max: int = 1 << 62
    """Most bytes of keys held (keys may be large: this, not only ``capacity``, bounds
    the map's memory)."""
    key_bytes: int = 0
    """An upper bound of the bytes of the keys held."""

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("an offset map holds at least one key")
        if self.end_offset < 0:
            self.end_offset = self.start_offset

    def add(self, records: Iterable[RecordSummary]) -> bool:
        """Add records in offset order; False (and nothing more added) once a record's
        key would not fit. Records below ``start_offset`` are skipped."""
        for record in records:
            if record.offset < self.end_offset:
                continue
            if record.key is not None:
                if record.key not in self.newest:
                    if (
                        len(self.newest) >= self.capacity
                        or self.key_bytes + len(record.key) > self.bytes_max
                    ):
                        return False
                    self.key_bytes += len(record.key)
                self.newest[record.key] = record.offset
            self.end_offset = record.offset + 1
        return True

    def add_keys(self, keys: Sequence[bytes | None], base_offset: int) -> bool:
        """``add`` for one batch's keys (record i at ``base_offset + i``), in one dict
        update when they fit for sure, else record by record."""
        batch_bytes = sum(len(k) for k in keys if k is not None)
        if (
            base_offset < self.end_offset
            or len(self.newest) + len(keys) > self.capacity
            or self.key_bytes + batch_bytes > self.bytes_max
        ):
            return self.add(
                RecordSummary(base_offset + i, key, False) for i, key in enumerate(keys)
            )
        self.key_bytes += batch_bytes
        offsets = range(base_offset, base_offset + len(keys))
        self.newest.update((k, o) for k, o in zip(keys, offsets, strict=True) if k is not None)
        self.end_offset = base_offset + len(keys)
        return True

    def cover_to(self, offset: int) -> None:
        """Every record below ``offset`` was added (a whole segment was read, some of its
        offsets already compacted away): the map covers up to there."""
        self.end_offset = max(self.end_offset, offset)


def kept(
    offsets: Sequence[int],
    keys: Sequence[bytes | None],
    tombstones: Sequence[bool] | None,
    offset_map: OffsetMap,
    tombstones_expired_below: int,
) -> list[bool]:
    """Which of these records (offset, key, tombstone: a null value; ``tombstones`` None
    when there is none) a pass whose map is ``offset_map`` keeps: every record at or past
    the map's end, and below it every record without a key, or that is the newest of its
    key and not a tombstone at an offset below ``tombstones_expired_below`` (past its
    retention). One comprehension over a batch: the cleaner's per-record path."""
    end = offset_map.end_offset
    newest = offset_map.newest.get
    decided = [
        key is None or offset >= end or newest(key, offset) <= offset
        for offset, key in zip(offsets, keys, strict=True)
    ]
    if tombstones is not None:
        expired_below = min(end, tombstones_expired_below)
        for i, tombstone in enumerate(tombstones):
            if tombstone and keys[i] is not None and offsets[i] < expired_below:
                decided[i] = False
    return decided


def survivors(
    records: Sequence[RecordSummary],
    offset_map: OffsetMap,
    tombstones_expired_below: int,
) -> list[RecordSummary]:
    """The records of a segment that a pass keeps (``kept``)."""
    decided = kept(
        [r.offset for r in records],
        [r.key for r in records],
        [r.tombstone for r in records],
        offset_map,
        tombstones_expired_below,
    )
    return [r for r, keep in zip(records, decided, strict=True) if keep]


def cleanable_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    """The dirty share of the cleanable bytes (0 when there are none)."""
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0
