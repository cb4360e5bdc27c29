"""The Python client: Producer, Consumer and Admin over Headwater's gRPC API.

from headwater.client import Admin, Consumer, Producer

with Admin("127.0.0.1:7700") as admin:
    admin.create_topic("events", partitions=3)
with Producer("127.0.0.1:7700", acks="all") as producer:
    producer.send("events", b"hello", key=b"user-1").result()
with Consumer("127.0.0.1:7700", auto_offset_reset="earliest") as consumer:
    consumer.assign("events")
    for record in consumer.poll(timeout_ms=1000):
        print(record.partition, record.offset, record.value)
"""

from headwater.client.admin import Admin, NewTopic
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
    PartitionLag,
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
from headwater.client.consumer import (
    Consumer,
    ConsumerRecord,
    FetchedBatch,
    PollResult,
)
from headwater.client.groups import CommitFailedError
from headwater.client.health import node_serving
from headwater.client.membership import RebalanceListener
from headwater.client.positions import TopicPartition
from headwater.client.producer import (
    BatchFuture,
    BatchMetadata,
    Producer,
    RecordFuture,
    RecordMetadata,
)
from headwater.client.producer_settings import ProducerOptions, ProducerSettings
from headwater.client.reader import FetchedRange, LogReader
from headwater.shared.tls import ClientSecurity

__all__ = [
    "Admin",
    "BatchFuture",
    "BatchMetadata",
    "BrokerDescription",
    "ClientSecurity",
    "ClusterMetadata",
    "CommitFailedError",
    "CommittedOffset",
    "Consumer",
    "ConsumerRecord",
    "FetchedBatch",
    "FetchedRange",
    "GroupDescription",
    "GroupListing",
    "GroupSummary",
    "LogReader",
    "MemberDescription",
    "NewTopic",
    "OffsetSpec",
    "PartitionDescription",
    "PartitionLag",
    "PartitionMetadata",
    "PollResult",
    "Producer",
    "ProducerOptions",
    "ProducerSettings",
    "ProducerState",
    "RebalanceListener",
    "RecordFuture",
    "RecordMetadata",
    "ReplicaDamage",
    "ReplicaLogDescription",
    "ReplicaProgress",
    "TopicDescription",
    "TopicMetadata",
    "TopicPartition",
    "TopicPartitions",
    "TopicSummary",
    "UserDescription",
    "node_serving",
]
