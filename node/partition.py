"""One partition served by this node: its log, high watermark, and fetch waiters.

Single-node: the high watermark is the log end offset after each append (and, under
flush_policy ``ack``, after the fsync). Fetches that reach the high watermark wait on
``data_arrived`` until it moves, the wait ends, or the node closes.

Thread-safety: appends serialize on the log's lock; ``data_arrived`` guards waiters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from headwater.errors import ErrorCode, HeadwaterError
from headwater.log.api import AppendInfo, PartitionLog, ReadResult, offset_out_of_range


class Partition:
    def __init__(self, topic: str, index: int, log: PartitionLog, max_message_bytes: int) -> None:
        self.topic = topic
        self.index = index
        self.log = log
        self.max_message_bytes = max_message_bytes
        self.leader_epoch = 0
        self.data_arrived = threading.Condition()
        self._closed = False

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    def append(self, batch: bytes, now_ms: int) -> AppendInfo:
        info = self.log.append(batch, self.leader_epoch, now_ms)
        with self.data_arrived:
            self.data_arrived.notify_all()
        return info

    def check_fetch_offset(self, offset: int) -> None:
        start, end = self.log.log_start_offset, self.high_watermark
        if not start <= offset <= end:
            raise offset_out_of_range(offset, start, end)

    def wait_for_data(
        self, offset: int, max_wait_ms: int, still_wanted: Callable[[], bool]
    ) -> None:
        """Block until the high watermark passes ``offset``, ``max_wait_ms`` pass, the node
        closes, or ``still_wanted()`` turns false (the caller went away)."""
        deadline = time.monotonic() + max_wait_ms / 1000
        with self.data_arrived:
            while self.high_watermark <= offset and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not still_wanted():
                    return
                self.data_arrived.wait(min(remaining, 0.5))

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        return self.log.read(offset, max_bytes, upper_bound=self.high_watermark)

    def close(self) -> None:
        with self.data_arrived:
            self._closed = True
            self.data_arrived.notify_all()

    def check_open(self) -> None:
        if self._closed:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"partition {self.index} of topic {self.topic!r} was deleted or the node "
                "is stopping",
            )
