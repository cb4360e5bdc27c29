"""One partition replica hosted by this node: its log, role, high watermark, and fetch
waiters.

The role comes from the metadata (``become``): the leader takes produce and fetch
requests; a follower refuses them with NOT_LEADER_OR_FOLLOWER. The high watermark is the
log end offset after each append (and, under flush_policy ``ack``, after the fsync).
Fetches that reach the high watermark wait for the next append, the end of their wait, or
the partition closing.

Concurrency: the node's handlers run on one asyncio event loop. Appends run on it too,
except under flush_policy ``ack``, whose fsync would stall every other call: those run in
a worker thread (``asyncio.to_thread``). Waiters are loop futures, woken thread-safely
(``call_soon_threadsafe``) by whichever thread appended; ``_lock`` guards their set.
"""

from __future__ import annotations

import asyncio
import threading

from headwater.errors import ErrorCode, HeadwaterError
from headwater.log.api import AppendInfo, PartitionLog, ReadResult, offset_out_of_range
from headwater.raft.image import PartitionState


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        log: PartitionLog,
        max_message_bytes: int,
        fsync_on_append: bool = False,
        topic_id: str = "",
    ) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self.index = index
        self.log = log
        self.max_message_bytes = max_message_bytes
        self.fsync_on_append = fsync_on_append
        self.leader_epoch = 0
        self.is_leader = False
        self.state: PartitionState | None = None
        self._lock = threading.Lock()
        self._waiters: set[asyncio.Future[None]] = set()
        self._closed = False

    def become(self, state: PartitionState, node_id: int) -> None:
        """Take the role ``state`` gives ``node_id`` (leader or follower) and its epoch."""
        was_leader, old_epoch = self.is_leader, self.leader_epoch
        self.state = state
        self.leader_epoch = state.leader_epoch
        self.is_leader = state.leader == node_id
        if was_leader and (not self.is_leader or old_epoch != self.leader_epoch):
            self._wake_all()  # waiting fetches re-check the role and end

    def check_leader(self) -> None:
        """Raise NOT_LEADER_OR_FOLLOWER unless this replica leads the partition."""
        if not self.is_leader:
            leader = self.state.leader if self.state else -1
            raise HeadwaterError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"this node does not lead partition {self.index} of {self.topic!r} "
                f"(leader: {'none' if leader < 0 else f'node {leader}'}); refresh metadata",
            )

    @property
    def high_watermark(self) -> int:
        return self.log.log_end_offset

    def append_now(self, batch: bytes, now_ms: int) -> AppendInfo:
        """Append on the calling thread and wake the waiting fetches."""
        info = self.log.append(batch, self.leader_epoch, now_ms)
        self._wake_all()
        return info

    async def append(self, batch: bytes, now_ms: int) -> AppendInfo:
        """Append; an fsync-before-ack append runs in a worker thread, off the loop."""
        if self.fsync_on_append:
            return await asyncio.to_thread(self.append_now, batch, now_ms)
        return self.append_now(batch, now_ms)

    def _wake_all(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def check_fetch_offset(self, offset: int) -> None:
        start, end = self.log.log_start_offset, self.high_watermark
        if not start <= offset <= end:
            raise offset_out_of_range(offset, start, end)

    async def wait_for_data(self, offset: int, wait_s: float) -> None:
        """Return once the high watermark passes ``offset``, ``wait_s`` pass, or the
        partition closes (whichever comes first)."""
        if wait_s <= 0 or self.high_watermark > offset or self._closed:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiters.add(waiter)
        try:
            if self.high_watermark > offset or self._closed:  # appended while registering
                return
            async with asyncio.timeout(wait_s):  # no wrapper task, unlike asyncio.wait_for
                await waiter
        except TimeoutError:
            return
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        return self.log.read(offset, max_bytes, upper_bound=self.high_watermark)

    def close(self) -> None:
        self._closed = True
        self._wake_all()

    def check_open(self) -> None:
        if self._closed:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"partition {self.index} of topic {self.topic!r} was deleted or the node "
                "is stopping",
            )
