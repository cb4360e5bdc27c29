"""The node's clock: wall-clock milliseconds since the Unix epoch, the unit of every time
the node writes or compares with another node's or a client's (record and batch
timestamps, retention, request deadlines, group sessions, signed calls between nodes).

Taken from ``time.time_ns`` in integers: float seconds (``time.time() * 1000``) lose a
millisecond for present-day values. Durations measured within one process use
``time.monotonic`` instead, which a clock step does not move."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch, now."""
    return time.time_ns() // 1_000_000
