"""The leader-epoch cache of a partition log (pure): which leader epoch began at which
offset.

Every batch carries the leader epoch of the leader that appended it, and epochs never go
back along a log. The cache keeps one ``(epoch, start_offset)`` entry per epoch that has
records in the log (and the epoch of a new leader, from the offset where it took over),
in increasing order of both fields. It answers Kafka's OffsetsForLeaderEpoch question: *where
does epoch E end in this log?* A follower that rejoins asks its leader that question for
its own latest epoch and truncates its log to the answer, so that the two logs never
diverge (KIP-101/KIP-279).

File form (``leader-epoch-checkpoint`` in the partition folder), as Kafka's: a version
line (``0``), a count line, then one ``EPOCH START_OFFSET`` line per entry.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Final

CHECKPOINT_VERSION: Final = 0
UNDEFINED: Final = -1


class EpochCheckpointError(ValueError):
    """A checkpoint file that cannot be parsed (the log rebuilds the cache instead)."""


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Thread-safety: none; the owning log serializes access."""

    def __init__(self, entries: list[EpochEntry] | None = None) -> None:
        self.entries: list[EpochEntry] = list(entries or [])

    @property
    def latest_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else UNDEFINED

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` begins at ``start_offset`` (no-op when ``epoch`` is already
        the latest). Entries of a later or equal epoch, or starting at or past
        ``start_offset``, are dropped: they described a tail that is gone (for example a
        leadership this replica took but never wrote in). Returns True when the cache
        changed."""
        if self.entries and epoch == self.entries[-1].epoch:
            return False
        self.entries = [
            e for e in self.entries if e.start_offset < start_offset and e.epoch < epoch
        ]
        self.entries.append(EpochEntry(epoch, start_offset))
        return True

    def truncate_from_end(self, log_end_offset: int) -> bool:
        """Drop epochs that begin at or past ``log_end_offset`` (after truncating a log)."""
        kept = [e for e in self.entries if e.start_offset < log_end_offset]
        changed = len(kept) != len(self.entries)
        self.entries = kept
        return changed

    def truncate_from_start(self, log_start_offset: int) -> bool:
        """Forget epochs wholly before ``log_start_offset`` (after retention); the epoch
        holding it now starts there."""
        kept = [
            e
            for i, e in enumerate(self.entries)
            if i + 1 == len(self.entries) or self.entries[i + 1].start_offset > log_start_offset
        ]
        if kept and kept[0].start_offset < log_start_offset:
            kept[0] = EpochEntry(kept[0].epoch, log_start_offset)
        changed = kept != self.entries
        self.entries = kept
        return changed

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(the largest epoch <= ``epoch`` in this log, the offset where it ends): the
        start of the next epoch, or ``log_end_offset`` for the latest one. (UNDEFINED,
        UNDEFINED) when the log knows no epoch that old."""
        found = None
        for i, entry in enumerate(self.entries):
            if entry.epoch > epoch:
                break
            found = i
        if found is None:
            return UNDEFINED, UNDEFINED
        if found + 1 < len(self.entries):
            return self.entries[found].epoch, self.entries[found + 1].start_offset
        return self.entries[found].epoch, log_end_offset

    def to_text(self) -> str:
        lines = [str(CHECKPOINT_VERSION), str(len(self.entries))]
        lines += [f"{e.epoch} {e.start_offset}" for e in self.entries]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_text(cls, text: str) -> LeaderEpochCache:
        lines = text.split("\n")
        try:
            version, count = int(lines[0]), int(lines[1])
            if version != CHECKPOINT_VERSION:
                raise EpochCheckpointError(f"checkpoint version {version}")
            entries = []
            for line in lines[2 : 2 + count]:
                epoch_text, offset_text = line.split()
                entries.append(EpochEntry(int(epoch_text), int(offset_text)))
        except (IndexError, ValueError) as exc:
            raise EpochCheckpointError(f"unreadable leader-epoch checkpoint: {exc}") from exc
        if len(entries) != count or any(
            b.epoch <= a.epoch or b.start_offset < a.start_offset
            for a, b in itertools.pairwise(entries)
        ):
            raise EpochCheckpointError("leader-epoch checkpoint entries are not increasing")
        return cls(entries)
