"""gRPC servicers of one node: ``headwater.v1.Broker`` and ``headwater.v1.Admin``.

Each handler checks its request (every bad field gets a HeadwaterError naming the field
and its valid range), calls the LogManager, and builds the response. Operating errors
become gRPC statuses in ``headwater.grpc_errors``; anything unexpected is logged here
with its traceback and reaches the client as UNKNOWN_SERVER_ERROR without one.

Every handler runs on the node's asyncio event loop (grpc.aio), so a produced batch
reaches a waiting fetch without crossing threads. Work done on the loop is short and
bounded: batch validation, page-cache writes and preads of at most fetch_bytes_max.
Appends that fsync before acknowledging run in a worker thread (Partition.append).
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, TypeVar

import grpc
import pyarrow.compute as pc

from headwater.client.partitioner import partition_for_key
from headwater.config import NodeConfig
from headwater.errors import ErrorCode, HeadwaterError
from headwater.grpc_errors import abort
from headwater.log import batch as batch_format
from headwater.node.log_manager import LogManager, now_ms
from headwater.node.partition import Partition
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

_log = logging.getLogger(__name__)
Handler = TypeVar("Handler", bound=Callable[..., Any])
PRODUCE_TIMEOUT_MS_MAX: Final = 300_000
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


class BrokerService(pb_grpc.BrokerServicer):
    def __init__(self, config: NodeConfig, logs: LogManager) -> None:
        self.config = config
        self.logs = logs
        self._round_robin = itertools.count()

    # ------------------------------------------------------------------ Produce

    @rpc_handler
    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ProduceResponse:
        return await self._produce(request)

    async def ProduceStream(
        self,
        requests: AsyncIterator[pb.ProduceRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[pb.ProduceResponse]:
        """Answer each request in arrival order; a failure is answered, not fatal."""
        async for request in requests:
            try:
                yield await self._produce(request)
            except HeadwaterError as error:
                yield pb.ProduceResponse(
                    error_code=pb.ErrorCode.ValueType(error.code), error_message=error.message
                )
            except Exception as exc:
                _log.exception("ProduceStream request failed")
                yield pb.ProduceResponse(
                    error_code=pb.UNKNOWN_SERVER_ERROR,
                    error_message=f"internal error: {type(exc).__name__}: {exc}",
                )

    async def _produce(self, request: pb.ProduceRequest) -> pb.ProduceResponse:
        if request.acks not in ACKS_VALID:
            raise _invalid(
                f"acks is {request.acks}; valid: 0 (default = all), 1 (none), 2 (leader), 3 (all)",
                ErrorCode.INVALID_REQUIRED_ACKS,
            )
        if not 0 <= request.timeout_ms <= PRODUCE_TIMEOUT_MS_MAX:
            raise _invalid(
                f"timeout_ms is {request.timeout_ms}; valid range is [0, {PRODUCE_TIMEOUT_MS_MAX}]"
            )
        topic = self.logs.topic(request.topic)
        payload = request.WhichOneof("payload")
        if payload == "batch":
            if request.partition == -1:
                raise _invalid(
                    "partition -1 (broker's choice) needs `records`, not an encoded batch"
                )
            partition = self.logs.partition(request.topic, request.partition)
            results = [await self._append(partition, request.batch)]
        elif payload == "records":
            results = await self._produce_records(request, topic.partitions)
        else:
            raise _invalid("ProduceRequest has neither `batch` nor `records`")
        return pb.ProduceResponse(results=results)

    async def _append(self, partition: Partition, batch: bytes) -> pb.PartitionProduceResult:
        max_message_bytes = partition.max_message_bytes
        if len(batch) > max_message_bytes:
            raise HeadwaterError(
                ErrorCode.MESSAGE_TOO_LARGE,
                f"batch of {len(batch)} bytes exceeds max_message_bytes {max_message_bytes} of "
                f"topic {partition.topic!r}",
            )
        batch_format.validate_batch(batch)
        partition.check_open()
        info = await partition.append(batch, now_ms())
        return pb.PartitionProduceResult(
            partition=partition.index,
            base_offset=info.base_offset,
            record_count=info.record_count,
            log_start_offset=info.log_start_offset,
        )

    async def _produce_records(
        self, request: pb.ProduceRequest, partitions: int
    ) -> list[pb.PartitionProduceResult]:
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
            self.logs.topic(request.topic).check_partition(request.partition)
        groups: dict[int, list[pb.Record]] = {}
        keyless_target = (
            request.partition if request.partition != -1 else next(self._round_robin) % partitions
        )
        for record in records:
            if request.partition != -1:
                target = request.partition
            elif record.HasField("key"):
                target = partition_for_key(record.key, partitions)
            else:
                target = keyless_target
            groups.setdefault(target, []).append(record)
        now = now_ms()
        encoded = {}
        for target, group in sorted(groups.items()):
            encoded[target] = batch_format.encode_batch(
                [r.value if r.HasField("value") else None for r in group],
                keys=[r.key if r.HasField("key") else None for r in group],
                headers=[
                    [(h.key, h.value if h.HasField("value") else None) for h in r.headers]
                    for r in group
                ],
                timestamps_ms=[
                    r.timestamp_ms if r.HasField("timestamp_ms") else now for r in group
                ],
                compression=batch_format.Compression(request.compression),
            )
        return [
            await self._append(self.logs.partition(request.topic, target), data)
            for target, data in encoded.items()
        ]

    # ------------------------------------------------------------------ Fetch

    @rpc_handler
    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.FetchResponse:
        self._check_fetch(request)
        return await self._fetch(request, request.offset)

    async def FetchStream(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.FetchResponse]:
        """Repeated long polls from advancing offsets, until the client cancels."""
        try:
            self._check_fetch(request)
            offset = request.offset
            while True:
                response = await self._fetch(request, offset)
                offset = response.next_offset
                yield response
        except HeadwaterError as error:
            await abort(context, error)

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

    async def _fetch(self, request: pb.FetchRequest, offset: int) -> pb.FetchResponse:
        """One long poll of ``request``'s partition from ``offset``."""
        partition = self.logs.partition(request.topic, request.partition)
        partition.check_fetch_offset(offset)
        max_bytes = request.max_bytes or self.config.fetch_bytes_default
        deadline = time.monotonic() + request.max_wait_ms / 1000
        result = partition.read(offset, max_bytes)
        while len(result.data) < max(request.min_bytes, 1) and time.monotonic() < deadline:
            await partition.wait_for_data(result.next_offset, deadline - time.monotonic())
            partition.check_open()
            result = partition.read(offset, max_bytes)
            if len(result.data) and len(result.data) >= request.min_bytes:
                break
        response = pb.FetchResponse(
            high_watermark=partition.high_watermark,
            log_start_offset=partition.log.log_start_offset,
            next_offset=result.next_offset,
        )
        if request.format == pb.RECORD_FORMAT_RECORDS:
            response.decoded.extend(_decoded_records(result.data, offset))
        else:
            response.records = result.data
        return response

    # ------------------------------------------------------------------ ListOffsets

    @rpc_handler
    def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListOffsetsResponse:
        topic = self.logs.topic(request.topic)
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
        indexes = list(request.partitions) or list(range(topic.partitions))
        offsets = []
        for index in indexes:
            partition = self.logs.partition(request.topic, index)
            timestamp = -1
            if request.spec == pb.OFFSET_SPEC_EARLIEST:
                offset = partition.log.log_start_offset
            elif request.spec == pb.OFFSET_SPEC_LATEST:
                offset = partition.high_watermark
            else:
                found = partition.log.offset_for_timestamp(request.timestamp_ms)
                offset, timestamp = (
                    found
                    if found and found[0] < partition.high_watermark
                    else (
                        partition.high_watermark,
                        -1,
                    )
                )
            offsets.append(
                pb.PartitionOffset(partition=index, offset=offset, timestamp_ms=timestamp)
            )
        return pb.ListOffsetsResponse(offsets=offsets)

    # ------------------------------------------------------------------ Metadata

    @rpc_handler
    def Metadata(
        self, request: pb.MetadataRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.MetadataResponse:
        node_id = self.config.node_id
        records = (
            [self.logs.topic(n) for n in request.topics] if request.topics else self.logs.topics()
        )
        topics = [
            pb.TopicMetadata(
                name=record.name,
                topic_id=record.topic_id,
                partitions=[
                    pb.PartitionMetadata(
                        partition=p,
                        leader=node_id,
                        leader_epoch=self.logs.partition(record.name, p).leader_epoch,
                        replicas=[node_id],
                        isr=[node_id],
                    )
                    for p in range(record.partitions)
                ],
            )
            for record in records
        ]
        broker = pb.BrokerInfo(
            node_id=node_id,
            address=self.config.client_address,
            rack=self.config.rack,
            state="running",
        )
        return pb.MetadataResponse(
            brokers=[broker], controller_id=node_id, cluster_id=self.logs.cluster_id, topics=topics
        )


def _topic_result(name: str, action: Callable[[], str]) -> pb.TopicResult:
    """Run ``action`` for topic ``name``: its returned topic id, or its error, in a result."""
    result = pb.TopicResult(name=name)
    try:
        result.topic_id = action()
    except HeadwaterError as error:
        result.error_code = pb.ErrorCode.ValueType(error.code)
        result.error_message = error.message
    return result


def _decoded_records(data: bytes, first_offset: int) -> list[pb.ConsumedRecord]:
    out = []
    for decoded in batch_format.decode_batches(data):
        records = decoded.records
        if decoded.header.base_offset < first_offset:
            records = records.filter(pc.greater_equal(records.column("offset"), first_offset))
        for row, stamp in zip(
            records.to_pylist(), batch_format.timestamps_ms(records), strict=True
        ):
            record = pb.ConsumedRecord(
                offset=row["offset"],
                timestamp_ms=stamp,
                headers=[pb.Header(key=h["key"], value=h["value"]) for h in row["headers"] or []],
            )
            if row["key"] is not None:
                record.key = row["key"]
            if row["value"] is not None:
                record.value = row["value"]
            out.append(record)
    return out


class AdminService(pb_grpc.AdminServicer):
    def __init__(self, config: NodeConfig, logs: LogManager) -> None:
        self.config = config
        self.logs = logs

    @rpc_handler
    def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateTopicsResponse:
        return pb.CreateTopicsResponse(
            results=[
                _topic_result(
                    topic.name, functools.partial(self._create, topic, request.validate_only)
                )
                for topic in request.topics
            ]
        )

    def _create(self, topic: pb.NewTopic, validate_only: bool) -> str:
        """Create (or only check) one topic; return its id ("" when only checked)."""
        partitions = topic.partitions if topic.HasField("partitions") else None
        replication = topic.replication_factor if topic.HasField("replication_factor") else None
        args = (topic.name, partitions, replication, topic.configs)
        if validate_only:
            self.logs.check_new_topic(*args)
            return ""
        return self.logs.create_topic(*args).topic_id

    @rpc_handler
    def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteTopicsResponse:
        return pb.DeleteTopicsResponse(
            results=[
                _topic_result(name, functools.partial(self._delete, name)) for name in request.names
            ]
        )

    def _delete(self, name: str) -> str:
        self.logs.delete_topic(name)
        return ""

    @rpc_handler
    def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListTopicsResponse:
        return pb.ListTopicsResponse(
            topics=[
                pb.TopicSummary(
                    name=t.name,
                    topic_id=t.topic_id,
                    partitions=t.partitions,
                    replication_factor=t.replication_factor,
                )
                for t in self.logs.topics()
                if request.include_internal or not t.name.startswith("__")
            ]
        )

    @rpc_handler
    def DescribeTopics(
        self, request: pb.DescribeTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeTopicsResponse:
        records = (
            [self.logs.topic(n) for n in request.names] if request.names else self.logs.topics()
        )
        node_id = self.config.node_id
        described = []
        for record in records:
            partitions = []
            for p in range(record.partitions):
                partition = self.logs.partition(record.name, p)
                log = partition.log
                partitions.append(
                    pb.PartitionDescription(
                        partition=p,
                        leader=node_id,
                        leader_epoch=partition.leader_epoch,
                        replicas=[node_id],
                        isr=[node_id],
                        log_start_offset=log.log_start_offset,
                        log_end_offset=log.log_end_offset,
                        high_watermark=partition.high_watermark,
                        size_bytes=log.size_bytes,
                        segment_count=log.segment_count,
                    )
                )
            configs = self.config.topic_defaults() | record.configs
            described.append(
                pb.TopicDescription(
                    name=record.name,
                    topic_id=record.topic_id,
                    configs=configs,
                    partitions=partitions,
                )
            )
        return pb.DescribeTopicsResponse(topics=described)
