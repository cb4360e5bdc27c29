"""The Admin client's answers from headwater.v1 messages to headwater.client.admin_types:
the one place that reads those messages' fields, so that protobuf stays at the client's
gRPC edge. Pure: each function builds a value from a message.

Repeated fields become tuples and maps dicts, in the message's order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from headwater.client.admin_types import (
    BrokerDescription,
    ClusterMetadata,
    CommittedOffset,
    GroupDescription,
    GroupListing,
    GroupSummary,
    MemberDescription,
    OffsetSpec,
    PartitionDescription,
    PartitionMetadata,
    ProducerState,
    ReplicaDamage,
    ReplicaLogDescription,
    ReplicaProgress,
    TopicDescription,
    TopicMetadata,
    TopicPartitions,
    TopicSummary,
    UserDescription,
)
from headwater.v1 import headwater_pb2 as pb

OFFSET_SPECS: Final[dict[OffsetSpec, pb.OffsetSpec.ValueType]] = {
    OffsetSpec.EARLIEST: pb.OFFSET_SPEC_EARLIEST,
    OffsetSpec.LATEST: pb.OFFSET_SPEC_LATEST,
    OffsetSpec.TIMESTAMP: pb.OFFSET_SPEC_TIMESTAMP,
}


def topic_summary_of(message: pb.TopicSummary) -> TopicSummary:
    return TopicSummary(
        name=message.name,
        topic_id=message.topic_id,
        partitions=message.partitions,
        replication_factor=message.replication_factor,
    )


def partition_description_of(message: pb.PartitionDescription) -> PartitionDescription:
    return PartitionDescription(
        partition=message.partition,
        leader=message.leader,
        leader_epoch=message.leader_epoch,
        replicas=tuple(message.replicas),
        isr=tuple(message.isr),
        log_start_offset=message.log_start_offset,
        log_end_offset=message.log_end_offset,
        high_watermark=message.high_watermark,
        size_bytes=message.size_bytes,
        segment_count=message.segment_count,
        partition_epoch=message.partition_epoch,
        adding_replicas=tuple(message.adding_replicas),
        removing_replicas=tuple(message.removing_replicas),
        followers=tuple(
            ReplicaProgress(
                node_id=f.node_id,
                log_end_offset=f.log_end_offset,
                lag_records=f.lag_records,
                caught_up_ms_ago=f.caught_up_ms_ago,
            )
            for f in message.followers
        ),
        damaged_replicas=tuple(
            ReplicaDamage(node_id=d.node_id, damage=d.damage) for d in message.damaged_replicas
        ),
        cleanable_ratio=message.cleanable_ratio,
        cleaned_offset=message.cleaned_offset,
        producers=tuple(
            ProducerState(
                producer_id=p.producer_id,
                producer_epoch=p.producer_epoch,
                next_sequence=p.next_sequence,
                last_offset=p.last_offset,
                last_timestamp_ms=p.last_timestamp_ms,
            )
            for p in message.producers
        ),
    )


def topic_description_of(message: pb.TopicDescription) -> TopicDescription:
    return TopicDescription(
        name=message.name,
        topic_id=message.topic_id,
        configs=dict(message.configs),
        partitions=tuple(partition_description_of(p) for p in message.partitions),
        config_overrides=tuple(message.config_overrides),
    )


def cluster_metadata_of(message: pb.MetadataResponse) -> ClusterMetadata:
    return ClusterMetadata(
        brokers=tuple(
            BrokerDescription(
                node_id=b.node_id,
                address=b.address,
                rack=b.rack,
                state=b.state,
                broker_epoch=b.broker_epoch,
                log_dir_problem=b.log_dir_problem,
            )
            for b in message.brokers
        ),
        controller_id=message.controller_id,
        cluster_id=message.cluster_id,
        topics=tuple(
            TopicMetadata(
                name=t.name,
                topic_id=t.topic_id,
                partitions=tuple(partition_metadata_of(p) for p in t.partitions),
            )
            for t in message.topics
        ),
        raft_term=message.raft_term,
        raft_commit_index=message.raft_commit_index,
        metadata_offset=message.metadata_offset,
        node_id=message.node_id,
        metadata_digest=message.metadata_digest,
    )


def partition_metadata_of(message: pb.PartitionMetadata) -> PartitionMetadata:
    return PartitionMetadata(
        partition=message.partition,
        leader=message.leader,
        leader_epoch=message.leader_epoch,
        replicas=tuple(message.replicas),
        isr=tuple(message.isr),
        partition_epoch=message.partition_epoch,
        adding_replicas=tuple(message.adding_replicas),
        removing_replicas=tuple(message.removing_replicas),
    )


def replica_log_of(message: pb.DescribeReplicaLogResponse) -> ReplicaLogDescription:
    return ReplicaLogDescription(
        node_id=message.node_id,
        log_start_offset=message.log_start_offset,
        high_watermark=message.high_watermark,
        log_end_offset=message.log_end_offset,
        leader_epoch=message.leader_epoch,
        is_leader=message.is_leader,
        covered_start_offset=message.covered_start_offset,
        covered_end_offset=message.covered_end_offset,
        batch_count=message.batch_count,
        size_bytes=message.size_bytes,
        sha256=message.sha256,
        damage=message.damage,
    )


def user_of(message: pb.UserDescription) -> UserDescription:
    return UserDescription(
        name=message.name, mechanism=message.mechanism, iterations=message.iterations
    )


def group_listing_of(message: pb.ListGroupsResponse) -> GroupListing:
    return GroupListing(
        groups=tuple(
            GroupSummary(
                group_id=g.group_id,
                state=g.state,
                members=g.members,
                coordinator_id=g.coordinator_id,
            )
            for g in message.groups
        ),
        unreachable_nodes=tuple(message.unreachable_nodes),
    )


def _topic_partitions(items: Iterable[pb.TopicPartitions]) -> tuple[TopicPartitions, ...]:
    return tuple(TopicPartitions(topic=i.topic, partitions=tuple(i.partitions)) for i in items)


def member_of(message: pb.GroupMember) -> MemberDescription:
    return MemberDescription(
        member_id=message.member_id,
        instance_id=message.instance_id,
        client_id=message.client_id,
        member_epoch=message.member_epoch,
        subscribed_topics=tuple(message.subscribed_topics),
        subscribed_pattern=message.subscribed_pattern,
        assigned=_topic_partitions(message.assigned),
        revoking=_topic_partitions(message.revoking),
        target=_topic_partitions(message.target),
        session_timeout_ms=message.session_timeout_ms,
        rebalance_timeout_ms=message.rebalance_timeout_ms,
        host=message.host,
    )


def group_description_of(message: pb.DescribeGroupResponse) -> GroupDescription:
    return GroupDescription(
        group_id=message.group_id,
        state=message.state,
        group_epoch=message.group_epoch,
        target_epoch=message.target_epoch,
        assignor=message.assignor,
        coordinator_id=message.coordinator_id,
        members=tuple(member_of(m) for m in message.members),
        offsets=tuple(
            CommittedOffset(
                topic=o.topic,
                partition=o.partition,
                offset=o.offset,
                metadata=o.metadata,
                commit_timestamp_ms=o.commit_timestamp_ms,
            )
            for o in message.offsets
        ),
        protocol=message.protocol,
    )
