"""Replication of partition logs between nodes: the leader's side of fetch sessions, the
followers' fetchers, and ISR maintenance.

**Leader side** (``ReplicaService``, the internal ``headwater.v1.Replica`` service). Each
follower keeps one bidirectional ``Fetch`` stream (a *session*) per leader. A request
adds or updates partitions with the follower's log end offset, which the leader records
(``Partition.on_follower_fetch``: follower progress, then the high watermark). The leader
answers each request once: as soon as a session partition has records past the
follower's offset, or after ``max_wait_ms``, with the stored batches, byte for byte, and
each partition's high watermark (news of a high watermark alone waits up to
``HW_NEWS_LINGER_S`` for data to travel with). The follower appends, then sends its new
offsets: the leader learns that a follower *has* a batch only from the next request, never
from having sent it. ``OffsetForLeaderEpoch`` tells a follower where its latest epoch ends
in the leader's log.

**Follower side** (``LeaderFetcher``, one per leader node). When a replica becomes a
follower, or its leader epoch changes, it asks the leader where its own latest epoch ends
and truncates its log there (a leader's unreplicated tail never survives a leader change),
moves to the leader's log start if it is behind it, and then joins the session.

**ISR maintenance** (``ReplicaManager.tick``, every ``ISR_CHECK_S``). A leader asks the
active controller (``Controller.AlterPartition``) to drop followers that have lagged for
``replica_lag_ms_max`` and to add back followers that have caught up
(``headwater.node.replication``). The controller's answer is the partition's committed
state, which the leader takes at once (``Partition.take_committed_state``), without waiting
for its own metadata to show it: a node whose image lags, or stands still while it is cut
off from the metadata quorum, still takes back followers that caught up. Whether a
follower may join (is it a live broker?) is the controller's decision: the leader also
proposes a follower its image shows fenced once that follower has fetched since the image
first showed it so (``_may_join``). One request per partition is in flight at a time.

Everything here runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import grpc

from headwater.cancellation import task_is_stopping
from headwater.config import NodeConfig
from headwater.errors import ErrorCode, HeadwaterError
from headwater.grpc_errors import from_rpc_error
from headwater.node import replication
from headwater.node.cluster_state import ClusterState
from headwater.node.log_manager import LogManager, now_ms
from headwater.node.partition import Partition
from headwater.node.peers import Peers, peer_error
from headwater.node.service import rpc_handler
from headwater.node.tasks import cancel_and_wait
from headwater.raft.image import MetadataImage, PartitionState
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

T = TypeVar("T")
ISR_CHECK_S: Final = 0.25
RETRY_S: Final = 0.2
# A follower gives up on a silent leader after this much more than the fetch wait, and on
# an OffsetForLeaderEpoch after CALL_TIMEOUT_S: a leader that died mid-call must not hold
# its partitions' replication for the 30 s of a general request timeout.
SILENCE_EXTRA_S: Final = 3.0
CALL_TIMEOUT_S: Final = 2.0
# Each round of OffsetForLeaderEpoch moves to a strictly older epoch; a bounded number.
TRUNCATION_ROUNDS_MAX: Final = 64
ALTER_RETRY_S: Final = 2.0
# Answers to AlterPartition that mean the change was not, and will not be, committed.
# (A timeout, an unreachable controller or NOT_CONTROLLER leaves the outcome unknown: a
# controller that lost its term mid-proposal may still see it committed by the next.)
ISR_CHANGE_REFUSALS: Final = frozenset(
    {
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.STALE_BROKER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
)
# High watermark news without data waits this long for data to travel with: under load
# every data response carries the news, and a follower no longer costs two round trips
# per batch (data, then the high watermark its own next request moved).
HW_NEWS_LINGER_S: Final = 0.02
# How often a fetch session counts as a fetch of its partitions the follower did not
# report (see ReplicaService._refresh_session); well within replica_lag_ms_max.
SESSION_REFRESH_MS: Final = 1000
STREAM_END: Final[object] = grpc.aio.EOF  # type: ignore[attr-defined]
_log = logging.getLogger(__name__)
Key = tuple[str, int]


# --------------------------------------------------------------------------- leader side


def _leader_partition(
    logs: LogManager, topic: str, index: int, leader_epoch: int, replica_id: int
) -> Partition:
    """The local leader replica that ``replica_id`` may fetch at ``leader_epoch``."""
    partition = logs.partition(topic, index)
    if partition is None or not partition.is_leader or partition.state is None:
        raise HeadwaterError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER, f"this node does not lead {topic}-{index}"
        )
    if leader_epoch < partition.leader_epoch:
        raise HeadwaterError(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"{topic}-{index}: leader epoch {leader_epoch} is older than {partition.leader_epoch}",
        )
    if leader_epoch > partition.leader_epoch:
        raise HeadwaterError(
            ErrorCode.UNKNOWN_LEADER_EPOCH,
            f"{topic}-{index}: leader epoch {leader_epoch} is newer than {partition.leader_epoch}",
        )
    if replica_id not in partition.state.replicas:
        raise HeadwaterError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"node {replica_id} is not a replica of {topic}-{index}",
        )
    return partition


@dataclass(slots=True)
class _SessionPartition:
    partition: Partition
    leader_epoch: int
    fetch_offset: int
    sent_high_watermark: int = -1


class ReplicaService(pb_grpc.ReplicaServicer):
    """The leader's side of replication. Every request is refused with
    NOT_LEADER_OR_FOLLOWER while this node may not lead (``may_lead``: starting, fenced,
    or its leadership lease ran out), so a deposed leader that wakes up answers with a
    fencing error, never with data or epochs."""

    def __init__(
        self,
        config: NodeConfig,
        logs: LogManager,
        state: ClusterState,
        may_lead: Callable[[], bool],
    ) -> None:
        self.config = config
        self.logs = logs
        self.state = state
        self.may_lead = may_lead

    def _stale_registration(self, replica_id: int, broker_epoch: int) -> HeadwaterError | None:
        """STALE_BROKER_EPOCH unless ``broker_epoch`` is ``replica_id``'s current
        registration in this node's image (None when it is): a fetch from an old process of
        that node (or from anything that is not its current registration) never counts as
        the replica's progress, so it can neither hold up nor advance the high watermark,
        nor bring the replica into the ISR. (Joining the ISR also needs the controller,
        which admits only registered, unfenced brokers.)"""
        broker = self.state.image.brokers.get(replica_id)
        if broker is not None and broker.broker_epoch == broker_epoch:
            return None
        current = "none" if broker is None else str(broker.broker_epoch)
        return HeadwaterError(
            ErrorCode.STALE_BROKER_EPOCH,
            f"node {replica_id} fetched with broker epoch {broker_epoch}; its current "
            f"registration here has {current}",
        )

    def _leader_partition(
        self, topic: str, index: int, leader_epoch: int, replica_id: int
    ) -> Partition:
        if not self.may_lead():
            raise HeadwaterError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"node {self.config.node_id} may not act as a leader now (starting, fenced, "
                f"or no recent heartbeat answer from the controller); {topic}-{index}",
            )
        return _leader_partition(self.logs, topic, index, leader_epoch, replica_id)

    @rpc_handler
    async def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetForLeaderEpochResponse:
        partition = self._leader_partition(
            request.topic,
            request.partition,
            request.current_leader_epoch,
            request.replica_id,
        )
        epoch, end_offset = partition.log.end_offset_for_epoch(request.leader_epoch)
        return pb.OffsetForLeaderEpochResponse(
            leader_epoch=epoch,
            end_offset=end_offset,
            log_start_offset=partition.log.log_start_offset,
        )

    async def Fetch(
        self,
        requests: AsyncIterator[pb.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        session: dict[Key, _SessionPartition] = {}
        refreshed_ms = 0
        try:
            async for request in requests:
                errors = self._update_session(session, request, wake.set)
                now_wall = now_ms()
                if not errors and now_wall - refreshed_ms >= SESSION_REFRESH_MS:
                    refreshed_ms = now_wall
                    self._refresh_session(session, request, now_wall)
                if errors:
                    yield pb.ReplicaFetchResponse(partitions=errors)
                    continue
                wait_ms = min(max(request.max_wait_ms, 0), self.config.replica_fetch_wait_ms_max)
                budget = min(max(request.max_bytes, 1), self.config.replica_fetch_bytes_max)
                now = loop.time()
                deadline = now + wait_ms / 1000
                news_due = min(deadline, now + HW_NEWS_LINGER_S)
                while True:
                    wake.clear()
                    response = pb.ReplicaFetchResponse()
                    now = loop.time()
                    news_pending = self._collect(
                        session, budget, wake.set, response, with_news=now >= news_due
                    )
                    if response.partitions or now >= deadline:
                        break
                    wait_s = (news_due if news_pending else deadline) - now
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_s):
                            await wake.wait()
                yield response
        finally:
            for entry in session.values():
                entry.partition.replica_listeners.discard(wake.set)

    def _update_session(
        self,
        session: dict[Key, _SessionPartition],
        request: pb.ReplicaFetchRequest,
        listener: Callable[[], None],
    ) -> list[pb.ReplicaFetchData]:
        errors = []
        now = now_ms()
        for ref in request.removed:
            gone = session.pop((ref.topic, ref.partition), None)
            if gone is not None:
                gone.partition.replica_listeners.discard(listener)
        # The same for every position of the request: checked once.
        stale = self._stale_registration(request.replica_id, request.broker_epoch)
        for position in request.positions:
            key = (position.topic, position.partition)
            error = stale
            if error is None:
                try:
                    partition = self._leader_partition(
                        position.topic,
                        position.partition,
                        position.leader_epoch,
                        request.replica_id,
                    )
                except HeadwaterError as refused:
                    error = refused
                else:
                    if position.fetch_offset > partition.log.log_end_offset:
                        # A replica cannot hold records its leader does not have: it must
                        # truncate (OffsetForLeaderEpoch) before it fetches, and never
                        # counts as caught up.
                        error = HeadwaterError(
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"fetch offset {position.fetch_offset} is past the leader's log "
                            f"end offset {partition.log.log_end_offset}; truncate first",
                        )
            if error is not None:
                old = session.pop(key, None)
                if old is not None:
                    old.partition.replica_listeners.discard(listener)
                errors.append(_error_data(position.topic, position.partition, error))
                continue
            partition.on_follower_fetch(request.replica_id, position.fetch_offset, now)
            old = session.get(key)
            if old is not None and old.partition is not partition:
                old.partition.replica_listeners.discard(listener)
            partition.replica_listeners.add(listener)
            session[key] = _SessionPartition(
                partition,
                position.leader_epoch,
                position.fetch_offset,
                old.sent_high_watermark if old is not None else -1,
            )
        return errors

    @staticmethod
    def _refresh_session(
        session: dict[Key, _SessionPartition], request: pb.ReplicaFetchRequest, now: int
    ) -> None:
        """Count a request as a fetch of every partition of the session at the position
        the follower last reported (a follower reports a partition only when its position
        moves, so silence means "still there"). Without this, a follower that caught up and
        then sat idle had "not fetched" for longer than ``replica_lag_ms_max`` and was
        never proposed for the ISR again: an idle partition whose acks=all writes are
        refused below ``min_insync_replicas`` stayed so until a leader change."""
        reported = {(p.topic, p.partition) for p in request.positions}
        for key, entry in session.items():
            partition = entry.partition
            if (
                key not in reported
                and partition.is_leader
                and partition.leader_epoch == entry.leader_epoch
            ):
                partition.on_follower_fetch(request.replica_id, entry.fetch_offset, now)

    def _collect(
        self,
        session: dict[Key, _SessionPartition],
        budget: int,
        listener: Callable[[], None],
        response: pb.ReplicaFetchResponse,
        with_news: bool,
    ) -> bool:
        """Add to ``response`` the data of the session (up to ``budget`` bytes, at least
        one batch) with each partition's high watermark; partitions that can no longer be
        served leave it with an error. High watermark news alone (no data) is added only
        ``with_news``; returns whether some was left out. (Entries are added in place:
        passing built submessages to a constructor makes upb serialize and parse each one
        again, records included.)"""
        news_pending = False
        for key, entry in list(session.items()):
            partition = entry.partition
            try:
                partition.check_open()
                if not partition.is_leader or partition.leader_epoch != entry.leader_epoch:
                    raise HeadwaterError(
                        ErrorCode.FENCED_LEADER_EPOCH,
                        f"{key[0]}-{key[1]}: leadership moved on (epoch {partition.leader_epoch})",
                    )
                log = partition.log
                if entry.fetch_offset < log.log_end_offset and budget > 0:
                    result = partition.read_for_replica(entry.fetch_offset, budget)
                    budget -= len(result.data)
                elif entry.sent_high_watermark == partition.high_watermark:
                    continue
                elif with_news:
                    result = None
                else:
                    news_pending = True
                    continue
            except HeadwaterError as error:
                del session[key]
                partition.replica_listeners.discard(listener)
                response.partitions.append(_error_data(key[0], key[1], error))
                continue
            entry.sent_high_watermark = partition.high_watermark
            response.partitions.add(
                topic=key[0],
                partition=key[1],
                records=result.data if result is not None else b"",
                high_watermark=partition.high_watermark,
                log_start_offset=log.log_start_offset,
                log_end_offset=log.log_end_offset,
            )
        return news_pending


def _error_data(topic: str, partition: int, error: HeadwaterError) -> pb.ReplicaFetchData:
    return pb.ReplicaFetchData(
        topic=topic,
        partition=partition,
        error_code=pb.ErrorCode.ValueType(error.code),
        error_message=error.message,
    )


# --------------------------------------------------------------------------- follower side


@dataclass(slots=True)
class _Following:
    partition: Partition
    leader_epoch: int
    ready: bool = False  # truncated and in the session
    retry_at: float = 0.0


@dataclass(slots=True)
class LeaderFetcher:
    """Copies the partitions that ``leader_id`` leads into this node's replicas."""

    manager: ReplicaManager
    leader_id: int
    address: str
    following: dict[Key, _Following] = field(default_factory=dict)
    removed: set[Key] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            _log.error("replica fetcher for node %d stopped: %r", self.leader_id, task.exception())
        elif task.cancelled():
            _log.debug("replica fetcher for node %d was cancelled", self.leader_id)

    async def stop(self) -> None:
        await cancel_and_wait(self.task)

    def follow(self, partition: Partition, leader_epoch: int) -> None:
        key = (partition.topic, partition.index)
        current = self.following.get(key)
        if (
            current is not None
            and current.partition is partition
            and current.leader_epoch == leader_epoch
        ):
            return
        self.following[key] = _Following(partition, leader_epoch)
        self.removed.discard(key)
        self.changed.set()

    def unfollow(self, key: Key) -> None:
        if self.following.pop(key, None) is not None:
            self.removed.add(key)
            self.changed.set()

    async def _run(self) -> None:
        while True:
            if not self.following:
                self.changed.clear()
                await self.changed.wait()
                continue
            try:
                await self._session()
            except grpc.RpcError as error:
                _log.debug(
                    "replica fetch from node %d: %s",
                    self.leader_id,
                    peer_error(error, self.address),
                )
            except HeadwaterError as error:
                _log.debug("replica fetch from node %d: %s", self.leader_id, error)
            except asyncio.InvalidStateError as error:  # the call ended while writing to it
                _log.debug("replica fetch from node %d: %s", self.leader_id, error)
            except asyncio.CancelledError:
                if task_is_stopping():
                    raise  # this fetcher is being stopped
                # grpc.aio raises CancelledError for a call that was cancelled under it.
                _log.debug("replica fetch from node %d: the call was cancelled", self.leader_id)
            except Exception:
                # A fetcher must outlive any one failure, or its partitions stop replicating.
                _log.exception("replica fetch from node %d failed", self.leader_id)
            for entry in self.following.values():
                entry.ready = False
            await asyncio.sleep(RETRY_S)

    async def _session(self) -> None:
        stub = self.manager.peers.replica(self.address)
        # grpc-stubs lacks the no-iterator form (write/read) of a stream-stream call.
        call = stub.Fetch()  # type: ignore[call-arg]
        silence_s = self.manager.config.replica_fetch_wait_ms_max / 1000 + SILENCE_EXTRA_S
        try:
            positions = await self._prepare_new()
            await self._within(call, silence_s, call.write(self._request(positions, True)))
            while True:
                response = await self._within(call, silence_s, call.read())
                if response is STREAM_END:
                    return
                assert isinstance(response, pb.ReplicaFetchResponse)
                positions = await self._apply(response)
                positions += await self._prepare_new()
                await self._within(call, silence_s, call.write(self._request(positions, True)))
        finally:
            call.cancel()

    async def _within(self, call: Any, seconds: float, step: Awaitable[T]) -> T:
        """Await one read or write of ``call``, cancelling the call if the leader stays
        silent for ``seconds``. (Cancelling the awaiting task is not enough: a grpc.aio
        read can outlive it.)"""
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            call.cancel()

        watchdog = asyncio.get_running_loop().call_later(seconds, expire)
        try:
            return await step
        except asyncio.CancelledError:
            if task_is_stopping():
                raise  # this fetcher is being stopped
            # grpc.aio raises CancelledError for a call that was cancelled under it.
            reason = "went silent" if fired else "cancelled the fetch"
            raise HeadwaterError(
                ErrorCode.REQUEST_TIMED_OUT, f"node {self.leader_id} {reason}"
            ) from None
        finally:
            watchdog.cancel()

    def _request(
        self, positions: list[pb.ReplicaFetchPosition], clear_removed: bool
    ) -> pb.ReplicaFetchRequest:
        removed = [pb.ReplicaPartition(topic=t, partition=p) for t, p in sorted(self.removed)]
        if clear_removed:
            self.removed.clear()
        config = self.manager.config
        return pb.ReplicaFetchRequest(
            replica_id=config.node_id,
            broker_epoch=self.manager.broker_epoch(),
            positions=positions,
            removed=removed,
            max_wait_ms=config.replica_fetch_wait_ms_max,
            max_bytes=config.replica_fetch_bytes_max,
        )

    async def _prepare_new(self) -> list[pb.ReplicaFetchPosition]:
        """Truncate every partition not yet in the session, all at once (a leader that
        went silent costs one CALL_TIMEOUT_S, not one per partition), and return the
        positions of those that are ready."""
        loop = asyncio.get_running_loop()
        waiting = [
            (key, entry)
            for key, entry in self.following.items()
            if not entry.ready and loop.time() >= entry.retry_at
        ]
        if not waiting:
            return []
        outcomes = await asyncio.gather(
            *(self._truncate(entry) for _key, entry in waiting), return_exceptions=True
        )
        positions = []
        for (key, entry), outcome in zip(waiting, outcomes, strict=True):
            if isinstance(outcome, grpc.RpcError | HeadwaterError):
                error = (
                    peer_error(outcome, self.address)
                    if isinstance(outcome, grpc.RpcError)
                    else outcome
                )
                _log.debug("cannot start following %s-%d: %s", key[0], key[1], error)
                entry.retry_at = loop.time() + RETRY_S
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            if self.following.get(key) is not entry:
                continue  # unfollowed or re-followed meanwhile
            entry.ready = True
            positions.append(self._position(entry))
        return positions

    def _position(self, entry: _Following) -> pb.ReplicaFetchPosition:
        return pb.ReplicaFetchPosition(
            topic=entry.partition.topic,
            partition=entry.partition.index,
            leader_epoch=entry.leader_epoch,
            fetch_offset=entry.partition.log.log_end_offset,
        )

    async def _truncate(self, entry: _Following) -> None:
        """Cut the replica's log to where it agrees with the leader's (KIP-101/279, see
        ``replication.truncation_step``), asking as many rounds as the rule needs.

        Each answer is acted on only after ``Partition.check_following`` confirms, on the
        loop and after the await that brought it, that this replica still follows this
        leader at this epoch: an answer to a request sent before the leadership moved
        (say, to a paused leader that answers when it wakes) is dropped. The partition
        refuses a cut below its high watermark (``truncate_as_follower``)."""
        partition = entry.partition
        log = partition.log
        key = (partition.topic, partition.index)
        response = pb.OffsetForLeaderEpochResponse(log_start_offset=log.log_start_offset)
        for _ in range(TRUNCATION_ROUNDS_MAX):
            asked = log.latest_epoch
            response = await self.manager.peers.replica(self.address).OffsetForLeaderEpoch(
                pb.OffsetForLeaderEpochRequest(
                    topic=partition.topic,
                    partition=partition.index,
                    replica_id=self.manager.config.node_id,
                    current_leader_epoch=entry.leader_epoch,
                    leader_epoch=asked,
                ),
                timeout=CALL_TIMEOUT_S,
            )
            self._check_current(key, entry)
            if response.leader_epoch > asked:
                raise HeadwaterError(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"{key[0]}-{key[1]}: node {self.leader_id} answered epoch "
                    f"{response.leader_epoch} to a question about epoch {asked}",
                )
            if asked < 0 and log.log_end_offset == log.log_start_offset:
                break  # an empty log has nothing to cut
            step = replication.truncation_step(
                log.end_offset_for_epoch,
                log.log_end_offset,
                partition.high_watermark,
                response.leader_epoch,
                response.end_offset,
            )
            before = log.log_end_offset
            after = partition.truncate_as_follower(
                self.leader_id, entry.leader_epoch, step.offset, now_ms()
            )
            if after < before:
                self.manager.counters.truncations += 1
                _log.info(
                    "%s-%d: truncated from %d to %d (leader epoch %d ends at %d on node %d, "
                    "leader epoch %d)",
                    key[0],
                    key[1],
                    before,
                    after,
                    response.leader_epoch,
                    response.end_offset,
                    self.leader_id,
                    entry.leader_epoch,
                )
            if step.done:
                break
        else:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{key[0]}-{key[1]}: no agreement with node {self.leader_id} after "
                f"{TRUNCATION_ROUNDS_MAX} rounds of OffsetForLeaderEpoch",
            )
        if log.log_end_offset < response.log_start_offset:
            partition.check_following(self.leader_id, entry.leader_epoch)
            log.reset_to(response.log_start_offset, now_ms())

    def _check_current(self, key: Key, entry: _Following) -> None:
        """Raise FENCED_LEADER_EPOCH unless ``entry`` is still how this replica follows
        this leader (see ``Partition.check_following``)."""
        if self.following.get(key) is not entry:
            raise HeadwaterError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"{key[0]}-{key[1]}: no longer follows node {self.leader_id} at epoch "
                f"{entry.leader_epoch}",
            )
        entry.partition.check_following(self.leader_id, entry.leader_epoch)

    async def _apply(self, response: pb.ReplicaFetchResponse) -> list[pb.ReplicaFetchPosition]:
        """Append what arrived; return the positions that moved."""
        moved = []
        loop = asyncio.get_running_loop()
        for data in response.partitions:
            key = (data.topic, data.partition)
            entry = self.following.get(key)
            if entry is None:
                continue
            partition = entry.partition
            if not entry.ready:
                continue  # sent for an earlier epoch; this one truncates first
            try:
                self._check_current(key, entry)
            except HeadwaterError as error:
                _log.debug("%s", error)
                continue
            if data.error_code != pb.NONE:
                _log.debug(
                    "%s-%d from node %d: %s", key[0], key[1], self.leader_id, data.error_message
                )
                entry.ready = False
                entry.retry_at = loop.time() + RETRY_S
                continue
            records = data.records  # each read of a bytes field copies it
            if records:
                try:
                    if partition.fsync_on_append:
                        await asyncio.to_thread(partition.append_replicated, records, now_ms())
                    else:
                        partition.append_replicated(records, now_ms())
                except HeadwaterError as error:
                    _log.warning(
                        "%s-%d: cannot append from node %d: %s",
                        key[0],
                        key[1],
                        self.leader_id,
                        error,
                    )
                    entry.ready = False
                    entry.retry_at = loop.time() + RETRY_S
                    self.removed.add(key)
                    continue
                moved.append(self._position(entry))
            partition.follower_high_watermark(data.high_watermark)
        return moved


# --------------------------------------------------------------------------- manager


@dataclass(slots=True)
class ReplicationCounters:
    """Counters for metrics: ISR changes this node asked for and got, truncations."""

    isr_shrinks: int = 0
    isr_expands: int = 0
    truncations: int = 0


class ReplicaManager:
    def __init__(
        self,
        config: NodeConfig,
        logs: LogManager,
        state: ClusterState,
        peers: Peers,
        broker_epoch: Callable[[], int],
        may_lead: Callable[[], bool],
    ) -> None:
        self.config = config
        self.logs = logs
        self.state = state
        self.peers = peers
        self.broker_epoch = broker_epoch
        self.may_lead = may_lead
        self.counters = ReplicationCounters()
        self._fetchers: dict[int, LeaderFetcher] = {}
        self._followed: dict[Key, int] = {}  # partition -> leader id
        self._altering: dict[Key, float] = {}  # partition -> when the request may repeat
        # partition -> the ISR change whose outcome is unknown (state it was made at, ISR)
        self._unresolved: dict[Key, tuple[PartitionState, tuple[int, ...]]] = {}
        self._fenced_since: dict[int, int] = {}  # broker -> when the image showed it fenced
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick_forever())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        for fetcher in self._fetchers.values():
            await fetcher.stop()

    async def reconcile(
        self, image: MetadataImage, roles: list[tuple[Partition, PartitionState]]
    ) -> None:
        """Follow the leader of every hosted partition this node does not lead."""
        me = self.config.node_id
        wanted: dict[Key, tuple[Partition, PartitionState]] = {
            (p.topic, p.index): (p, s) for p, s in roles if s.leader not in (me, -1)
        }
        for key, leader in list(self._followed.items()):
            entry = wanted.get(key)
            if entry is None or entry[1].leader != leader:
                self._fetchers[leader].unfollow(key)
                del self._followed[key]
        for key, (partition, state) in wanted.items():
            fetcher = self._fetchers.get(state.leader)
            address = image.broker_internal_address(state.leader)
            if fetcher is not None and fetcher.address != address:
                await fetcher.stop()
                for followed in list(fetcher.following):
                    self._followed.pop(followed, None)
                del self._fetchers[state.leader]
                fetcher = None
            if fetcher is None:
                if not address:
                    continue
                fetcher = self._fetchers[state.leader] = LeaderFetcher(self, state.leader, address)
                fetcher.start()
            fetcher.follow(partition, state.leader_epoch)
            self._followed[key] = state.leader

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(ISR_CHECK_S)
            try:
                self.tick()
            except Exception:
                _log.exception("ISR check failed")

    def tick(self) -> None:
        """Ask the controller for the ISR changes every led partition needs."""
        if not self.may_lead():
            return
        now = now_ms()
        clock = time.monotonic()
        image = self.state.image
        self._note_fenced(image, now)
        for partition in self.logs.hosted():
            state = partition.state
            if not partition.is_leader or state is None:
                continue
            key = (partition.topic, partition.index)
            if clock < self._altering.get(key, 0.0):
                continue
            unresolved = self._unresolved.get(key)
            if unresolved is not None:
                made_at, asked = unresolved
                if (
                    made_at.leader_epoch == state.leader_epoch
                    and made_at.partition_epoch >= state.partition_epoch
                ):
                    # Its outcome is unknown: ask the same again, never another change,
                    # until an answer says what was committed.
                    self._altering[key] = clock + ALTER_RETRY_S
                    asyncio.get_running_loop().create_task(self._alter(partition, made_at, asked))
                    continue
                del self._unresolved[key]  # the partition moved on: it can never commit
            end = partition.log.log_end_offset
            wanted = replication.isr_after_shrink(
                self.config.node_id,
                state.isr,
                partition.followers,
                end,
                now,
                self.config.replica_lag_ms_max,
            )
            if wanted == state.isr:
                wanted = replication.isr_after_expand(
                    self.config.node_id,
                    state.replicas,
                    state.isr,
                    partition.followers,
                    partition.high_watermark,
                    partition.epoch_start_offset,
                    now,
                    self.config.replica_lag_ms_max,
                )
                wanted = tuple(
                    b
                    for b in wanted
                    if b in state.isr or self._may_join(image, b, partition.followers.get(b))
                )
            if wanted == state.isr:
                continue
            self._altering[key] = clock + ALTER_RETRY_S
            partition.expect_isr(wanted)
            asyncio.get_running_loop().create_task(self._alter(partition, state, wanted))

    def _note_fenced(self, image: MetadataImage, now: int) -> None:
        """Remember when this node's image first showed each broker not live."""
        for broker_id, broker in image.brokers.items():
            if broker.live:
                self._fenced_since.pop(broker_id, None)
            else:
                self._fenced_since.setdefault(broker_id, now)

    def _may_join(
        self, image: MetadataImage, broker_id: int, progress: replication.FollowerProgress | None
    ) -> bool:
        """Is a caught-up follower worth proposing for the ISR? A live broker is. So is one
        this node's image shows fenced but that has fetched since the image first showed
        it: the image may be behind the controller's (the broker was unfenced since), and
        the controller decides. A follower that has not fetched since it was fenced (a
        dead broker's last fetch) is not."""
        broker = image.brokers.get(broker_id)
        if broker is None:
            return False
        if broker.live:
            return True
        fenced_since = self._fenced_since.get(broker_id)
        return (
            progress is not None
            and fenced_since is not None
            and (progress.last_fetch_ms > fenced_since)
        )

    async def _alter(
        self, partition: Partition, state: PartitionState, isr: tuple[int, ...]
    ) -> None:
        key = (partition.topic, partition.index)
        address = self.state.image.controller_internal_address
        shrink = len(isr) < len(state.isr)
        request = (state, isr)
        self._unresolved[key] = request
        try:
            if not address:
                raise HeadwaterError(ErrorCode.NOT_CONTROLLER, "no active controller known")
            answer = await self.peers.controller(address).AlterPartition(
                pb.AlterPartitionRequest(
                    broker_id=self.config.node_id,
                    broker_epoch=self.broker_epoch(),
                    topic_id=partition.topic_id,
                    partition=partition.index,
                    leader_epoch=state.leader_epoch,
                    partition_epoch=state.partition_epoch,
                    new_isr=isr,
                ),
                timeout=self.peers.timeout_s,
            )
        except (grpc.RpcError, HeadwaterError) as exc:
            error = from_rpc_error(exc, address) if isinstance(exc, grpc.RpcError) else exc
            _log.info("%s-%d: ISR change to %s failed: %s", key[0], key[1], list(isr), error)
            if error.code in ISR_CHANGE_REFUSALS:
                # Refused for good (no copy of it can commit): the joining followers stop
                # counting towards the high watermark. Otherwise the outcome is unknown:
                # they keep counting, and the same request is made again (tick).
                if self._unresolved.get(key) is request:
                    del self._unresolved[key]
                if partition.state is state:
                    partition.expect_isr(None)
            return
        if self._unresolved.get(key) is request:
            del self._unresolved[key]
        committed = PartitionState(
            partition=partition.index,
            replicas=tuple(answer.replicas),
            isr=tuple(answer.isr),
            leader=answer.leader,
            leader_epoch=answer.leader_epoch,
            partition_epoch=answer.partition_epoch,
            adding_replicas=tuple(answer.adding_replicas),
            removing_replicas=tuple(answer.removing_replicas),
        )
        if committed.isr != state.isr:
            if shrink:
                self.counters.isr_shrinks += 1
            else:
                self.counters.isr_expands += 1
            _log.info("%s-%d: ISR %s -> %s", key[0], key[1], list(state.isr), list(committed.isr))
        # Taken now: this node's image may lag behind the controller's, or stand still.
        partition.take_committed_state(committed)
        # Joining brokers the controller does not consider live were left out: ask again
        # after a pause, not on the next check.
        wait_s = ISR_CHECK_S if set(isr) <= set(committed.isr) else ALTER_RETRY_S
        self._altering[key] = time.monotonic() + wait_s

    def under_replicated(self) -> int:
        return sum(
            1
            for p in self.logs.hosted()
            if p.is_leader and p.state is not None and len(p.state.isr) < len(p.state.replicas)
        )
