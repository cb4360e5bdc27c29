"""The ``headwater.v1.Broker`` servicer of one node.

Each handler checks its request (every bad field gets a HeadwaterError naming the field
and its valid range), finds the partition in the metadata image, serves it from the local
replica when this node leads it or forwards it to the leader, and builds the
response. Operating errors
become gRPC statuses in ``headwater.shared.grpc_errors``; anything unexpected is logged here
with its traceback and reaches the client as UNKNOWN_SERVER_ERROR without one.

The handlers delegate the parts that do not depend on the request's routing: forwarding
to a partition's leader (``headwater.node.forwarding``), the server-side encoding of plain
records and decoding of batches (``headwater.node.record_encoding``), and the Metadata
answers with their per-image cache (``headwater.node.metadata_answers``).

Every handler runs on the node's asyncio event loop (grpc.aio), so a produced batch
reaches a waiting fetch without crossing threads. Work done on the loop is short and
bounded: batch validation, page-cache writes and preads of at most fetch_bytes_max.
Appends that fsync before acknowledging run in a worker thread (Partition.append).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TypeVar

import grpc

from headwater.log import batch as batch_format
from headwater.log.kafka_records import to_columnar
from headwater.node.authorizer import Authorizer
from headwater.node.broker_core import Appended, BrokerCore, OffsetSpec
from headwater.node.clock import now_ms
from headwater.node.cluster_state import ClusterState
from headwater.node.config import NodeConfig
from headwater.node.forwarding import Forwarder
from headwater.node.limits import LongCallSlots, StreamBudget, distinct, yield_every
from headwater.node.log_manager import LogManager
from headwater.node.metadata_answers import MetadataAnswers
from headwater.node.metrics import NodeMetrics
from headwater.node.partition import Partition
from headwater.node.peers import Peers, is_forwarded
from headwater.node.producer_ids import ProducerIdAllocator
from headwater.node.record_encoding import decoded_records, encode_records
from headwater.node.throttling import Quotas
from headwater.raft.image import MetadataImage, TopicImage
from headwater.shared.acls import Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import abort
from headwater.shared.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_RATE
from headwater.shared.topics import INTERNAL_PREFIX
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

_log = logging.getLogger(__name__)
Handler = TypeVar("Handler", bound=Callable[..., Any])
PRODUCE_TIMEOUT_MS_MAX: Final = 300_000
# Requests of one ProduceStream appended and waiting for their acknowledgement at once.
PRODUCE_PIPELINE_MAX: Final = 32
ACKS_VALID: Final = (pb.ACKS_UNSPECIFIED, pb.ACKS_NONE, pb.ACKS_LEADER, pb.ACKS_ALL)


def rpc_handler(method: Handler) -> Handler:
    """Make a unary handler (plain or coroutine) an asyncio one that turns HeadwaterError
    into a gRPC status, and logs and masks anything unexpected."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            result = method(self, request, context)
            return await result if inspect.isawaitable(result) else result
        except HeadwaterError as error:
            failure = error
        except Exception as exc:
            _log.exception("%s failed", method.__name__)
            failure = HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"internal error in {method.__name__}: {type(exc).__name__}: {exc}",
            )
        return await abort(context, failure)

    return wrapper  # type: ignore[return-value]


def _invalid(message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> HeadwaterError:
    return HeadwaterError(code, message)


FETCH_STREAM_IDLE_WAIT_S: Final = 0.5
"""After an empty answer, a FetchStream waits this long for records before the next one
(whatever its max_wait_ms): an idle stream answers at most twice a second."""


class BrokerService(pb_grpc.BrokerServicer):
    """Produce, fetch, offsets and metadata; requests for partitions led elsewhere are
    forwarded to their leader (one hop, see ``headwater.node.peers``)."""

    def __init__(
        self,
        config: NodeConfig,
        logs: LogManager,
        state: ClusterState,
        peers: Peers,
        quorum_status: Callable[[], tuple[int, int]],
        may_lead: Callable[[], bool] = lambda: True,
        producer_ids: ProducerIdAllocator | None = None,
        metrics: NodeMetrics | None = None,
        *,
        authorizer: Authorizer,
        quotas: Quotas,
        controller_active: Callable[[], bool] = lambda: False,
    ) -> None:
        """``metrics``: where to count records, bytes and produce latency (None: metrics
        are off, and nothing is counted). ``authorizer`` decides each request's
        permission (``headwater.node.authorizer``). ``controller_active``: is this node
        the active controller now (see ``MetadataAnswers``)?"""
        self.config = config
        self.auth = authorizer
        self.quotas = quotas
        self.metrics = metrics
        self.state = state
        self.core = BrokerCore(
            config,
            logs,
            state,
            authorizer=authorizer,
            may_lead=may_lead,
            producer_ids=producer_ids,
            metrics=metrics,
        )
        self.forwarding = Forwarder(config, peers)
        self.long_calls = LongCallSlots(config.streams_per_connection_max, config.streams_max)
        self.metadata_answers = MetadataAnswers(config.node_id, quorum_status, controller_active)
        self._round_robin = itertools.count()

    # ------------------------------------------------------------------ routing

    def _topic(self, image: MetadataImage, name: str) -> TopicImage:
        return self.core.topic(image, name)

    async def _leader_replica(
        self, image: MetadataImage, topic: TopicImage, index: int
    ) -> Partition | None:
        return await self.core.leader_replica(image, topic, index)

    # ------------------------------------------------------------------ Produce

    @rpc_handler
    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProduceResponse:
        if self.metrics is None:
            return await self._produce(request, is_forwarded(context))
        began = time.perf_counter()
        try:
            return await self._produce(request, is_forwarded(context))
        finally:
            self.metrics.produce_timer("Produce", request.acks).observe(time.perf_counter() - began)

    async def ProduceStream(
        self,
        requests: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ProduceResponse]:
        """Answer each request in arrival order; a failure is answered, not fatal.

        Requests are pipelined: each is appended as soon as the one before it on the stream
        has been appended (appends keep the stream's order), and waits for its replicas
        (acks=all) alongside the requests after it. Up to PRODUCE_PIPELINE_MAX requests,
        and ``stream_buffer_bytes_max`` bytes of them, are in progress; beyond that the
        stream stops reading (gRPC flow control). The stream holds one of the node's
        long-call slots (``headwater.node.limits``)."""
        forwarded = is_forwarded(context)
        try:
            with self.long_calls.hold(context.peer(), forwarded):
                async for response in self._produce_stream(requests, forwarded):
                    yield response
        except HeadwaterError as error:
            await abort(context, error)

    async def _produce_stream(
        self, requests: AsyncIterator[pb.ProduceRequest], forwarded: bool
    ) -> AsyncIterator[pb.ProduceResponse]:
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue[asyncio.Task[pb.ProduceResponse] | None] = asyncio.Queue(
            PRODUCE_PIPELINE_MAX
        )
        budget = StreamBudget(self.config.stream_buffer_bytes_max)

        async def accept() -> None:
            try:
                async for request in requests:
                    appended: asyncio.Future[None] = loop.create_future()
                    answer = loop.create_task(self._answer(request, forwarded, appended, budget))
                    await asyncio.wait((answer, appended), return_when=asyncio.FIRST_COMPLETED)
                    await answers.put(answer)
                    await budget.wait_for_room()
            finally:
                await answers.put(None)

        accepting = loop.create_task(accept())
        try:
            while (answer := await answers.get()) is not None:
                yield await answer
            await accepting  # a failure to read the requests surfaces here
        finally:
            accepting.cancel()
            while not answers.empty():
                left = answers.get_nowait()
                if left is not None:
                    left.cancel()

    async def _answer(
        self,
        request: pb.ProduceRequest,
        forwarded: bool,
        appended: asyncio.Future[None],
        budget: StreamBudget,
    ) -> pb.ProduceResponse:
        """_produce's response, or the error response it ended with (counted in the
        ProduceStream errors, as a failed unary call is)."""
        began = time.perf_counter()
        try:
            return await self._produce(request, forwarded, appended, budget)
        except HeadwaterError as error:
            self._count_stream_error(error.code)
            return pb.ProduceResponse(
                error_code=pb.ErrorCode.ValueType(error.code),
                error_message=error.message,
                retriable=error.retriable,
            )
        except Exception as exc:
            _log.exception("ProduceStream request failed")
            self._count_stream_error(ErrorCode.UNKNOWN_SERVER_ERROR)
            return pb.ProduceResponse(
                error_code=pb.UNKNOWN_SERVER_ERROR,
                error_message=f"internal error: {type(exc).__name__}: {exc}",
            )
        finally:
            if self.metrics is not None:
                self.metrics.produce_timer("ProduceStream", request.acks).observe(
                    time.perf_counter() - began
                )

    def _count_stream_error(self, code: ErrorCode) -> None:
        if self.metrics is not None:
            self.metrics.rpc_errors.labels("Broker", "ProduceStream", code.name).inc()

    async def _produce(
        self,
        request: pb.ProduceRequest,
        forwarded: bool,
        appended: asyncio.Future[None] | None = None,
        budget: StreamBudget | None = None,
    ) -> pb.ProduceResponse:
        """Append the request's batches, set ``appended``, then wait for their
        acknowledgement level (acks=all: the in-sync replicas) and answer. The batches'
        bytes are charged to ``budget`` (a ProduceStream's) until the answer. Needs
        ``write`` on the topic (each request of a stream is checked)."""
        self.auth.require(Operation.WRITE, ResourceType.TOPIC, request.topic)
        if request.acks not in ACKS_VALID:
            raise _invalid(
                f"acks is {request.acks}; valid: 0 (default = all), 1 (none), 2 (leader), 3 (all)",
                ErrorCode.INVALID_REQUIRED_ACKS,
            )
        if not 0 <= request.timeout_ms <= PRODUCE_TIMEOUT_MS_MAX:
            raise _invalid(
                f"timeout_ms is {request.timeout_ms}; valid range is [0, {PRODUCE_TIMEOUT_MS_MAX}]"
            )
        if request.deadline_unix_ms < 0:
            raise _invalid(
                f"deadline_unix_ms is {request.deadline_unix_ms}; valid: 0 (none) or "
                "milliseconds since the Unix epoch"
            )
        if request.topic.startswith(INTERNAL_PREFIX):
            raise _invalid(
                f"topic {request.topic!r} is internal: only the cluster writes to it",
                ErrorCode.INVALID_TOPIC_EXCEPTION,
            )
        image = self.state.image
        topic = self._topic(image, request.topic)
        payload = request.WhichOneof("payload")
        if payload == "batch":
            if request.partition == -1:
                raise _invalid(
                    "partition -1 (broker's choice) needs `records`, not an encoded batch"
                )
            topic.check_partition(request.partition)
            batches = {request.partition: request.batch}
        elif payload == "records":
            batches = self._encode_records(request, len(topic.partitions), topic)
        else:
            raise _invalid("ProduceRequest has neither `batch` nor `records`")
        acknowledgements: list[asyncio.Future[pb.PartitionProduceResult]] = []
        release = budget.charge(sum(map(len, batches.values()))) if budget else None
        try:
            for index, data in sorted(batches.items()):
                acknowledgements.append(
                    await self._produce_one(image, topic, index, data, request, forwarded)
                )
            if appended is not None and not appended.done():
                appended.set_result(None)
            results = [await acknowledgement for acknowledgement in acknowledgements]
        finally:
            for acknowledgement in acknowledgements:
                acknowledgement.cancel()  # no-op once done; after a failure, stop waiting
            if release is not None:
                release()
        # Over a quota: the answer waits (the data is in; nothing is dropped). Each request
        # of a stream counts as a request (the call itself was counted when it began).
        if not self.quotas.active:
            return pb.ProduceResponse(results=results)
        charges = [(PRODUCER_BYTE_RATE, float(sum(map(len, batches.values()))))]
        if budget is not None:
            charges.append((REQUEST_RATE, 1.0))
        throttled_ms = await self.quotas.hold(*charges)
        return pb.ProduceResponse(results=results, throttle_time_ms=throttled_ms)

    async def _produce_one(
        self,
        image: MetadataImage,
        topic: TopicImage,
        index: int,
        batch: bytes,
        request: pb.ProduceRequest,
        forwarded: bool,
    ) -> asyncio.Future[pb.PartitionProduceResult]:
        """Append ``batch`` to partition ``index`` here, or forward it to the leader and
        await the answer (forwarded requests go one at a time, so they keep their order);
        returns the acknowledgement to await."""
        local = await self._leader_replica(image, topic, index)
        if local is not None:
            return await self._append(local, batch, request)
        return _resolved(
            await self.forwarding.produce(image, topic, index, batch, request, forwarded)
        )

    async def _append(
        self, partition: Partition, batch: bytes, request: pb.ProduceRequest
    ) -> asyncio.Future[pb.PartitionProduceResult]:
        """Append ``batch``; return its acknowledgement (``BrokerCore.append``)."""
        acknowledgement = await self.core.append(
            partition,
            batch,
            acks_all=request.acks in (pb.ACKS_ALL, pb.ACKS_UNSPECIFIED),
            timeout_ms=request.timeout_ms,
            deadline_unix_ms=request.deadline_unix_ms,
        )
        if not acknowledgement.done():  # acks=all: waits for the in-sync replicas
            return asyncio.ensure_future(_produce_result(acknowledgement))
        return _resolved(_partition_result(acknowledgement.result()))

    @rpc_handler
    async def InitProducerId(
        self, request: pb.InitProducerIdRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.InitProducerIdResponse:
        producer_id, producer_epoch = await self.core.init_producer_id()
        return pb.InitProducerIdResponse(producer_id=producer_id, producer_epoch=producer_epoch)

    def _encode_records(
        self, request: pb.ProduceRequest, partitions: int, topic: TopicImage
    ) -> dict[int, bytes]:
        """Check the request's plain records and choose the partition of its keyless ones
        (the next in turn when the request leaves it to the broker), then group and encode
        them (``record_encoding.encode_records``)."""
        records = request.records.records
        if not records:
            raise _invalid("`records` is empty; send at least one record")
        if request.compression not in (c.value for c in batch_format.Compression):
            raise HeadwaterError(
                ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                f"compression {request.compression} is not supported; "
                "valid: 0 (none), 3 (lz4), 4 (zstd)",
            )
        if request.partition != -1:
            topic.check_partition(request.partition)
        keyless_target = (
            request.partition if request.partition != -1 else next(self._round_robin) % partitions
        )
        return encode_records(request, partitions, keyless_target, now_ms())

    # ------------------------------------------------------------------ Fetch

    @rpc_handler
    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FetchResponse:
        response = await self._fetch_once(request, context)
        if self.quotas.active:
            response.throttle_time_ms = await self.quotas.hold(
                (CONSUMER_BYTE_RATE, float(response.ByteSize()))
            )
        return response

    async def _fetch_once(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FetchResponse:
        self.auth.require(Operation.READ, ResourceType.TOPIC, request.topic)
        self._check_fetch(request)
        image = self.state.image
        topic = self._topic(image, request.topic)
        topic.check_partition(request.partition)
        local = await self._leader_replica(image, topic, request.partition)
        if local is not None:
            if request.max_wait_ms <= 0:
                return await self._fetch(local, request, request.offset)
            with self.long_calls.hold(context.peer(), is_forwarded(context)):
                return await self._fetch(local, request, request.offset)
        address = self.forwarding.leader_address(
            image, topic, request.partition, is_forwarded(context)
        )
        return await self.forwarding.fetch(address, request)

    async def FetchStream(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.FetchResponse]:
        """Repeated long polls from advancing offsets, until the client cancels, this node
        stops leading the partition (NOT_LEADER_OR_FOLLOWER), or the partition is deleted.
        The stream holds one of the node's long-call slots (``headwater.node.limits``)."""
        try:
            with self.long_calls.hold(context.peer(), is_forwarded(context)):
                async for response in self._fetch_stream(request, context):
                    # Checked for every answer, forwarded streams included: an ACL
                    # removed ends the stream.
                    self.auth.require(Operation.READ, ResourceType.TOPIC, request.topic)
                    if self.quotas.active:
                        response.throttle_time_ms = await self.quotas.hold(
                            (CONSUMER_BYTE_RATE, float(response.ByteSize())), (REQUEST_RATE, 1.0)
                        )
                    yield response
        except HeadwaterError as error:
            await abort(context, error)

    async def _fetch_stream(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.FetchResponse]:
        self.auth.require(Operation.READ, ResourceType.TOPIC, request.topic)
        self._check_fetch(request)
        image = self.state.image
        topic = self._topic(image, request.topic)
        topic.check_partition(request.partition)
        local = await self._leader_replica(image, topic, request.partition)
        if local is None:
            address = self.forwarding.leader_address(
                image, topic, request.partition, is_forwarded(context)
            )
            async for response in self.forwarding.fetch_stream(address, request):
                yield response
            return
        offset = request.offset
        idle = False
        while True:
            if idle:
                # Nothing came last time: wait for records at least FETCH_STREAM_IDLE_WAIT_S
                # (a stream with max_wait_ms 0 at the log's end answered 11,000 empty
                # responses a second); records that arrive end the wait at once.
                await local.wait_for_data(offset, FETCH_STREAM_IDLE_WAIT_S)
            response = await self._fetch(local, request, offset)
            idle = response.next_offset == offset and not response.records
            offset = response.next_offset
            yield response

    def _check_fetch(self, request: pb.FetchRequest) -> None:
        config = self.config
        if not 0 <= request.max_bytes <= config.fetch_bytes_max:
            raise _invalid(
                f"max_bytes is {request.max_bytes}; valid range is [0, {config.fetch_bytes_max}] "
                "(0 = server default)",
                ErrorCode.INVALID_FETCH_SIZE,
            )
        if not 0 <= request.max_wait_ms <= config.fetch_wait_ms_max:
            raise _invalid(
                f"max_wait_ms is {request.max_wait_ms}; "
                f"valid range is [0, {config.fetch_wait_ms_max}]"
            )
        if request.min_bytes < 0:
            raise _invalid(
                f"min_bytes is {request.min_bytes}; valid range is [0, {config.fetch_bytes_max}]"
            )
        if request.format not in (pb.RECORD_FORMAT_BATCHES, pb.RECORD_FORMAT_RECORDS):
            raise _invalid(f"format is {request.format}; valid: 0 (batches), 1 (records)")
        if request.max_response_bytes and request.max_response_bytes < RESPONSE_BYTES_MIN:
            raise _invalid(
                f"max_response_bytes is {request.max_response_bytes}; valid: 0 (4 MiB, a stock "
                f"gRPC client's limit) or [{RESPONSE_BYTES_MIN}, {(1 << 31) - 1}]"
            )

    async def _fetch(
        self, partition: Partition, request: pb.FetchRequest, offset: int
    ) -> pb.FetchResponse:
        """One long poll of ``partition`` from ``offset`` (``BrokerCore.read``)."""
        response_max = request.max_response_bytes or STOCK_RECEIVE_BYTES
        records_bytes_max = response_max - RESPONSE_FRAMING_BYTES
        max_bytes = min(request.max_bytes or self.config.fetch_bytes_default, records_bytes_max)
        result = await self.core.read(
            partition, offset, max_bytes, request.min_bytes, request.max_wait_ms / 1000
        )
        # Batches produced over Kafka's protocol are kept as they came: transcoded here.
        data, cut_at = to_columnar(result.data, max_bytes)
        if len(data) > records_bytes_max:  # one batch alone, more than the client takes
            raise _too_large(offset, len(data), response_max)
        response = pb.FetchResponse(
            high_watermark=partition.high_watermark,
            log_start_offset=partition.log.log_start_offset,
            next_offset=result.next_offset if cut_at is None else cut_at,
        )
        if request.format == pb.RECORD_FORMAT_RECORDS:
            answer = decoded_records(data, offset, bytes_max=records_bytes_max)
            if answer.too_large_bytes:
                raise _too_large(offset, answer.too_large_bytes, response_max, "record")
            response.decoded.extend(answer.records)
            if answer.resume_offset is not None:
                response.next_offset = answer.resume_offset
        else:
            response.records = data
        # What the answer holds, when cut.
        self.core.count_out(partition, response.next_offset - offset, len(data))
        return response

    # ------------------------------------------------------------------ ListOffsets

    @rpc_handler
    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListOffsetsResponse:
        self.auth.require(Operation.DESCRIBE, ResourceType.TOPIC, request.topic)
        image = self.state.image
        topic = self._topic(image, request.topic)
        if request.spec not in (
            pb.OFFSET_SPEC_EARLIEST,
            pb.OFFSET_SPEC_LATEST,
            pb.OFFSET_SPEC_TIMESTAMP,
        ):
            raise _invalid(
                f"spec is {request.spec}; valid: 0 (earliest), 1 (latest), 2 (timestamp)"
            )
        if request.spec == pb.OFFSET_SPEC_TIMESTAMP and request.timestamp_ms < 0:
            raise _invalid(
                f"timestamp_ms is {request.timestamp_ms}; must be >= 0", ErrorCode.INVALID_TIMESTAMP
            )
        indexes = distinct(  # a partition asked twice is answered once
            request.partitions, self.config.partitions_max, "partitions", "partitions_max"
        ) or list(range(len(topic.partitions)))
        found: dict[int, pb.PartitionOffset] = {}
        remote: dict[str, list[int]] = {}
        for index in indexes:
            topic.check_partition(index)
            local = await self._leader_replica(image, topic, index)
            if local is None:
                address = self.forwarding.leader_address(image, topic, index, is_forwarded(context))
                remote.setdefault(address, []).append(index)
            else:
                found[index] = _offset_of(self.core, local, request)
        for address, subset in remote.items():
            answer = await self.forwarding.list_offsets(address, request, subset)
            found.update({o.partition: o for o in answer.offsets})
        return pb.ListOffsetsResponse(offsets=[found[i] for i in indexes])

    # ------------------------------------------------------------------ Metadata

    @rpc_handler
    async def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.MetadataResponse:
        """Topics asked by name need ``describe`` on each; without names, the answer
        holds the topics the caller may describe. At most ``topics_max`` names; a name
        asked twice is answered once."""
        image = self.state.image
        asked = distinct(request.topics, self.config.topics_max, "topics", "topics_max")
        for name in asked:
            self.auth.require(Operation.DESCRIBE, ResourceType.TOPIC, name)
        if request.include_digest:  # the digest covers every topic, ACL and user
            self.auth.require_cluster(Operation.DESCRIBE)
        names = asked or self.auth.visible(ResourceType.TOPIC, sorted(image.topics))
        topics = [
            self.metadata_answers.topic_metadata(image, self._topic(image, name))
            async for name in yield_every(names, weight=lambda n: _partitions_of(image, n))
        ]
        return self.metadata_answers.response(image, topics, request.include_digest)


def _partitions_of(image: MetadataImage, name: str) -> int:
    topic = image.topics.get(name)
    return len(topic.partitions) if topic is not None else 1


STOCK_RECEIVE_BYTES: Final = 4 << 20
"""A stock gRPC client's receive limit (tonic, grpc-go, grpc-java, Python's grpc): what
a Fetch answer fits in when the request does not say (max_response_bytes 0)."""
RESPONSE_FRAMING_BYTES: Final = 256
"""Room kept in an answer for its fields other than the records (a few varints)."""
RESPONSE_BYTES_MIN: Final = 64 << 10


def _too_large(offset: int, size: int, response_max: int, what: str = "batch") -> HeadwaterError:
    return HeadwaterError(
        ErrorCode.FETCH_RESPONSE_TOO_LARGE,
        f"the {what} at offset {offset} is {size} bytes, more than fits in an answer of "
        f"max_response_bytes {response_max} (0 means 4 MiB, a stock gRPC client's limit): "
        f"raise the client's gRPC receive limit and max_response_bytes to at least "
        f"{size + RESPONSE_FRAMING_BYTES}",
    )


_OFFSET_SPECS: Final = {
    pb.OFFSET_SPEC_EARLIEST: OffsetSpec.EARLIEST,
    pb.OFFSET_SPEC_LATEST: OffsetSpec.LATEST,
    pb.OFFSET_SPEC_TIMESTAMP: OffsetSpec.TIMESTAMP,
}


def _offset_of(
    core: BrokerCore, partition: Partition, request: pb.ListOffsetsRequest
) -> pb.PartitionOffset:
    found = core.offset_of(partition, _OFFSET_SPECS[request.spec], request.timestamp_ms)
    return pb.PartitionOffset(
        partition=partition.index, offset=found.offset, timestamp_ms=found.timestamp_ms
    )


async def _produce_result(acknowledgement: asyncio.Future[Appended]) -> pb.PartitionProduceResult:
    return _partition_result(await acknowledgement)


def _partition_result(appended: Appended) -> pb.PartitionProduceResult:
    return pb.PartitionProduceResult(
        partition=appended.partition,
        base_offset=appended.base_offset,
        record_count=appended.record_count,
        log_start_offset=appended.log_start_offset,
    )


def _resolved(result: pb.PartitionProduceResult) -> asyncio.Future[pb.PartitionProduceResult]:
    """An acknowledgement that is already in."""
    done: asyncio.Future[pb.PartitionProduceResult] = asyncio.get_running_loop().create_future()
    done.set_result(result)
    return done
