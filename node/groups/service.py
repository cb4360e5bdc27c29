"""The ``headwater.v1.Groups`` servicer: consumer groups on any node.

A call for a group is served by the group's coordinator, the leader of partition
``coordinator_partition(group_id)`` of ``__consumer_offsets``: here, when this node leads
it (``headwater.node.groups.coordinator``), else forwarded there (one hop; a forwarded
call this node cannot serve is answered NOT_COORDINATOR, never forwarded again). The first
call for any group asks the active controller to create ``__consumer_offsets``.

Every request is checked before it reaches the coordinator: sizes and counts first (a
request naming more partitions than ``decisions.OWNED_PARTITIONS_MAX`` is refused before anything
is built from it), then the fields (``decisions.check_heartbeat``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import grpc

from headwater.node.authorizer import Authorizer, current_caller
from headwater.node.cluster_state import ClusterState
from headwater.node.config import NodeConfig
from headwater.node.controller import ControllerDriver
from headwater.node.groups import decisions
from headwater.node.groups.coordinator import GroupCoordinator
from headwater.node.groups.image import GroupsImage, GroupState
from headwater.node.groups.records import (
    OFFSETS_TOPIC,
    OffsetCommitted,
    TopicPartitionKey,
    coordinator_partition,
)
from headwater.node.peers import (
    FORWARDED,
    LOCAL_ONLY_KEY,
    Peers,
    is_forwarded,
    is_local_only,
    peer_error,
)
from headwater.node.service import rpc_handler
from headwater.raft.image import MetadataImage
from headwater.raft.records import NO_LEADER
from headwater.shared.acls import CLUSTER_RESOURCE, WILDCARD, Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.topics import check_group_id
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

METADATA_WAIT_S: Final = 5.0
LOAD_WAIT_S: Final = 2.0
LOAD_POLL_S: Final = 0.02
LIST_PEER_TIMEOUT_S: Final = 5.0
LOCAL_ONLY: Final = ((LOCAL_ONLY_KEY, "1"),)


def partition_keys(items: Iterable[pb.TopicPartitions], what: str) -> frozenset[TopicPartitionKey]:
    keys: set[TopicPartitionKey] = set()
    count = 0
    for item in items:
        count += len(item.partitions)
        if count > decisions.OWNED_PARTITIONS_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"{what} names more than {decisions.OWNED_PARTITIONS_MAX} partitions",
            )
        for partition in item.partitions:
            if partition < 0:
                raise HeadwaterError(
                    ErrorCode.INVALID_REQUEST,
                    f"{what}: partition {partition} of {item.topic!r} is negative",
                )
            keys.add((item.topic, partition))
    return frozenset(keys)


def topic_partitions(keys: Iterable[TopicPartitionKey]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(keys):
        by_topic.setdefault(topic, []).append(partition)
    return [pb.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()]


@dataclass(frozen=True, slots=True)
class ClassicView:
    """A group of Kafka's classic protocol as its coordinator holds it."""

    state: str
    generation: int
    protocol_name: str
    members: tuple[pb.GroupMember, ...]


class ClassicDirectory(Protocol):
    """The classic groups this node coordinates (kept by the Kafka front)."""

    def has_members(self, group_id: str) -> bool:
        """Has the group members of the classic protocol here?"""
        ...

    def view(self, group_id: str) -> ClassicView | None:
        """The group as DescribeGroup shows it; None when it is not a classic group here."""
        ...

    def listings(self) -> list[tuple[str, str, int]]:
        """(group id, state, members) of each classic group here."""
        ...


class NoClassicGroups:
    """A node without a Kafka listener: no classic groups."""

    def has_members(self, group_id: str) -> bool:
        return False

    def view(self, group_id: str) -> ClassicView | None:
        return None

    def listings(self) -> list[tuple[str, str, int]]:
        return []


CONSUMER_PROTOCOL: Final = "consumer"
CLASSIC_PROTOCOL: Final = "classic"


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


def with_classic(
    answer: pb.DescribeGroupResponse, classic: ClassicView | None
) -> pb.DescribeGroupResponse:
    """``answer`` (the group's committed state) as a classic group when it is one: a
    group id is one kind at a time, classic while the classic view has members or the
    committed state has none."""
    if classic is None or (answer.members and not classic.members):
        return answer
    answer.protocol = CLASSIC_PROTOCOL
    answer.state = classic.state
    answer.group_epoch = classic.generation
    answer.target_epoch = 0
    answer.assignor = classic.protocol_name
    del answer.members[:]
    answer.members.extend(classic.members)
    return answer


def _committed(committed: OffsetCommitted) -> pb.CommittedOffset:
    return pb.CommittedOffset(
        topic=committed.topic,
        partition=committed.partition,
        offset=committed.offset,
        metadata=committed.metadata,
        commit_timestamp_ms=committed.commit_timestamp_ms,
    )


class GroupsService(pb_grpc.GroupsServicer):
    def __init__(
        self,
        config: NodeConfig,
        state: ClusterState,
        peers: Peers,
        coordinator: GroupCoordinator | None,
        controller: ControllerDriver | None,
        may_lead: Callable[[], bool],
        *,
        authorizer: Authorizer,
    ) -> None:
        self.config = config
        self.auth = authorizer
        self.state = state
        self.peers = peers
        self.coordinator = coordinator
        self.controller = controller
        self.may_lead = may_lead
        self._creating: asyncio.Task[None] | None = None
        self.classic: ClassicDirectory = NoClassicGroups()
        """The classic groups of this node (set by the Kafka front): a group with members
        there takes no ConsumerGroupHeartbeat, and DescribeGroup and ListGroups show
        them."""

    # ------------------------------------------------------------------ routing

    async def _offsets_topic(self) -> MetadataImage:
        """The image, once it holds ``__consumer_offsets`` (created on first use)."""
        image = self.state.image
        if OFFSETS_TOPIC in image.topics:
            return image
        if not self.state.current:
            raise HeadwaterError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"node {self.config.node_id} is starting and has not caught up with the "
                "cluster metadata; retry",
            )
        if self._creating is None or self._creating.done():
            self._creating = asyncio.get_running_loop().create_task(self._create_offsets_topic())
        try:
            await asyncio.shield(self._creating)
        except HeadwaterError as error:
            raise HeadwaterError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{OFFSETS_TOPIC} could not be created yet: {error.message}",
            ) from None
        await self.state.wait_until(lambda im: OFFSETS_TOPIC in im.topics, METADATA_WAIT_S)
        image = self.state.image
        if OFFSETS_TOPIC not in image.topics:
            raise HeadwaterError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{OFFSETS_TOPIC} is being created; retry"
            )
        return image

    async def _create_offsets_topic(self) -> None:
        if self.controller is not None and self.controller.is_active():
            await self.controller.create_offsets_topic()
            return
        address = self.state.image.controller_internal_address
        if not address:
            raise HeadwaterError(ErrorCode.NOT_CONTROLLER, "no active controller is known")
        try:
            await self.peers.controller(address).CreateOffsetsTopic(
                pb.CreateOffsetsTopicRequest(), timeout=self.peers.timeout_s
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None

    async def locate(self, group_id: str) -> tuple[MetadataImage, int, int]:
        return await self._locate(group_id)

    async def _locate(self, group_id: str) -> tuple[MetadataImage, int, int]:
        """(image, coordinator partition, its leader) of ``group_id``."""
        check_group_id(group_id)
        image = await self._offsets_topic()
        topic = image.topics[OFFSETS_TOPIC]
        index = coordinator_partition(group_id, len(topic.partitions))
        leader = topic.partitions[index].leader
        if leader == NO_LEADER:
            raise HeadwaterError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{OFFSETS_TOPIC}-{index}, which holds group {group_id!r}, has no leader now",
            )
        return image, index, leader

    async def _route(self, group_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> int | str:
        return await self.route(group_id, forwarded=is_forwarded(context))

    async def route(self, group_id: str, forwarded: bool) -> int | str:
        """The coordinator partition when this node coordinates ``group_id`` (its shard
        loaded), else the coordinator's address to forward to (NOT_COORDINATOR when
        ``forwarded``: a call is forwarded once at most)."""
        image, index, leader = await self._locate(group_id)
        if leader != self.config.node_id or self.coordinator is None:
            if forwarded:
                raise HeadwaterError(
                    ErrorCode.NOT_COORDINATOR,
                    f"node {self.config.node_id} does not coordinate group {group_id!r} (node "
                    f"{leader} does); find the coordinator again",
                )
            address = image.broker_internal_address(leader)
            if not address:
                raise HeadwaterError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE, f"the address of node {leader} is unknown"
                )
            return address
        if not self.may_lead():
            raise HeadwaterError(
                ErrorCode.NOT_COORDINATOR,
                f"node {self.config.node_id} cannot lead partitions now (starting, fenced or "
                "cut off); retry",
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOAD_WAIT_S
        while True:
            shard = self.coordinator.shards.get(index)
            if shard is not None and shard.loaded:
                shard.check_serving()
                return index
            if loop.time() >= deadline:
                if shard is None:
                    raise HeadwaterError(
                        ErrorCode.NOT_COORDINATOR,
                        f"node {self.config.node_id} is taking over {OFFSETS_TOPIC}-{index}; retry",
                    )
                shard.check_serving()
            await asyncio.sleep(LOAD_POLL_S)

    async def _forward(self, address: str, method: str, request: Any) -> Any:
        try:
            return await getattr(self.peers.groups(address), method)(
                request, metadata=FORWARDED, timeout=self.peers.timeout_s
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None

    def _coordinator(self) -> GroupCoordinator:
        assert self.coordinator is not None  # _route returns an index only with one
        return self.coordinator

    # ------------------------------------------------------------------ shared by both fronts

    def authorize_heartbeat(
        self, group_id: str, subscribed_topics: Sequence[str], subscribed_pattern: str
    ) -> None:
        """A member's heartbeat needs ``read`` on the group and ``describe`` on each
        subscribed topic; a pattern subscription needs ``describe`` on every topic (the
        literal topic ``*``: the assignment names every topic it matches)."""
        self.auth.require(Operation.READ, ResourceType.GROUP, group_id)
        if len(subscribed_topics) > decisions.SUBSCRIBED_TOPICS_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"{len(subscribed_topics)} subscribed topics; at most "
                f"{decisions.SUBSCRIBED_TOPICS_MAX}",
            )
        for topic in set(subscribed_topics):
            self.auth.require(Operation.DESCRIBE, ResourceType.TOPIC, topic)
        if subscribed_pattern:
            self.auth.require(Operation.DESCRIBE, ResourceType.TOPIC, WILDCARD)

    async def consumer_heartbeat(
        self, index: int, heartbeat: decisions.Heartbeat
    ) -> tuple[decisions.HeartbeatAnswer, int]:
        """A member's heartbeat at the coordinator of ``__consumer_offsets-{index}`` (this
        node): its answer and the heartbeat interval to give it. A group with members of
        Kafka's classic protocol takes none: INCONSISTENT_GROUP_PROTOCOL."""
        saved = self._coordinator().committed(index).group(heartbeat.group_id)
        if self.classic.has_members(heartbeat.group_id) or (saved and saved.has_classic_members):
            raise HeadwaterError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"group {heartbeat.group_id!r} has members of Kafka's classic protocol "
                "(JoinGroup); use another group id, or let them leave first",
            )
        return await self._coordinator().heartbeat(index, heartbeat)

    # ------------------------------------------------------------------ calls

    @rpc_handler
    async def FindCoordinator(
        self, request: pb.FindCoordinatorRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FindCoordinatorResponse:
        self.auth.require(Operation.DESCRIBE, ResourceType.GROUP, request.group_id)
        image, index, leader = await self._locate(request.group_id)
        return pb.FindCoordinatorResponse(
            node_id=leader, address=image.broker_address(leader), partition=index
        )

    @rpc_handler
    async def ConsumerGroupHeartbeat(
        self,
        request: pb.ConsumerGroupHeartbeatRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.ConsumerGroupHeartbeatResponse:
        """See ``authorize_heartbeat``."""
        self.authorize_heartbeat(
            request.group_id, request.subscribed_topics, request.subscribed_pattern
        )
        owned = partition_keys(request.owned, "owned")
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
        answer, interval = await self.consumer_heartbeat(route, heartbeat)
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
        # Needs read on the group and on every topic committed (the whole call is refused
        # when one topic is not allowed).
        self.auth.require(Operation.READ, ResourceType.GROUP, request.group_id)
        for topic in {o.topic for o in request.offsets}:
            self.auth.require(Operation.READ, ResourceType.TOPIC, topic)
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            return await self._forward(route, "OffsetCommit", request)  # type: ignore[no-any-return]
        items = [
            decisions.CommitItem(o.topic, o.partition, o.offset, o.metadata)
            for o in request.offsets
        ]
        answers = await self._coordinator().commit(
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
        self.auth.require(Operation.DESCRIBE, ResourceType.GROUP, request.group_id)
        answer = await self._offset_fetch(request, context)
        if self.auth.enabled:
            visible = set(self.auth.visible(ResourceType.TOPIC, {o.topic for o in answer.offsets}))
            kept = [o for o in answer.offsets if o.topic in visible]
            if len(kept) != len(answer.offsets):
                answer = pb.OffsetFetchResponse(offsets=kept)
        return answer

    async def _offset_fetch(
        self, request: pb.OffsetFetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.OffsetFetchResponse:
        wanted = partition_keys(request.partitions, "partitions")
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            return await self._forward(route, "OffsetFetch", request)  # type: ignore[no-any-return]
        group = self._coordinator().committed(route).group(request.group_id)
        offsets = group.offsets if group is not None else {}
        if not wanted:
            return pb.OffsetFetchResponse(
                offsets=[_committed(c) for _, c in sorted(offsets.items())]
            )
        answer = []
        for key in sorted(wanted):
            committed = offsets.get(key)
            answer.append(
                _committed(committed)
                if committed is not None
                else pb.CommittedOffset(topic=key[0], partition=key[1], offset=-1)
            )
        return pb.OffsetFetchResponse(offsets=answer)

    @rpc_handler
    async def DescribeGroup(
        self, request: pb.DescribeGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeGroupResponse:
        """Needs ``describe`` on the group; of the topics the answer names (committed
        offsets, members' subscriptions, assignments and targets) it keeps those the
        caller may describe, as OffsetFetch does (a pattern subscription is kept: it
        names no topic)."""
        self.auth.require(Operation.DESCRIBE, ResourceType.GROUP, request.group_id)
        answer = await self._describe_group(request, context)
        if self.auth.enabled:
            _hide_topics(answer, set(self.auth.visible(ResourceType.TOPIC, _topics_of(answer))))
        return answer

    async def _describe_group(
        self, request: pb.DescribeGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeGroupResponse:
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            return await self._forward(route, "DescribeGroup", request)  # type: ignore[no-any-return]
        group = self._coordinator().committed(route).group(request.group_id)
        classic = self.classic.view(request.group_id)
        if group is None and classic is None:
            raise HeadwaterError(
                ErrorCode.GROUP_ID_NOT_FOUND, f"group {request.group_id!r} does not exist"
            )
        if group is None:
            answer = pb.DescribeGroupResponse(
                group_id=request.group_id, coordinator_id=self.config.node_id
            )
        else:
            answer = describe(group, self.config.node_id)
        return with_classic(answer, classic)

    @rpc_handler
    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteGroupResponse:
        self.auth.require(Operation.DELETE, ResourceType.GROUP, request.group_id)
        route = await self._route(request.group_id, context)
        if isinstance(route, str):
            return await self._forward(route, "DeleteGroup", request)  # type: ignore[no-any-return]
        await self._coordinator().delete(route, request.group_id)
        return pb.DeleteGroupResponse()

    @rpc_handler
    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListGroupsResponse:
        own = self._visible_groups(self._own_groups())
        if is_local_only(context):
            return pb.ListGroupsResponse(groups=own)
        image = self.state.image
        others = [n for n in image.live_broker_ids() if n != self.config.node_id]

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
        groups = list(own)
        unreachable = []
        for node_id, answer in zip(others, answers, strict=True):
            if answer is None:
                unreachable.append(node_id)
            else:
                groups += answer.groups
        groups = self._visible_groups(groups)
        groups.sort(key=lambda g: g.group_id)
        return pb.ListGroupsResponse(groups=groups, unreachable_nodes=unreachable)

    def _visible_groups(self, groups: list[pb.GroupListing]) -> list[pb.GroupListing]:
        """The groups the caller may describe (all, with describe on the cluster)."""
        if self.auth.allows(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
            return groups
        visible = set(self.auth.visible(ResourceType.GROUP, [g.group_id for g in groups]))
        return [g for g in groups if g.group_id in visible]

    def own_group_listings(self) -> list[str]:
        """The ids of the groups this node coordinates (their partitions loaded)."""
        return [g.group_id for g in self._own_groups()]

    def group_state(self, group_id: str) -> tuple[str, list[tuple[str, str]]] | None:
        """The state of a group this node coordinates and its (member id, client id)s;
        None when it has no such group."""
        if self.coordinator is None:
            return None
        for shard in list(self.coordinator.shards.values()):
            if shard.loaded:
                group = shard.committed().group(group_id)
                if group is not None:
                    members = [(m, j.client_id) for m, j in sorted(group.members.items())]
                    return group.state, members
        return None

    def _own_groups(self) -> list[pb.GroupListing]:
        if self.coordinator is None or not self.may_lead():
            return []
        listings: dict[str, pb.GroupListing] = {}
        for shard in list(self.coordinator.shards.values()):
            if not shard.loaded:
                continue
            image: GroupsImage = shard.committed()
            for group_id, group in image.groups.items():
                listings[group_id] = pb.GroupListing(
                    group_id=group_id,
                    state=group.state,
                    members=len(group.members),
                    coordinator_id=self.config.node_id,
                )
        for group_id, state, members in self.classic.listings():
            listed = listings.get(group_id)
            if listed is None or members or not listed.members:
                listings[group_id] = pb.GroupListing(
                    group_id=group_id,
                    state=state,
                    members=members,
                    coordinator_id=self.config.node_id,
                )
        return list(listings.values())


def _topics_of(answer: pb.DescribeGroupResponse) -> set[str]:
    """Every topic a group description names."""
    topics = {o.topic for o in answer.offsets}
    for member in answer.members:
        topics.update(member.subscribed_topics)
        for assignment in (member.assigned, member.revoking, member.target):
            topics.update(t.topic for t in assignment)
    return topics


def _hide_topics(answer: pb.DescribeGroupResponse, visible: set[str]) -> None:
    """Drop from ``answer`` (in place) every mention of a topic not in ``visible``."""

    def keep(items: Any) -> None:
        kept = [item for item in items if item.topic in visible]
        if len(kept) != len(items):
            del items[:]
            items.extend(kept)

    keep(answer.offsets)
    for member in answer.members:
        subscribed = [t for t in member.subscribed_topics if t in visible]
        if len(subscribed) != len(member.subscribed_topics):
            del member.subscribed_topics[:]
            member.subscribed_topics.extend(subscribed)
        for assignment in (member.assigned, member.revoking, member.target):
            keep(assignment)
