"""Log lines any peer can cause, at a bounded rate (pure but for the logger and the clock).

A line a stranger can trigger (a refused login, a refused inter-broker call, a dropped
Raft connection) must not let them flood the node's log: ``LogEvery`` writes at most one
line per interval and says in the next line how many it left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any


class LogEvery:
    """At most one line per ``interval_s`` through ``logger`` at ``level``; the lines left
    out meanwhile are counted, and the next line written ends with "(and N more since the
    last line)"."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float,
        level: int = logging.WARNING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.level = level
        self.clock = clock
        self.next_at = float("-inf")
        self.left_out = 0

    def log(self, message: str, *args: Any) -> bool:
        """Write the line unless one was written within the interval; True if written."""
        now = self.clock()
        if now < self.next_at:
            self.left_out += 1
            return False
        self.next_at = now + self.interval_s
        if self.left_out:
            message += " (and %d more since the last line)"
            args = (*args, self.left_out)
        self.left_out = 0
        self.logger.log(self.level, message, *args)
        return True
