"""Quota enforcement on a node: how long to hold a response back (``headwater.shared.quotas``).

``Quotas.hold(key, amount)`` charges the current caller's bucket for ``amount`` (bytes,
or 1 request) and sleeps for the delay the bucket's debt asks; it returns the delay in
milliseconds, which the response reports as ``throttle_time_ms``. Trusted callers
(other nodes forwarding a request they already charged) are never held. With no quota
in the metadata the check is one attribute read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from headwater.node.security.authorizer import Caller, current_caller
from headwater.raft.metadata.image import MetadataImage
from headwater.shared.quotas import Throttle, quota_for


def user_name(principal: str) -> str:
    """The user entity of a principal: "User:alice" -> "alice"."""
    return principal.partition(":")[2]


class Quotas:
    def __init__(
        self, image: Callable[[], MetadataImage], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.image = image
        self.clock = clock
        self.throttle = Throttle()

    @property
    def active(self) -> bool:
        """Is any quota set? (When not, callers skip measuring what to charge.)"""
        return bool(self.image().quotas)

    def delay_s(self, key: str, amount: float, caller: Caller | None = None) -> float:
        """Charge ``caller`` (the current call's by default) ``amount`` under quota
        ``key``; the seconds to hold its response."""
        quotas = self.image().quotas
        if not quotas:
            return 0.0
        who = caller if caller is not None else current_caller()
        if who.trusted:
            return 0.0
        found = quota_for(quotas, user_name(who.principal), who.client_id, key)
        if found is None:
            return 0.0
        bucket, rate = found
        return self.throttle.charge(key, bucket, rate, amount, self.clock())

    async def hold(self, *charges: tuple[str, float]) -> int:
        """Charge the current caller each (key, amount) and sleep for the longest delay
        they ask; that delay in ms (0, at once, with no quota set: ``delay_s`` looks)."""
        delay = max(self.delay_s(key, amount) for key, amount in charges)
        if delay <= 0:
            return 0
        await asyncio.sleep(delay)
        return round(delay * 1000)
