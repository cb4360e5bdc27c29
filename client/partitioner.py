"""Partition choice (pure): Kafka's murmur2 for keyed records
(``headwater.shared.partitioning``), sticky for keyless ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwater.shared.partitioning import murmur2, partition_for_key

if TYPE_CHECKING:
    import random  # the caller passes a seeded random.Random

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key"]


class StickyPartitioner:
    """Keyless records stick to one partition until its batch is sent, then switch
    (Kafka's KIP-480), so that keyless traffic forms full batches. Not thread-safe."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._current: dict[str, int] = {}

    def partition(self, topic: str, partitions: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= partitions:
            current = self._rng.randrange(partitions)
            self._current[topic] = current
        return current

    def on_batch_sent(self, topic: str, partition: int, partitions: int) -> None:
        """Move to another partition after a batch of ``partition`` was closed."""
        if self._current.get(topic) == partition and partitions > 1:
            choice = self._rng.randrange(partitions - 1)
            self._current[topic] = choice if choice < partition else choice + 1
