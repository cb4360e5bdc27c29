"""Producer ids for idempotent producers (InitProducerId).

The controller hands out ids in blocks (``metadata.decisions.allocate_producer_ids``, 1000 at
a time), each committed through the metadata quorum as ``ProducerIdsAllocated`` before the
broker that asked gets it: blocks are contiguous and never overlap, whichever controller
allocates, so an id is never handed out twice in the cluster's life. A broker keeps its
current block in memory and hands out its ids in order; a block it did not use up before
a restart is simply skipped (ids are plentiful: 2^63).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.controller import ControllerDriver
from headwater.node.cluster.peers import Peers, peer_error
from headwater.node.config import NodeConfig
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb


class ProducerIdAllocator:
    """Hands out this broker's block of producer ids; asks the controller for the next
    block when it runs out (one request at a time)."""

    def __init__(
        self,
        config: NodeConfig,
        state: ClusterState,
        peers: Peers,
        controller: ControllerDriver | None,
        broker_epoch: Callable[[], int],
    ) -> None:
        self.config = config
        self.state = state
        self.peers = peers
        self.controller = controller
        self.broker_epoch = broker_epoch
        self._next = 0
        self._end = 0
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                self._next, self._end = await self._allocate()
            producer_id = self._next
            self._next += 1
            return producer_id

    async def _allocate(self) -> tuple[int, int]:
        broker_epoch = self.broker_epoch()
        if not self.config.is_broker or broker_epoch < 0:
            raise HeadwaterError(
                ErrorCode.BROKER_NOT_AVAILABLE,
                f"node {self.config.node_id} is not a registered broker (yet) and cannot "
                "hand out producer ids; ask a broker",
            )
        if self.controller is not None and self.controller.is_active():
            return await self.controller.allocate_producer_ids(self.config.node_id, broker_epoch)
        address = self.state.image.controller_internal_address
        if not address:
            raise HeadwaterError(ErrorCode.NOT_CONTROLLER, "no active controller is known; retry")
        try:
            answer = await self.peers.controller(address).AllocateProducerIds(
                pb.AllocateProducerIdsRequest(
                    node_id=self.config.node_id, broker_epoch=broker_epoch
                ),
                timeout=self.peers.timeout_s,
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None
        if not 0 <= answer.first_producer_id < answer.end_producer_id:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"the controller at {address} answered an empty block of producer ids "
                f"[{answer.first_producer_id}, {answer.end_producer_id})",
            )
        return answer.first_producer_id, answer.end_producer_id
