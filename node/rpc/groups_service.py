"""The ``headwater.v1.Groups`` servicer: consumer groups on any node, a translation of
requests and answers over ``GroupCore`` (which holds the rules).

A call for a group is served by the group's coordinator: here, when this node
coordinates it, else forwarded there (one hop; a forwarded call this node cannot serve
is answered NOT_COORDINATOR, never forwarded again). Sizes and counts are checked before
anything is built from a request (a request naming more partitions than
``decisions.OWNED_PARTITIONS_MAX`` is refused first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Final

import grpc

from headwater.node.cluster.peers import (
    FORWARDED,
    LOCAL_ONLY_KEY,
    Peers,
    is_forwarded,
    is_local_only,
    peer_error,
)
from headwater.node.groups import decisions
from headwater.node.groups.core import (
    CLASSIC_PROTOCOL,
    CONSUMER_PROTOCOL,
    ClassicView,
    GroupCore,
    GroupDescription,
    GroupListing,
    partition_keys,
)
from headwater.node.groups.image import GroupState
from headwater.node.groups.records import OffsetCommitted, TopicPartitionKey
from headwater.node.rpc.call_hooks import rpc_handler
from headwater.node.security.authorizer import current_caller
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

LIST_PEER_TIMEOUT_S: Final = 5.0
LOCAL_ONLY: Final = ((LOCAL_ONLY_KEY, "1"),)


def topic_partitions(keys: Iterable[TopicPartitionKey]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(keys):
        by_topic.setdefault(topic, []).append(partition)
    return [pb.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()]


def _keys(items: Iterable[pb.TopicPartitions], what: str) -> frozenset[TopicPartitionKey]:
    return partition_keys(((item.topic, item.partitions) for item in items), what)


def describe(group: GroupState, coordinator_id: int) -> pb.DescribeGroupResponse:
    members = []
    for member_id, joined in sorted(group.members.items()):
        current = group.current.get(member_id)
        members.append(
            pb.GroupMember(
                member_id=member_id,
                instance_id=joined.instance_id,
                client_id=joined.client_id,
                member_epoch=current.member_epoch if current else 0,
                subscribed_topics=joined.subscribed_topics,
                subscribed_pattern=joined.subscribed_pattern,
                assigned=topic_partitions(current.assigned if current else ()),
                revoking=topic_partitions(current.revoking if current else ()),
                target=topic_partitions(group.target.get(member_id, ())),
                session_timeout_ms=joined.session_timeout_ms,
                rebalance_timeout_ms=joined.rebalance_timeout_ms,
                host=joined.host,
            )
        )
    return pb.DescribeGroupResponse(
        group_id=group.group_id,
        state=group.state,
        group_epoch=group.epoch,
        target_epoch=group.target_epoch,
        assignor=decisions.group_assignor(group),
        coordinator_id=coordinator_id,
        members=members,
        offsets=[_committed(c) for _, c in sorted(group.offsets.items())],
        protocol=CONSUMER_PROTOCOL,
    )


def _classic(answer: pb.DescribeGroupResponse, classic: ClassicView) -> pb.DescribeGroupResponse:
    """``answer`` (the group's committed state) shown as the classic group it is."""
    answer.protocol = CLASSIC_PROTOCOL
    answer.state = classic.state
    answer.group_epoch = classic.generation
    answer.target_epoch = 0
    answer.assignor = classic.protocol_name
    del answer.members[:]
    answer.members.extend(
        pb.GroupMember(
            member_id=member.member_id,
            instance_id=member.instance_id,
            client_id=member.client_id,
            host=member.host,
            member_epoch=member.generation,
            subscribed_topics=member.subscribed_topics,
            assigned=[
                pb.TopicPartitions(topic=topic, partitions=partitions)
                for topic, partitions in member.assigned
            ],
            session_timeout_ms=member.session_timeout_ms,
            rebalance_timeout_ms=member.rebalance_timeout_ms,
        )
        for member in classic.members
    )
    return answer


def description(described: GroupDescription) -> pb.DescribeGroupResponse:
    if described.committed is None:
        answer = pb.DescribeGroupResponse(
            group_id=described.group_id, coordinator_id=described.coordinator_id
        )
    else:
        answer = describe(described.committed, described.coordinator_id)
    if described.classic is not None and described.classic_shown:
        return _classic(answer, described.classic)
    return answer


def _committed(committed: OffsetCommitted) -> pb.CommittedOffset:
    return pb.CommittedOffset(
        topic=committed.topic,
        partition=committed.partition,
        offset=committed.offset,
        metadata=committed.metadata,
        commit_timestamp_ms=committed.commit_timestamp_ms,
    )


def _listing(listing: GroupListing) -> pb.GroupListing:
    return pb.GroupListing(
        group_id=listing.group_id,
        state=listing.state,
        members=listing.members,
        coordinator_id=listing.coordinator_id,
    )


class OffsetsTopicAt:
    """``GroupCore``'s way to have the active controller at an address create
    ``__consumer_offsets``."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    async def __call__(self, address: str) -> None:
        try:
            await self.peers.controller(address).CreateOffsetsTopic(
                pb.CreateOffsetsTopicRequest(), timeout=self.peers.timeout_s
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None


class GroupsService(pb_grpc.GroupsServicer):
    def __init__(self, core: GroupCore, peers: Peers) -> None:
        self.core = core
        self.peers = peers

    async def _route(self, group_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> int | str:
        return await self.core.route(group_id, forwarded=is_forwarded(context))

    async def _forward(self, address: str, method: str, request: Any) -> Any:
        try:
            return await getattr(self.peers.groups(address), method)(
                request, metadata=FORWARDED, timeout=self.peers.timeout_s
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None

    @rpc_handler
    async def FindCoordinator(
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FindCoordinatorResponse:
        self.core.authorize_coordinator_lookup(request.group_id)
        image, index, leader = await self.core.locate(request.group_id)
        return pb.FindCoordinatorResponse(
            node_id=leader, address=image.broker_address(leader), partition=index
        )

    @rpc_handler
    async def ConsumerGroupHeartbeat(
        self,
        request: pb.ConsumerGroupHeartbeatRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.ConsumerGroupHeartbeatResponse:
        """See ``GroupCore.authorize_heartbeat``."""
        self.core.authorize_heartbeat(
            request.group_id, request.subscribed_topics, request.subscribed_pattern
        )
        owned = _keys(request.owned, "owned")
        caller = current_caller()
        if not caller.trusted:
            # Who the member is in DescribeGroup, taken where the member's call arrives (a
            # forwarded call is this node's): the client id its calls carry (the one
            # quotas go by) unless it names one, and its address.
            request.client_id = request.client_id or caller.client_id
            request.client_host = caller.host
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            return await self._forward(route, "ConsumerGroupHeartbeat", request)  # type: ignore[no-any-return]
        heartbeat = decisions.Heartbeat(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=request.member_epoch,
            instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            subscribed_topics=tuple(request.subscribed_topics),
            subscribed_pattern=request.subscribed_pattern,
            assignor=request.assignor,
            owned=owned,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
        )
        answer, interval = await self.core.consumer_heartbeat(route, heartbeat)
        return pb.ConsumerGroupHeartbeatResponse(
            member_id=answer.member_id,
            member_epoch=answer.member_epoch,
            heartbeat_interval_ms=interval,
            assignment=topic_partitions(answer.assigned),
            group_epoch=answer.group_epoch,
            session_timeout_ms=answer.session_timeout_ms,
        )

    @rpc_handler
    async def OffsetCommit(
        self, request: pb.OffsetCommitRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetCommitResponse:
        if not 1 <= len(request.offsets) <= decisions.COMMIT_PARTITIONS_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"OffsetCommit names {len(request.offsets)} partitions; valid: 1 to "
                f"{decisions.COMMIT_PARTITIONS_MAX}",
            )
        self.core.authorize_commit(request.group_id, [o.topic for o in request.offsets])
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            return await self._forward(route, "OffsetCommit", request)  # type: ignore[no-any-return]
        items = [
            decisions.CommitItem(o.topic, o.partition, o.offset, o.metadata)
            for o in request.offsets
        ]
        answers = await self.core.commit(
            route, request.group_id, request.member_id, request.member_epoch, items
        )
        return pb.OffsetCommitResponse(
            results=[
                pb.OffsetCommitResult(
                    topic=item.topic,
                    partition=item.partition,
                    error_code=pb.ErrorCode.ValueType(error.code if error else 0),
                    error_message=error.message if error else "",
                    retriable=error.retriable if error else False,
                )
                for item, error in zip(items, answers, strict=True)
            ]
        )

    @rpc_handler
    async def OffsetFetch(
        self, request: pb.OffsetFetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetFetchResponse:
        """Needs ``describe`` on the group; the answer holds the offsets of the topics
        the caller may describe."""
        self.core.authorize_describe(request.group_id)
        wanted = _keys(request.partitions, "partitions")
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            answer: pb.OffsetFetchResponse = await self._forward(route, "OffsetFetch", request)
            offsets = list(answer.offsets)
        else:
            offsets = [_committed(c) for c in self.core.offsets(route, request.group_id, wanted)]
        visible = self.core.topic_visibility()
        if visible is not None:
            offsets = [o for o in offsets if visible(o.topic)]
        return pb.OffsetFetchResponse(offsets=offsets)

    @rpc_handler
    async def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeGroupResponse:
        """Needs ``describe`` on the group; of the topics the answer names (committed
        offsets, members' subscriptions, assignments and targets) it keeps those the
        caller may describe, as OffsetFetch does (a pattern subscription is kept: it
        names no topic)."""
        self.core.authorize_describe(request.group_id)
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            answer: pb.DescribeGroupResponse = await self._forward(route, "DescribeGroup", request)
        else:
            answer = description(self.core.describe(route, request.group_id))
        visible = self.core.topic_visibility()
        if visible is not None:
            _hide_topics(answer, visible)
        return answer

    @rpc_handler
    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteGroupResponse:
        self.core.authorize_delete(request.group_id)
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            return await self._forward(route, "DeleteGroup", request)  # type: ignore[no-any-return]
        await self.core.delete(route, request.group_id)
        return pb.DeleteGroupResponse()

    @rpc_handler
    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListGroupsResponse:
        own = [_listing(g) for g in self.core.visible_groups(self.core.own_groups())]
        if is_local_only(context):
            return pb.ListGroupsResponse(groups=own)
        node_id = self.core.config.node_id
        image = self.core.state.image
        others = [n for n in image.live_broker_ids() if n != node_id]

        async def ask(node_id: int) -> pb.ListGroupsResponse | None:
            try:
                answer: pb.ListGroupsResponse = await self.peers.groups(
                    image.broker_internal_address(node_id)
                ).ListGroups(
                    pb.ListGroupsRequest(), metadata=LOCAL_ONLY, timeout=LIST_PEER_TIMEOUT_S
                )
                return answer
            except grpc.RpcError:
                return None

        answers = await asyncio.gather(*(ask(n) for n in others))
        listings = list(self.core.own_groups())
        unreachable = []
        for node_id, answer in zip(others, answers, strict=True):
            if answer is None:
                unreachable.append(node_id)
            else:
                listings += [
                    GroupListing(g.group_id, g.state, g.members, g.coordinator_id)
                    for g in answer.groups
                ]
        groups = [_listing(g) for g in self.core.visible_groups(listings)]
        groups.sort(key=lambda g: g.group_id)
        return pb.ListGroupsResponse(groups=groups, unreachable_nodes=unreachable)


def _hide_topics(answer: pb.DescribeGroupResponse, visible: Callable[[str], bool]) -> None:
    """Drop from ``answer`` (in place) every mention of a topic not ``visible``."""

    def keep(items: Any) -> None:
        kept = [item for item in items if visible(item.topic)]
        if len(kept) != len(items):
            del items[:]
            items.extend(kept)

    keep(answer.offsets)
    for member in answer.members:
        subscribed = [t for t in member.subscribed_topics if visible(t)]
        if len(subscribed) != len(member.subscribed_topics):
            del member.subscribed_topics[:]
            member.subscribed_topics.extend(subscribed)
        for assignment in (member.assigned, member.revoking, member.target):
            keep(assignment)
