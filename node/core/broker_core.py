"""The broker's operations on partitions, written once for every front (gRPC and Kafka's
wire protocol): authorization, finding the replica that serves a request, appending a
batch with its checks, acknowledgement level, idempotence and deadline, the long poll
over many partitions, the offset of a spec, quotas and producer ids. No protocol type
appears here: a front checks and translates its request, calls these, and translates
the answer (``headwater.node.rpc.broker_service`` for gRPC, ``headwater.node.kafka`` for Kafka's
protocol).

Rules every caller gets from here, not from its own code:
- ``route`` authorizes first (the operation on the topic's name, before its existence is
  looked at), refuses writes to internal topics, then finds the partition: ``None`` when
  another node leads it (the gRPC front forwards; ``led`` answers
  NOT_LEADER_OR_FOLLOWER, and a Kafka client asks Metadata again); a partition without a
  leader, a node that may not lead yet, a node still catching up with the metadata, or
  an offline data folder raise the retriable error that says so.
- ``append`` checks the batch (format, CRC, size, timestamps, keys of compacted topics;
  a Kafka batch is checked record by record and wrapped), refuses idempotent batches
  without acks=all and producer ids never allocated, checks ``min_insync_replicas`` for
  acks=all before appending, and never appends once the client's deadline has passed.
  acks=all is answered only once the in-sync replicas hold the batch (the high watermark
  passed it). A refusal after the append (the wait for the replicas failed) is answered
  as a ``Refusal``, never kept as an exception (an exception beside its traceback's
  frames is a reference cycle; thousands a request cost the cyclic collector seconds).
- ``fetch`` is the one long poll: every partition asked read below its high watermark,
  within the answer's bytes (the first batch of the first partition with records whole,
  Kafka's KIP-74), waiting up to the time asked for ``min_bytes``, then the consumer
  byte-rate quota charged.
- ``throttle`` charges the caller's quotas and holds the answer for their delay.

Every method runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final, Generic, Protocol, TypeVar

from headwater.log import batch as batch_format
from headwater.log.api import ReadResult
from headwater.log.kafka_records import BadRecordsError, to_stored
from headwater.node.clock import now_ms
from headwater.node.cluster.producer_ids import ProducerIdAllocator
from headwater.node.config import NodeConfig
from headwater.node.core.limits import yield_every
from headwater.node.core.throttling import Quotas
from headwater.node.ops.metrics import NodeMetrics
from headwater.node.replicas.partition import Partition
from headwater.node.security.authorizer import Authorizer
from headwater.raft.metadata.image import MetadataImage, TopicImage
from headwater.raft.metadata.records import NO_LEADER
from headwater.shared.acls import CLUSTER_RESOURCE, Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_RATE
from headwater.shared.topics import INTERNAL_PREFIX

T = TypeVar("T")

TAKEOVER_WAIT_S: Final = 2.0
"""How long a request waits for this node's replica to take a leadership the metadata
has just given it."""
PRODUCER_ID_WAIT_S: Final = 1.0
"""How long an idempotent batch waits for this node's image to show its producer id
(allocated a moment ago through another node)."""
FETCH_SLICE_S: Final = 0.01
"""A fetch gives the event loop back once it has held it this long since it last did,
checked after each partition (as well as every ``LOOP_SLICE_ITEMS`` partitions): reading
and cutting a batch of one small record costs 15-25 µs, depending on the machine, so a
slice of 100 partitions of such batches held the loop for a quarter of a second, and a
slice by bytes read (256 KiB) took 25 ms on one machine and 50 ms on another. A timer on
the loop waits about three slices at most."""
CHECK_INLINE_BYTES_MAX: Final = 1 << 20
"""A Kafka batch of more bytes than this is checked (decompressed, every record parsed,
``to_stored``) in a worker thread: about 5 ms a MiB. ``append`` returns once it is
appended, so a connection's batches keep their order."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a partition's part of a request was refused: Headwater's code (Kafka's, but
    for a few of its own), the message, and for a Kafka batch refused record by record,
    (index in the batch, what is wrong) of each (Produce v8's per-record errors)."""

    code: ErrorCode
    message: str
    records: tuple[tuple[int, str], ...] = ()

    @classmethod
    def of(cls, error: HeadwaterError) -> Refusal:
        return cls(
            error.code, error.message, error.records if isinstance(error, BadRecordsError) else ()
        )

    def error(self) -> HeadwaterError:
        return HeadwaterError(self.code, self.message)


@dataclass(frozen=True, slots=True)
class KafkaBatch:
    """One partition's records of a Kafka Produce, as the client sent them: unchecked
    until ``append`` checks them against the partition's settings."""

    records: bytes | None


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


@dataclass(slots=True)
class FetchedPartition(Generic[T]):
    """One partition of a fetch: what was asked (``topic``, ``index``, ``offset``,
    ``max_bytes``) and, once ``BrokerCore.fetch`` returns, its answer: a ``refusal``, or
    the partition's offsets and the records taken (in the front's form, ``T``; None:
    none) with ``size`` bytes and the offset after them (``next_offset``: with none
    taken, ``offset``, or past a gap compaction left)."""

    topic: str
    index: int
    offset: int
    max_bytes: int
    refusal: Refusal | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    leader_epoch: int = -1
    records: T | None = None
    size: int = 0
    next_offset: int = -1
    replica: Partition | None = None
    """The replica a stream of fetches began on: a later fetch on another (the topic
    deleted and made again) is refused."""

    def clear(self) -> None:
        self.refusal = None
        self.high_watermark = self.log_start_offset = self.leader_epoch = -1
        self.records = None
        self.size = 0
        self.next_offset = self.offset


TakeRecords = Callable[[Partition, ReadResult, int, bool], Awaitable[tuple[T, int, int]]]
"""How a front takes records from a partition's read: ``take(partition, read, limit,
whole_first)`` returns (the records in the front's form, their size in bytes, the offset
after them) from ``read`` on, within ``limit`` bytes (the first batch whole when
``whole_first``); it may read on with ``BrokerCore.read``."""


class HostedReplicas(Protocol):
    """The replicas this node hosts (``LogManager``; the simulated cluster's own)."""

    offline_problem: str
    """Why the data folder is offline; empty while it serves."""

    def partition(self, topic: str, index: int) -> Partition | None: ...


class MetadataView(Protocol):
    """This node's view of the cluster metadata (``ClusterState``; the simulated
    cluster's own)."""

    image: MetadataImage
    current: bool
    """Whether this node has caught up with the cluster's metadata since it started."""

    async def wait_reconciled(self, offset: int, timeout_s: float) -> bool: ...

    async def wait_until(
        self, predicate: Callable[[MetadataImage], bool], timeout_s: float
    ) -> bool: ...


class BrokerCore:
    """One node's partition operations (see the module doc)."""

    def __init__(
        self,
        config: NodeConfig,
        logs: HostedReplicas,
        state: MetadataView,
        *,
        authorizer: Authorizer,
        may_lead: Callable[[], bool] = lambda: True,
        producer_ids: ProducerIdAllocator | None = None,
        metrics: NodeMetrics | None = None,
        quotas: Quotas | None = None,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        """``clock``: wall-clock milliseconds (``headwater.node.clock``; the simulated
        cluster passes its virtual clock)."""
        self.clock = clock
        self.config = config
        self.logs = logs
        self.state = state
        self.auth = authorizer
        self.may_lead = may_lead
        self.producer_ids = producer_ids
        self.metrics = metrics
        self.quotas = quotas

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

    def authorize(self, operation: Operation, name: str) -> None:
        """The caller may do ``operation`` on topic ``name`` (checked before its existence
        is looked at); a write is refused on an internal topic (only the cluster writes to
        those)."""
        self.auth.require(operation, ResourceType.TOPIC, name)
        if operation is Operation.WRITE and name.startswith(INTERNAL_PREFIX):
            raise HeadwaterError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic {name!r} is internal: only the cluster writes to it",
            )

    def may_describe(self, name: str) -> bool:
        """Whether the caller may see topic ``name`` in Metadata (``describe`` on it): a
        front refuses a topic named otherwise (gRPC the call, Kafka the topic)."""
        return self.auth.allows(Operation.DESCRIBE, ResourceType.TOPIC, name)

    def describable_topics(self, image: MetadataImage) -> list[str]:
        """The topics a Metadata that names none answers: those the caller may describe,
        by name."""
        return self.auth.visible(ResourceType.TOPIC, sorted(image.topics))

    def authorized_topic(self, image: MetadataImage, operation: Operation, name: str) -> TopicImage:
        """The topic ``name``, once ``authorize`` lets the caller do ``operation`` on it."""
        self.authorize(operation, name)
        return self.topic(image, name)

    async def route(
        self, image: MetadataImage, operation: Operation, name: str, index: int
    ) -> Partition | None:
        """This node's replica of partition ``index`` of ``name`` when it leads it, None
        when another node does, for a caller that may do ``operation`` on the topic
        (``authorized_topic``)."""
        topic = self.authorized_topic(image, operation, name)
        topic.check_partition(index)
        return await self.leader_replica(image, topic, index)

    async def led(
        self, image: MetadataImage, operation: Operation, name: str, index: int
    ) -> Partition:
        """``route``, for a front that does not forward: NOT_LEADER_OR_FOLLOWER when
        another node leads the partition (the client asks where, then asks it)."""
        partition = await self.route(image, operation, name, index)
        if partition is None:
            raise HeadwaterError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"node {self.config.node_id} does not lead {name}-{index}",
            )
        return partition

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
        batch: bytes | KafkaBatch,
        *,
        acks_all: bool,
        timeout_ms: int,
        deadline_unix_ms: int = 0,
    ) -> asyncio.Future[Appended | Refusal]:
        """Append ``batch`` to ``partition``, which this node leads: a produced batch of the
        columnar format or a Kafka batch, checked whole here (see the module doc); return
        its acknowledgement: done at once for acks 0 and 1, a task waiting for the in-sync
        replicas for acks=all (``timeout_ms``, 0: the node's request timeout) that ends
        with the ``Refusal`` when they do not take it in time."""
        max_message_bytes = partition.max_message_bytes
        config = partition.log_config
        if isinstance(batch, KafkaBatch):
            records = batch.records
            if not records:
                raise HeadwaterError(ErrorCode.INVALID_RECORD, "the partition's records are empty")
            check = functools.partial(
                to_stored,
                records,
                max_message_bytes,
                timestamp_range=config.timestamp_range(self.clock()),
                require_keys=config.compacted,
            )
            produced = (
                check()
                if len(records) <= CHECK_INLINE_BYTES_MAX
                else await asyncio.to_thread(check)
            )
            stored = produced.stored
            _check_stored_size(stored, partition)
            header = batch_format.read_header(stored)
        else:
            stored = batch
            _check_stored_size(stored, partition)
            header = batch_format.validate_batch(
                stored,
                max_uncompressed_bytes=max_message_bytes,
                timestamp_range=config.timestamp_range(self.clock()),
                require_keys=config.compacted,
            )
        partition.check_open()
        if header.producer_id >= 0:
            await self.check_idempotent(header.producer_id, acks_all)
        if acks_all:
            partition.check_min_insync()
        info = await partition.append(stored, self.clock(), deadline_unix_ms)
        if self.metrics is not None and not info.duplicate:
            self.metrics.count_in(partition.topic, info.record_count, len(stored))
        result = Appended(
            partition=partition.index,
            base_offset=info.base_offset,
            record_count=info.record_count,
            log_start_offset=info.log_start_offset,
        )
        loop = asyncio.get_running_loop()
        if not acks_all:
            done: asyncio.Future[Appended | Refusal] = loop.create_future()
            done.set_result(result)
            return done
        timeout_s = (timeout_ms or self.config.request_timeout_ms) / 1000

        async def replicated() -> Appended | Refusal:
            try:
                await partition.wait_for_replication(info.last_offset + 1, timeout_s)
            except HeadwaterError as error:
                return Refusal.of(error)
            return result

        return loop.create_task(replicated())

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

    def read(self, partition: Partition, offset: int, max_bytes: int) -> ReadResult:
        """Whole batches of ``partition`` from ``offset`` below the high watermark, up to
        ``max_bytes`` (at least one batch when there is one), once the partition is open,
        led here and holds ``offset``."""
        partition.check_open()
        partition.check_leader()
        partition.check_fetch_offset(offset)
        return partition.read(offset, max_bytes)

    async def fetch(
        self,
        asked: Sequence[FetchedPartition[T]],
        take: TakeRecords[T],
        *,
        max_bytes: int,
        min_bytes: int,
        max_wait_s: float,
        count_request: bool = False,
    ) -> int:
        """The long poll: read every partition ``asked`` (each authorized for READ and
        led here, else refused), taking records with ``take`` while the answer holds
        fewer than ``max_bytes`` (each partition at most its own ``max_bytes``; the
        first batch of the first partition with records whole, so a consumer always
        makes progress), and again as records arrive until ``min_bytes`` are in, a
        partition is refused, or ``max_wait_s`` passed. Fills each ``FetchedPartition``'s
        answer, charges the consumer byte-rate quota (and the request rate, with
        ``count_request``: each answer of a stream) and returns the answer's delay in
        ms. Partitions named twice must be named once by the caller."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_s
        while True:
            found, waiting, refused, taken = await self._fetch_pass(asked, take, max_bytes)
            if found >= min_bytes or refused or not waiting or loop.time() >= deadline:
                break
            waits = [
                asyncio.ensure_future(p.wait_for_data(offset, deadline - loop.time()))
                for p, offset in waiting
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        for partition, entry in taken:
            self.count_out(partition, entry.next_offset - entry.offset, entry.size)
        if refused and not found:  # an answer of refusals only is not charged
            return 0
        return await self.throttle(fetched_bytes=found, requests=1 if count_request else None)

    async def _fetch_pass(
        self, asked: Sequence[FetchedPartition[T]], take: TakeRecords[T], max_bytes: int
    ) -> tuple[int, list[tuple[Partition, int]], bool, list[tuple[Partition, FetchedPartition[T]]]]:
        """One read of every partition asked: (record bytes taken, the partitions that may
        yet bring more and from which offset, whether one was refused, the partitions
        that brought records). Once ``max_bytes`` are in, the partitions after are
        answered with their offsets but not read."""
        found = 0
        waiting: list[tuple[Partition, int]] = []
        taken: list[tuple[Partition, FetchedPartition[T]]] = []
        refused = False
        clock = time.perf_counter
        slice_began = clock()
        async for entry in yield_every(asked):
            if clock() - slice_began >= FETCH_SLICE_S:
                await asyncio.sleep(0)
                slice_began = clock()
            entry.clear()
            try:
                partition = await self.led(
                    self.state.image, Operation.READ, entry.topic, entry.index
                )
                if entry.replica is not None and partition is not entry.replica:
                    # The stream's replica is gone (its topic deleted, maybe made again).
                    entry.replica.check_open()
                    raise HeadwaterError(
                        ErrorCode.NOT_LEADER_OR_FOLLOWER,
                        f"node {self.config.node_id} no longer leads the replica of "
                        f"{entry.topic}-{entry.index} this fetch began on",
                    )
                entry.high_watermark = partition.high_watermark
                entry.log_start_offset = partition.log.log_start_offset
                entry.leader_epoch = partition.leader_epoch
                budget = max_bytes - found
                if budget <= 0 and found:  # the answer is full: the rest next time
                    continue
                limit = max(1, min(entry.max_bytes, budget))
                result = self.read(partition, entry.offset, limit)
                if not result.data:
                    # Nothing below the high watermark from the offset on, or a gap left
                    # by compaction up to ``result.next_offset``: the answer moves past
                    # the gap, and the wait is for records after it.
                    entry.next_offset = result.next_offset
                    waiting.append((partition, result.next_offset))
                    continue
                records, size, next_offset = await take(partition, result, limit, not found)
                if next_offset >= partition.high_watermark:
                    waiting.append((partition, next_offset))  # it may yet bring more
                if not size:
                    continue
                entry.records, entry.size, entry.next_offset = records, size, next_offset
                taken.append((partition, entry))
                found += size
            except HeadwaterError as error:
                entry.refusal = Refusal.of(error)
                refused = True
        return found, waiting, refused, taken

    def count_out(self, partition: Partition, records: int, size: int) -> None:
        """Count records and bytes a read answered (when metrics are on)."""
        if self.metrics is not None and size:
            self.metrics.count_out(partition.topic, records, size)

    # ------------------------------------------------------------------ quotas

    @property
    def throttles(self) -> bool:
        """Is any quota set? (When not, a front need not measure what it would charge.)"""
        return self.quotas is not None and self.quotas.active

    async def throttle(
        self,
        *,
        produced_bytes: float | None = None,
        fetched_bytes: float | None = None,
        requests: float | None = None,
    ) -> int:
        """Charge the current caller's quotas for what is given (bytes produced, bytes
        fetched, requests) and hold the answer for the longest delay they ask: the delay
        in ms, which the answer reports (0 at once with no quota set). The data is in:
        nothing is dropped."""
        if self.quotas is None or not self.quotas.active:
            return 0
        charges = [
            (key, float(amount))
            for key, amount in (
                (PRODUCER_BYTE_RATE, produced_bytes),
                (CONSUMER_BYTE_RATE, fetched_bytes),
                (REQUEST_RATE, requests),
            )
            if amount is not None
        ]
        return await self.quotas.hold(*charges)

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


def _check_stored_size(stored: bytes, partition: Partition) -> None:
    """MESSAGE_TOO_LARGE for a batch that, as stored, is larger than the topic's
    ``max_message_bytes`` (which keeps every batch within a stock gRPC client's answer)."""
    if len(stored) > partition.max_message_bytes:
        raise HeadwaterError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"batch of {len(stored)} bytes exceeds max_message_bytes "
            f"{partition.max_message_bytes} of topic {partition.topic!r}",
        )
