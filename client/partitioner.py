"""Partition choice (pure): Kafka's murmur2 for keyed records, sticky for keyless ones.

``murmur2`` is Apache Kafka's ``Utils.murmur2`` (seed 0x9747b28c, 32-bit, signed result),
and ``partition_for_key`` is its default partitioner: ``(murmur2(key) & 0x7fffffff) %
partitions``, so a key lands on the same partition number as in Kafka.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import random  # the caller passes a seeded random.Random

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data`` as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    body = length - (length & 3)
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[body + 2] << 16
    if rest >= 2:
        h ^= data[body + 1] << 8
    if rest >= 1:
        h ^= data[body]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def _positive_hash(key: bytes) -> int:
    return murmur2(key) & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default partition for ``key`` among ``partitions``."""
    assert partitions > 0
    return _positive_hash(key) % partitions


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
