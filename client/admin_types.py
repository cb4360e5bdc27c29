"""What the Admin client answers: topics, partitions, brokers, the cluster's metadata, a
replica's log, users and consumer groups, as frozen values of the client's own.

Field names are the Admin API's (the fields of the headwater.v1 messages they come from,
proto/headwater/v1/headwater.proto); repeated fields are tuples, maps are dicts, and a
message field is the matching type here. headwater.client.admin_messages builds them from
the messages (the one place that does); this module imports no protobuf
(tests/test_layers.py), so a program that reads these values needs no generated code.

Offsets are record offsets in a partition's log; ``[start, end)`` ranges include start
and exclude end. Node ids are the brokers' ``node_id``; -1 means none.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass


class OffsetSpec(enum.Enum):
    """Where ``Admin.list_offsets`` looks in each partition."""

    EARLIEST = "earliest"
    """The log start offset: the first offset still in the log."""
    LATEST = "latest"
    """The high watermark: the offset the next consumable record will get."""
    TIMESTAMP = "timestamp"
    """The first offset whose record timestamp is >= the timestamp given (ms since the
    epoch); the high watermark when no record is that recent."""


# ------------------------------------------------------------------------- topics


@dataclass(frozen=True, slots=True)
class TopicSummary:
    """One topic of ``Admin.list_topics``."""

    name: str
    topic_id: str
    """A UUID that changes when the topic is deleted and created again."""
    partitions: int
    """How many partitions the topic has."""
    replication_factor: int
    """How many replicas each partition has."""


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    """A follower as its partition's leader sees it."""

    node_id: int
    log_end_offset: int
    """The follower's log end offset as of its last fetch; -1 when it has not fetched
    since this leader took over."""
    lag_records: int
    """Records the follower lacks: the leader's log end offset minus the follower's; -1
    when it has not fetched."""
    caught_up_ms_ago: int
    """Time since the follower last had everything the leader had, in ms."""


@dataclass(frozen=True, slots=True)
class ReplicaDamage:
    """What a node set aside from its replica when it opened it: a log cut by recovery
    (the rest kept in damaged/ in the partition's folder) or an unreadable partition
    metadata file (the folder kept in DATA_DIR/damaged/)."""

    node_id: int
    damage: str
    """What was set aside and where, in words."""


@dataclass(frozen=True, slots=True)
class ProducerState:
    """An idempotent producer as a partition's leader knows it."""

    producer_id: int
    producer_epoch: int
    next_sequence: int
    """The sequence number the producer's next batch must start at."""
    last_offset: int
    """The offset of the last record of its last batch, -1 when none is kept."""
    last_timestamp_ms: int
    """Its last batch's max timestamp, ms since the epoch; the leader forgets the
    producer producer_id_expiration_ms after it."""


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition of ``Admin.describe_topics``: its replicas as the metadata has them
    and its log as its leader has it."""

    partition: int
    leader: int
    """The leader's node id, -1 while the partition has none (offline)."""
    leader_epoch: int
    """Bumped at every leader change."""
    replicas: tuple[int, ...]
    """Replica node ids; the first is the preferred leader."""
    isr: tuple[int, ...]
    """In-sync replicas: the leader and the followers that have every committed record."""
    log_start_offset: int
    """The first offset still in the log (it advances as retention deletes segments)."""
    log_end_offset: int
    """The offset the next appended record will get."""
    high_watermark: int
    """Records below it are committed and visible to consumers."""
    size_bytes: int
    """Bytes of segment files (logs and indexes) on the leader's disk."""
    segment_count: int
    partition_epoch: int
    """Bumped at every change of the partition's metadata."""
    adding_replicas: tuple[int, ...]
    """Replicas a reassignment in progress adds (empty without one)."""
    removing_replicas: tuple[int, ...]
    """Replicas a reassignment in progress removes (empty without one)."""
    followers: tuple[ReplicaProgress, ...]
    """The leader's view of each follower (empty for partitions the answering node does
    not lead)."""
    damaged_replicas: tuple[ReplicaDamage, ...]
    """Replicas whose node set something aside when it opened them; empty when none did
    or their nodes could not be asked."""
    cleanable_ratio: float
    """Compacted topics: the leader's dirty share of its cleanable log, in [0, 1] (the
    cleaner cleans at the topic's min_cleanable_dirty_ratio); -1 for other topics or
    when unknown."""
    cleaned_offset: int
    """Compacted topics: the offset below which the leader's log is clean; -1 for other
    topics or when unknown."""
    producers: tuple[ProducerState, ...]
    """The idempotent producers the leader tracks on this partition."""


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """One topic of ``Admin.describe_topics``."""

    name: str
    topic_id: str
    """A UUID that changes when the topic is deleted and created again."""
    configs: Mapping[str, str]
    """Every topic config (the node's names, docs/configuration.md) with its effective
    value: set on the topic or the node's default."""
    partitions: tuple[PartitionDescription, ...]
    """By partition number."""
    config_overrides: tuple[str, ...]
    """The configs set on the topic, sorted; the rest of ``configs`` are defaults."""


# ------------------------------------------------------------------------- metadata


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    """A registered broker."""

    node_id: int
    address: str
    """host:port that clients connect to."""
    rack: str
    """Its rack ("" when none was set)."""
    state: str
    """"running", "fenced", "shutting_down" or "log_dir_offline" (its log directory
    cannot be written: it leads nothing and is in no ISR until it can)."""
    broker_epoch: int
    """The registration's epoch, assigned by the controller at each process start."""
    log_dir_problem: str
    """While ``state`` is "log_dir_offline": what failed (the folder and the errno)."""


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    """A partition's replicas and leader as the metadata has them."""

    partition: int
    leader: int
    """The leader's node id, -1 while the partition has none (offline)."""
    leader_epoch: int
    """Bumped at every leader change."""
    replicas: tuple[int, ...]
    """Replica node ids; the first is the preferred leader."""
    isr: tuple[int, ...]
    """In-sync replicas: the leader and the followers that have every committed record."""
    partition_epoch: int
    """Bumped at every change of the partition's metadata."""
    adding_replicas: tuple[int, ...]
    """Replicas a reassignment in progress adds (empty without one)."""
    removing_replicas: tuple[int, ...]
    """Replicas a reassignment in progress removes (empty without one)."""


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """A topic's partitions as the metadata has them."""

    name: str
    topic_id: str
    """A UUID that changes when the topic is deleted and created again."""
    partitions: tuple[PartitionMetadata, ...]


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """The cluster's metadata as one node holds it (``Admin.metadata``,
    ``Admin.node_metadata``)."""

    brokers: tuple[BrokerDescription, ...]
    """Every registered broker, by node id."""
    controller_id: int
    """The active controller's node id, -1 when there is none."""
    cluster_id: str
    topics: tuple[TopicMetadata, ...]
    """The topics asked for (every topic when none was named)."""
    raft_term: int
    """The answering node's Raft term of the metadata quorum (the controller epoch)."""
    raft_commit_index: int
    """The answering node's Raft commit index; 0 on broker-only nodes (not voters)."""
    metadata_offset: int
    """How many metadata batches the answering node's image has applied."""
    node_id: int
    """The node that answered."""
    metadata_digest: bytes
    """SHA-256 of the answering node's whole metadata image (32 bytes) when asked for
    (``Admin.node_metadata``), else empty. Nodes whose images are equal answer equal
    digests; two nodes at one metadata_offset with different digests applied different
    metadata."""


@dataclass(frozen=True, slots=True)
class ReplicaLogDescription:
    """One node's replica of a partition (``Admin.describe_replica_log``): its offsets and
    a SHA-256 of the stored batches holding a range of offsets."""

    node_id: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    leader_epoch: int
    """The leader epoch this replica is at."""
    is_leader: bool
    """Whether this replica leads the partition now."""
    covered_start_offset: int
    """Whole batches covering [covered_start_offset, covered_end_offset) were hashed (the
    first may begin before the range asked, the last end after it); both -1 when nothing
    was hashed. One call hashes at most 256 MiB: a covered_end_offset below the end asked
    for means "ask again from there"."""
    covered_end_offset: int
    batch_count: int
    """How many batches were hashed."""
    size_bytes: int
    """Their total size in bytes, as stored."""
    sha256: bytes
    """SHA-256 of those batches' bytes as stored, headers included (replicas store the
    leader's batches unchanged); empty when nothing was hashed."""
    damage: str
    """What this node set aside from its replica when it opened it, and where; "" when
    nothing."""


# ------------------------------------------------------------------------- users


@dataclass(frozen=True, slots=True)
class UserDescription:
    """A user with SCRAM credentials (never its keys)."""

    name: str
    mechanism: str
    """The SASL mechanism of its credentials (SCRAM-SHA-256)."""
    iterations: int
    """PBKDF2 iterations of its salted password."""


# ------------------------------------------------------------------------- groups


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """One group of ``Admin.list_groups``."""

    group_id: str
    state: str
    """"empty", "assigning", "reconciling" or "stable" (docs/groups.md); a classic
    group's state by Kafka's names."""
    members: int
    """How many members it has."""
    coordinator_id: int
    """The node id of its coordinator."""


@dataclass(frozen=True, slots=True)
class GroupListing:
    """``Admin.list_groups``'s answer."""

    groups: tuple[GroupSummary, ...]
    unreachable_nodes: tuple[int, ...]
    """Nodes that did not answer: their groups are missing from ``groups``."""


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    """Partitions of one topic."""

    topic: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """A member of a group."""

    member_id: str
    instance_id: str
    """Its static membership id, "" when it has none."""
    client_id: str
    member_epoch: int
    """Its epoch; a classic group's generation."""
    subscribed_topics: tuple[str, ...]
    subscribed_pattern: str
    """Its topic pattern (a regular expression), "" when it subscribed by name."""
    assigned: tuple[TopicPartitions, ...]
    """What the member reads."""
    revoking: tuple[TopicPartitions, ...]
    """What it is giving up (empty in classic groups)."""
    target: tuple[TopicPartitions, ...]
    """What the assignor wants it to have (empty in classic groups)."""
    session_timeout_ms: int
    rebalance_timeout_ms: int
    host: str
    """The address the member connects from, as its node saw it."""


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's committed offset of one partition."""

    topic: str
    partition: int
    offset: int
    """The offset the group reads next; -1 when it has no committed offset."""
    metadata: str
    """The text committed with the offset."""
    commit_timestamp_ms: int
    """When it was committed, ms since the epoch."""


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """``Admin.describe_group``'s answer."""

    group_id: str
    state: str
    """"consumer" groups: empty, assigning, reconciling, stable. "classic" groups: Empty,
    PreparingRebalance, CompletingRebalance, Stable (Kafka's names)."""
    group_epoch: int
    """Bumped when the group's members or subscriptions change; a classic group's
    generation."""
    target_epoch: int
    """The group epoch the assignor's target assignment was computed at (the group is
    "assigning" while it lags ``group_epoch``)."""
    assignor: str
    """A classic group's chosen protocol (range, roundrobin, cooperative-sticky, ...)."""
    coordinator_id: int
    """The node id of its coordinator."""
    members: tuple[MemberDescription, ...]
    offsets: tuple[CommittedOffset, ...]
    protocol: str
    """"consumer": the server-side protocol (ConsumerGroupHeartbeat); "classic": Kafka's
    JoinGroup and SyncGroup, with the assignor in the client."""


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """A group's progress on one partition (``Admin.group_lag``)."""

    topic: str
    partition: int
    committed: int | None
    """The committed offset, None without a commit."""
    log_end: int
    """The partition's high watermark."""
    lag: int | None
    """Records behind: ``log_end`` - ``committed`` (at least 0), None without a commit."""
    member_id: str
    """The member that reads or is giving up the partition, "" when none does."""
