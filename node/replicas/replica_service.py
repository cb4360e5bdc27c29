"""The leader's side of replication: ``ReplicaService``, the internal ``headwater.v1.Replica``
service, and its fetch sessions.

Each follower keeps one bidirectional ``Fetch`` stream (a *session*) per leader. A request
adds or updates partitions with the follower's log end offset, which the leader records
(``Partition.on_follower_fetch``: follower progress, then the high watermark). The leader
answers each request once: as soon as a session partition has records past the
follower's offset, or after ``max_wait_ms``, with the stored batches, byte for byte, and
each partition's high watermark (news of a high watermark alone waits up to
``HW_NEWS_LINGER_S`` for data to travel with). The follower appends, then sends its new
offsets: the leader learns that a follower *has* a batch only from the next request, never
from having sent it. ``OffsetForLeaderEpoch`` tells a follower where its latest epoch ends
in the leader's log.

The followers' side is ``headwater.node.replicas.follower_fetcher``; ISR maintenance is
``headwater.node.replicas.replica_manager``.

Everything here runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import grpc

from headwater.node.clock import now_ms
from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.config import NodeConfig
from headwater.node.replicas.log_manager import LogManager
from headwater.node.replicas.partition import Partition
from headwater.node.replicas.replica_checks import (
    fetch_position_error,
    leader_partition,
    stale_registration,
)
from headwater.node.rpc.call_hooks import rpc_handler
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from headwater.node.replicas.replica_manager import Key

# High watermark news without data waits this long for data to travel with: under load
# every data response carries the news, and a follower no longer costs two round trips
# per batch (data, then the high watermark its own next request moved).
HW_NEWS_LINGER_S: Final = 0.02
# How often a fetch session counts as a fetch of its partitions the follower did not
# report (see ReplicaService._refresh_session); well within replica_lag_ms_max.
SESSION_REFRESH_MS: Final = 1000
_log = logging.getLogger(__name__)


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

    def _leader_partition(
        self, topic: str, index: int, leader_epoch: int, replica_id: int
    ) -> Partition:
        return leader_partition(
            self.logs.partition(topic, index),
            topic,
            index,
            leader_epoch,
            replica_id,
            node_id=self.config.node_id,
            may_lead=self.may_lead(),
        )

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
        stale = stale_registration(self.state.image, request.replica_id, request.broker_epoch)
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
                    error = fetch_position_error(partition, position.fetch_offset)
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
        retriable=error.retriable,
    )
