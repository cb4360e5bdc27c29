"""Kafka's key partitioning (pure), shared by the clients and the node.

``murmur2`` is Apache Kafka's ``Utils.murmur2`` (seed 0x9747b28c, 32-bit, signed result),
and ``partition_for_key`` is its default partitioner: ``(murmur2(key) & 0x7fffffff) %
partitions``, so a key lands on the same partition number as in Kafka.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final

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
