"""asyncio producer and consumer: a record's whole client-side path on one event loop.

The threaded Producer and Consumer hand every record across several Python threads
(caller, sender, stream reader, fetch reader), and under the GIL each hand-off costs up
to a switch interval. These classes do the same work with ``grpc.aio`` on the caller's
event loop, for latency-sensitive programs (``headwater bench e2e`` uses them).

AsyncProducer: the threaded Producer's batching, ordering, limits and retry decisions, from
the same sans-I/O core (headwater.client.accumulator) driven by the event loop instead of
a sender thread; tests/test_client_engines.py runs one behaviour suite against both. It
has ``send``, ``send_batch`` and ``send_encoded``; ``linger_ms`` is 0 by default, so
records sent in one loop iteration leave together, and records sent while their
partition has a batch in flight leave together when it is answered (up to
``batch_bytes`` each). The one difference: with acks=0 a future completes when the node
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
import logging
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import grpc

from headwater.cancellation import task_is_stopping
from headwater.client.accumulator import (
    NEVER,
    ProducerBatch,
    RecordAccumulator,
    check_record_size,
    cut_batches,
    delivery_timed_out,
    group_by_partition,
    record_size,
)
from headwater.client.aio_groups import AsyncGroupCalls, HeartbeatTask
from headwater.client.connection import (
    MESSAGE_BYTES_MAX,
    RETRY_BACKOFF_MAX_S,
    RETRY_BACKOFF_MIN_S,
    LayoutCache,
    broker_addresses,
    partition_leaders,
    resolve_bootstrap,
)
from headwater.client.consumer import FetchedBatch, PollResult, fetched_from
from headwater.client.membership import (
    Membership,
    RebalanceListener,
    subscription_of,
    uncommitted,
)
from headwater.client.offsets import offset_requests, offsets_answered, one_timestamp
from headwater.client.partitioner import StickyPartitioner, partition_for_key
from headwater.client.positions import FetchPositions, TopicPartition
from headwater.client.producer import (
    BatchMetadata,
    RecordMetadata,
    buffer_full,
    check_batch_lengths,
    check_in_flight,
    encoded_record_count,
    idempotence_for,
    parse_acks,
    producer_settings,
)
from headwater.client.retry import ANSWER_GRACE_S
from headwater.client.sessions import AioSession, aio_session_interceptors
from headwater.errors import ErrorCode, HeadwaterError
from headwater.grpc_errors import from_rpc_error
from headwater.log.batch import Compression, HeaderPairs, encode_batch
from headwater.tls import RECONNECT_OPTIONS, ClientSecurity, open_aio_channel
from headwater.topics import check_partition
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

_log = logging.getLogger(__name__)
ARRIVALS_MAX: Final = 64
GROUP_STEP_S: Final = 0.05
"""In a group, how often a poll acts on revocations and assignments while it waits."""
# flush() wakes the pump every 20 such periods while it waits (a partition may be waiting
# out a failed request's deadline).
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
    the bootstrap node (cached per topic until ``invalidate``, with the stale fallback of
    ``LayoutCache``), and one channel per node. A partition without a leader goes to the
    bootstrap node, which forwards or explains."""

    def __init__(
        self, bootstrap_address: str, timeout_s: float, security: ClientSecurity | None = None
    ) -> None:
        self.bootstrap_address = bootstrap_address
        self.timeout_s = timeout_s
        self.security = ClientSecurity.resolve(security)
        self._credentials = self.security.credentials()
        self._options = [*_OPTIONS, *self.security.channel_options()]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._layouts: LayoutCache[list[str]] = LayoutCache()  # leader address by partition

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            session = (
                AioSession(self.security.username, self.security.password, address)
                if self.security.uses_sessions
                else None
            )
            channel = open_aio_channel(
                address,
                self._credentials,
                self._options,
                aio_session_interceptors(session) if session is not None else None,
                call_metadata=self.security.call_metadata(),
            )
            if session is not None:
                session.channel = channel
            self._channels[address] = channel
        return channel

    def stub(self, address: str) -> pb_grpc.BrokerAsyncStub:
        return pb_grpc.BrokerStub(self.channel(address))

    def cached(self, topic: str) -> list[str] | None:
        """The leader address of each partition of ``topic`` as last asked, or None."""
        return self._layouts.get(topic)

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
                return self._layouts.fallback(topic, from_rpc_error(exc, topic))
            (described,) = response.topics
            leaders = partition_leaders(described, broker_addresses(response))
            layout = [address or self.bootstrap_address for address in leaders]
            self._layouts.store(topic, layout)
        return layout

    def invalidate(self, topic: str) -> None:
        self._layouts.invalidate(topic)

    async def checked_leaders(self, topic: str, partition: int) -> list[str]:
        """``leaders(topic)``, once the topic has ``partition``: a partition number past the
        cached count asks again (partitions may have been added since), then raises
        PARTITION_OUT_OF_RANGE (not retriable) if the topic still lacks it."""
        leaders = await self.leaders(topic)
        if partition >= len(leaders):
            self.invalidate(topic)
            leaders = await self.leaders(topic)
        check_partition(topic, partition, len(leaders))
        return leaders

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()


class _Completion:
    """What a batch's outcome completes: one future per record (``send``), or one for the
    whole batch (``send_batch``, ``send_encoded``)."""

    __slots__ = ("batch_future", "futures", "settled")

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[RecordMetadata]] = []
        self.batch_future: asyncio.Future[BatchMetadata] | None = None
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the batch is resolved, either way: what flush waits for, one future
        a batch (waiting on every record's future cost flush seconds for 300k records)."""

    def waiting(self) -> list[asyncio.Future[Any]]:
        futures: list[asyncio.Future[Any]] = [f for f in self.futures if not f.done()]
        if self.batch_future is not None and not self.batch_future.done():
            futures.append(self.batch_future)
        return futures

    def resolve(
        self, batch: ProducerBatch[_Completion], base_offset: int, error: HeadwaterError | None
    ) -> None:
        topic, partition = batch.slot
        if not self.settled.done():
            self.settled.set_result(None)
        if error is not None:
            for future in self.waiting():
                future.set_exception(error)
            return
        stamps = batch.timestamps
        for i, future in enumerate(self.futures):
            if not future.done():
                offset = base_offset + i if base_offset >= 0 else -1
                stamp = stamps if isinstance(stamps, int) else stamps[i]
                future.set_result(RecordMetadata(topic, partition, offset, stamp))
        if self.batch_future is not None and not self.batch_future.done():
            metadata = BatchMetadata(topic, partition, base_offset, batch.record_count)
            self.batch_future.set_result(metadata)


@dataclass(slots=True)
class _ProduceStream:
    """One ProduceStream to a node: its outgoing requests and, in order, the batch each
    answer settles."""

    call: grpc.aio.StreamStreamCall[pb.ProduceRequest, pb.ProduceResponse]
    outgoing: asyncio.Queue[pb.ProduceRequest | None]
    answers: deque[ProducerBatch[_Completion]]
    reader: asyncio.Task[None] | None = None
    watchdog: asyncio.TimerHandle | None = None


class AsyncProducer:
    """The asyncio engine over the shared accumulator (headwater.client.accumulator):
    options, limits, retries and errors as the threaded Producer's (see its module).
    ``linger_ms`` is 0 by default: records sent in one loop iteration leave together, and
    records sent while their partition has a batch in flight leave together when it is
    answered (up to ``batch_bytes`` each)."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        acks: str | int = "all",
        linger_ms: int = 0,
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
        enable_idempotence: bool | None = None,
        max_in_flight_per_partition: int = 5,
        security: ClientSecurity | None = None,
    ) -> None:
        check_in_flight(max_in_flight_per_partition)
        settings = producer_settings(
            append_timeout_ms=append_timeout_ms,
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=retry_backoff_max_ms,
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            buffer_bytes_max=buffer_bytes_max,
            max_block_ms=max_block_ms,
        )
        self.address = resolve_bootstrap(bootstrap)[0]
        self.settings = settings
        self.acks = parse_acks(acks)
        self.idempotent = idempotence_for(enable_idempotence, self.acks)
        self.compression = Compression.parse(compression)
        self.timeout_s = request_timeout_ms / 1000
        self.batch_bytes = batch_bytes
        self.delivery_timeout_s = settings.delivery_timeout_s
        self.buffer_bytes_max = buffer_bytes_max
        self.max_block_s = max_block_ms / 1000
        self._router = _Router(self.address, self.timeout_s, security)
        self._streams: dict[str, _ProduceStream] = {}
        self._rng = random.Random()
        # Keyless records stick to a partition until its batch leaves (Kafka's KIP-480).
        self._sticky = StickyPartitioner(self._rng)
        self._partition_counts: dict[str, int] = {}
        self._acc: RecordAccumulator[_Completion] = RecordAccumulator(
            settings,
            self._rng,
            new_completion=lambda _slot: _Completion(),
            clock=time.monotonic,
            on_batch_closed=self._advance_sticky,
            idempotent=self.idempotent,
            max_in_flight=max_in_flight_per_partition,
        )
        self._initializing: asyncio.Task[None] | None = None
        self._room = asyncio.Event()
        self._closing = False
        self._flushing = 0
        self._pump_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_s = NEVER
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _advance_sticky(self, slot: tuple[str, int]) -> None:
        self._sticky.on_batch_sent(slot[0], slot[1], self._partition_counts.get(slot[0], 1))

    async def _partition_count(self, topic: str) -> int:
        if self._closing:
            raise HeadwaterError(ErrorCode.INVALID_REQUEST, "producer is closed")
        count = self._partition_counts[topic] = len(await self._router.leaders(topic))
        return count

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
        count = await self._partition_count(topic)
        if partition is None:
            partition = (
                partition_for_key(key, count)
                if key is not None
                else self._sticky.partition(topic, count)
            )
        elif not 0 <= partition < count:  # ask again, then raise if still not there
            count = len(await self._router.checked_leaders(topic, partition))
        size = record_size(value, key)
        check_record_size(size)
        await self._reserve(size)
        stamp = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        completion, _index, _changed = self._acc.append(
            (topic, partition), value, key, headers, stamp, size
        )
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        completion.futures.append(future)
        self._schedule_pump()  # records sent in this loop iteration leave together
        return future

    async def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeaderPairs | None] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> list[asyncio.Future[BatchMetadata]]:
        """Queue many records at once, as the threaded ``Producer.send_batch``; await the
        returned futures for each batch's metadata."""
        if not check_batch_lengths(values, keys, headers):
            return []
        count = await self._partition_count(topic)
        stamp = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        if keys is not None and partition is None and any(k is not None for k in keys):
            groups = group_by_partition(keys, count, self._sticky.partition(topic, count))
        else:
            if partition is None:
                partition = self._sticky.partition(topic, count)
            elif not 0 <= partition < count:  # ask again, then raise if still not there
                count = len(await self._router.checked_leaders(topic, partition))
            groups = {partition: list(range(len(values)))}
        futures: list[asyncio.Future[BatchMetadata]] = []
        for target, indexes in sorted(groups.items()):
            whole = len(indexes) == len(values)
            part_values = values if whole else [values[i] for i in indexes]
            part_keys = keys if whole or keys is None else [keys[i] for i in indexes]
            part_headers = headers if whole or headers is None else [headers[i] for i in indexes]
            for start, end, size in cut_batches(part_values, self.batch_bytes):
                futures.append(
                    await self._enqueue(
                        (topic, target),
                        part_values[start:end],
                        part_keys[start:end] if part_keys is not None else None,
                        part_headers[start:end] if part_headers is not None else None,
                        stamp,
                        end - start,
                        size,
                    )
                )
            self._sticky.on_batch_sent(topic, target, count)
        return futures

    async def send_encoded(
        self, topic: str, partition: int, batch: bytes
    ) -> asyncio.Future[BatchMetadata]:
        """Queue one batch encoded beforehand, as the threaded ``Producer.send_encoded``."""
        record_count = encoded_record_count(batch)
        if not 0 <= partition < await self._partition_count(topic):
            await self._router.checked_leaders(topic, partition)
        return await self._enqueue(
            (topic, partition), (), None, None, 0, record_count, len(batch), batch
        )

    async def _enqueue(
        self,
        slot: tuple[str, int],
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[HeaderPairs | None] | None,
        stamp: int,
        record_count: int,
        size: int,
        payload: bytes | None = None,
    ) -> asyncio.Future[BatchMetadata]:
        await self._reserve(size)
        completion = _Completion()
        future: asyncio.Future[BatchMetadata] = asyncio.get_running_loop().create_future()
        completion.batch_future = future
        self._acc.add_batch(
            slot,
            completion,
            values,
            keys,
            headers,
            stamp,
            record_count,
            size,
            time.monotonic(),
            payload,
        )
        self._schedule_pump()
        return future

    async def _reserve(self, size: int) -> None:
        """Wait until ``size`` more bytes fit the buffer (an oversized record is let in
        when the buffer is empty), for up to ``max_block_ms``."""
        deadline = time.monotonic() + self.max_block_s
        while True:
            if self._closing:  # also after a wait: close may have flushed meanwhile
                raise HeadwaterError(ErrorCode.INVALID_REQUEST, "producer is closed")
            if self._acc.fits(size, self.buffer_bytes_max):
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise buffer_full(self._acc.buffered_bytes, self.buffer_bytes_max, self.max_block_s)
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), remaining)

    # ------------------------------------------------------------------ sending

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """Send what the accumulator hands out, fail what expired, and come back at the
        next deadline (a linger, a backoff, an append-deadline barrier)."""
        self._pump_scheduled = False
        if (
            self.idempotent
            and self._acc.producer_id < 0
            and self._initializing is None
            and not self._acc.idle()
        ):
            self._initializing = asyncio.get_running_loop().create_task(self._init_producer_id())
        now_s = time.monotonic()
        drained = self._acc.drain(
            now_s, time.time_ns() // 1_000_000, bool(self._flushing or self._closing)
        )
        for batch in drained.expired:
            self._finish(batch, -1, delivery_timed_out(self.delivery_timeout_s))
        for batch in drained.sendable:
            self._send(batch)
        if drained.wake_at_s < self._timer_at_s:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at_s = drained.wake_at_s
            delay_s = max(drained.wake_at_s - now_s, 0.0)
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)

    async def _init_producer_id(self) -> None:
        """Ask for this producer's id (idempotence) until one arrives or nothing waits
        to be sent; batches wait (and expire) meanwhile."""
        try:
            while self._acc.producer_id < 0 and not self._acc.idle():
                try:
                    answer = await self._router.stub(self.address).InitProducerId(
                        pb.InitProducerIdRequest(), timeout=self.timeout_s
                    )
                except grpc.RpcError:
                    await asyncio.sleep(self.settings.retry.backoff_base_ms / 1000)
                    self._schedule_pump()  # expire what waited too long
                    continue
                self._acc.producer_id = answer.producer_id
        finally:
            self._initializing = None
            self._schedule_pump()

    def _on_timer(self) -> None:
        self._timer, self._timer_at_s = None, NEVER
        self._pump()

    def _stream(self, address: str) -> _ProduceStream:
        """The live ProduceStream to ``address``, opened (again) when needed."""
        stream = self._streams.get(address)
        if stream is None or stream.call.done():
            outgoing: asyncio.Queue[pb.ProduceRequest | None] = asyncio.Queue()
            call = self._router.stub(address).ProduceStream(_drain(outgoing))
            stream = self._streams[address] = _ProduceStream(call, outgoing, deque())
            stream.reader = asyncio.get_running_loop().create_task(self._read(address, stream))
        return stream

    def _send(self, batch: ProducerBatch[_Completion]) -> None:
        """Encode ``batch`` (first attempt) and send it to its partition's leader, after
        asking the metadata when the leader is not known (a retry after the leader moved)."""
        if batch.payload is None:
            try:
                batch.payload = encode_batch(
                    batch.values,
                    keys=batch.keys,
                    headers=batch.headers,
                    timestamps_ms=batch.timestamps,
                    compression=self.compression,
                    producer_id=self._acc.producer_id if self.idempotent else -1,
                    producer_epoch=batch.producer_epoch,
                    base_sequence=batch.base_sequence,
                )
            except ValueError as exc:
                self._finish(batch, -1, HeadwaterError(ErrorCode.INVALID_RECORD, str(exc)))
                return
            batch.values = batch.keys = batch.headers = ()  # free the record lists
        topic, partition = batch.slot
        leaders = self._router.cached(topic)
        if leaders is not None and partition < len(leaders):
            self._transmit(batch, leaders[partition])
            return
        task = asyncio.get_running_loop().create_task(self._send_after_lookup(batch))
        self._tasks.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._tasks.discard)

    async def _send_after_lookup(self, batch: ProducerBatch[_Completion]) -> None:
        """Whatever goes wrong before the batch is sent fails this attempt (nothing was
        sent: the outcome is known), so the batch's futures always complete."""
        topic, partition = batch.slot
        try:
            leaders = await self._router.checked_leaders(topic, partition)
        except HeadwaterError as error:
            self._failed(batch, error, answered=True)
            return
        except Exception as exc:
            problem = HeadwaterError(ErrorCode.UNKNOWN_SERVER_ERROR, f"retry failed: {exc!r}")
            self._failed(batch, problem, answered=True)
            return
        self._transmit(batch, leaders[partition])

    def _transmit(self, batch: ProducerBatch[_Completion], address: str) -> None:
        assert batch.payload is not None
        topic, partition = batch.slot
        batch.sent_s = time.monotonic()
        request = pb.ProduceRequest(
            topic=topic,
            partition=partition,
            batch=batch.stamped_payload(self._acc.producer_id),
            acks=self.acks,
            timeout_ms=int(self.timeout_s * 1000),
            deadline_unix_ms=batch.append_deadline_unix_ms,
        )
        stream = self._stream(address)
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
                self._finish(batch, response.results[0].base_offset, None)
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

    def _failed(
        self, batch: ProducerBatch[_Completion], error: HeadwaterError, answered: bool
    ) -> None:
        """An attempt of ``batch`` failed: the accumulator queues its retry (before
        anything queued after it) or the failure is final."""
        if self.acks == pb.ACKS_NONE or error.code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            # acks=0: at most once, no error is reported. DUPLICATE_SEQUENCE_NUMBER: the
            # batch was appended before (offsets no longer known): written.
            self._finish(batch, -1, None)
            return
        if error.retriable:  # e.g. the leader moved or stopped answering: ask again
            self._router.invalidate(batch.slot[0])
        wait_s = self._acc.retry_after(
            batch, error, answered, time.monotonic(), time.time_ns() // 1_000_000
        )
        if wait_s is not None:
            self._schedule_pump()  # the pump sets a timer for the retry's time
            return
        self._finish(batch, -1, error, answered)

    def _finish(
        self,
        batch: ProducerBatch[_Completion],
        base_offset: int,
        error: HeadwaterError | None,
        answered: bool = True,
    ) -> None:
        """Complete ``batch``'s futures, settle it, and send what it held back."""
        batch.completion.resolve(batch, base_offset, error)
        self._acc.settle(batch, time.monotonic(), time.time_ns() // 1_000_000, error, answered)
        self._room.set()
        self._schedule_pump()

    async def flush(self) -> None:
        """Send every record queued before the call now and wait until each is answered
        (acknowledged or failed for good). Records other tasks send meanwhile are sent
        at once too, but not waited for: a task that keeps sending cannot hold flush (or
        close) up."""
        self._flushing += 1
        try:
            self._schedule_pump()
            waiting = {c.settled for c in self._acc.completions() if not c.settled.done()}
            while waiting:
                _done, waiting = await asyncio.wait(waiting, timeout=FLUSH_POLL_S * 20)
                self._schedule_pump()
        finally:
            self._flushing -= 1

    async def close(self) -> None:
        """Refuse further sends, flush what was accepted, then close the streams and
        channels. (Closing first: a record another task sent during the flush would
        otherwise be left unsent, its future pending for ever.)"""
        self._closing = True
        with contextlib.suppress(HeadwaterError):
            await self.flush()
        if self._timer is not None:
            self._timer.cancel()
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


_SPEC_OF_RESET: Final = {"earliest": pb.OFFSET_SPEC_EARLIEST, "latest": pb.OFFSET_SPEC_LATEST}


class AsyncConsumer:
    """The threaded Consumer's assignment, positions and reset policy (one sans-I/O core,
    headwater.client.positions), with one FetchStream per partition read by a task."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        fetch_max_bytes: int = 4 << 20,
        fetch_max_wait_ms: int = 500,
        auto_offset_reset: str = "latest",
        check_crcs: bool = True,
        security: ClientSecurity | None = None,
        group_id: str | None = None,
    ) -> None:
        self._positions = FetchPositions(auto_offset_reset)
        if fetch_max_bytes < 1 or fetch_max_wait_ms < 0:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                "fetch_max_bytes must be >= 1 and fetch_max_wait_ms >= 0",
            )
        self.address = resolve_bootstrap(bootstrap)[0]
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.auto_offset_reset = auto_offset_reset
        self.check_crcs = check_crcs
        self._router = _Router(self.address, CONSUMER_CALL_TIMEOUT_S, security)
        self._readers: dict[TopicPartition, asyncio.Task[None]] = {}
        # (partition, generation, (record batches, next offset) or None, error or None)
        self._arrivals: asyncio.Queue[
            tuple[TopicPartition, int, tuple[bytes, int] | None, HeadwaterError | None]
        ] = asyncio.Queue(maxsize=ARRIVALS_MAX)
        self._group: _AsyncGroup | None = None
        self.group_id = group_id
        """The group ``subscribe`` joins when it names none (Kafka's ``group.id``)."""

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ assignment

    async def assign(self, partitions: str | Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume a whole topic (a name) or the given partitions; positions start unset
        (``auto_offset_reset`` places them at the first poll)."""
        if self._group is not None:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                "this consumer is subscribed to a group; assign() and subscribe() do not mix",
            )
        if isinstance(partitions, str):
            count = len(await self._router.leaders(partitions))
            wanted = [TopicPartition(partitions, p) for p in range(count)]
        else:
            wanted = [
                p if isinstance(p, TopicPartition) else TopicPartition(*p) for p in partitions
            ]
            for tp in wanted:  # raises for unknown topics and partitions
                await self._router.checked_leaders(tp.topic, tp.partition)
        await self._stop_readers()
        self._positions.assign(wanted)

    async def assign_at(
        self, topic: str, spec: pb.OffsetSpec.ValueType = pb.OFFSET_SPEC_LATEST
    ) -> None:
        """Consume every partition of ``topic`` from its earliest or latest offset."""
        await self.assign(topic)
        await self._seek_spec(None, spec)

    def assignment(self) -> list[TopicPartition]:
        return self._positions.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next poll reads ``partition`` from ``offset`` (checked by the broker)."""
        self._positions.seek(partition, offset)
        reader = self._readers.pop(partition, None)
        if reader is not None:
            reader.cancel()  # what it queued already is of an old generation: dropped

    async def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        await self._seek_spec(partitions, pb.OFFSET_SPEC_EARLIEST)

    async def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        await self._seek_spec(partitions, pb.OFFSET_SPEC_LATEST)

    async def seek_to_timestamp(
        self, timestamp_ms: int, partitions: Iterable[TopicPartition] | None = None
    ) -> None:
        """Position at the first record with timestamp >= timestamp_ms (else the end)."""
        await self._seek_spec(partitions, pb.OFFSET_SPEC_TIMESTAMP, timestamp_ms)

    async def position(self, partition: TopicPartition) -> int:
        if self._positions.offset(partition) is None:
            await self._reset(partition)
        position = self._positions.offset(partition)
        assert position is not None
        return position

    async def _seek_spec(
        self,
        partitions: Iterable[TopicPartition] | None,
        spec: pb.OffsetSpec.ValueType,
        timestamp_ms: int = 0,
    ) -> None:
        keys = [(tp.topic, tp.partition) for tp in self._positions.check_assigned(partitions)]
        stamps = one_timestamp(keys, spec, timestamp_ms)
        for request in offset_requests(keys, spec, stamps):
            try:
                response = await self._router.stub(self.address).ListOffsets(
                    request, timeout=CONSUMER_CALL_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                raise from_rpc_error(exc, request.topic) from None
            for (topic, partition), offset in offsets_answered(request, response).items():
                self.seek(TopicPartition(topic, partition), offset)

    async def _reset(self, partition: TopicPartition, cause: HeadwaterError | None = None) -> None:
        await self._seek_spec(
            [partition], _SPEC_OF_RESET[self._positions.reset_to(partition, cause)]
        )

    # ------------------------------------------------------------------ fetching

    async def _read(self, tp: TopicPartition, offset: int, generation: int) -> None:
        """Feed ``tp``'s arrivals into the queue until stopped. A stream that ends or fails
        with a retriable error (a leader moving, a node restarting) is reopened from the
        next offset after what was queued, with backoff, for up to ``READ_RETRY_S`` without
        progress; any other error, or running out of that time, is queued for ``poll``."""
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
                max_response_bytes=MESSAGE_BYTES_MAX,
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
                        arrival = (records, response.next_offset)
                        await self._arrivals.put((tp, generation, arrival, None))
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
                    raise  # stopped by a seek, a reassignment or close
                # grpc.aio raises CancelledError for a call cancelled under it.
                error = HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{address}: fetch stream was cancelled"
                )
            finally:
                call.cancel()
            self._router.invalidate(tp.topic)  # the leader may have moved
            if not error.retriable or time.monotonic() + backoff_s > give_up_at:
                await self._arrivals.put((tp, generation, None, error))
                return
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)

    async def _start_readers(self) -> None:
        """A reader for every assigned partition without one, from its position."""
        for tp in self._positions:
            if tp not in self._readers:
                offset = await self.position(tp)
                generation = self._positions.generation(tp)
                task = asyncio.get_running_loop().create_task(self._read(tp, offset, generation))
                self._readers[tp] = task

    async def poll(self, timeout_ms: float = 1000) -> PollResult:
        """Batches that arrive within ``timeout_ms`` (possibly none). In a group, also
        where partitions are revoked and assigned (see ``subscribe``)."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        if self._group is not None:
            return await self._poll_in_group(deadline)
        if not self._positions:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "no partitions assigned; call assign() first"
            )
        return await self._poll_until(deadline)

    async def _poll_in_group(self, deadline: float) -> PollResult:
        while True:
            await self._group_step()
            now = time.monotonic()
            if self._positions:
                result = await self._poll_until(min(deadline, now + GROUP_STEP_S))
                if result.batches or time.monotonic() >= deadline:
                    return result
            elif now >= deadline:
                return PollResult([])
            else:
                await asyncio.sleep(min(GROUP_STEP_S, deadline - now))

    async def _poll_until(self, deadline: float) -> PollResult:
        await self._start_readers()
        batches: list[FetchedBatch] = []
        try:
            if self._arrivals.empty():
                async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                    first = await self._arrivals.get()
            else:
                first = self._arrivals.get_nowait()
        except TimeoutError:
            return PollResult(batches)
        items = [first]
        while not self._arrivals.empty():
            items.append(self._arrivals.get_nowait())
        for tp, generation, arrival, error in items:
            position = self._positions.accept(tp, generation)
            if position is None:
                continue  # from before a seek or reassignment
            if error is not None:
                self._readers.pop(tp, None)
                if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise error
                await self._reset(tp, error)  # the next poll reads from the new position
                continue
            assert arrival is not None
            records, next_offset = arrival
            fetched, resume = fetched_from(tp, records, position, self.check_crcs)
            batches += fetched
            if resume is None:
                self._positions.advance(tp, next_offset)
            else:  # the rest of the answer is fetched again, by a new reader from ``resume``
                self.seek(tp, resume)
        return PollResult(batches)

    async def _stop_readers(self) -> None:
        for task in self._readers.values():
            task.cancel()
        for task in self._readers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._readers.clear()

    # ------------------------------------------------------------------ groups

    async def subscribe(
        self,
        topics: str | Sequence[str] | None = None,
        *,
        group_id: str | None = None,
        pattern: str | None = None,
        listener: RebalanceListener | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        instance_id: str = "",
        client_id: str = "",
        assignor: str = "",
        session_timeout_ms: int = 0,
        max_poll_interval_ms: int = 300_000,
    ) -> None:
        """Join consumer group ``group_id`` (default: the consumer's): the same options
        and semantics as the threaded ``Consumer.subscribe`` (docs/groups.md); the
        heartbeats run as a task on this event loop, and the listener is called from
        ``poll``."""
        subscription = subscription_of(
            self.group_id if group_id is None else group_id,
            topics,
            pattern,
            subscribed=self._group is not None,
            assigned=bool(self._positions),
            instance_id=instance_id,
            client_id=client_id,
            assignor=assignor,
            session_timeout_ms=session_timeout_ms,
            max_poll_interval_ms=max_poll_interval_ms,
        )
        calls = AsyncGroupCalls(
            self._router.channel, self.address, subscription.group_id, CONSUMER_CALL_TIMEOUT_S
        )
        membership = Membership(subscription)
        self._group = _AsyncGroup(
            calls,
            membership,
            HeartbeatTask(calls, membership, max_poll_interval_ms / 1000),
            listener,
            enable_auto_commit,
            auto_commit_interval_ms / 1000,
        )

    def _require_group(self) -> _AsyncGroup:
        if self._group is None:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "this consumer is not in a group; call subscribe()"
            )
        return self._group

    async def _group_step(self) -> None:
        """Act on what the coordinator said since the last poll (see Membership)."""
        group = self._require_group()
        membership = group.membership
        group.heartbeats.polled()
        if group.heartbeats.error is not None:
            error, group.heartbeats.error = group.heartbeats.error, None
            raise error
        if group.auto_commit and time.monotonic() >= group.next_auto_commit_s:
            group.next_auto_commit_s = time.monotonic() + group.auto_commit_interval_s
            await self._commit_quietly(None)
        if membership.lost():
            gone = sorted(membership.owned)
            await self._drop(gone)
            if group.listener is not None:
                group.listener.on_lost(gone)
            membership.forget_owned(time.monotonic())
            group.last_committed.clear()
            group.heartbeats.wake()
        revoke = membership.to_revoke()
        if revoke:
            if group.listener is not None:
                group.listener.on_revoked(revoke)
            if group.auto_commit:
                await self._commit_quietly(revoke)
            await self._drop(revoke)
            membership.released(revoke, time.monotonic())
            group.heartbeats.wake()
        assign = membership.to_assign()
        if assign:
            # Owned from now on, before the call (see the threaded Consumer).
            membership.taken(assign)
            try:
                committed = await group.calls.committed(assign)
            except HeadwaterError:
                membership.released(assign, time.monotonic())
                raise
            self._positions.add(assign)
            for tp in assign:
                if tp in committed:
                    self.seek(tp, committed[tp].offset)
            if group.listener is not None:
                group.listener.on_assigned(assign)

    async def _drop(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            reader = self._readers.pop(tp, None)
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        self._positions.remove(partitions)

    def _uncommitted(
        self, group: _AsyncGroup, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, int]:
        return uncommitted(self._positions.known(), group.last_committed, partitions)

    async def _commit_quietly(self, partitions: list[TopicPartition] | None) -> None:
        group = self._require_group()
        try:
            await self._commit_offsets(group, self._uncommitted(group, partitions))
        except HeadwaterError as error:
            _log.warning("auto-commit of group offsets failed: %s", error)

    async def _commit_offsets(self, group: _AsyncGroup, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` through the one commit in flight: offsets asked for while a
        commit is out are merged (the latest per partition) and sent together when it
        is back, so commits reach the coordinator in the order they were asked for (a
        partition's committed offset never goes back to an older request's) and many
        small commits cost one request per round trip."""
        if not offsets:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        group.commit_pending.update(offsets)
        group.commit_waiters.append(done)
        if group.committing is None:
            group.committing = asyncio.get_running_loop().create_task(self._send_commits(group))
        await asyncio.shield(done)

    async def _send_commits(self, group: _AsyncGroup) -> None:
        try:
            while group.commit_pending:
                offsets, group.commit_pending = group.commit_pending, {}
                waiters, group.commit_waiters = group.commit_waiters, []
                membership = group.membership
                try:
                    await group.calls.commit(offsets, membership.member_id, membership.member_epoch)
                except HeadwaterError as error:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(error)
                    continue
                group.last_committed.update(offsets)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            group.committing = None

    async def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (the next offset to read per partition), or the positions of
        everything ``poll`` handed out, and wait until they are stored (replicated);
        CommitFailedError names partitions that were not."""
        group = self._require_group()
        await self._commit_offsets(
            group, self._uncommitted(group, None) if offsets is None else dict(offsets)
        )

    def commit_async(self, offsets: dict[TopicPartition, int] | None = None) -> asyncio.Task[None]:
        """``commit`` as a task: the positions are taken now; await the task (or not)."""
        group = self._require_group()
        snapshot = self._uncommitted(group, None) if offsets is None else dict(offsets)
        return asyncio.get_running_loop().create_task(self._commit_offsets(group, snapshot))

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where it has none)."""
        wanted = list(partitions)
        found = await self._require_group().calls.committed(wanted)
        return {tp: (found[tp].offset if tp in found else None) for tp in wanted}

    async def close(self) -> None:
        """In a group: commit (under auto-commit) and leave."""
        group = self._group
        if group is not None:
            if group.auto_commit:
                await self._commit_quietly(None)
            self._group = None
            await group.heartbeats.stop(leave=True)
        await self._stop_readers()
        await self._router.close()


@dataclass(slots=True)
class _AsyncGroup:
    calls: AsyncGroupCalls
    membership: Membership
    heartbeats: HeartbeatTask
    listener: RebalanceListener | None
    auto_commit: bool
    auto_commit_interval_s: float
    next_auto_commit_s: float = 0.0
    last_committed: dict[TopicPartition, int] = field(default_factory=dict)
    commit_pending: dict[TopicPartition, int] = field(default_factory=dict)
    commit_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    committing: asyncio.Task[None] | None = None
