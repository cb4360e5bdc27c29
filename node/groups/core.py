"""Consumer groups for every front (gRPC's Groups service and Kafka's group requests):
plain types in and out, Headwater's error codes, no protocol type.

A group is served by its coordinator, the leader of partition
``coordinator_partition(group_id)`` of ``__consumer_offsets`` (created on the first use
of any group, by the active controller: here when this node is it, else through an
``OffsetsTopicLink``). ``route`` says whether this node coordinates a group (its
partition loaded and serving) or where the coordinator is; the gRPC front forwards
there once, Kafka's front answers NOT_COORDINATOR and the client asks again.

Rules written here once, for both fronts:

- who may do what: ``read`` on the group to heartbeat, join, commit (and ``read`` on each
  topic committed: ``commit_refusals``), and ``describe`` on each subscribed topic
  (``describe`` on every topic for a pattern); ``describe`` on the group to find its
  coordinator, fetch its offsets or describe it; ``delete`` to delete it; a listing
  holds the groups the caller may describe (all of them with ``describe`` on the
  cluster), and an answer names only the topics the caller may describe
  (``topic_visibility``);
- a group id is one protocol at a time: a KIP-848 heartbeat to a group with classic
  members is refused (INCONSISTENT_GROUP_PROTOCOL), and the classic view of a group
  stands for it while it has members (``ClassicView``);
- the bounds on a heartbeat's subscribed topics and on the partitions a request names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.controller import ControllerDriver
from headwater.node.config import NodeConfig
from headwater.node.groups import decisions
from headwater.node.groups.coordinator import GroupCoordinator
from headwater.node.groups.image import GroupState
from headwater.node.groups.records import (
    OFFSETS_TOPIC,
    OffsetCommitted,
    TopicPartitionKey,
    coordinator_partition,
)
from headwater.node.security.authorizer import Authorizer
from headwater.raft.metadata.image import MetadataImage
from headwater.raft.metadata.records import NO_LEADER
from headwater.shared.acls import CLUSTER_RESOURCE, WILDCARD, Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.topics import check_group_id

METADATA_WAIT_S: Final = 5.0
LOAD_WAIT_S: Final = 2.0
LOAD_POLL_S: Final = 0.02
CONSUMER_PROTOCOL: Final = "consumer"
CLASSIC_PROTOCOL: Final = "classic"

OffsetsTopicLink = Callable[[str], Awaitable[None]]
"""How ``__consumer_offsets`` is asked of the active controller at an address when this
node is not it (the gRPC front's forwarding); raises the controller's refusal."""


@dataclass(frozen=True, slots=True)
class ClassicMemberView:
    """A member of a classic group as a description shows it: its subscribed topics and
    assigned partitions read from the consumer protocol's bytes (empty when the group's
    protocol type is another, or the bytes do not decode)."""

    member_id: str
    instance_id: str
    client_id: str
    host: str
    generation: int
    subscribed_topics: tuple[str, ...]
    assigned: tuple[tuple[str, tuple[int, ...]], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int


@dataclass(frozen=True, slots=True)
class ClassicView:
    """A group of Kafka's classic protocol as its coordinator holds it."""

    state: str
    generation: int
    protocol_name: str
    members: tuple[ClassicMemberView, ...]


class ClassicDirectory(Protocol):
    """The classic groups this node coordinates."""

    def has_members(self, group_id: str) -> bool:
        """Has the group members of the classic protocol here?"""
        ...

    def view(self, group_id: str) -> ClassicView | None:
        """The group as a description shows it; None when it is not a classic group here."""
        ...

    def listings(self) -> list[tuple[str, str, int]]:
        """(group id, state, members) of each classic group here."""
        ...


class NoClassicGroups:
    """A node without a Kafka listener: no classic groups."""

    def has_members(self, group_id: str) -> bool:  # noqa: ARG002 (none has)
        return False

    def view(self, group_id: str) -> ClassicView | None:  # noqa: ARG002 (none is)
        return None

    def listings(self) -> list[tuple[str, str, int]]:
        return []


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One group a node coordinates."""

    group_id: str
    state: str
    members: int
    coordinator_id: int


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A group as its coordinator describes it: the committed state (None for a group
    that only has classic members in memory) and the classic view, which stands for the
    group while it has members or the committed state has none (``classic_shown``)."""

    group_id: str
    coordinator_id: int
    committed: GroupState | None
    classic: ClassicView | None

    @property
    def classic_shown(self) -> bool:
        if self.classic is None:
            return False
        return not (self.committed is not None and self.committed.members) or bool(
            self.classic.members
        )


def partition_keys(
    items: Iterable[tuple[str, Sequence[int]]], what: str
) -> frozenset[TopicPartitionKey]:
    """(topic, partitions) pairs as a set of keys, refused past
    ``decisions.OWNED_PARTITIONS_MAX`` partitions (before the set is built further) or with
    a negative partition."""
    keys: set[TopicPartitionKey] = set()
    count = 0
    for topic, partitions in items:
        count += len(partitions)
        if count > decisions.OWNED_PARTITIONS_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"{what} names more than {decisions.OWNED_PARTITIONS_MAX} partitions",
            )
        for partition in partitions:
            if partition < 0:
                raise HeadwaterError(
                    ErrorCode.INVALID_REQUEST,
                    f"{what}: partition {partition} of {topic!r} is negative",
                )
            keys.add((topic, partition))
    return frozenset(keys)


class GroupCore:
    """Consumer groups on one node (see the module doc)."""

    def __init__(
        self,
        config: NodeConfig,
        state: ClusterState,
        coordinator: GroupCoordinator | None,
        controller: ControllerDriver | None,
        may_lead: Callable[[], bool],
        offsets_topic_link: OffsetsTopicLink,
        *,
        authorizer: Authorizer,
    ) -> None:
        self.config = config
        self.auth = authorizer
        self.state = state
        self.coordinator = coordinator
        self.controller = controller
        self.may_lead = may_lead
        self.offsets_topic_link = offsets_topic_link
        self._creating: asyncio.Task[None] | None = None
        self.classic: ClassicDirectory = NoClassicGroups()
        """The classic groups of this node (set when it serves Kafka's protocol): a group
        with members there takes no KIP-848 heartbeat, and descriptions and listings show
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
        await self.offsets_topic_link(address)

    async def locate(self, group_id: str) -> tuple[MetadataImage, int, int]:
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

    async def route(self, group_id: str, forwarded: bool) -> int | str:
        """The coordinator partition when this node coordinates ``group_id`` (its shard
        loaded), else the coordinator's address to forward to (NOT_COORDINATOR when
        ``forwarded``: a call is forwarded once at most)."""
        image, index, leader = await self.locate(group_id)
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

    async def here(self, group_id: str) -> int:
        """The coordinator partition of ``group_id``, which this node coordinates; else
        NOT_COORDINATOR (the front that does not forward)."""
        route = await self.route(group_id, forwarded=True)
        assert isinstance(route, int)  # forwarded=True: never an address
        return route

    def coordinator_here(self) -> GroupCoordinator:
        """This node's coordinator (``route`` returns a partition only with one)."""
        assert self.coordinator is not None
        return self.coordinator

    def committed(self, index: int, group_id: str) -> GroupState | None:
        """What is committed of ``group_id`` in ``__consumer_offsets-{index}`` (here)."""
        return self.coordinator_here().committed(index).group(group_id)

    def held(self, index: int, group_id: str) -> GroupState | None:
        """``group_id`` as the coordinator holds it now (written, perhaps not yet
        committed): what a member's next heartbeat is decided against."""
        return self.coordinator_here().shard(index).image.group(group_id)

    # ------------------------------------------------------------------ authorization

    def authorize_coordinator_lookup(self, group_id: str) -> None:
        self.auth.require(Operation.DESCRIBE, ResourceType.GROUP, group_id)

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

    def authorize_membership(self, group_id: str) -> None:
        """Joining, syncing, a classic heartbeat and leaving need ``read`` on the group."""
        self.auth.require(Operation.READ, ResourceType.GROUP, group_id)

    def authorize_commit(self, group_id: str, topics: Sequence[str]) -> None:
        """A commit needs ``read`` on the group and on each topic it names; refused
        whole when one is not allowed (gRPC's commit)."""
        self.auth.require(Operation.READ, ResourceType.GROUP, group_id)
        for topic in set(topics):
            self.auth.require(Operation.READ, ResourceType.TOPIC, topic)

    def commit_refusals(self, group_id: str, topics: Iterable[str]) -> set[str]:
        """The same rule, refused per topic (Kafka's OffsetCommit answers each partition):
        the group refused here, else the topics the caller may not read."""
        self.auth.require(Operation.READ, ResourceType.GROUP, group_id)
        return {
            t for t in set(topics) if not self.auth.allows(Operation.READ, ResourceType.TOPIC, t)
        }

    def authorize_describe(self, group_id: str) -> None:
        """Fetching a group's offsets and describing it need ``describe`` on the group."""
        self.auth.require(Operation.DESCRIBE, ResourceType.GROUP, group_id)

    def authorize_delete(self, group_id: str) -> None:
        self.auth.require(Operation.DELETE, ResourceType.GROUP, group_id)

    def topic_visibility(self) -> Callable[[str], bool] | None:
        """Whether the caller may describe a topic (remembered for one answer); None when
        every caller may describe every topic (no authorizer)."""
        if not self.auth.enabled:
            return None
        seen: dict[str, bool] = {}

        def visible(topic: str) -> bool:
            allowed = seen.get(topic)
            if allowed is None:
                allowed = seen[topic] = self.auth.allows(
                    Operation.DESCRIBE, ResourceType.TOPIC, topic
                )
            return allowed

        return visible

    def visible_groups(self, listings: list[GroupListing]) -> list[GroupListing]:
        """The groups the caller may describe (all, with describe on the cluster)."""
        if self.auth.allows(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_RESOURCE):
            return listings
        visible = set(self.auth.visible(ResourceType.GROUP, [g.group_id for g in listings]))
        return [g for g in listings if g.group_id in visible]

    # ------------------------------------------------------------------ operations

    async def consumer_heartbeat(
        self, index: int, heartbeat: decisions.Heartbeat
    ) -> tuple[decisions.HeartbeatAnswer, int]:
        """A member's heartbeat at the coordinator of ``__consumer_offsets-{index}`` (this
        node): its answer and the heartbeat interval to give it. A group with members of
        Kafka's classic protocol takes none: INCONSISTENT_GROUP_PROTOCOL."""
        saved = self.committed(index, heartbeat.group_id)
        if self.classic.has_members(heartbeat.group_id) or (saved and saved.has_classic_members):
            raise HeadwaterError(
                ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                f"group {heartbeat.group_id!r} has members of Kafka's classic protocol "
                "(JoinGroup); use another group id, or let them leave first",
            )
        return await self.coordinator_here().heartbeat(index, heartbeat)

    async def commit(
        self,
        index: int,
        group_id: str,
        member_id: str,
        member_epoch: int,
        items: list[decisions.CommitItem],
    ) -> Sequence[HeadwaterError | None]:
        """Commit ``items`` for a member of a KIP-848 group (or, with member epoch -1 and
        no member id, from outside the group): each item's refusal or None."""
        return await self.coordinator_here().commit(index, group_id, member_id, member_epoch, items)

    def offsets(
        self, index: int, group_id: str, wanted: frozenset[TopicPartitionKey]
    ) -> list[OffsetCommitted]:
        """The group's committed offsets of ``wanted`` (all of them when empty), by
        partition; a partition without one at offset -1."""
        group = self.committed(index, group_id)
        committed = group.offsets if group is not None else {}
        if not wanted:
            return [c for _, c in sorted(committed.items())]
        return [
            committed.get(key) or OffsetCommitted(group_id, key[0], key[1], -1, "", 0)
            for key in sorted(wanted)
        ]

    def describe(self, index: int, group_id: str) -> GroupDescription:
        """The group as its coordinator holds it; GROUP_ID_NOT_FOUND when there is none."""
        group = self.committed(index, group_id)
        classic = self.classic.view(group_id)
        if group is None and classic is None:
            raise HeadwaterError(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
        return GroupDescription(group_id, self.config.node_id, group, classic)

    def group_state(self, group_id: str) -> tuple[str, list[tuple[str, str]]] | None:
        """The committed state of a group this node coordinates and its (member id,
        client id)s; None when it has no such group."""
        if self.coordinator is None:
            return None
        for shard in list(self.coordinator.shards.values()):
            if shard.loaded:
                group = shard.committed().group(group_id)
                if group is not None:
                    members = [(m, j.client_id) for m, j in sorted(group.members.items())]
                    return group.state, members
        return None

    async def delete(self, index: int, group_id: str) -> None:
        await self.coordinator_here().delete(index, group_id)

    def own_groups(self) -> list[GroupListing]:
        """The groups this node coordinates (their partitions loaded), both protocols: a
        group listed by its classic state while that has members or the committed state
        has none."""
        if self.coordinator is None or not self.may_lead():
            return []
        listings: dict[str, GroupListing] = {}
        node_id = self.config.node_id
        for shard in list(self.coordinator.shards.values()):
            if not shard.loaded:
                continue
            for group_id, group in shard.committed().groups.items():
                listings[group_id] = GroupListing(
                    group_id, group.state, len(group.members), node_id
                )
        for group_id, state, members in self.classic.listings():
            listed = listings.get(group_id)
            if listed is None or members or not listed.members:
                listings[group_id] = GroupListing(group_id, state, members, node_id)
        return list(listings.values())
