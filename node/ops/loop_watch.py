"""How long the node's event loop is held at a time: a task that asks to wake every
``TICK_S`` and measures how late it wakes.

Heartbeats, leases, replication and every client share one event loop, so a piece of
work that holds it for long (a huge request decoded in one go, an answer built for
10,000 topics) delays them all; a broker whose loop is held for its session timeout is
fenced. The watch measures that from the inside: each wake-up's lateness is how long the
loop was held by something else (to within one tick: a stall that begins just after a
wake-up is seen up to ``TICK_S`` shorter). Lateness from ``STALL_REPORTED_S`` on is
counted (``stalls``), the longest seen kept (``longest_s``), each one observed in the
``headwater_event_loop_stall_seconds`` histogram when the node serves metrics, and one
from ``STALL_LOGGED_S`` on is logged at WARNING, at most one line per 10 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Final

from headwater.shared.log_limits import LogEvery

_log = logging.getLogger(__name__)
_stall_lines = LogEvery(_log, 10.0)
TICK_S: Final = 0.01
STALL_REPORTED_S: Final = 0.005
STALL_LOGGED_S: Final = 0.5


class LoopWatch:
    """Measures the event loop's stalls while ``start``ed (see the module doc)."""

    def __init__(self, observe: Callable[[float], None] | None = None) -> None:
        """``observe(seconds)``: called with each stall from ``STALL_REPORTED_S`` on."""
        self.observe = observe
        self.stalls = 0
        self.longest_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + TICK_S
            await asyncio.sleep(TICK_S)
            self.record(loop.time() - due)

    def record(self, late_s: float) -> None:
        """One wake-up ``late_s`` seconds after it was due."""
        if late_s < STALL_REPORTED_S:
            return
        self.stalls += 1
        self.longest_s = max(self.longest_s, late_s)
        if self.observe is not None:
            self.observe(late_s)
        if late_s >= STALL_LOGGED_S:
            _stall_lines.log("the event loop was held for %.0f ms", late_s * 1000)
