"""asyncio producer and consumer: a record's whole client-side path on one event loop.

The threaded Producer and Consumer hand every record across several Python threads
(caller, sender, stream reader, fetch reader), and under the GIL each hand-off costs up
to a switch interval. These classes do the same work with ``grpc.aio`` on the caller's
event loop, for latency-sensitive programs (``headwater bench e2e`` uses them).

AsyncProducer: records of a partition accumulate while a request of that partition is in
flight (one at a time, so records are stored in send order) and leave as one batch when
it is answered (up to ``batch_bytes`` each). Records sent in the same loop iteration
leave together. Partitioning, retries (one pure policy, ``headwater.client.retry``),
limits, timeouts and errors are the threaded Producer's; tests/test_client_engines.py
runs one behaviour suite against both. The differences: no ``linger_ms``, no
``send_batch`` or ``send_encoded``, and with acks=0 a future completes when the node
answers.

AsyncConsumer: one FetchStream per assigned partition, each read by a task into one
bounded asyncio queue; ``poll`` waits on that queue. A stream that ends or fails with a
retriable error is reopened where it stopped; other errors are raised by ``poll``.

Both talk to each partition's leader directly (its address from Metadata, asked again
after a retriable error), not through the bootstrap node: a forwarded request costs one
more hop each way.

Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
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
    TRANSPORT_ERRORS,
    broker_addresses,
    partition_leaders,
    resolve_bootstrap,
)
from headwater.client.consumer import FetchedBatch, PollResult, TopicPartition, fetched_from
from headwater.client.partitioner import StickyPartitioner, partition_for_key
from headwater.client.producer import (
    RECORD_OVERHEAD_BYTES,
    RecordMetadata,
    buffer_full,
    check_producer_limits,
    parse_acks,
)
from headwater.client.retry import ANSWER_GRACE_S, OUTCOME_UNKNOWN, RetryPolicy
from headwater.errors import ErrorCode, HeadwaterError
from headwater.grpc_errors import from_rpc_error
from headwater.log.batch import Compression, HeaderPairs, encode_batch
from headwater.topics import check_partition
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

ARRIVALS_MAX: Final = 64
# flush() polls at this period while a partition waits out a failed request's deadline.
FLUSH_POLL_S: Final = 0.005
# How long a partition's reader retries a stream that keeps failing without progress.
READ_RETRY_S: Final = 30.0
CONSUMER_CALL_TIMEOUT_S: Final = 30.0
_OPTIONS: Final = [
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    *RECONNECT_OPTIONS,
]


class _Router:
    """Where each partition's requests go: its leader's address, from Metadata asked of
    the bootstrap node (cached per topic until ``invalidate``), and one channel per node.
    A partition without a leader goes to the bootstrap node, which forwards or explains.
    An invalidated layout is kept as stale: while no node answers (a transport error), the
    stale layout still routes, so sends queue and retries go on; any answer, such as
    "the topic does not exist", is taken as it is."""

    def __init__(self, bootstrap_address: str, timeout_s: float) -> None:
        self.bootstrap_address = bootstrap_address
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._layouts: dict[str, list[str]] = {}  # topic -> leader address by partition
        self._stale: dict[str, list[str]] = {}  # invalidated layouts, the fallback

    def stub(self, address: str) -> pb_grpc.BrokerAsyncStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(address, options=_OPTIONS)
        return pb_grpc.BrokerStub(channel)

    async def leaders(self, topic: str) -> list[str]:
        """The leader address of each partition of ``topic`` (its length: the count).
        Raises when the topic's metadata cannot be had and none was known before."""
        layout = self._layouts.get(topic)
        if layout is None:
            try:
                response = await self.stub(self.bootstrap_address).Metadata(
                    pb.MetadataRequest(topics=[topic]), timeout=self.timeout_s
                )
            except grpc.RpcError as exc:
                error = from_rpc_error(exc, topic)
                stale = self._stale.get(topic)
                if stale is not None and error.code in TRANSPORT_ERRORS:
                    return stale  # no node answers: route as before (never a deleted topic)
                raise error from None
            (described,) = response.topics
            leaders = partition_leaders(described, broker_addresses(response))
            layout = [address or self.bootstrap_address for address in leaders]
            self._layouts[topic] = layout
            self._stale.pop(topic, None)
        return layout

    def invalidate(self, topic: str) -> None:
        layout = self._layouts.pop(topic, None)
        if layout is not None:
            self._stale[topic] = layout

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()


@dataclass(slots=True)
class _Batch:
    """Records of one partition encoded as one batch, from their first attempt until they
    are acknowledged or fail for good."""

    slot: tuple[str, int]
    payload: bytes
    futures: list[asyncio.Future[RecordMetadata]]
    stamps: list[int]
    size: int  # bytes of the producer's buffer its records hold
    delivery_deadline_s: float  # monotonic: no retry after it
    retries: int = 0
    # ProduceRequest.deadline_unix_ms of the latest attempt: no node appends it later.
    append_deadline_unix_ms: int = 0
    sent_s: float = 0.0  # monotonic time of the latest attempt


@dataclass(slots=True)
class _ProduceStream:
    """One ProduceStream to a node: its outgoing requests and, in order, the batch each
    answer settles."""

    call: grpc.aio.StreamStreamCall[pb.ProduceRequest, pb.ProduceResponse]
    outgoing: asyncio.Queue[pb.ProduceRequest | None]
    answers: deque[_Batch]
    reader: asyncio.Task[None] | None = None
    watchdog: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class _PartitionQueue:
    """Records waiting for a partition, and the batch of it in flight or waiting to be
    retried (one at a time: records are stored in send order, retries included)."""

    values: list[bytes | None] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    headers: list[HeaderPairs | None] | None = None  # None until a record has headers
    stamps: list[int] = field(default_factory=list)
    futures: list[asyncio.Future[RecordMetadata]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # each record's bytes of the buffer
    first_queued_s: list[float] = field(default_factory=list)  # monotonic, per record
    in_flight: bool = False  # a batch is sent, waiting for its retry, or waiting out a deadline
    scheduled: bool = False
    retry: _Batch | None = None
    # The append deadline of the batch that failed last with an unknown outcome: the next
    # batch is not sent before it has passed (send order).
    append_deadline_unix_ms: int = 0


class AsyncProducer:
    """Options, limits, retries and errors as the threaded Producer's (see its module):
    ``retries`` with exponential backoff within ``delivery_timeout_ms``, a retry after an
    unknown outcome only once the failed attempt's append deadline has passed, at most
    ``buffer_bytes_max`` bytes of records waiting (``send`` waits up to ``max_block_ms``
    for room, then raises REQUEST_TIMED_OUT). There is no ``linger_ms``: records sent while
    their partition has a batch in flight leave together when it is answered."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        acks: str | int = "all",
        compression: str = "none",
        batch_bytes: int = 1 << 20,
        retries: int = 10,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1000,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        buffer_bytes_max: int = 256 << 20,
        max_block_ms: int = 60_000,
        append_timeout_ms: int = 5_000,
    ) -> None:
        check_producer_limits(
            append_timeout_ms=append_timeout_ms,
            batch_bytes=batch_bytes,
            retry_backoff_ms=retry_backoff_ms,
            retries=retries,
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            buffer_bytes_max=buffer_bytes_max,
            max_block_ms=max_block_ms,
        )
        self.address = resolve_bootstrap(bootstrap)[0]
        self.append_timeout_ms = min(append_timeout_ms, request_timeout_ms)
        self.acks = parse_acks(acks)
        self.compression = Compression.parse(compression)
        self.timeout_s = request_timeout_ms / 1000
        self.batch_bytes = batch_bytes
        self.retry = RetryPolicy(retries, retry_backoff_ms, retry_backoff_max_ms)
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.buffer_bytes_max = buffer_bytes_max
        self.max_block_s = max_block_ms / 1000
        self._router = _Router(self.address, self.timeout_s)
        self._streams: dict[str, _ProduceStream] = {}
        self._leaders: dict[tuple[str, int], str] = {}  # where each in-use partition goes
        self._queues: dict[tuple[str, int], _PartitionQueue] = {}
        self._rng = random.Random()
        # Keyless records stick to a partition until its batch leaves (Kafka's KIP-480).
        self._sticky = StickyPartitioner(self._rng)
        self._partition_counts: dict[str, int] = {}
        self._buffered_bytes = 0
        self._room = asyncio.Event()
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeaderPairs | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Queue one record; await the returned future for its metadata."""
        if self._closing:
            raise HeadwaterError(ErrorCode.INVALID_REQUEST, "producer is closed")
        leaders = await self._router.leaders(topic)
        count = self._partition_counts[topic] = len(leaders)
        if partition is None:
            partition = (
                partition_for_key(key, count)
                if key is not None
                else self._sticky.partition(topic, count)
            )
        else:
            check_partition(topic, partition, count)
        size = RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0)
        if key is not None:
            size += len(key)
        await self._reserve(size)
        slot = (topic, partition)
        self._leaders[slot] = leaders[partition]
        queue = self._queues.setdefault(slot, _PartitionQueue())
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        if headers and queue.headers is None:
            queue.headers = [None] * len(queue.values)
        if queue.headers is not None:
            queue.headers.append(headers)
        queue.values.append(value)
        queue.keys.append(key)
        queue.stamps.append(time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms)
        queue.futures.append(future)
        queue.sizes.append(size)
        queue.first_queued_s.append(time.monotonic())
        if not queue.in_flight and not queue.scheduled:
            queue.scheduled = True  # records sent in this loop iteration leave together
            asyncio.get_running_loop().call_soon(self._dispatch, slot)
        return future

    async def _reserve(self, size: int) -> None:
        """Wait until ``size`` more bytes fit the buffer (an oversized record is let in
        when the buffer is empty), for up to ``max_block_ms``."""
        if self._closing:
            raise HeadwaterError(ErrorCode.INVALID_REQUEST, "producer is closed")
        deadline = time.monotonic() + self.max_block_s
        while self._buffered_bytes + size > self.buffer_bytes_max and self._buffered_bytes > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise buffer_full(self._buffered_bytes, self.buffer_bytes_max, self.max_block_s)
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), remaining)
        self._buffered_bytes += size

    def _release(self, size: int) -> None:
        self._buffered_bytes -= size
        self._room.set()

    def _stream(self, address: str) -> _ProduceStream:
        """The live ProduceStream to ``address``, opened (again) when needed."""
        stream = self._streams.get(address)
        if stream is None or stream.call.done():
            outgoing: asyncio.Queue[pb.ProduceRequest | None] = asyncio.Queue()
            call = self._router.stub(address).ProduceStream(_drain(outgoing))
            stream = self._streams[address] = _ProduceStream(call, outgoing, deque())
            stream.reader = asyncio.get_running_loop().create_task(self._read(address, stream))
        return stream

    def _dispatch(self, slot: tuple[str, int]) -> None:
        """Send the partition's waiting records as one batch, unless one is in flight."""
        queue = self._queues[slot]
        queue.scheduled = False
        if queue.in_flight or not queue.values:
            return
        # The records that fit batch_bytes (at least one); the rest wait for the next batch.
        count, size = 0, 0
        for record_size in queue.sizes:
            if count and size + record_size > self.batch_bytes:
                break
            count, size = count + 1, size + record_size
        values, keys, stamps = queue.values[:count], queue.keys[:count], queue.stamps[:count]
        headers = queue.headers[:count] if queue.headers is not None else None
        futures, first_queued_s = queue.futures[:count], queue.first_queued_s[0]
        del queue.values[:count], queue.keys[:count], queue.stamps[:count]
        del queue.futures[:count], queue.sizes[:count], queue.first_queued_s[:count]
        if queue.headers is not None:
            del queue.headers[:count]
            if not queue.values:
                queue.headers = None
        self._sticky.on_batch_sent(slot[0], slot[1], self._partition_counts.get(slot[0], 1))
        try:
            payload = encode_batch(
                values,
                keys=keys,
                headers=headers,
                timestamps_ms=stamps,
                compression=self.compression,
            )
        except ValueError as exc:
            _fail(futures, HeadwaterError(ErrorCode.INVALID_RECORD, str(exc)))
            self._release(size)
            return
        deadline_s = first_queued_s + self.delivery_timeout_s
        self._send(_Batch(slot, payload, futures, stamps, size, deadline_s))

    def _send(self, batch: _Batch) -> None:
        """Send one attempt of ``batch`` to its partition's leader."""
        slot = batch.slot
        queue = self._queues[slot]
        queue.in_flight = True
        batch.sent_s = time.monotonic()
        batch.append_deadline_unix_ms = time.time_ns() // 1_000_000 + self.append_timeout_ms
        request = pb.ProduceRequest(
            topic=slot[0],
            partition=slot[1],
            batch=batch.payload,
            acks=self.acks,
            timeout_ms=int(self.timeout_s * 1000),
            deadline_unix_ms=batch.append_deadline_unix_ms,
        )
        stream = self._stream(self._leaders[slot])
        stream.answers.append(batch)
        stream.outgoing.put_nowait(request)  # at most one request per partition waits here
        if stream.watchdog is None:
            self._watch(stream)

    def _watch(self, stream: _ProduceStream) -> None:
        """Cancel ``stream`` once its oldest request has waited ``request_timeout_ms`` (plus
        ``ANSWER_GRACE_S``) for an answer (a node that stopped answering): its batches fail
        with a retriable error whose outcome is unknown, and are retried."""
        stream.watchdog = None
        if stream.call.done() or not stream.answers:
            return
        waited_s = time.monotonic() - stream.answers[0].sent_s
        limit_s = self.timeout_s + ANSWER_GRACE_S
        if waited_s >= limit_s:
            stream.call.cancel()
            return
        stream.watchdog = asyncio.get_running_loop().call_later(
            limit_s - waited_s, self._watch, stream
        )

    async def _read(self, address: str, stream: _ProduceStream) -> None:
        error: HeadwaterError
        try:
            async for response in stream.call:
                batch = stream.answers.popleft()
                if response.error_code != pb.NONE:
                    failure = HeadwaterError(ErrorCode(response.error_code), response.error_message)
                    self._failed(batch, failure, answered=True)
                    continue
                base = response.results[0].base_offset
                topic, partition = batch.slot
                for i, (future, stamp) in enumerate(zip(batch.futures, batch.stamps, strict=True)):
                    if not future.done():
                        future.set_result(RecordMetadata(topic, partition, base + i, stamp))
                self._release(batch.size)
                self._settled(batch.slot)
            error = HeadwaterError(ErrorCode.NETWORK_EXCEPTION, f"{address}: produce stream closed")
        except grpc.RpcError as exc:
            error = from_rpc_error(exc, address)
        except asyncio.CancelledError:
            if task_is_stopping():
                raise
            # grpc.aio raises CancelledError for a call cancelled under it (the watchdog).
            error = HeadwaterError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"{address}: no answer within request_timeout_ms={int(self.timeout_s * 1000)}",
            )
        except Exception as exc:  # an answer that makes no sense: the stream is done for
            stream.call.cancel()
            error = HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"{address}: bad produce answer: {exc!r}"
            )
        while stream.answers:
            self._failed(stream.answers.popleft(), error, answered=False)

    def _failed(self, batch: _Batch, error: HeadwaterError, answered: bool) -> None:
        """An attempt of ``batch`` failed: retry it (before anything queued after it) or
        fail its records (RetryPolicy.retry_after_s decides)."""
        if error.retriable:  # e.g. the leader moved: ask again
            self._router.invalidate(batch.slot[0])
        now_unix_ms = time.time_ns() // 1_000_000
        wait_s = None
        if self.acks != pb.ACKS_NONE and not self._closing:
            wait_s = self.retry.retry_after_s(
                error,
                answered,
                batch.retries,
                time.monotonic(),
                batch.delivery_deadline_s,
                batch.append_deadline_unix_ms - now_unix_ms,
                self._rng,
            )
        if wait_s is not None:
            batch.retries += 1
            queue = self._queues[batch.slot]
            queue.retry = batch
            asyncio.get_running_loop().call_later(wait_s, self._start_retry, batch.slot)
            return
        _fail(batch.futures, error)
        self._release(batch.size)
        outcome_known = answered and error.code not in OUTCOME_UNKNOWN
        if not outcome_known:
            self._queues[batch.slot].append_deadline_unix_ms = batch.append_deadline_unix_ms
        self._settled(batch.slot, outcome_known)

    def _start_retry(self, slot: tuple[str, int]) -> None:
        batch = self._queues[slot].retry
        if batch is not None:
            self._queues[slot].retry = None
            task = asyncio.get_running_loop().create_task(self._resend(batch))
            self._tasks.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._tasks.discard)

    async def _resend(self, batch: _Batch) -> None:
        """The retry of ``batch``: to the partition's leader as the metadata names it now.
        Whatever goes wrong before it is sent fails this attempt (nothing was sent: the
        outcome is known), so the batch's futures always complete."""
        topic, partition = batch.slot
        try:
            leaders = await self._router.leaders(topic)
            check_partition(topic, partition, len(leaders))
            if time.monotonic() >= batch.delivery_deadline_s:
                raise HeadwaterError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"delivery_timeout_ms={int(self.delivery_timeout_s * 1000)} passed",
                )
        except HeadwaterError as error:
            self._failed(batch, error, answered=True)
            return
        except Exception as exc:
            problem = HeadwaterError(ErrorCode.UNKNOWN_SERVER_ERROR, f"retry failed: {exc!r}")
            self._failed(batch, problem, answered=True)
            return
        self._leaders[batch.slot] = leaders[partition]
        self._send(batch)

    def _settled(self, slot: tuple[str, int], outcome_known: bool = True) -> None:
        """The batch in flight for ``slot`` is done; send the next one. After a final
        failure whose outcome is unknown, the next one waits until the failed one's append
        deadline has passed (plus a margin for node clocks behind this one's), so the
        failed request, delayed somewhere, can never be appended after it."""
        queue = self._queues[slot]
        wait_ms = 0
        if not outcome_known:
            now_unix_ms = time.time_ns() // 1_000_000
            wait_ms = queue.append_deadline_unix_ms + self.retry.backoff_base_ms - now_unix_ms
        if wait_ms > 0:
            asyncio.get_running_loop().call_later(wait_ms / 1000, self._settled, slot)
            return
        queue.in_flight = False
        if queue.values:
            self._dispatch(slot)

    def _pending(self) -> list[asyncio.Future[RecordMetadata]]:
        """Futures of every record not yet answered: queued, in flight or to be retried."""
        waiting = [f for q in self._queues.values() for f in q.futures]
        waiting += [f for q in self._queues.values() if q.retry for f in q.retry.futures]
        waiting += [f for s in self._streams.values() for b in s.answers for f in b.futures]
        return [f for f in waiting if not f.done()]

    async def flush(self) -> None:
        """Wait until every queued record is answered (acknowledged or failed for good)."""
        while any(q.in_flight or q.values for q in self._queues.values()):
            waiting = self._pending()
            if waiting:
                await asyncio.wait(waiting, timeout=FLUSH_POLL_S * 20)
            else:
                await asyncio.sleep(FLUSH_POLL_S)

    async def close(self) -> None:
        """Flush, then close the streams and channels (later sends raise)."""
        with contextlib.suppress(HeadwaterError):
            await self.flush()
        self._closing = True
        for stream in self._streams.values():
            stream.outgoing.put_nowait(None)  # ends the request iterator, even of a dead call
        for stream in self._streams.values():
            if stream.reader is not None:
                with contextlib.suppress(asyncio.CancelledError, grpc.RpcError, TimeoutError):
                    await asyncio.wait_for(stream.reader, self.timeout_s)
            if stream.watchdog is not None:
                stream.watchdog.cancel()
        await self._router.close()


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
        self._router = _Router(self.address, CONSUMER_CALL_TIMEOUT_S)
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
        count = len(await self._router.leaders(topic))
        try:
            offsets = await self._router.stub(self.address).ListOffsets(
                pb.ListOffsetsRequest(topic=topic, partitions=list(range(count)), spec=spec),
                timeout=CONSUMER_CALL_TIMEOUT_S,
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
            try:
                address = (await self._router.leaders(tp.topic))[tp.partition]
            except (HeadwaterError, IndexError):
                address = self.address  # the bootstrap node forwards, or names the problem
            call = self._router.stub(address).FetchStream(request)
            try:
                async for response in call:
                    records = response.records  # each read of a bytes field copies it
                    if records:
                        await self._arrivals.put((tp, (records, response.next_offset), None))
                    offset = max(offset, response.next_offset)
                    backoff_s = RETRY_BACKOFF_MIN_S
                    give_up_at = time.monotonic() + READ_RETRY_S
                error = HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{address}: fetch stream of {tp} ended"
                )
            except grpc.RpcError as exc:
                error = from_rpc_error(exc, address)
            except asyncio.CancelledError:
                if task_is_stopping():
                    raise  # stopped by _stop_readers
                # grpc.aio raises CancelledError for a call cancelled under it.
                error = HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{address}: fetch stream was cancelled"
                )
            finally:
                call.cancel()
            self._router.invalidate(tp.topic)  # the leader may have moved
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
        await self._router.close()
