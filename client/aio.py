"""asyncio producer and consumer: a record's whole client-side path on one event loop.

The threaded Producer and Consumer hand every record across several Python threads
(caller, sender, stream reader, fetch reader), and under the GIL each hand-off costs up
to a switch interval. These classes do the same work with ``grpc.aio`` on the caller's
event loop, for latency-sensitive programs (``headwater bench e2e`` uses them).

AsyncProducer: records of a partition accumulate while a request of that partition is in
flight (one at a time, so records are stored in send order) and leave as one batch when
it is answered. Records sent in the same loop iteration leave together. Errors fail the
records' futures (no retries: callers that want them use the threaded Producer).

AsyncConsumer: one FetchStream per assigned partition, each read by a task into one
bounded asyncio queue; ``poll`` waits on that queue. A stream that ends or fails with a
retriable error is reopened where it stopped; other errors are raised by ``poll``.

Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Final

import grpc

from headwater.cancellation import task_is_stopping
from headwater.client.connection import (
    MESSAGE_BYTES_MAX,
    RECONNECT_OPTIONS,
    RETRY_BACKOFF_MAX_S,
    RETRY_BACKOFF_MIN_S,
    resolve_bootstrap,
)
from headwater.client.consumer import FetchedBatch, PollResult, TopicPartition, fetched_from
from headwater.client.partitioner import partition_for_key
from headwater.client.producer import RecordMetadata, parse_acks
from headwater.errors import ErrorCode, HeadwaterError
from headwater.grpc_errors import from_rpc_error
from headwater.log.batch import Compression, encode_batch
from headwater.node.topics import check_partition
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

ARRIVALS_MAX: Final = 64
# How long a partition's reader retries a stream that keeps failing without progress.
READ_RETRY_S: Final = 30.0
_OPTIONS: Final = [
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    *RECONNECT_OPTIONS,
]


async def _layout(
    stub: pb_grpc.BrokerStub, topic: str, timeout_s: float
) -> tuple[int, dict[int, int]]:
    """(partition count, {partition: leader node id}) of ``topic``."""
    try:
        # mypy picks the sync signature BrokerAsyncStub inherits from BrokerStub here.
        response = await stub.Metadata(  # type: ignore[misc]
            pb.MetadataRequest(topics=[topic]), timeout=timeout_s
        )
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, topic) from None
    (described,) = response.topics
    return len(described.partitions), {p.partition: p.leader for p in described.partitions}


@dataclass(slots=True)
class _PartitionQueue:
    """Records waiting for a partition, and whether a request of it is in flight."""

    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    stamps: list[int] = field(default_factory=list)
    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    in_flight: bool = False
    scheduled: bool = False


class AsyncProducer:
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        acks: str | int = "all",
        compression: str = "none",
        request_timeout_ms: int = 30_000,
    ) -> None:
        self.address = resolve_bootstrap(bootstrap)[0]
        self.acks = parse_acks(acks)
        self.compression = Compression.parse(compression)
        self.timeout_s = request_timeout_ms / 1000
        self._channel = grpc.aio.insecure_channel(self.address, options=_OPTIONS)
        self._stub = pb_grpc.BrokerStub(self._channel)
        self._call: grpc.aio.StreamStreamCall[pb.ProduceRequest, pb.ProduceResponse] | None = None
        self._outgoing: asyncio.Queue[pb.ProduceRequest | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None
        self._answers: deque[
            tuple[tuple[str, int], list[asyncio.Future[RecordMetadata]], list[int]]
        ] = deque()
        self._partitions: dict[str, int] = {}
        self._queues: dict[tuple[str, int], _PartitionQueue] = {}
        self._sticky: dict[str, int] = {}

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _partition_count(self, topic: str) -> int:
        count = self._partitions.get(topic)
        if count is None:
            count, _leaders = await _layout(self._stub, topic, self.timeout_s)
            self._partitions[topic] = count
        return count

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; await the returned future for its metadata."""
        count = await self._partition_count(topic)
        if partition is None:
            partition = (
                partition_for_key(key, count)
                if key is not None
                else self._sticky.setdefault(topic, 0)
            )
        else:
            check_partition(topic, partition, count)
        slot = (topic, partition)
        queue = self._queues.setdefault(slot, _PartitionQueue())
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        queue.values.append(value)
        queue.keys.append(key)
        queue.stamps.append(time.time_ns() // 1_000_000)
        queue.futures.append(future)
        if not queue.in_flight and not queue.scheduled:
            queue.scheduled = True  # records sent in this loop iteration leave together
            asyncio.get_running_loop().call_soon(self._dispatch, slot)
        return future

    def _stream(self) -> asyncio.Queue[pb.ProduceRequest | None]:
        """The outgoing queue of the live ProduceStream, opened (again) when needed."""
        if self._call is None or self._call.done():
            self._outgoing = asyncio.Queue()
            self._call = self._stub.ProduceStream(_drain(self._outgoing))
            self._reader = asyncio.get_running_loop().create_task(self._read(self._call))
        return self._outgoing

    def _dispatch(self, slot: tuple[str, int]) -> None:
        queue = self._queues[slot]
        queue.scheduled = False
        if queue.in_flight or not queue.values:
            return
        values, keys, stamps, futures = queue.values, queue.keys, queue.stamps, queue.futures
        queue.values, queue.keys, queue.stamps, queue.futures = [], [], [], []
        try:
            batch = encode_batch(
                values, keys=keys, timestamps_ms=stamps, compression=self.compression
            )
        except ValueError as exc:
            _fail(futures, HeadwaterError(ErrorCode.INVALID_RECORD, str(exc)))
            return
        queue.in_flight = True
        request = pb.ProduceRequest(
            topic=slot[0],
            partition=slot[1],
            batch=batch,
            acks=self.acks,
            timeout_ms=int(self.timeout_s * 1000),
        )
        self._answers.append((slot, futures, stamps))
        self._stream().put_nowait(request)  # at most one request per partition waits here

    async def _read(
        self, call: grpc.aio.StreamStreamCall[pb.ProduceRequest, pb.ProduceResponse]
    ) -> None:
        error: HeadwaterError
        try:
            async for response in call:
                slot, futures, stamps = self._answers.popleft()
                if response.error_code != pb.NONE:
                    _fail(
                        futures,
                        HeadwaterError(ErrorCode(response.error_code), response.error_message),
                    )
                else:
                    base = response.results[0].base_offset
                    for i, (future, stamp) in enumerate(zip(futures, stamps, strict=True)):
                        if not future.done():
                            future.set_result(RecordMetadata(slot[0], slot[1], base + i, stamp))
                self._settled(slot)
            error = HeadwaterError(
                ErrorCode.NETWORK_EXCEPTION, f"{self.address}: produce stream closed"
            )
        except grpc.RpcError as exc:
            error = from_rpc_error(exc, self.address)
        while self._answers:
            slot, futures, _stamps = self._answers.popleft()
            _fail(futures, error)
            self._settled(slot)

    def _settled(self, slot: tuple[str, int]) -> None:
        queue = self._queues[slot]
        queue.in_flight = False
        if queue.values:
            self._dispatch(slot)

    async def flush(self) -> None:
        """Wait until every queued record is answered."""
        while any(q.in_flight or q.values for q in self._queues.values()):
            waiting = [f for q in self._queues.values() for f in q.futures]
            waiting += [f for _slot, futures, _s in self._answers for f in futures]
            await asyncio.wait(waiting) if waiting else await asyncio.sleep(0)

    async def close(self) -> None:
        with contextlib.suppress(HeadwaterError):
            await self.flush()
        if self._call is not None and not self._call.done():
            self._outgoing.put_nowait(None)
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError, grpc.RpcError):
                await asyncio.wait_for(self._reader, self.timeout_s)
        await self._channel.close(None)


async def _drain(
    queue: asyncio.Queue[pb.ProduceRequest | None],
) -> AsyncIterator[pb.ProduceRequest]:
    """The requests of a stream, until the None that ends it."""
    while (request := await queue.get()) is not None:
        yield request


def _fail(futures: list[asyncio.Future[RecordMetadata]], error: HeadwaterError) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)


class AsyncConsumer:
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        fetch_max_bytes: int = 4 << 20,
        fetch_max_wait_ms: int = 500,
        check_crcs: bool = True,
    ) -> None:
        self.address = resolve_bootstrap(bootstrap)[0]
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.check_crcs = check_crcs
        self._channel = grpc.aio.insecure_channel(self.address, options=_OPTIONS)
        self._stub = pb_grpc.BrokerStub(self._channel)
        self._positions: dict[TopicPartition, int] = {}
        self._readers: dict[TopicPartition, asyncio.Task[None]] = {}
        # (partition, (record batches, next offset) or None, error or None)
        self._arrivals: asyncio.Queue[
            tuple[TopicPartition, tuple[bytes, int] | None, HeadwaterError | None]
        ] = asyncio.Queue(maxsize=ARRIVALS_MAX)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def assign_at(
        self, topic: str, spec: pb.OffsetSpec.ValueType = pb.OFFSET_SPEC_LATEST
    ) -> None:
        """Consume every partition of ``topic`` from its earliest or latest offset."""
        count, _leaders = await _layout(self._stub, topic, 30)
        try:
            offsets = await self._stub.ListOffsets(
                pb.ListOffsetsRequest(topic=topic, partitions=list(range(count)), spec=spec),
                timeout=30,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, topic) from None
        await self._stop_readers()
        self._positions = {TopicPartition(topic, o.partition): o.offset for o in offsets.offsets}
        for tp in self._positions:
            self._readers[tp] = asyncio.get_running_loop().create_task(self._read(tp))

    async def _read(self, tp: TopicPartition) -> None:
        """Feed ``tp``'s arrivals into the queue until stopped. A stream that ends or fails
        with a retriable error (a leader moving, a node restarting) is reopened from the
        next offset after what was queued, with backoff, for up to ``READ_RETRY_S`` without
        progress; any other error, or running out of that time, is queued for ``poll``."""
        offset = self._positions[tp]
        backoff_s = RETRY_BACKOFF_MIN_S
        give_up_at = time.monotonic() + READ_RETRY_S
        while True:
            request = pb.FetchRequest(
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                max_bytes=self.fetch_max_bytes,
                max_wait_ms=self.fetch_max_wait_ms,
                min_bytes=1,
                replica_id=-1,
            )
            call = self._stub.FetchStream(request)
            try:
                async for response in call:
                    records = response.records  # each read of a bytes field copies it
                    if records:
                        await self._arrivals.put((tp, (records, response.next_offset), None))
                    offset = max(offset, response.next_offset)
                    backoff_s = RETRY_BACKOFF_MIN_S
                    give_up_at = time.monotonic() + READ_RETRY_S
                error = HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{self.address}: fetch stream of {tp} ended"
                )
            except grpc.RpcError as exc:
                error = from_rpc_error(exc, self.address)
            except asyncio.CancelledError:
                if task_is_stopping():
                    raise  # stopped by _stop_readers
                # grpc.aio raises CancelledError for a call cancelled under it.
                error = HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{self.address}: fetch stream was cancelled"
                )
            finally:
                call.cancel()
            if not error.retriable or time.monotonic() + backoff_s > give_up_at:
                await self._arrivals.put((tp, None, error))
                return
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)

    async def poll(self, timeout_ms: float = 1000) -> PollResult:
        """Batches that arrive within ``timeout_ms`` (possibly none)."""
        batches: list[FetchedBatch] = []
        try:
            if self._arrivals.empty():
                async with asyncio.timeout(max(timeout_ms, 0) / 1000):
                    first = await self._arrivals.get()
            else:
                first = self._arrivals.get_nowait()
        except TimeoutError:
            return PollResult(batches)
        items = [first]
        while not self._arrivals.empty():
            items.append(self._arrivals.get_nowait())
        for tp, arrival, error in items:
            if error is not None:
                raise error
            assert arrival is not None
            records, next_offset = arrival
            position = self._positions[tp]
            batches += fetched_from(tp, records, position, self.check_crcs)
            self._positions[tp] = max(position, next_offset)
        return PollResult(batches)

    async def _stop_readers(self) -> None:
        for task in self._readers.values():
            task.cancel()
        for task in self._readers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._readers.clear()

    async def close(self) -> None:
        await self._stop_readers()
        await self._channel.close(None)
