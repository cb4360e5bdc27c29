"""Rates per client host: a token bucket for each host (pure: the caller passes the time).

A host may do ``rate_per_s`` things a second, and up to ``burst`` at once after a quiet
spell: its bucket holds at most ``burst`` tokens, refills at ``rate_per_s`` tokens a
second, and each thing takes one. ``take`` answers how long the caller must wait before
its token is there (0: now); a token is taken only when it is there now, so a caller
told to wait asks again later. Used for the new connections a host may open a second
(``connection_rate_per_host_max``, on the gRPC and the Kafka listener) and for the
requests a host may send before logging in on the Kafka listener
(``kafka_prelogin_request_rate_per_host_max``).

At most ``HOSTS_TRACKED_MAX`` hosts are tracked: past it, the hosts whose bucket is full
again (quiet for ``burst / rate_per_s`` seconds) are forgotten, which changes nothing they
may do; if every tracked host is busy, the oldest buckets are forgotten (those hosts get a
full bucket again), so memory stays bounded whatever the number of hosts.
"""

from __future__ import annotations

from typing import Final

HOSTS_TRACKED_MAX: Final = 100_000


class HostRates:
    """A token bucket per host (see the module doc). Not thread-safe: one owner."""

    def __init__(self, rate_per_s: float, burst: float | None = None) -> None:
        assert rate_per_s > 0, rate_per_s
        self.rate_per_s = rate_per_s
        self.burst = rate_per_s if burst is None else burst
        assert self.burst >= 1, self.burst
        self._buckets: dict[str, tuple[float, float]] = {}  # host -> (tokens, as of when)

    def tokens(self, host: str, now_s: float) -> float:
        """The tokens ``host`` has at ``now_s``."""
        tokens, since = self._buckets.get(host, (self.burst, now_s))
        return min(self.burst, tokens + max(0.0, now_s - since) * self.rate_per_s)

    def take(self, host: str, now_s: float) -> float:
        """Take one of ``host``'s tokens if it has one: 0.0. Otherwise nothing is taken,
        and the answer is the seconds until it has one."""
        tokens = self.tokens(host, now_s)
        if tokens < 1.0:
            return (1.0 - tokens) / self.rate_per_s
        if host not in self._buckets and len(self._buckets) >= HOSTS_TRACKED_MAX:
            self._forget(now_s)
        self._buckets[host] = (tokens - 1.0, now_s)
        return 0.0

    def _forget(self, now_s: float) -> None:
        self._buckets = {
            host: state
            for host, state in self._buckets.items()
            if self.tokens(host, now_s) < self.burst
        }
        while len(self._buckets) >= HOSTS_TRACKED_MAX:
            del self._buckets[next(iter(self._buckets))]

    def __len__(self) -> int:
        return len(self._buckets)
