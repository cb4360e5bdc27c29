"""Retry decisions (pure), shared by the threaded and the asyncio producers: whether a
failed batch is tried again, and after how long.

A batch that failed with a retriable error is retried up to ``retries`` times, each retry
starting before its delivery deadline (``delivery_timeout_ms`` after it was queued): a
batch's outcome is known by the deadline plus one request's timeout at most. The n-th
retry waits about ``backoff_base_ms * 2**(n-1)``, capped at ``backoff_max_ms``, times a
jitter in [0.8, 1.2]. When the failed attempt's outcome is unknown (no answer, a broken
stream, a timeout: the request may still be appended somewhere), the retry also waits
until that attempt's append deadline has passed, plus ``backoff_base_ms`` (at least
``CLOCK_MARGIN_MS_MIN``) as the margin for node clocks behind this client's: no copy of
the failed attempt can then land after the retry or after later batches of the partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from headwater.shared.errors import ErrorCode

if TYPE_CHECKING:
    import random  # the caller passes a seeded random.Random

    from headwater.shared.errors import HeadwaterError

# Failures after which a request may still be appended later (the node or the link went
# quiet, or a forwarding node lost its answer). Every other error answer means that
# nothing was appended, or that the batch is already in the log (a replication timeout),
# before anything sent later.
OUTCOME_UNKNOWN: Final = frozenset(
    {
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    }
)


ANSWER_GRACE_S: Final = 1.0
"""How long past ``request_timeout_ms`` a producer waits for a stream's oldest answer
before it abandons the stream (its batches' outcomes become unknown). The node answers an
acks=all request still waiting for replication at ``request_timeout_ms`` itself (the
request's ``timeout_ms``), and a stream answers in order: abandoning it at that very
moment would make batches of other partitions, appended and answered just behind, unknown
and retried (written twice)."""
CLOCK_MARGIN_MS_MIN: Final = 100
"""The least margin for node clocks behind this client's (see the module docstring)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``retries`` more attempts after the first; backoff as in the module docstring."""

    retries: int = 10
    backoff_base_ms: int = 100
    backoff_max_ms: int = 1000

    @property
    def clock_margin_ms(self) -> int:
        """The margin for node clocks behind this client's (see the module docstring)."""
        return max(self.backoff_base_ms, CLOCK_MARGIN_MS_MIN)

    def backoff_ms(self, attempt: int, rng: random.Random) -> float:
        assert attempt >= 1
        base = min(self.backoff_base_ms * (2 ** min(attempt - 1, 30)), self.backoff_max_ms)
        return float(base * rng.uniform(0.8, 1.2))

    def retry_after_s(
        self,
        error: HeadwaterError,
        answered: bool,
        retries_done: int,
        now_s: float,
        delivery_deadline_s: float,
        append_deadline_left_ms: float,
        rng: random.Random,
    ) -> float | None:
        """Seconds to wait before retrying a batch whose attempt failed with ``error``, or
        None to give up (the error is final).

        ``answered``: the node answered with ``error`` (False: no answer arrived, the
        outcome is unknown). ``retries_done``: retries already made of this batch.
        ``now_s`` and ``delivery_deadline_s`` are on one monotonic clock;
        ``append_deadline_left_ms`` is the failed attempt's append deadline less the wall
        clock now.
        """
        if not error.retriable or retries_done >= self.retries:
            return None
        wait_ms = self.backoff_ms(retries_done + 1, rng)
        if not answered or error.code in OUTCOME_UNKNOWN:
            wait_ms = max(wait_ms, append_deadline_left_ms + self.clock_margin_ms)
        if now_s + wait_ms / 1000 >= delivery_deadline_s:
            return None  # the retry would start past the delivery deadline: give up now
        return wait_ms / 1000
