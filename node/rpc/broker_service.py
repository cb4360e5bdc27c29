"""The ``headwater.v1.Broker`` servicer of one node.

Each handler checks its request (every bad field gets a HeadwaterError naming the field
and its valid range), finds the partition in the metadata image, serves it from the local
replica when this node leads it or forwards it to the leader, and builds the
response. Operating errors
become gRPC statuses in ``headwater.shared.grpc_errors``; anything unexpected is logged here
with its traceback and reaches the client as UNKNOWN_SERVER_ERROR without one.

The handlers delegate the parts that do not depend on the request's routing: forwarding
to a partition's leader (``headwater.node.rpc.forwarding``), the server-side encoding of plain
records and decoding of batches (``headwater.node.rpc.record_encoding``), and the Metadata
answers with their per-image cache (``headwater.node.rpc.metadata_answers``).

Every handler runs on the node's asyncio event loop (grpc.aio), so a produced batch
reaches a waiting fetch without crossing threads. Work done on the loop is short and
bounded: batch validation, page-cache writes and preads of at most fetch_bytes_max.
Appends that fsync before acknowledging run in a worker thread (Partition.append).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import grpc

from headwater.log import batch as batch_format
from headwater.log.api import ReadResult
from headwater.log.kafka_records import holds_kafka_records, to_columnar
from headwater.node.clock import now_ms
from headwater.node.cluster.peers import Peers, is_forwarded
from headwater.node.core.broker_core import (
    Appended,
    BrokerCore,
    FetchedPartition,
    OffsetSpec,
    Refusal,
)
from headwater.node.core.limits import (
    LongCallSlots,
    StreamBudget,
    distinct,
    in_steps,
    shape_piece,
    stored_slices,
    yield_every,
)
from headwater.node.replicas.partition import Partition
from headwater.node.rpc.call_hooks import rpc_handler
from headwater.node.rpc.forwarding import Forwarder
from headwater.node.rpc.metadata_answers import MetadataAnswers
from headwater.node.rpc.record_encoding import decoding, encode_records
from headwater.raft.metadata.image import MetadataImage, TopicImage
from headwater.shared.acls import Operation, ResourceType
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import abort
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

_log = logging.getLogger(__name__)
PRODUCE_TIMEOUT_MS_MAX: Final = 300_000
# Requests of one ProduceStream appended and waiting for their acknowledgement at once.
PRODUCE_PIPELINE_MAX: Final = 32
ACKS_VALID: Final = (pb.ACKS_UNSPECIFIED, pb.ACKS_NONE, pb.ACKS_LEADER, pb.ACKS_ALL)


def _invalid(message: str, code: ErrorCode = ErrorCode.INVALID_REQUEST) -> HeadwaterError:
    return HeadwaterError(code, message)


FETCH_STREAM_IDLE_WAIT_S: Final = 0.5
"""After an empty answer, a FetchStream waits this long for records before the next one
(whatever its max_wait_ms): an idle stream answers at most twice a second."""


class BrokerService(pb_grpc.BrokerServicer):
    """Produce, fetch, offsets and metadata; requests for partitions led elsewhere are
    forwarded to their leader (one hop, see ``headwater.node.cluster.peers``)."""

    def __init__(
        self,
        core: BrokerCore,
        peers: Peers,
        quorum_status: Callable[[], tuple[int, int]],
        *,
        controller_active: Callable[[], bool] = lambda: False,
    ) -> None:
        """``core``: the node's broker operations, shared with the Kafka front.
        ``controller_active``: is this node the active controller now (see
        ``MetadataAnswers``)?"""
        config = self.config = core.config
        self.core = core
        self.auth = core.auth
        self.metrics = core.metrics
        self.state = core.state
        self.forwarding = Forwarder(config, peers)
        self.long_calls = LongCallSlots(config.streams_per_connection_max, config.streams_max)
        self.metadata_answers = MetadataAnswers(config.node_id, quorum_status, controller_active)
        self._round_robin = itertools.count()

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
        long-call slots (``headwater.node.core.limits``)."""
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
        self.core.authorize(Operation.WRITE, request.topic)
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
        image = self.state.image
        topic = self.core.topic(image, request.topic)
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
        # Each request of a stream counts as a request (the call itself was counted when
        # it began).
        throttled_ms = await self.core.throttle(
            produced_bytes=sum(map(len, batches.values())),
            requests=1 if budget is not None else None,
        )
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
        local = await self.core.leader_replica(image, topic, index)
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
        self.core.authorize(Operation.READ, request.topic)
        self._check_fetch(request)
        image = self.state.image
        local = await self.core.route(image, Operation.READ, request.topic, request.partition)
        if local is None:
            topic = image.topic_named(request.topic)
            address = self.forwarding.leader_address(
                image, topic, request.partition, is_forwarded(context)
            )
            response = await self.forwarding.fetch(address, request)
            if self.core.throttles:
                response.throttle_time_ms = await self.core.throttle(
                    fetched_bytes=response.ByteSize()
                )
            return response
        if request.max_wait_ms <= 0:
            return await self._fetch(request, local, request.offset)
        with self.long_calls.hold(context.peer(), is_forwarded(context)):
            return await self._fetch(request, local, request.offset)

    async def FetchStream(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.FetchResponse]:
        """Repeated long polls from advancing offsets, until the client cancels, this node
        stops leading the partition (NOT_LEADER_OR_FOLLOWER), the caller loses its right
        to read (each answer is authorized), or the partition is deleted. After an empty
        answer the next waits at least FETCH_STREAM_IDLE_WAIT_S for records. The stream
        holds one of the node's long-call slots (``headwater.node.core.limits``)."""
        try:
            with self.long_calls.hold(context.peer(), is_forwarded(context)):
                async for response in self._fetch_stream(request, context):
                    yield response
        except HeadwaterError as error:
            await abort(context, error)

    async def _fetch_stream(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.FetchResponse]:
        self.core.authorize(Operation.READ, request.topic)
        self._check_fetch(request)
        image = self.state.image
        local = await self.core.route(image, Operation.READ, request.topic, request.partition)
        if local is None:
            topic = image.topic_named(request.topic)
            address = self.forwarding.leader_address(
                image, topic, request.partition, is_forwarded(context)
            )
            async for response in self.forwarding.fetch_stream(address, request):
                # Forwarded answers are authorized and charged here: the leader trusts
                # this node. An ACL removed ends the stream.
                self.auth.require(Operation.READ, ResourceType.TOPIC, request.topic)
                if self.core.throttles:
                    response.throttle_time_ms = await self.core.throttle(
                        fetched_bytes=response.ByteSize(), requests=1
                    )
                yield response
            return
        offset = request.offset
        idle = False
        while True:
            # After an empty answer, wait for records at least FETCH_STREAM_IDLE_WAIT_S (a
            # stream with max_wait_ms 0 at the log's end answered 11,000 empty responses a
            # second); records that arrive end the wait at once.
            wait_s = request.max_wait_ms / 1000
            response = await self._fetch(
                request,
                local,
                offset,
                max(wait_s, FETCH_STREAM_IDLE_WAIT_S) if idle else wait_s,
                count_request=True,
            )
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
        self,
        request: pb.FetchRequest,
        replica: Partition,
        offset: int,
        max_wait_s: float | None = None,
        count_request: bool = False,
    ) -> pb.FetchResponse:
        """One long poll of the request's partition from ``offset`` on this node's
        ``replica`` (``BrokerCore.fetch``, waiting for at least one record, ``max_wait_s``
        or the request's), its records in the request's format and within its answer's
        size."""
        response_max = request.max_response_bytes or STOCK_RECEIVE_BYTES
        records_bytes_max = response_max - RESPONSE_FRAMING_BYTES
        max_bytes = min(request.max_bytes or self.config.fetch_bytes_default, records_bytes_max)
        decoded = request.format == pb.RECORD_FORMAT_RECORDS

        async def take(
            _partition: Partition, read: ReadResult, limit: int, _whole_first: bool
        ) -> tuple[pb.FetchResponse, int, int]:
            data, cut_at = await _columnar(read.data, limit)
            if len(data) > records_bytes_max:  # one batch alone, more than the client takes
                raise _too_large(offset, len(data), response_max)
            answer = pb.FetchResponse(next_offset=read.next_offset if cut_at is None else cut_at)
            if decoded:
                records = await in_steps(
                    decoding(data, offset, bytes_max=records_bytes_max, into=answer)
                )
                if records.too_large_bytes:
                    raise _too_large(offset, records.too_large_bytes, response_max, "record")
                if records.resume_offset is not None:
                    answer.next_offset = records.resume_offset
            else:
                answer.records = data
            return answer, len(data), answer.next_offset

        (fetched,) = asked = [
            FetchedPartition[pb.FetchResponse](
                request.topic, request.partition, offset, max_bytes, replica=replica
            )
        ]
        throttled_ms = await self.core.fetch(
            asked,
            take,
            max_bytes=max_bytes,
            min_bytes=max(request.min_bytes, 1),
            max_wait_s=request.max_wait_ms / 1000 if max_wait_s is None else max_wait_s,
            count_request=count_request,
        )
        if fetched.refusal is not None:
            raise fetched.refusal.error()
        response = fetched.records or pb.FetchResponse(next_offset=fetched.next_offset)
        response.high_watermark = fetched.high_watermark
        response.log_start_offset = fetched.log_start_offset
        response.throttle_time_ms = throttled_ms
        return response

    # ------------------------------------------------------------------ ListOffsets

    @rpc_handler
    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListOffsetsResponse:
        image = self.state.image
        topic = self.core.authorized_topic(image, Operation.DESCRIBE, request.topic)
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
            local = await self.core.route(image, Operation.DESCRIBE, request.topic, index)
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
            self.core.authorize(Operation.DESCRIBE, name)
        if request.include_digest:  # the digest covers every topic, ACL and user
            self.auth.require_cluster(Operation.DESCRIBE)
        names = asked or self.core.describable_topics(image)
        topics = [
            self.metadata_answers.topic_metadata(image, self.core.topic(image, name))
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


async def _columnar(data: bytes, budget: int) -> tuple[bytes, int | None]:
    """A read's stored batches as columnar ones within ``budget`` bytes (the first
    always), and the base offset of the first batch left out when some were
    (``to_columnar``). Batches produced over Kafka's protocol are kept as they came and
    transcoded here, a piece at a time (``stored_slices``); a read without any is
    answered as it is."""
    if not holds_kafka_records(data):
        return data, None
    parts: list[bytes | memoryview] = []
    size = 0
    async with contextlib.aclosing(stored_slices(data, records_of_kafka=True)) as pieces:
        async for piece in pieces:
            columnar, cut_at = await shape_piece(
                piece, functools.partial(to_columnar, piece.data, budget - size, not size)
            )
            parts.append(columnar)
            size += len(columnar)
            if cut_at is not None:
                return b"".join(parts), cut_at
    return b"".join(parts), None


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


async def _produce_result(
    acknowledgement: asyncio.Future[Appended | Refusal],
) -> pb.PartitionProduceResult:
    return _partition_result(await acknowledgement)


def _partition_result(appended: Appended | Refusal) -> pb.PartitionProduceResult:
    """A partition's result; a refusal fails the whole request, as gRPC answers one
    status a call."""
    if isinstance(appended, Refusal):
        raise appended.error()
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
