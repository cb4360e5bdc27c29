"""The leader's side of replication: ``ReplicaService``, the internal ``headwater.v1.Replica``
service, over gRPC.

Each follower keeps one bidirectional ``Fetch`` stream (a *session*) per leader; what the
leader knows of it and decides at each request is ``FetchSession``
(``headwater.node.replicas.fetch_session``, which states the rules and invariants). This
module is the session's driver: it takes each request, then answers it once, as soon as
a session partition has records past the follower's offset or after ``max_wait_ms``, with
the stored batches, byte for byte, and each partition's high watermark (news of a high
watermark alone waits up to ``HW_NEWS_LINGER_S`` for data to travel with).
``OffsetForLeaderEpoch`` tells a follower where its latest epoch ends in the leader's log
(``fetch_session.epoch_end``).

The followers' side is ``headwater.node.replicas.follower_fetcher``; ISR maintenance is
``headwater.node.replicas.replica_manager``.

Everything here runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Final

import grpc

from headwater.node.clock import now_ms
from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.config import NodeConfig
from headwater.node.replicas.fetch_session import (
    FetchSession,
    ReplicaData,
    ReplicaRefusal,
    epoch_end,
)
from headwater.node.replicas.log_manager import LogManager
from headwater.node.rpc.call_hooks import rpc_handler
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

# High watermark news without data waits this long for data to travel with: under load
# every data response carries the news, and a follower no longer costs two round trips
# per batch (data, then the high watermark its own next request moved).
HW_NEWS_LINGER_S: Final = 0.02


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

    @rpc_handler
    async def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetForLeaderEpochResponse:
        end = epoch_end(
            self.logs.partition(request.topic, request.partition),
            request,
            node_id=self.config.node_id,
            may_lead=self.may_lead(),
        )
        return pb.OffsetForLeaderEpochResponse(
            leader_epoch=end.leader_epoch,
            end_offset=end.end_offset,
            log_start_offset=end.log_start_offset,
        )

    async def Fetch(
        self,
        requests: AsyncIterator[pb.ReplicaFetchRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ReplicaFetchResponse]:
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        session = FetchSession(self.config.node_id, self.logs.partition, wake.set)
        try:
            async for request in requests:
                refusals = session.take(
                    replica_id=request.replica_id,
                    broker_epoch=request.broker_epoch,
                    positions=request.positions,
                    removed=request.removed,
                    image=self.state.image,
                    may_lead=self.may_lead(),
                    now_ms=now_ms(),
                )
                if refusals:
                    response = pb.ReplicaFetchResponse()
                    _add_parts(response, refusals)
                    yield response
                    continue
                wait_ms = min(max(request.max_wait_ms, 0), self.config.replica_fetch_wait_ms_max)
                budget = min(max(request.max_bytes, 1), self.config.replica_fetch_bytes_max)
                now = loop.time()
                deadline = now + wait_ms / 1000
                news_due = min(deadline, now + HW_NEWS_LINGER_S)
                while True:
                    wake.clear()
                    now = loop.time()
                    parts, news_pending = session.collect(budget, with_news=now >= news_due)
                    if parts or now >= deadline:
                        break
                    wait_s = (news_due if news_pending else deadline) - now
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(wait_s):
                            await wake.wait()
                response = pb.ReplicaFetchResponse()
                _add_parts(response, parts)
                yield response
        finally:
            session.close()


def _add_parts(
    response: pb.ReplicaFetchResponse, parts: Sequence[ReplicaData | ReplicaRefusal]
) -> None:
    """Add ``parts`` to ``response`` in place (passing built submessages to a constructor
    makes upb serialize and parse each one again, records included)."""
    for part in parts:
        if isinstance(part, ReplicaData):
            response.partitions.add(
                topic=part.topic,
                partition=part.partition,
                records=part.records,
                high_watermark=part.high_watermark,
                log_start_offset=part.log_start_offset,
                log_end_offset=part.log_end_offset,
            )
        else:
            error = part.error
            response.partitions.add(
                topic=part.topic,
                partition=part.partition,
                error_code=pb.ErrorCode.ValueType(error.code),
                error_message=error.message,
                retriable=error.retriable,
            )
