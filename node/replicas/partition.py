"""One partition replica hosted by this node: its log, role, high watermark, followers'
progress, and the requests waiting on it.

Roles come from the metadata (``become``). As **leader** it takes produce requests,
stamps its leader epoch on every batch, tracks each follower's log end offset (from
their fetches, ``on_follower_fetch``), and advances the high watermark to the minimum log
end offset over the ISR (``headwater.node.replicas.replication``). As **follower** it appends the
leader's batches unchanged (``append_replicated``) and takes the leader's high watermark,
capped by its own log end offset.

Consumers read only below the high watermark; a produce with acks=all is answered once
the high watermark passes its batch. The high watermark never goes back while the
process runs; it is checkpointed to ``high-watermark`` in the partition folder (every
second when it moved, and on close) and restored, capped by the log end offset, at start.

Concurrency: everything here runs on the node's asyncio event loop (``become`` too),
except the log write of fsync-before-ack appends (flush_policy ``ack``), which runs in a
worker thread (``asyncio.to_thread``) so that the fsync does not stall the loop, and
``maybe_checkpoint_high_watermark`` (the maintenance thread). Waiters are loop futures,
woken with ``call_soon_threadsafe``; ``_lock`` guards their sets. ``replica_listeners``
are called on the loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

from headwater.log import batch as batch_format
from headwater.log.api import AppendInfo, LogConfig, PartitionLog, ReadResult
from headwater.log.checkpoint_files import read_checked_offset, write_checked_offset
from headwater.node import clock
from headwater.node.replicas import replication
from headwater.raft.metadata.image import PartitionState
from headwater.shared.errors import ErrorCode, HeadwaterError

HIGH_WATERMARK_FILE: Final = "high-watermark"
_log = logging.getLogger(__name__)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Partition:
    def __init__(
        self,
        topic: str,
        index: int,
        log: PartitionLog,
        log_config: LogConfig,
        fsync_on_append: bool = False,
        topic_id: str = "",
        min_insync_replicas: int = 1,
        directory: Path | None = None,
    ) -> None:
        self.topic = topic
        self.topic_id = topic_id
        self.index = index
        self.log = log
        self.log_config = log_config
        """The topic's settings: what a produced batch is checked against."""
        self.damage = ""
        """What the node set aside from this replica when it opened it ("" when nothing;
        the log's own recovery cuts are in ``log.damage``)."""
        self.max_message_bytes = log_config.max_message_bytes
        self.fsync_on_append = fsync_on_append
        self.min_insync_replicas = min_insync_replicas
        self.directory = directory
        self.leader_epoch = -1
        self.is_leader = False
        self.state: PartitionState | None = None
        self.node_id = -1
        self.followers: dict[int, replication.FollowerProgress] = {}
        self.epoch_start_offset = 0
        # Followers the leader has asked the controller to add to the ISR: they count
        # towards the high watermark from the moment of asking (Kafka's "maximal ISR"), so
        # that none joins the ISR without the records below the high watermark.
        self._isr_joining: frozenset[int] = frozenset()
        # The topic allows electing a replica outside the ISR; then, and only then, may a
        # follower truncate below its high watermark (committed records are lost anyway).
        self.unclean_leader_election = False
        self._high_watermark = min(self._read_high_watermark(), log.log_end_offset)
        self._checkpointed_high_watermark = self._high_watermark
        self._last_checked = (self._high_watermark, self.leader_epoch)
        """(high watermark, leader epoch) when ``broken_promises`` last looked."""
        self._lock = threading.Lock()
        self._waiters: set[asyncio.Future[None]] = set()  # consumers: high watermark moved
        self._hw_waiters: list[tuple[int, asyncio.Future[None]]] = []  # acks=all
        # Replica fetch sessions, told of every append and role change.
        self.replica_listeners: set[Callable[[], None]] = set()
        self._closed = False

    # ------------------------------------------------------------------ role

    def become(
        self, state: PartitionState, node_id: int, now_ms: int, may_lead: bool = True
    ) -> None:
        """Take the role ``state`` gives ``node_id`` (leader or follower) and its epoch.

        ``may_lead`` False (the node is starting, fenced, or its lease ran out): a
        leadership the metadata gives this node is not taken; the replica neither serves
        nor follows until the node may lead again (a restarted node is a follower until
        the controller's current image names it leader)."""
        if (
            self.state is not None
            and state.leader_epoch == self.state.leader_epoch
            and state.partition_epoch < self.state.partition_epoch
        ):
            # An image older than the state the controller answered this leader with
            # (``take_committed_state``): the role may change, the state does not go back.
            state = self.state
        leads = state.leader == node_id and may_lead
        if state == self.state and node_id == self.node_id and leads == self.is_leader:
            return
        was_leader, old_epoch = self.is_leader, self.leader_epoch
        self.state = state
        self.node_id = node_id
        self.is_leader = leads
        self.leader_epoch = state.leader_epoch
        self._isr_joining = frozenset()  # an ISR change in flight is decided by now
        if self.is_leader and (not was_leader or old_epoch != state.leader_epoch):
            # A new leadership: followers' offsets are unknown until they fetch again, and
            # each has replica_lag_ms_max from now to do so before it leaves the ISR.
            self.followers = {
                r: replication.FollowerProgress(last_caught_up_ms=now_ms, last_fetch_ms=now_ms)
                for r in state.replicas
                if r != node_id
            }
            self.epoch_start_offset = self.log.log_end_offset
            _log.info(
                "leading %s-%d at epoch %d from offset %d",
                self.topic,
                self.index,
                state.leader_epoch,
                self.epoch_start_offset,
            )
        if was_leader and (not self.is_leader or old_epoch != state.leader_epoch):
            self._fail_hw_waiters(
                HeadwaterError(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    f"leadership of {self.topic}-{self.index} moved before the batch was "
                    "replicated; it may or may not be committed",
                )
            )
            self._wake_all()  # waiting fetches re-check the role and end
        if self.is_leader:
            self._maybe_advance_high_watermark()
        self._notify_replicas()

    def take_committed_state(self, state: PartitionState) -> bool:
        """The controller's answer to this leader's ISR change: the partition's committed
        state, taken at once rather than when this node's image shows it (a node whose
        metadata lags, or is cut off from the metadata quorum, must not be left with an
        ISR it can never correct). Taken only while this replica leads at the answer's
        leader epoch and the answer is newer than what it holds; True when taken.

        Invariants: the state only moves forward (partition epochs only grow), here and in
        ``become``; and the followers whose joining was asked for stop holding the high
        watermark only with a state newer than the one the request was made at, since
        the controller commits a request only at the partition epoch it was made at (see
        ``metadata.decisions.alter_partition_isr``): no copy of it can commit later."""
        current = self.state
        if (
            current is None
            or not self.is_leader
            or state.leader != self.node_id
            or state.leader_epoch != current.leader_epoch
            or state.partition_epoch <= current.partition_epoch
        ):
            return False
        self.state = state
        self._isr_joining = frozenset()
        self._maybe_advance_high_watermark()
        self._notify_replicas()
        return True

    @property
    def damage_report(self) -> str:
        """Everything the node set aside from this replica when it opened it: its folder
        (unreadable partition metadata) and its log's recovery cut ("" when nothing)."""
        return "; ".join(part for part in (self.damage, self.log.damage) if part)

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
    def isr(self) -> tuple[int, ...]:
        return self.state.isr if self.state else ()

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """The ISR plus the followers whose joining is in flight: what the high watermark
        waits for."""
        if not self._isr_joining:
            return self.isr
        return self.isr + tuple(sorted(self._isr_joining - set(self.isr)))

    def expect_isr(self, isr: tuple[int, ...] | None) -> None:
        """The leader asks the controller for ``isr`` (None: the request failed). From
        now until the metadata decides, followers it adds count towards the high
        watermark; followers it removes keep counting until the metadata removes them."""
        self._isr_joining = frozenset(isr or ()) - set(self.isr)

    # ------------------------------------------------------------------ high watermark

    def broken_promises(self) -> list[str]:
        """What this replica promises at every moment, checked against what it was when
        last asked (the seeded fault search asks after every step): the high watermark
        never above the log end, and never lower than before (but after an unclean
        election's truncation); the leader epoch never lower than before. Empty when all
        hold."""
        high_watermark, end, epoch = (
            self._high_watermark,
            self.log.log_end_offset,
            self.leader_epoch,
        )
        last_high_watermark, last_epoch = self._last_checked
        self._last_checked = (high_watermark, epoch)
        found = []
        if high_watermark > end:
            found.append(f"high watermark {high_watermark} above the log end {end}")
        if high_watermark < last_high_watermark and not self.unclean_leader_election:
            found.append(f"high watermark {high_watermark} below {last_high_watermark}")
        if epoch < last_epoch:
            found.append(f"leader epoch {epoch} below {last_epoch}")
        return [f"{self.topic}-{self.index}: {problem}" for problem in found]

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    def _set_high_watermark(self, value: int) -> None:
        if value <= self._high_watermark:
            return
        self._high_watermark = value
        self._wake_all()
        with self._lock:
            ready = [w for w in self._hw_waiters if w[0] <= value]
            self._hw_waiters = [w for w in self._hw_waiters if w[0] > value]
        for _, waiter in ready:
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def _maybe_advance_high_watermark(self) -> None:
        if not self.is_leader or self.state is None:
            return
        self._set_high_watermark(
            replication.high_watermark(
                self._high_watermark,
                self.node_id,
                self.log.log_end_offset,
                self.maximal_isr,
                self.followers,
            )
        )

    def follower_high_watermark(self, leader_high_watermark: int) -> None:
        """A follower learns the leader's high watermark (capped by its own log)."""
        self._set_high_watermark(min(leader_high_watermark, self.log.log_end_offset))

    def _read_high_watermark(self) -> int:
        """The checkpoint, or 0 when it is missing or damaged: a high watermark read too
        high would show uncommitted records as committed and forbid truncating a divergent
        tail, so a damaged one counts as unknown (the leader computes it again)."""
        if self.directory is None:
            return 0
        found = read_checked_offset(self.directory / HIGH_WATERMARK_FILE)
        return 0 if found is None else found

    def maybe_checkpoint_high_watermark(self) -> None:
        """Write the high watermark when it moved since the last write (any thread);
        raises the OSError when it cannot be written (the folder is failing)."""
        value = self._high_watermark
        if self.directory is None or value == self._checkpointed_high_watermark:
            return
        write_checked_offset(self.directory / HIGH_WATERMARK_FILE, value)
        self._checkpointed_high_watermark = value

    # ------------------------------------------------------------------ leader

    def check_min_insync(self) -> None:
        isr = self.isr
        if len(isr) < self.min_insync_replicas:
            raise HeadwaterError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"acks=all needs at least min_insync_replicas={self.min_insync_replicas} "
                f"in-sync replicas; partition {self.index} of {self.topic!r} has "
                f"{len(isr)} {list(isr)}",
            )

    def append_now(self, batch: bytes, now_ms: int, deadline_unix_ms: int = 0) -> AppendInfo:
        """Append (the leader's epoch is stamped on the batch). On the loop."""
        info = self._append_before(batch, self.leader_epoch, now_ms, deadline_unix_ms)
        self._after_append()
        return info

    async def append(self, batch: bytes, now_ms: int, deadline_unix_ms: int = 0) -> AppendInfo:
        """Append; an fsync-before-ack append runs in a worker thread, off the loop.
        Nothing is appended once ``deadline_unix_ms`` (the client's, 0: none) has passed
        on this node's clock: REQUEST_TIMED_OUT instead (see ``_append_before``)."""
        if self.fsync_on_append:
            info = await asyncio.to_thread(
                self._append_before, batch, self.leader_epoch, now_ms, deadline_unix_ms
            )
            self._after_append()
            return info
        return self.append_now(batch, now_ms, deadline_unix_ms)

    def _append_before(
        self, batch: bytes, leader_epoch: int, now_ms: int, deadline_unix_ms: int
    ) -> AppendInfo:
        """The log append, checked against the request's deadline at the last moment: a
        request the client stopped waiting for is never appended, so the client's retry,
        sent after the deadline, can never be overtaken by it (the check and the append
        are one step of the thread that runs them)."""
        if deadline_unix_ms:
            now_unix_ms = clock.now_ms()
            if now_unix_ms >= deadline_unix_ms:
                raise HeadwaterError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"the request's deadline passed {now_unix_ms - deadline_unix_ms} ms ago "
                    f"(deadline_unix_ms {deadline_unix_ms}) before {self.topic}-{self.index} "
                    "could append it; nothing was appended",
                )
        return self.log.append(batch, leader_epoch, now_ms)

    def _after_append(self) -> None:
        self._maybe_advance_high_watermark()
        self._notify_replicas()

    async def wait_for_replication(self, end_offset: int, timeout_s: float) -> None:
        """Return once the high watermark reaches ``end_offset`` (acks=all). Raises
        REQUEST_TIMED_OUT after ``timeout_s``, NOT_LEADER_OR_FOLLOWER if leadership moves,
        NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR fell below min_insync_replicas."""
        if self._high_watermark < end_offset:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            with self._lock:
                self._hw_waiters.append((end_offset, waiter))
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter
            except TimeoutError:
                raise HeadwaterError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"the in-sync replicas {list(self.isr)} did not all reach offset "
                    f"{end_offset} within {timeout_s:g} s (high watermark "
                    f"{self._high_watermark}); the batch may still be committed",
                ) from None
            finally:
                with self._lock:
                    self._hw_waiters = [w for w in self._hw_waiters if w[1] is not waiter]
        shrank = self.committed_ack_error()
        if shrank is not None:
            raise shrank

    def committed_ack_error(self) -> HeadwaterError | None:
        """The answer to an acks=all batch the high watermark has passed:
        NOT_ENOUGH_REPLICAS_AFTER_APPEND when the ISR is below ``min_insync_replicas``
        (the batch is committed, on fewer copies than asked), else None (acknowledged)."""
        if len(self.isr) >= self.min_insync_replicas:
            return None
        return HeadwaterError(
            ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            f"the batch is committed but the ISR {list(self.isr)} shrank below "
            f"min_insync_replicas={self.min_insync_replicas}",
        )

    def _fail_hw_waiters(self, error: HeadwaterError) -> None:
        with self._lock:
            waiters, self._hw_waiters = self._hw_waiters, []
        for _, waiter in waiters:
            waiter.get_loop().call_soon_threadsafe(_fail, waiter, error)

    def on_follower_fetch(self, replica_id: int, fetch_offset: int, now_ms: int) -> None:
        """A follower fetched from ``fetch_offset`` (so it has everything below it)."""
        previous = self.followers.get(replica_id, replication.FollowerProgress())
        self.followers[replica_id] = replication.on_fetch(
            previous, fetch_offset, self.log.log_end_offset, now_ms
        )
        self._maybe_advance_high_watermark()

    def _notify_replicas(self) -> None:
        for listener in list(self.replica_listeners):
            listener()

    # ------------------------------------------------------------------ follower

    def check_following(self, leader_id: int, leader_epoch: int) -> None:
        """Raise FENCED_LEADER_EPOCH unless this replica follows ``leader_id`` at
        ``leader_epoch`` right now. Every answer a follower acts on (a truncation point,
        fetched records) passes this check after the await that brought it, on the loop,
        so an answer sent by a leader the metadata has since replaced (a paused node that
        wakes and answers a request from before its pause) is dropped, never applied."""
        state = self.state
        if (
            self._closed
            or self.is_leader
            or state is None
            or state.leader != leader_id
            or state.leader_epoch != leader_epoch
        ):
            now = "none" if state is None else f"node {state.leader} at epoch {state.leader_epoch}"
            raise HeadwaterError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"{self.topic}-{self.index}: an answer from node {leader_id} at leader epoch "
                f"{leader_epoch} arrived after the leadership moved on (now: "
                f"{'this node' if self.is_leader else now})",
            )

    def truncate_as_follower(
        self, leader_id: int, leader_epoch: int, offset: int, now_ms: int
    ) -> int:
        """Cut the log to ``offset`` on the word of ``leader_id`` at ``leader_epoch``;
        return the new log end offset.

        Invariant: a replica never truncates below its high watermark (records below it
        are committed, and every leader of a later epoch holds them). An answer that asks
        for it is refused with KAFKA_STORAGE_ERROR and nothing is cut, unless the topic
        allows unclean leader election, where a leader may lack committed records: then
        the high watermark comes down with the log end (it is never above it)."""
        self.check_following(leader_id, leader_epoch)
        if offset < self._high_watermark and not self.unclean_leader_election:
            raise HeadwaterError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"{self.topic}-{self.index}: node {leader_id} (leader epoch {leader_epoch}) "
                f"asks to truncate to {offset}, below this replica's high watermark "
                f"{self._high_watermark}; refused (committed records are never cut)",
            )
        end = self.log.truncate_to(offset, now_ms)
        # Lower only after an unclean election, whose leader lacked committed records.
        self._high_watermark = min(self._high_watermark, end)
        return end

    def append_replicated(self, data: bytes, now_ms: int) -> int:
        """Append the leader's batches (``data``: whole batches, concatenated) unchanged;
        return the new log end offset."""
        position = 0
        view = memoryview(data)
        while position < len(data):
            header = batch_format.read_header(view, position)
            self.log.append_replicated(view[position : position + header.total_size], now_ms)
            position += header.total_size
        return self.log.log_end_offset

    # ------------------------------------------------------------------ consumers

    def _wake_all(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def check_fetch_offset(self, offset: int) -> None:
        """Consumers may ask for [log start, log end]; they read below the high watermark
        (an offset between the two waits, as after a leader change)."""
        start = self.log.log_start_offset
        end = max(self.log.log_end_offset, self._high_watermark)
        if not start <= offset <= end:
            raise HeadwaterError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} is outside the log; valid range is [{start}, {end}] (log "
                f"start offset to log end offset; records are readable below the high "
                f"watermark {self._high_watermark})",
            )

    async def wait_for_data(self, offset: int, wait_s: float) -> None:
        """Return once the high watermark passes ``offset``, ``wait_s`` pass, or the
        partition closes or changes role (whichever comes first)."""
        if wait_s <= 0 or self._high_watermark > offset or self._closed:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiters.add(waiter)
        try:
            if self._high_watermark > offset or self._closed:  # moved while registering
                return
            async with asyncio.timeout(wait_s):  # no wrapper task, unlike asyncio.wait_for
                await waiter
        except TimeoutError:
            return
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    def read(self, offset: int, max_bytes: int) -> ReadResult:
        """Consumer read: whole batches from ``offset``, none at or past the high watermark."""
        return self.log.read(offset, max_bytes, upper_bound=self._high_watermark)

    def read_for_replica(self, offset: int, max_bytes: int) -> ReadResult:
        """Follower read: whole batches from ``offset`` up to the log end."""
        return self.log.read(offset, max_bytes)

    def close(self) -> None:
        self._closed = True
        self._wake_all()
        self._fail_hw_waiters(
            HeadwaterError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"partition {self.index} of {self.topic!r} was closed on this node",
            )
        )
        self._notify_replicas()
        try:
            self.maybe_checkpoint_high_watermark()
        except OSError as exc:  # the last checkpoint stays: lower, so never unsafe
            _log.warning("cannot checkpoint the high watermark of %s: %s", self.directory, exc)

    def check_open(self) -> None:
        if self._closed:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"partition {self.index} of topic {self.topic!r} was deleted or the node "
                "is stopping",
            )


def _fail(waiter: asyncio.Future[None], error: HeadwaterError) -> None:
    if not waiter.done():
        waiter.set_exception(error)
