"""The producer: per-record ``send`` and many-record ``send_batch``, batched per partition.

Batching, ordering, limits and retry decisions are the shared sans-I/O core's
(headwater.client.accumulator), driven here by threads and by the asyncio AsyncProducer
on an event loop; tests/test_client_engines.py runs one behaviour suite against both.
Records accumulate per partition in an open batch; a batch closes when the next record
would take it past ``batch_bytes``, when ``linger_ms`` has passed since its first record,
or on ``flush``. One sender thread encodes closed batches (headwater.log.batch) and sends
them so that records of a partition are appended in the order they were sent, retries
included: an idempotent producer keeps up to ``max_in_flight_per_partition`` (5, at most
5) requests of a partition in flight, since the leader appends its batches only in
sequence order; without idempotence one at a time. A batch still unsent at its
``delivery_timeout_ms`` fails with REQUEST_TIMED_OUT.

Delivery semantics by ``acks``:

- ``acks=0``: the future completes (offset -1) when the request is handed to gRPC; an
  error after that is not reported (at most once).
- ``acks=1``: the future completes when the leader has appended the batch.
- ``acks="all"``: the future completes when every in-sync replica has it.

Retriable errors (NOT_LEADER_OR_FOLLOWER, unreachable node, timeouts, ...) are retried
with exponential backoff up to ``retries`` times within ``delivery_timeout_ms``. Futures
fail with the HeadwaterError that ended the attempts.

Idempotence (``enable_idempotence``; by default on with acks="all", off with 0 and 1, and
INVALID_CONFIG when asked for with 0 or 1): the producer gets a producer id from the
cluster before its first send and stamps every batch with it, an epoch and the sequence
of its first record (headwater.client.accumulator); the leader appends a retried batch
once and answers it with the original offsets, so retries never duplicate or reorder a
partition's records, through leader changes and restarts. Without idempotence a retry
after a lost response may append a batch twice (at least once).

Retries keep send order. Every request carries a deadline, ``append_timeout_ms`` after it
is sent (``ProduceRequest.deadline_unix_ms``), after which no node appends it. When an
attempt's outcome is unknown (no answer, a broken stream, a timeout), its retry waits until
that deadline has passed (plus ``retry_backoff_ms`` for clock differences), so a copy of
the request delayed in a paused node or a slow link can never land after the retry or
after later batches of the partition; a batch that fails for good with an unknown outcome
holds back the partition's next batch the same way. This assumes node clocks lag this
client's by less than ``retry_backoff_ms`` (at least 100 ms).

Limits: ``buffer_bytes_max`` bytes of records may wait; ``send`` blocks up to
``max_block_ms`` for room, then raises REQUEST_TIMED_OUT.

Thread-safety: ``send``, ``send_batch`` and ``flush`` may be called from any thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Unpack

from headwater.client.accumulator import (
    RECORD_BYTES_MAX,
    RECORD_OVERHEAD_BYTES,
    Drained,
    OpenBatch,
    ProducerBatch,
    RecordAccumulator,
    check_record_size,
    cut_batches,
    delivery_timed_out,
    group_by_partition,
)
from headwater.client.connection import Cluster
from headwater.client.partitioner import StickyPartitioner, partition_for_key
from headwater.client.produce_stream import ProduceStream
from headwater.client.producer_settings import (
    AcksLevel,
    ProducerOptions,
    ProducerSettings,
    acks_level,
)
from headwater.client.retry import ANSWER_GRACE_S
from headwater.log.batch import (
    CorruptBatchError,
    HeaderPairs,
    encode_batch,
    read_header,
)
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb

STREAM_CHECK_S: Final = 0.5
"""Longest the sender sleeps between checks for streams that stopped answering."""
_ACKS: Final[dict[AcksLevel, pb.Acks.ValueType]] = {
    "0": pb.ACKS_NONE,
    "1": pb.ACKS_LEADER,
    "all": pb.ACKS_ALL,
}


def check_batch_lengths(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    headers: Sequence[HeaderPairs | None] | None,
) -> bool:
    """Whether ``send_batch`` has records to send; ValueError when ``keys`` or ``headers``
    do not have one entry per value."""
    if keys is not None and len(keys) != len(values):
        raise ValueError(f"{len(keys)} keys for {len(values)} values")
    if headers is not None and len(headers) != len(values):
        raise ValueError(f"{len(headers)} header lists for {len(values)} values")
    return bool(values)


def encoded_record_count(batch: bytes) -> int:
    """The record count of a batch given to ``send_encoded``; CORRUPT_MESSAGE unless it
    is exactly one batch with a sound header."""
    header = read_header(batch)
    if header.total_size != len(batch):
        raise CorruptBatchError(
            f"send_encoded takes one batch: its header says {header.total_size} bytes, "
            f"{len(batch)} were given"
        )
    return header.record_count


def buffer_full(buffered_bytes: int, buffer_bytes_max: int, max_block_s: float) -> HeadwaterError:
    """What ``send`` raises after waiting ``max_block_ms`` for room in the buffer."""
    return HeadwaterError(
        ErrorCode.REQUEST_TIMED_OUT,
        f"producer buffer full ({buffered_bytes} of {buffer_bytes_max} bytes) for "
        f"max_block_ms={int(max_block_s * 1000)}",
    )


def parse_acks(acks: str | int) -> pb.Acks.ValueType:
    """0, 1 or "all" (also -1) to the protobuf Acks value; INVALID_REQUIRED_ACKS otherwise."""
    return _ACKS[acks_level(acks)]


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    topic: str
    partition: int
    base_offset: int
    record_count: int


class BatchResult:
    """Completion of one batch, shared by the futures of its records. A callback added
    runs exactly once: on the completing thread, or at once when already complete."""

    __slots__ = (
        "_callbacks",
        "_event",
        "_lock",
        "_settled",
        "base_offset",
        "error",
        "partition",
        "record_count",
        "topic",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.base_offset = -1
        self.record_count = 0
        self.error: HeadwaterError | None = None
        self._event = threading.Event()
        self._settled = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[BatchResult], None]] = []

    def complete(self, base_offset: int, error: HeadwaterError | None) -> None:
        self.base_offset = base_offset
        self.error = error
        with self._lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def wait(self, timeout: float | None) -> None:
        if not self._event.wait(timeout):
            raise HeadwaterError(ErrorCode.REQUEST_TIMED_OUT, f"no answer within {timeout} s")
        if self.error is not None:
            raise self.error

    def done(self) -> bool:
        return self._event.is_set()

    def mark_settled(self) -> None:
        """The engine is done with the batch: complete, callbacks run, buffer released."""
        self._settled.set()

    def wait_settled(self, timeout: float | None) -> bool:
        """Wait until ``mark_settled``; False if ``timeout`` passed first."""
        return self._settled.wait(timeout)

    def add_callback(self, callback: Callable[[BatchResult], None]) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback(self)


_new_object: Final = object.__new__
_time_ns: Final = time.time_ns


class RecordFuture:
    """The outcome of one ``send``: ``result()`` returns its RecordMetadata or raises.
    ``send`` fills the slots itself (cheaper than a call to ``__init__``)."""

    __slots__ = ("_batch", "_index", "_timestamp_ms")

    def __init__(self, batch: BatchResult, index: int, timestamp_ms: int) -> None:
        self._batch = batch
        self._index = index
        self._timestamp_ms = timestamp_ms

    def result(self, timeout: float | None = None) -> RecordMetadata:
        self._batch.wait(timeout)
        base = self._batch.base_offset
        offset = base + self._index if base >= 0 else -1
        return RecordMetadata(self._batch.topic, self._batch.partition, offset, self._timestamp_ms)

    def done(self) -> bool:
        return self._batch.done()

    def add_done_callback(self, callback: Callable[[RecordFuture], None]) -> None:
        """Call ``callback(future)`` with this future once its batch is done, as
        ``concurrent.futures.Future`` does: on the thread that completes the batch, or at
        once if it is already done. Exactly once."""
        self._batch.add_callback(lambda _batch: callback(self))

    def exception(self, timeout: float | None = None) -> HeadwaterError | None:
        try:
            self._batch.wait(timeout)
        except HeadwaterError as error:
            return error
        return None


class BatchFuture:
    """The outcome of one batch of ``send_batch``."""

    __slots__ = ("_batch",)

    def __init__(self, batch: BatchResult) -> None:
        self._batch = batch

    def result(self, timeout: float | None = None) -> BatchMetadata:
        self._batch.wait(timeout)
        b = self._batch
        return BatchMetadata(b.topic, b.partition, b.base_offset, b.record_count)

    def done(self) -> bool:
        return self._batch.done()

    def add_done_callback(self, callback: Callable[[BatchFuture], None]) -> None:
        """Call ``callback(future)`` with this future once the batch is done (as
        ``RecordFuture.add_done_callback``)."""
        self._batch.add_callback(lambda _batch: callback(self))

    def exception(self, timeout: float | None = None) -> HeadwaterError | None:
        """The error the batch failed with, or None once it is acknowledged; a
        REQUEST_TIMED_OUT error when ``timeout`` passes first (the batch may still land)."""
        try:
            self._batch.wait(timeout)
        except HeadwaterError as error:
            return error
        return None


class Producer:
    """The threaded engine over the shared accumulator (headwater.client.accumulator):
    callers append under one lock; one sender thread drains the accumulator, encodes and
    sends; answers arrive on the streams' reader threads."""

    def __init__(
        self, bootstrap: str | Sequence[str] | None = None, **options: Unpack[ProducerOptions]
    ) -> None:
        """``options``: the settings of ``ProducerSettings`` (headwater.client.
        producer_settings), with their defaults, units and ranges; INVALID_CONFIG (or
        INVALID_REQUIRED_ACKS, UNSUPPORTED_COMPRESSION_TYPE) names the first one out of
        range."""
        settings = self.settings = ProducerSettings(**options)
        accumulator_settings = settings.accumulator_settings()
        self.acks = parse_acks(settings.acks)
        self.idempotent = settings.idempotent
        self.compression = settings.codec
        self.batch_bytes = settings.batch_bytes
        self.delivery_timeout_s = accumulator_settings.delivery_timeout_s
        self.request_timeout_s = settings.request_timeout_ms / 1000
        self.buffer_bytes_max = settings.buffer_bytes_max
        self.max_block_s = settings.max_block_ms / 1000
        self.cluster = Cluster(
            bootstrap, request_timeout_s=self.request_timeout_s, security=settings.security
        )
        self._rng = random.Random()
        self._sticky = StickyPartitioner(self._rng)
        self._sticky_slots: dict[str, tuple[tuple[str, int], int]] = {}
        self._unsettled: dict[BatchResult, None] = {}
        """Completions of the batches not yet settled, oldest first (under the lock)."""
        self._lanes: dict[str, tuple[OpenBatch[BatchResult], int]] = {}
        """Per topic, the open batch of its sticky slot and the layout change count it
        was found under: ``send``'s direct path (``OpenBatch``)."""
        self._acc: RecordAccumulator[BatchResult] = RecordAccumulator(
            accumulator_settings,
            self._rng,
            new_completion=self._new_result,
            clock=time.monotonic,
            on_batch_closed=self._advance_sticky,
            idempotent=self.idempotent,
            max_in_flight=settings.max_in_flight_per_partition,
        )
        # The hot path (send) takes the C-level lock directly; waiting and notifying go
        # through the condition built on the same lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._streams_lock = threading.Lock()
        self._streams: dict[str, ProduceStream[ProducerBatch[BatchResult]]] = {}
        self._flush_requests = 0
        self._closing = False
        self._sender = threading.Thread(
            target=self._run_sender, name="producer-sender", daemon=True
        )
        self._sender.start()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sending

    def _new_result(self, slot: tuple[str, int]) -> BatchResult:
        """A batch's completion, registered as unsettled (what flush waits for) until
        ``_finish`` settles it. Called under the lock."""
        result = BatchResult(*slot)
        self._unsettled[result] = None
        return result

    def _advance_sticky(self, slot: tuple[str, int]) -> None:
        self._sticky.on_batch_sent(slot[0], slot[1], self.cluster.cached_partitions(slot[0]))
        self._sticky_slots.pop(slot[0], None)
        self._lanes.pop(slot[0], None)

    def _sticky_slot(self, topic: str) -> tuple[str, int]:
        """The slot keyless records of ``topic`` go to now, remembered (with the layout
        change count it was derived under) until its batch closes or a layout changes."""
        changed = self.cluster.layouts_changed
        slot = (topic, self._sticky.partition(topic, self.cluster.layout(topic).partitions))
        self._sticky_slots[topic] = (slot, changed)
        return slot

    def _partition_for(self, topic: str, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            self.cluster.checked_layout(topic, partition)
            return partition
        count = self.cluster.layout(topic).partitions
        if key is not None:
            return partition_for_key(key, count)
        return self._sticky.partition(topic, count)

    def _reserve(self, size: int) -> None:
        """Wait (holding the condition) until ``size`` more bytes fit the buffer."""
        if self._closing:
            raise HeadwaterError(ErrorCode.INVALID_REQUEST, "producer is closed")
        deadline = time.monotonic() + self.max_block_s
        while not self._acc.fits(size, self.buffer_bytes_max):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise buffer_full(self._acc.buffered_bytes, self.buffer_bytes_max, self.max_block_s)
            self._cond.wait(remaining)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeaderPairs | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordFuture:
        """Queue one record; the future resolves once the batch holding it is acknowledged."""
        stamp = _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        size = RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0)  # record_size
        if key is None and partition is None and not headers:
            # The per-record hot path: a keyless record joins the open batch of its
            # topic's sticky partition (its lane) by OpenBatch.add_direct, inlined.
            lane = self._lanes.get(topic)
            if lane is not None:
                batch = lane[0]
                accumulator = self._acc
                lock = self._lock
                lock.acquire()  # not `with`: half the cost here
                try:
                    if (
                        size < batch.direct_room
                        and -2147483648 <= stamp - batch.first_timestamp <= 2147483647
                        and accumulator.buffered_bytes + size <= self.buffer_bytes_max
                        and lane[1] == self.cluster.layouts_changed
                    ):
                        values = batch.values
                        index = len(values)
                        values.append(value)
                        batch.timestamps.append(stamp)
                        batch.direct_room -= size
                        batch.size += size
                        accumulator.buffered_bytes += size
                        future = _new_object(RecordFuture)  # no __init__ frame
                        future._batch = batch.completion
                        future._index = index
                        future._timestamp_ms = stamp
                        return future
                finally:
                    lock.release()
        return self._send_any(topic, value, key, headers, partition, stamp, size)

    def _send_any(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        headers: HeaderPairs | None,
        partition: int | None,
        stamp: int,
        size: int,
    ) -> RecordFuture:
        """``send`` for any record: it picks the partition, waits for buffer room, and
        opens the lane of the topic's sticky partition when it can."""
        if key is not None:
            size += len(key)
        if size > RECORD_BYTES_MAX:
            check_record_size(size)  # raises MESSAGE_TOO_LARGE
        sticky = partition is None and key is None
        if sticky:
            cached = self._sticky_slots.get(topic)
            if cached is None or cached[1] != self.cluster.layouts_changed:
                slot = self._sticky_slot(topic)
            else:
                slot = cached[0]
        else:
            slot = (topic, self._partition_for(topic, key, partition))
        accumulator = self._acc
        with self._lock:  # the condition's lock (its own __enter__ is a Python call)
            if self._closing or not accumulator.fits(size, self.buffer_bytes_max):
                self._reserve(size)
            result, index, changed = accumulator.append(slot, value, key, headers, stamp, size)
            if changed:
                self._cond.notify_all()
            if sticky:
                # The lane is stale once its batch closes (direct_room 0: the sticky slot
                # moves on then) or a layout changes.
                batch = accumulator.open_batch(slot)
                cached = self._sticky_slots.get(topic)
                if batch is not None and cached is not None and cached[0] == slot:
                    self._lanes[topic] = (batch, cached[1])
        return RecordFuture(result, index, stamp)

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None = None,
        headers: Sequence[HeaderPairs | None] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> list[BatchFuture]:
        """Queue many records at once, skipping per-record bookkeeping.

        Keyed records are spread by key; keyless ones all go to ``partition`` or to one
        sticky partition. Records are cut into batches of about ``batch_bytes``.
        """
        if not check_batch_lengths(values, keys, headers):
            return []
        stamp = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        futures: list[BatchFuture] = []
        if keys is not None and partition is None and any(k is not None for k in keys):
            count = self.cluster.layout(topic).partitions
            groups = group_by_partition(keys, count, self._sticky.partition(topic, count))
            for target, indexes in sorted(groups.items()):
                futures += self._queue_records(
                    topic,
                    target,
                    [values[i] for i in indexes],
                    [keys[i] for i in indexes],
                    [headers[i] for i in indexes] if headers is not None else None,
                    stamp,
                )
        else:
            target = self._partition_for(topic, None, partition)
            futures += self._queue_records(topic, target, values, keys, headers, stamp)
        return futures

    def send_encoded(self, topic: str, partition: int, batch: bytes) -> BatchFuture:
        """Queue one batch encoded beforehand (``headwater.log.batch.encode_batch``, with
        its producer id, base sequence and timestamps as the caller set them) for
        ``partition``, after what is already queued for it; it is sent as it is, with the
        same retries, order and acknowledgement as batches this producer encodes. The
        broker checks it as any produced batch (docs/record-batch-format.md).

        Raises CORRUPT_MESSAGE when ``batch`` is not exactly one batch with a sound header;
        UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist, PARTITION_OUT_OF_RANGE
        for a partition it does not have.
        """
        record_count = encoded_record_count(batch)
        self.cluster.checked_layout(topic, partition)
        return self._enqueue((topic, partition), (), None, None, 0, record_count, len(batch), batch)

    def _enqueue(
        self,
        slot: tuple[str, int],
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[HeaderPairs | None] | None,
        stamp: int,
        record_count: int,
        size: int,
        payload: bytes | None = None,
    ) -> BatchFuture:
        """Queue a whole batch for ``slot`` behind what is already queued for it."""
        with self._cond:
            self._reserve(size)
            result = self._new_result(slot)
            result.record_count = record_count
            self._acc.add_batch(
                slot,
                result,
                values,
                keys,
                headers,
                stamp,
                record_count,
                size,
                time.monotonic(),
                payload,
            )
            self._cond.notify_all()
        return BatchFuture(result)

    def _queue_records(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[HeaderPairs | None] | None,
        stamp: int,
    ) -> list[BatchFuture]:
        slot = (topic, partition)
        futures = [
            self._enqueue(
                slot,
                values[start:end],
                keys[start:end] if keys is not None else None,
                headers[start:end] if headers is not None else None,
                stamp,
                end - start,
                size,
            )
            for start, end, size in cut_batches(values, self.batch_bytes)
        ]
        self._advance_sticky((topic, partition))
        return futures

    # ------------------------------------------------------------------ sender thread

    def _next_drained(self) -> Drained[BatchResult] | None:
        """What may be sent now (or expired), after waiting at most once (until a record,
        an answer or a deadline arrives); an empty answer lets the caller check stream
        expiry outside the lock; None once closed and drained."""
        with self._cond:
            for _attempt in range(2):
                now = time.monotonic()
                drained = self._acc.drain(
                    now, time.time_ns() // 1_000_000, bool(self._flush_requests or self._closing)
                )
                if drained.sendable or drained.expired:
                    return drained
                if self._closing and self._acc.idle():
                    return None
                if _attempt == 0:
                    wake_at = min(drained.wake_at_s, now + STREAM_CHECK_S)
                    self._cond.wait(max(wake_at - now, 0.0005))
            return drained

    def _init_producer_id(self) -> None:
        """Ask the cluster for this producer's id (idempotence), retrying retriable
        failures within one delivery timeout; batches wait (and expire) meanwhile."""
        try:
            answer = self.cluster.call_any(
                lambda address: self.cluster.broker(address).InitProducerId(
                    pb.InitProducerIdRequest(), timeout=self.request_timeout_s
                ),
                retry_s=self.request_timeout_s,
            )
        except HeadwaterError:
            time.sleep(self.settings.retry_backoff_ms / 1000)
            return
        with self._cond:
            self._acc.producer_id = answer.producer_id
            self._cond.notify_all()

    def _run_sender(self) -> None:
        while True:
            if self.idempotent and self._acc.producer_id < 0 and not self._acc.idle():
                self._init_producer_id()
            self._expire_streams(time.monotonic())
            drained = self._next_drained()
            if drained is None:
                return
            for batch in drained.expired:
                self._finish(batch, -1, delivery_timed_out(self.delivery_timeout_s))
            for batch in drained.sendable:
                self._send(batch)

    def _send(self, batch: ProducerBatch[BatchResult]) -> None:
        topic, partition = batch.slot
        try:
            if batch.payload is None:
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
                batch.values = batch.keys = batch.headers = ()  # free the record lists
            payload = batch.stamped_payload(self._acc.producer_id)
            address = self.cluster.leader(topic, partition)
        except HeadwaterError as error:
            self._on_answer(batch, None, error, answered=True)  # nothing sent: retried
            return
        except ValueError as exc:
            self._finish(batch, -1, HeadwaterError(ErrorCode.INVALID_RECORD, str(exc)))
            return
        request = pb.ProduceRequest(
            topic=topic,
            partition=partition,
            batch=payload,
            acks=self.acks,
            timeout_ms=int(self.request_timeout_s * 1000),
            deadline_unix_ms=batch.append_deadline_unix_ms,
        )
        try:
            sent = self._stream(address).send(request, batch)
            if not sent:  # broke just now: one fresh stream, then give up to the retry path
                sent = self._stream(address).send(request, batch)
        except HeadwaterError as error:
            self._on_answer(batch, None, error)
            return
        if not sent:
            self._on_answer(
                batch,
                None,
                HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{address}: produce stream unavailable"
                ),
            )
            return
        if self.acks == pb.ACKS_NONE:
            batch.completion.complete(-1, None)

    def _stream(self, address: str) -> ProduceStream[ProducerBatch[BatchResult]]:
        """The live ProduceStream to ``address``, opened (again) when needed."""
        with self._streams_lock:
            stream = self._streams.get(address)
            if stream is None or stream.broken:
                stream = ProduceStream(self.cluster.broker(address), address, self._on_answer)
                self._streams[address] = stream
            return stream

    def _expire_streams(self, now: float) -> None:
        """Cancel streams whose oldest request waited past request_timeout_ms (a node that
        stopped answering); their requests fail retriably and are resent."""
        with self._streams_lock:
            streams = list(self._streams.values())
        for stream in streams:
            if stream.oldest_wait_s(now) > self.request_timeout_s + ANSWER_GRACE_S:
                stream.cancel()

    def _on_answer(
        self,
        batch: ProducerBatch[BatchResult],
        response: pb.ProduceResponse | None,
        error: HeadwaterError | None,
        answered: bool | None = None,
    ) -> None:
        """An attempt's outcome: ``response``, or ``error`` without one (the outcome is
        unknown unless ``answered`` says nothing was sent)."""
        if response is not None and response.error_code == pb.NONE:
            self._finish(batch, response.results[0].base_offset, None)
            return
        if response is not None:
            error = HeadwaterError(ErrorCode(response.error_code), response.error_message)
        assert error is not None
        if answered is None:
            answered = response is not None
        if self.acks == pb.ACKS_NONE or error.code is ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
            # DUPLICATE_SEQUENCE_NUMBER: the batch was appended before (its offsets are
            # no longer known): written, as Kafka's producer takes it.
            self._finish(batch, -1, None)
            return
        if error.retriable:  # e.g. the leader moved or stopped answering: ask again
            self.cluster.invalidate(batch.slot[0])
        with self._cond:
            wait_s = self._acc.retry_after(
                batch, error, answered, time.monotonic(), time.time_ns() // 1_000_000
            )
            if wait_s is not None:
                self._cond.notify_all()
                return
        self._finish(batch, -1, error, answered)

    def _finish(
        self,
        batch: ProducerBatch[BatchResult],
        base_offset: int,
        error: HeadwaterError | None,
        answered: bool = True,
    ) -> None:
        """Complete ``batch`` (its callbacks run on this thread, outside the lock), then
        settle it in the accumulator."""
        result = batch.completion
        if not result.done():
            result.record_count = batch.record_count
            result.complete(base_offset, error)
        with self._cond:
            self._acc.settle(batch, time.monotonic(), time.time_ns() // 1_000_000, error, answered)
            self._unsettled.pop(result, None)
            self._cond.notify_all()
        result.mark_settled()

    # ------------------------------------------------------------------ flush and close

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every record queued before the call now, and wait until each is
        acknowledged or failed. Records other threads send meanwhile are sent at once
        too, but not waited for: a thread that keeps sending cannot hold flush (or
        close) up. Raises REQUEST_TIMED_OUT when ``timeout_s`` passes first."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._flush_requests += 1
            self._cond.notify_all()
            pending = list(self._unsettled)
        try:
            for result in pending:
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0)
                if not result.wait_settled(remaining):
                    raise HeadwaterError(
                        ErrorCode.REQUEST_TIMED_OUT, f"flush did not finish within {timeout_s} s"
                    )
        finally:
            with self._cond:
                self._flush_requests -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the sender thread and close the channels."""
        try:
            self.flush(timeout_s)
        finally:
            with self._cond:
                self._closing = True
                self._acc.stop_direct_appends()  # so every send sees _closing
                self._cond.notify_all()
            self._sender.join(timeout_s)
            with self._streams_lock:
                streams = list(self._streams.values())
                self._streams.clear()
            for stream in streams:
                stream.close()
            self.cluster.close()
