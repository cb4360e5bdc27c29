"""Retry policy (pure): how many attempts, and exponential backoff with jitter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import random  # the caller passes a seeded random.Random


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``retries`` more attempts after the first; the n-th retry waits about
    ``backoff_ms * 2**(n-1)``, capped at ``backoff_max_ms``, times a jitter in [0.8, 1.2]."""

    retries: int = 10
    backoff_base_ms: int = 100
    backoff_max_ms: int = 1000

    def backoff_ms(self, attempt: int, rng: random.Random) -> float:
        assert attempt >= 1
        base = min(self.backoff_base_ms * (2 ** min(attempt - 1, 30)), self.backoff_max_ms)
        return float(base * rng.uniform(0.8, 1.2))
