"""The asyncio producer (``AsyncProducer``): the threaded Producer's batching, ordering,
limits and retry decisions, from the same sans-I/O core (headwater.client.accumulator)
driven by the event loop instead of a sender thread; tests/test_client_engines.py runs one
behaviour suite against both. It has ``send``, ``send_batch`` and ``send_encoded``;
``linger_ms`` is 0 by default, so records sent in one loop iteration leave together, and
records sent while their partition has a batch in flight leave together when it is
answered (up to ``batch_bytes`` each). The one difference: with acks=0 a future completes
when the node answers. It talks to each partition's leader directly (``LeaderRouter``).

Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, Unpack

import grpc

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
from headwater.client.aio_router import LeaderRouter
from headwater.client.connection import (
    resolve_bootstrap,
)
from headwater.client.partitioner import StickyPartitioner, partition_for_key
from headwater.client.producer import (
    BatchMetadata,
    RecordMetadata,
    buffer_full,
    check_batch_lengths,
    encoded_record_count,
    parse_acks,
)
from headwater.client.producer_settings import (
    ASYNC_LINGER_MS_DEFAULT,
    ProducerOptions,
    ProducerSettings,
)
from headwater.client.retry import ANSWER_GRACE_S
from headwater.log.batch import HeaderPairs, encode_batch
from headwater.shared.cancellation import task_is_stopping
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb

# flush() wakes the pump every 20 such periods while it waits (a partition may be waiting
# out a failed request's deadline).
FLUSH_POLL_S: Final = 0.005


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
        self, bootstrap: str | Sequence[str] | None = None, **options: Unpack[ProducerOptions]
    ) -> None:
        """``options``: the settings of ``ProducerSettings`` (headwater.client.
        producer_settings), as ``Producer`` takes them, but for ``linger_ms``, which is
        ``ASYNC_LINGER_MS_DEFAULT`` (0) unless given."""
        options.setdefault("linger_ms", ASYNC_LINGER_MS_DEFAULT)
        settings = self.settings = ProducerSettings(**options)
        accumulator_settings = settings.accumulator_settings()
        self.address = resolve_bootstrap(bootstrap)[0]
        self.acks = parse_acks(settings.acks)
        self.idempotent = settings.idempotent
        self.compression = settings.codec
        self.timeout_s = settings.request_timeout_ms / 1000
        self.batch_bytes = settings.batch_bytes
        self.delivery_timeout_s = accumulator_settings.delivery_timeout_s
        self.buffer_bytes_max = settings.buffer_bytes_max
        self.max_block_s = settings.max_block_ms / 1000
        self._router = LeaderRouter(self.address, self.timeout_s, settings.security)
        self._streams: dict[str, _ProduceStream] = {}
        self._rng = random.Random()
        # Keyless records stick to a partition until its batch leaves (Kafka's KIP-480).
        self._sticky = StickyPartitioner(self._rng)
        self._partition_counts: dict[str, int] = {}
        self._acc: RecordAccumulator[_Completion] = RecordAccumulator(
            accumulator_settings,
            self._rng,
            new_completion=lambda _slot: _Completion(),
            clock=time.monotonic,
            on_batch_closed=self._advance_sticky,
            idempotent=self.idempotent,
            max_in_flight=settings.max_in_flight_per_partition,
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
                    await asyncio.sleep(self.settings.retry_backoff_ms / 1000)
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
