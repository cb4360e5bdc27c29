"""Forwarding of ``headwater.v1.Broker`` requests to the leader of a partition that
another node leads (one hop, see ``headwater.node.cluster.peers``).

A forwarded request carries the ``headwater-forwarded`` metadata key (``FORWARDED``).
``Forwarder.leader_address`` refuses to forward a request that was itself forwarded
(NOT_LEADER_OR_FOLLOWER: the client's metadata is stale), so a request never makes a
second hop. Produce goes on as one request per partition (its batch, acks and
timeouts), Fetch as it came, ListOffsets as one request per leader node for that node's
partitions, and FetchStream is proxied: the leader's stream is relayed until either side
ends it. A peer's gRPC error becomes a HeadwaterError naming the peer (``peer_error``).

Everything here runs on the node's event loop (grpc.aio calls on the peers' channels).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from headwater.node.cluster.peers import FORWARDED, Peers, peer_error
from headwater.node.config import NodeConfig
from headwater.raft.metadata.image import MetadataImage, TopicImage
from headwater.shared.cancellation import task_is_stopping
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb


class Forwarder:
    """Calls to the leaders of partitions this node does not lead, over ``peers``."""

    def __init__(self, config: NodeConfig, peers: Peers) -> None:
        self.config = config
        self.peers = peers

    def leader_address(
        self, image: MetadataImage, topic: TopicImage, index: int, forwarded: bool
    ) -> str:
        """The address of the leader of partition ``index``, to forward a request to;
        refused for a request that was itself ``forwarded``."""
        leader = topic.partitions[index].leader
        if forwarded:
            raise HeadwaterError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"node {self.config.node_id} does not lead partition {index} of {topic.name!r} "
                f"(the leader is node {leader}); refresh metadata",
            )
        address = image.broker_internal_address(leader)
        if not address:
            raise HeadwaterError(
                ErrorCode.LEADER_NOT_AVAILABLE, f"the leader of partition {index} is unknown"
            )
        return address

    async def produce(
        self,
        image: MetadataImage,
        topic: TopicImage,
        index: int,
        batch: bytes,
        request: pb.ProduceRequest,
        forwarded: bool,
    ) -> pb.PartitionProduceResult:
        """Forward ``batch`` of ``request`` to the leader of partition ``index``; its result."""
        address = self.leader_address(image, topic, index, forwarded)
        forward = pb.ProduceRequest(
            topic=topic.name,
            partition=index,
            batch=batch,
            acks=request.acks,
            timeout_ms=request.timeout_ms,
            deadline_unix_ms=request.deadline_unix_ms,
        )
        try:
            response = await self.peers.broker(address).Produce(
                forward, metadata=FORWARDED, timeout=self.peers.timeout_s
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None
        return response.results[0]

    async def fetch(self, address: str, request: pb.FetchRequest) -> pb.FetchResponse:
        """Forward a Fetch to the leader at ``address``; it may wait ``max_wait_ms`` there."""
        try:
            response: pb.FetchResponse = await self.peers.broker(address).Fetch(
                request,
                metadata=FORWARDED,
                timeout=self.peers.timeout_s + request.max_wait_ms / 1000,
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None
        return response

    async def fetch_stream(
        self, address: str, request: pb.FetchRequest
    ) -> AsyncIterator[pb.FetchResponse]:
        """Relay the FetchStream of the leader at ``address``."""
        call = self.peers.broker(address).FetchStream(request, metadata=FORWARDED)
        try:
            async for response in call:
                yield response
        except grpc.RpcError as error:
            raise peer_error(error, address) from None
        except asyncio.CancelledError:
            if task_is_stopping():
                raise  # the client went away
            # grpc.aio raises CancelledError for a call cancelled under it: the client
            # gets a retriable error, not a stream that looks cancelled by itself.
            raise HeadwaterError(
                ErrorCode.BROKER_NOT_AVAILABLE, f"the fetch stream from node at {address} ended"
            ) from None
        finally:
            call.cancel()

    async def list_offsets(
        self, address: str, request: pb.ListOffsetsRequest, subset: list[int]
    ) -> pb.ListOffsetsResponse:
        """Ask the leader at ``address`` for the offsets of its partitions ``subset``."""
        forward = pb.ListOffsetsRequest(
            topic=request.topic,
            partitions=subset,
            spec=request.spec,
            timestamp_ms=request.timestamp_ms,
        )
        try:
            answer: pb.ListOffsetsResponse = await self.peers.broker(address).ListOffsets(
                forward, metadata=FORWARDED, timeout=self.peers.timeout_s
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None
        return answer
