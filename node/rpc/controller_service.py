"""The internal ``headwater.v1.Controller`` servicer: broker registration and heartbeats
(answered by the active controller only) and metadata for broker-only nodes (answered by
any controller node)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc

from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.controller import ControllerDriver, not_controller
from headwater.node.rpc.call_hooks import rpc_handler
from headwater.raft.metadata.image import snapshot_records
from headwater.raft.metadata.records import LOG_DIR_PROBLEM_CHARS_MAX, encode_batch
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import abort
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

METADATA_POLL_S: Final = 10.0


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(
        self,
        state: ClusterState,
        controller: ControllerDriver | None,
        image_current: Callable[[], bool] = lambda: True,
    ) -> None:
        self.state = state
        self.controller = controller
        self.image_current = image_current

    def _active(self) -> ControllerDriver:
        if self.controller is None:
            raise not_controller(self.state.image)
        return self.controller

    @rpc_handler
    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RegisterBrokerResponse:
        if not request.incarnation_id or not request.address:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "RegisterBroker needs incarnation_id and address"
            )
        epoch = await self._active().register(
            request.node_id,
            request.incarnation_id,
            request.address,
            request.rack,
            request.internal_address,
            request.partition_capacity,
            request.kafka_address,
        )
        return pb.RegisterBrokerResponse(broker_epoch=epoch)

    @rpc_handler
    async def BrokerHeartbeat(
        self, request: pb.BrokerHeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.BrokerHeartbeatResponse:
        outcome = await self._active().heartbeat(
            request.node_id,
            request.broker_epoch,
            request.want_shutdown,
            request.log_dir_problem[:LOG_DIR_PROBLEM_CHARS_MAX],
        )
        return pb.BrokerHeartbeatResponse(
            fenced=outcome.fenced, shutdown_ready=outcome.shutdown_ready
        )

    @rpc_handler
    async def AlterPartition(
        self, request: pb.AlterPartitionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AlterPartitionResponse:
        state = await self._active().alter_partition(request)
        return pb.AlterPartitionResponse(
            isr=state.isr,
            leader_epoch=state.leader_epoch,
            partition_epoch=state.partition_epoch,
            leader=state.leader,
            replicas=state.replicas,
            adding_replicas=state.adding_replicas,
            removing_replicas=state.removing_replicas,
        )

    @rpc_handler
    async def CreateOffsetsTopic(
        self, request: pb.CreateOffsetsTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateOffsetsTopicResponse:
        return pb.CreateOffsetsTopicResponse(topic_id=await self._active().create_offsets_topic())

    @rpc_handler
    async def AllocateProducerIds(
        self, request: pb.AllocateProducerIdsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AllocateProducerIdsResponse:
        first, end = await self._active().allocate_producer_ids(
            request.node_id, request.broker_epoch
        )
        return pb.AllocateProducerIdsResponse(first_producer_id=first, end_producer_id=end)

    async def FetchMetadata(
        self, request: pb.FetchMetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.FetchMetadataResponse]:
        """The whole image each time it moves past the caller's offset, once this node's
        image is current (a broker-only node treats every image it gets as complete)."""
        if self.controller is None:
            await abort(
                context,
                HeadwaterError(
                    ErrorCode.NOT_CONTROLLER, "only controller nodes serve FetchMetadata"
                ),
            )
        offset = request.offset
        while True:
            if not await self.state.wait_for_offset(offset + 1, METADATA_POLL_S):
                continue
            if not self.image_current():
                await self.state.wait_until(lambda _image: self.image_current(), 1.0)
                continue
            image = self.state.image
            offset = image.offset
            yield pb.FetchMetadataResponse(
                offset=offset, records=encode_batch(snapshot_records(image))
            )
