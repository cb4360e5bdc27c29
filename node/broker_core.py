"""The broker's operations on partitions, written once for every front (gRPC and Kafka's
wire protocol): finding the replica that serves a request, appending a batch with its
acknowledgement level, idempotence and deadline, the long-poll read, the offset of a
spec, and producer ids. No protocol type appears here: a front checks and translates
its request, calls these, and translates the answer (``headwater.node.service`` for
gRPC, ``headwater.node.kafka`` for Kafka's protocol).

Rules every caller gets from here, not from its own code:
- A request for a partition this node does not lead gets ``None`` from
  ``leader_replica`` (the gRPC front forwards it; the Kafka front answers
  NOT_LEADER_OR_FOLLOWER, and the client asks Metadata again); a partition without a
  leader, a node that may not lead yet, or an offline data folder raise the retriable
  error that says so.
- ``append`` validates the batch (format, CRC, size, timestamps, keys of compacted
  topics), refuses idempotent batches without acks=all and producer ids never
  allocated, checks ``min_insync_replicas`` for acks=all before appending, and never
  appends once the client's deadline has passed. acks=all is answered only once the
  in-sync replicas hold the batch (the high watermark passed it).
- ``read`` returns only records below the high watermark.

Every method runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from headwater.log import batch as batch_format
from headwater.log.api import ReadResult
from headwater.log.kafka_records import ProducedBatch
from headwater.node.authorizer import Authorizer
from headwater.node.clock import now_ms
from headwater.node.cluster_state import ClusterState
from headwater.node.config import NodeConfig
from headwater.node.log_manager import LogManager
from headwater.node.metrics import NodeMetrics
from headwater.node.partition import Partition
from headwater.node.producer_ids import ProducerIdAllocator
from headwater.raft.image import MetadataImage, TopicImage
from headwater.raft.records import NO_LEADER
from headwater.shared.acls import CLUSTER_RESOURCE, Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError

TAKEOVER_WAIT_S: Final = 2.0
"""How long a request waits for this node's replica to take a leadership the metadata
has just given it."""
PRODUCER_ID_WAIT_S: Final = 1.0
"""How long an idempotent batch waits for this node's image to show its producer id
(allocated a moment ago through another node)."""


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an appended (or deduplicated) batch is: its first offset, record count and
    the log start offset."""

    partition: int
    base_offset: int
    record_count: int
    log_start_offset: int


class OffsetSpec(enum.Enum):
    """Which offset ``offset_of`` finds."""

    EARLIEST = "earliest"
    LATEST = "latest"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True, slots=True)
class FoundOffset:
    """An offset ``offset_of`` found, with its record's timestamp (-1: none asked)."""

    offset: int
    timestamp_ms: int = -1


class BrokerCore:
    """One node's partition operations (see the module doc)."""

    def __init__(
        self,
        config: NodeConfig,
        logs: LogManager,
        state: ClusterState,
        *,
        authorizer: Authorizer,
        may_lead: Callable[[], bool] = lambda: True,
        producer_ids: ProducerIdAllocator | None = None,
        metrics: NodeMetrics | None = None,
    ) -> None:
        self.config = config
        self.logs = logs
        self.state = state
        self.auth = authorizer
        self.may_lead = may_lead
        self.producer_ids = producer_ids
        self.metrics = metrics

    # ------------------------------------------------------------------ routing

    def topic(self, image: MetadataImage, name: str) -> TopicImage:
        """The topic ``name`` of ``image``. A node that has not yet seen a current image
        (it is starting and replaying or fetching the metadata) answers LEADER_NOT_AVAILABLE
        (retriable) for a topic it does not know, never "does not exist": the topic may
        well exist."""
        if name not in image.topics and not self.state.current:
            raise HeadwaterError(
                ErrorCode.LEADER_NOT_AVAILABLE,
                f"node {self.config.node_id} is starting and has not caught up with the "
                f"cluster metadata yet, so it cannot tell where topic {name!r} is; retry "
                "(or ask another node)",
            )
        return image.topic_named(name)

    async def leader_replica(
        self, image: MetadataImage, topic: TopicImage, index: int
    ) -> Partition | None:
        """This node's replica when it leads partition ``index``; None when another node
        does. Raises LEADER_NOT_AVAILABLE while the partition has no leader. When the
        metadata has just made this node the leader, waits (up to TAKEOVER_WAIT_S) for the
        replica to take the role."""
        state = topic.partitions[index]
        if state.leader == NO_LEADER:
            raise HeadwaterError(
                ErrorCode.LEADER_NOT_AVAILABLE,
                f"partition {index} of {topic.name!r} has no leader: no in-sync replica "
                f"is alive (replicas {list(state.replicas)}, ISR {list(state.isr)})",
            )
        if state.leader != self.config.node_id:
            return None
        if self.logs.offline_problem:
            raise HeadwaterError(
                ErrorCode.KAFKA_STORAGE_ERROR,
                f"node {self.config.node_id} cannot lead {topic.name}-{index}: its data folder "
                f"is offline ({self.logs.offline_problem}); its leadership is moving to "
                "another in-sync replica, retry",
            )
        if not self.may_lead():
            raise HeadwaterError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"node {self.config.node_id} is starting or fenced and cannot lead "
                f"{topic.name}-{index} yet; retry",
            )
        local = self.logs.partition(topic.name, index)
        if local is None or local.leader_epoch < state.leader_epoch:
            await self.state.wait_reconciled(image.offset, TAKEOVER_WAIT_S)
            local = self.logs.partition(topic.name, index)
        if local is None or not local.is_leader or local.leader_epoch != state.leader_epoch:
            raise HeadwaterError(
                ErrorCode.LEADER_NOT_AVAILABLE,
                f"partition {index} of {topic.name!r} is becoming led by this node; retry",
            )
        return local

    # ------------------------------------------------------------------ produce

    async def append(
        self,
        partition: Partition,
        batch: bytes | ProducedBatch,
        *,
        acks_all: bool,
        timeout_ms: int,
        deadline_unix_ms: int = 0,
    ) -> asyncio.Future[Appended]:
        """Append ``batch`` to ``partition``, which this node leads: a produced batch of the
        columnar format (checked whole here) or a Kafka batch ``to_stored`` checked and
        wrapped; return its acknowledgement: done at once for acks 0 and 1, a task waiting
        for the in-sync replicas for acks=all (``timeout_ms``, 0: the node's request
        timeout)."""
        max_message_bytes = partition.max_message_bytes
        stored = batch.stored if isinstance(batch, ProducedBatch) else batch
        if len(stored) > max_message_bytes:
            raise HeadwaterError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"batch of {len(stored)} bytes exceeds max_message_bytes {max_message_bytes} of "
                f"topic {partition.topic!r}",
            )
        if isinstance(batch, ProducedBatch):
            header = batch_format.read_header(stored)
        else:
            header = batch_format.validate_batch(
                stored,
                max_uncompressed_bytes=max_message_bytes,
                timestamp_range=partition.log_config.timestamp_range(now_ms()),
                require_keys=partition.log_config.compacted,
            )
        partition.check_open()
        if header.producer_id >= 0:
            await self.check_idempotent(header.producer_id, acks_all)
        if acks_all:
            partition.check_min_insync()
        info = await partition.append(stored, now_ms(), deadline_unix_ms)
        if self.metrics is not None and not info.duplicate:
            self.metrics.count_in(partition.topic, info.record_count, len(stored))
        result = Appended(
            partition=partition.index,
            base_offset=info.base_offset,
            record_count=info.record_count,
            log_start_offset=info.log_start_offset,
        )
        done: asyncio.Future[Appended] = asyncio.get_running_loop().create_future()
        if not acks_all:
            done.set_result(result)
            return done
        timeout_s = (timeout_ms or self.config.request_timeout_ms) / 1000

        async def replicated() -> Appended:
            await partition.wait_for_replication(info.last_offset + 1, timeout_s)
            return result

        return asyncio.get_running_loop().create_task(replicated())

    async def check_idempotent(self, producer_id: int, acks_all: bool) -> None:
        """An idempotent batch needs acks=all (a retry deduplicates only what the in-sync
        replicas hold) and a producer id the cluster allocated, or one from the range
        writers name themselves (SELF_NAMED_PRODUCER_ID_MIN up)."""
        if not acks_all:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUIRED_ACKS,
                f"the batch carries producer id {producer_id} (idempotent) and needs acks=all; "
                "idempotent batches sent with acks 0 or 1 are refused",
            )
        if producer_id >= batch_format.SELF_NAMED_PRODUCER_ID_MIN:
            return  # named by its writer, not allocated (docs/record-batch-format.md)
        if producer_id >= self.state.image.next_producer_id:
            # Allocated a moment ago through another node, maybe: this image may lag.
            await self.state.wait_until(
                lambda image: image.next_producer_id > producer_id, PRODUCER_ID_WAIT_S
            )
        allocated = self.state.image.next_producer_id
        if producer_id >= allocated:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_PRODUCER_ID,
                f"producer id {producer_id} was never allocated (ids below {allocated} are); "
                "ask InitProducerId for one; nothing was appended",
            )

    async def init_producer_id(self) -> tuple[int, int]:
        """A new producer id and its epoch (0). Kafka's rule for an idempotent producer:
        write on the cluster or on any topic."""
        image = self.state.image
        # A generator: with the authorizer off, no topic is looked at.
        self.auth.require_any(
            Operation.WRITE,
            itertools.chain(
                [(ResourceType.CLUSTER, CLUSTER_RESOURCE)],
                ((ResourceType.TOPIC, name) for name in image.topics),
            ),
        )
        if self.producer_ids is None:
            raise HeadwaterError(
                ErrorCode.BROKER_NOT_AVAILABLE,
                f"node {self.config.node_id} is not a broker; ask a broker for a producer id",
            )
        return await self.producer_ids.next_id(), 0

    # ------------------------------------------------------------------ read

    async def read(
        self, partition: Partition, offset: int, max_bytes: int, min_bytes: int, max_wait_s: float
    ) -> ReadResult:
        """One long poll of ``partition`` from ``offset``: whole batches below the high
        watermark, up to ``max_bytes`` (at least one batch when there is one), waiting up
        to ``max_wait_s`` for ``min_bytes`` (at least one record)."""
        partition.check_open()
        partition.check_leader()
        partition.check_fetch_offset(offset)
        deadline = time.monotonic() + max_wait_s
        result = partition.read(offset, max_bytes)
        while len(result.data) < max(min_bytes, 1) and time.monotonic() < deadline:
            await partition.wait_for_data(result.next_offset, deadline - time.monotonic())
            partition.check_open()
            partition.check_leader()
            result = partition.read(offset, max_bytes)
            if len(result.data) and len(result.data) >= min_bytes:
                break
        return result

    def count_out(self, partition: Partition, records: int, size: int) -> None:
        """Count records and bytes a read answered (when metrics are on)."""
        if self.metrics is not None and size:
            self.metrics.count_out(partition.topic, records, size)

    # ------------------------------------------------------------------ offsets

    @staticmethod
    def offset_of(partition: Partition, spec: OffsetSpec, timestamp_ms: int = -1) -> FoundOffset:
        """The earliest offset, the latest (the high watermark), or the first whose record
        has a timestamp >= ``timestamp_ms`` (the high watermark when none has).

        Raises OFFSET_NOT_AVAILABLE (retriable) for the latest or a timestamp's offset
        while a new leader's high watermark is below the offset its leadership began at:
        it is catching up with its followers, and answering it would send a reader back
        from offsets it was told were committed (Kafka's KIP-207)."""
        catching_up = partition.high_watermark < partition.epoch_start_offset
        if spec is not OffsetSpec.EARLIEST and catching_up:
            raise HeadwaterError(
                ErrorCode.OFFSET_NOT_AVAILABLE,
                f"{partition.topic}-{partition.index}: the new leader's high watermark "
                f"{partition.high_watermark} has not yet reached the offset its leadership "
                f"began at ({partition.epoch_start_offset}); retry",
            )
        if spec is OffsetSpec.EARLIEST:
            return FoundOffset(partition.log.log_start_offset)
        if spec is OffsetSpec.LATEST:
            return FoundOffset(partition.high_watermark)
        found = partition.log.offset_for_timestamp(timestamp_ms)
        if found and found[0] < partition.high_watermark:
            return FoundOffset(found[0], found[1])
        return FoundOffset(partition.high_watermark)
