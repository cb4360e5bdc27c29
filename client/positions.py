"""Fetch positions (sans-I/O), shared by the threaded Consumer and the AsyncConsumer: which
partitions are assigned, where each is read next, and which arrivals still count.

A position is None until it is known: the consumer then asks for the offset that
``auto_offset_reset`` names (``earliest``: the log start; ``latest``: the high watermark;
``none``: raise OFFSET_OUT_OF_RANGE), and the same policy applies when a position falls
out of the log (retention). Every assignment or seek of a partition moves it to a new
*generation*; arrivals are tagged with the generation their fetch started in, and one
from an older generation (a fetch started before the seek) is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Literal

from headwater.shared.errors import ErrorCode, HeadwaterError

RESET_POLICIES: Final = ("earliest", "latest", "none")
ResetTo = Literal["earliest", "latest"]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int


def check_reset_policy(auto_offset_reset: str) -> None:
    if auto_offset_reset not in RESET_POLICIES:
        raise HeadwaterError(
            ErrorCode.INVALID_CONFIG,
            f"auto_offset_reset is {auto_offset_reset!r}; valid: {', '.join(RESET_POLICIES)}",
        )


class FetchPositions:
    """The assignment and each assigned partition's next offset and generation."""

    def __init__(self, auto_offset_reset: str) -> None:
        check_reset_policy(auto_offset_reset)
        self.auto_offset_reset = auto_offset_reset
        self._offsets: dict[TopicPartition, int | None] = {}
        self._generations: dict[TopicPartition, int] = {}
        self._next_generation = 1

    def __bool__(self) -> bool:
        return bool(self._offsets)

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(list(self._offsets))

    def _bump(self, partition: TopicPartition) -> None:
        self._generations[partition] = self._next_generation
        self._next_generation += 1

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Replace the assignment; every position starts unknown."""
        self._offsets = dict.fromkeys(partitions)
        self._generations = {}
        for partition in self._offsets:
            self._bump(partition)

    def add(self, partitions: Iterable[TopicPartition]) -> None:
        """Assign ``partitions`` too (positions unknown), keeping the others."""
        for partition in partitions:
            if partition not in self._offsets:
                self._offsets[partition] = None
                self._bump(partition)

    def remove(self, partitions: Iterable[TopicPartition]) -> None:
        for partition in partitions:
            self._offsets.pop(partition, None)
            self._generations.pop(partition, None)

    def known(self) -> dict[TopicPartition, int]:
        """Every assigned partition's position, where known."""
        return {p: o for p, o in self._offsets.items() if o is not None}

    def assignment(self) -> list[TopicPartition]:
        return sorted(self._offsets)

    def check_assigned(self, partitions: Iterable[TopicPartition] | None) -> list[TopicPartition]:
        """``partitions`` (all assigned ones when None); INVALID_REQUEST for one that is
        not assigned."""
        targets = list(self._offsets) if partitions is None else list(partitions)
        for partition in targets:
            if partition not in self._offsets:
                raise HeadwaterError(
                    ErrorCode.INVALID_REQUEST, f"{partition} is not assigned to this consumer"
                )
        return targets

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Read ``partition`` from ``offset`` next (the broker checks it is in the log)."""
        if offset < 0:
            raise HeadwaterError(
                ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is negative; offsets start at 0"
            )
        self.check_assigned([partition])
        self._offsets[partition] = offset
        self._bump(partition)

    def offset(self, partition: TopicPartition) -> int | None:
        """The next offset of ``partition``, None while unknown."""
        self.check_assigned([partition])
        return self._offsets[partition]

    def generation(self, partition: TopicPartition) -> int:
        return self._generations[partition]

    def unknown(self) -> list[TopicPartition]:
        """Assigned partitions whose position is not known yet."""
        return [p for p, offset in self._offsets.items() if offset is None]

    def reset_to(self, partition: TopicPartition, cause: HeadwaterError | None = None) -> ResetTo:
        """Where ``auto_offset_reset`` puts ``partition``; raises ``cause`` (or
        OFFSET_OUT_OF_RANGE) under ``none``."""
        if self.auto_offset_reset == "none":
            raise cause or HeadwaterError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{partition} has no position and auto_offset_reset is 'none'",
            )
        return "earliest" if self.auto_offset_reset == "earliest" else "latest"

    def accept(self, partition: TopicPartition, generation: int) -> int | None:
        """The position an arrival of ``generation`` continues from, or None when it is
        from before a seek or reassignment (drop it)."""
        if self._generations.get(partition) != generation:
            return None
        return self._offsets[partition]

    def advance(self, partition: TopicPartition, next_offset: int) -> None:
        """Records up to ``next_offset`` were handed out: never moves backwards."""
        current = self._offsets[partition]
        self._offsets[partition] = next_offset if current is None else max(current, next_offset)
