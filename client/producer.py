"""The producer: per-record ``send`` and many-record ``send_batch``, batched per partition.

Records accumulate per partition in an open batch; a batch closes when it reaches
``batch_bytes``, when ``linger_ms`` has passed since its first record, or on ``flush``.
One sender thread encodes closed batches (headwater.log.batch) and sends them, keeping at
most one request in flight per partition so that records of a partition are appended in
the order they were sent, retries included.

Delivery semantics by ``acks``:

- ``acks=0``: the future completes (offset -1) when the request is handed to gRPC; an
  error after that is not reported (at most once).
- ``acks=1``: the future completes when the leader has appended the batch.
- ``acks="all"``: the future completes when every in-sync replica has it.

Retriable errors (NOT_LEADER_OR_FOLLOWER, unreachable node, timeouts, ...) are retried
with exponential backoff up to ``retries`` times within ``delivery_timeout_ms``; a retry
after a lost response may append a batch twice (at least once). Futures fail with the
HeadwaterError that ended the attempts.

Retries keep send order. Every request carries a deadline, ``append_timeout_ms`` after it
is sent (``ProduceRequest.deadline_unix_ms``), after which no node appends it. When an
attempt's outcome is unknown (no answer, a broken stream, a timeout), its retry waits until
that deadline has passed (plus ``retry_backoff_ms`` for clock differences), so a copy of
the request delayed in a paused node or a slow link can never land after the retry or
after later batches of the partition. This assumes node clocks lag this client's by less
than ``retry_backoff_ms``.

Limits: ``buffer_bytes_max`` bytes of records may wait; ``send`` blocks up to
``max_block_ms`` for room, then raises REQUEST_TIMED_OUT.

Thread-safety: ``send``, ``send_batch`` and ``flush`` may be called from any thread.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from headwater.client.connection import Cluster
from headwater.client.partitioner import StickyPartitioner, partition_for_key
from headwater.client.produce_stream import ProduceStream
from headwater.client.retry import ANSWER_GRACE_S, RetryPolicy
from headwater.errors import ErrorCode, HeadwaterError
from headwater.log.batch import (
    Compression,
    CorruptBatchError,
    HeaderPairs,
    encode_batch,
    read_header,
)
from headwater.topics import check_partition
from headwater.v1 import headwater_pb2 as pb

RECORD_OVERHEAD_BYTES: Final = 12
STREAM_CHECK_S: Final = 0.5
"""Longest the sender sleeps between checks for streams that stopped answering."""
_ACKS: Final[dict[str, pb.Acks.ValueType]] = {
    "0": pb.ACKS_NONE,
    "1": pb.ACKS_LEADER,
    "all": pb.ACKS_ALL,
    "-1": pb.ACKS_ALL,
}
_INVALIDATING: Final = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
    }
)


_SETTING_MINIMUM: Final = {
    "append_timeout_ms": 1,
    "linger_ms": 0,
    "batch_bytes": 1,
    "retries": 0,
    "retry_backoff_ms": 0,
    "request_timeout_ms": 1,
    "delivery_timeout_ms": 1,
    "buffer_bytes_max": 1,
    "max_block_ms": 0,
}


def check_producer_limits(**settings: int) -> None:
    """Raise INVALID_CONFIG naming the first producer setting below its minimum."""
    for name, value in settings.items():
        low = _SETTING_MINIMUM[name]
        if value < low:
            raise HeadwaterError(ErrorCode.INVALID_CONFIG, f"{name} is {value}; must be >= {low}")


def buffer_full(buffered_bytes: int, buffer_bytes_max: int, max_block_s: float) -> HeadwaterError:
    """What ``send`` raises after waiting ``max_block_ms`` for room in the buffer."""
    return HeadwaterError(
        ErrorCode.REQUEST_TIMED_OUT,
        f"producer buffer full ({buffered_bytes} of {buffer_bytes_max} bytes) for "
        f"max_block_ms={int(max_block_s * 1000)}",
    )


def parse_acks(acks: str | int) -> pb.Acks.ValueType:
    """0, 1 or "all" (also -1) to the protobuf Acks value; INVALID_REQUIRED_ACKS otherwise."""
    value = _ACKS.get(str(acks).strip().lower())
    if value is None:
        raise HeadwaterError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks is {acks!r}; valid: 0, 1, all")
    return value


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
    """Completion of one batch, shared by the futures of its records."""

    __slots__ = (
        "_callbacks",
        "_event",
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
        self._callbacks: list[Callable[[BatchResult], None]] = []

    def complete(self, base_offset: int, error: HeadwaterError | None) -> None:
        self.base_offset = base_offset
        self.error = error
        self._event.set()
        for callback in self._callbacks:
            callback(self)

    def wait(self, timeout: float | None) -> None:
        if not self._event.wait(timeout):
            raise HeadwaterError(ErrorCode.REQUEST_TIMED_OUT, f"no answer within {timeout} s")
        if self.error is not None:
            raise self.error

    def done(self) -> bool:
        return self._event.is_set()

    def add_callback(self, callback: Callable[[BatchResult], None]) -> None:
        self._callbacks.append(callback)
        if self._event.is_set():
            callback(self)


class RecordFuture:
    """The outcome of one ``send``: ``result()`` returns its RecordMetadata or raises."""

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

    def add_done_callback(self, callback: Callable[[BatchResult], None]) -> None:
        """Call ``callback(batch_result)`` on the completing thread once the batch is done."""
        self._batch.add_callback(callback)

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

    def add_done_callback(self, callback: Callable[[BatchResult], None]) -> None:
        self._batch.add_callback(callback)

    def exception(self, timeout: float | None = None) -> HeadwaterError | None:
        """The error the batch failed with, or None once it is acknowledged; a
        REQUEST_TIMED_OUT error when ``timeout`` passes first (the batch may still land)."""
        try:
            self._batch.wait(timeout)
        except HeadwaterError as error:
            return error
        return None


class _OpenBatch:
    """Records accumulating for one partition. ``keys`` and ``headers`` stay None until
    the first record that has one (then they are back-filled with None), which saves two
    list appends per record on the common keyless path."""

    __slots__ = ("created", "headers", "keys", "result", "size", "timestamps", "values")

    def __init__(self, result: BatchResult, now: float) -> None:
        self.result = result
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[HeaderPairs | None] | None = None
        self.timestamps: list[int] = []
        self.size = 0
        self.created = now


@dataclass(slots=True)
class _Pending:
    """A closed batch waiting to be sent or resent."""

    result: BatchResult
    values: Sequence[bytes | None]
    keys: Sequence[bytes | None] | None
    headers: Sequence[HeaderPairs | None] | None
    timestamps: int | Sequence[int]
    size: int
    deadline: float
    payload: bytes | None = None
    attempts: int = 0
    not_before: float = 0.0
    # The last attempt's deadline (ProduceRequest.deadline_unix_ms): no node appends that
    # attempt after it, so a retry sent later cannot be overtaken by it.
    append_deadline_unix_ms: int = 0


class Producer:
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        acks: str | int = "all",
        linger_ms: int = 5,
        batch_bytes: int = 1 << 20,
        compression: str = "none",
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
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            request_timeout_ms=request_timeout_ms,
            delivery_timeout_ms=delivery_timeout_ms,
            buffer_bytes_max=buffer_bytes_max,
            max_block_ms=max_block_ms,
        )
        self.acks = parse_acks(acks)
        self.compression = Compression.parse(compression)
        self.linger_s = linger_ms / 1000
        self.batch_bytes = batch_bytes
        self.retry = RetryPolicy(retries, retry_backoff_ms, retry_backoff_max_ms)
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self.append_timeout_ms = min(append_timeout_ms, request_timeout_ms)
        self.buffer_bytes_max = buffer_bytes_max
        self.max_block_s = max_block_ms / 1000
        self.cluster = Cluster(bootstrap, request_timeout_s=self.request_timeout_s)
        self._rng = random.Random()
        self._sticky = StickyPartitioner(self._rng)
        # The hot path (send) takes the C-level lock directly; waiting and notifying go
        # through the condition built on the same lock.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._streams_lock = threading.Lock()
        self._streams: dict[str, ProduceStream[tuple[tuple[str, int], _Pending]]] = {}
        self._open: dict[tuple[str, int], _OpenBatch] = {}
        self._ready: dict[tuple[str, int], deque[_Pending]] = {}
        self._in_flight: set[tuple[str, int]] = set()
        self._buffered_bytes = 0
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

    def _partition_for(self, topic: str, key: bytes | None, partition: int | None) -> int:
        count = self.cluster.layout(topic).partitions
        if partition is not None:
            check_partition(topic, partition, count)
            return partition
        if key is not None:
            return partition_for_key(key, count)
        return self._sticky.partition(topic, count)

    def _reserve(self, size: int) -> None:
        """Wait (holding the condition) until ``size`` more bytes fit the buffer."""
        if self._closing:
            raise HeadwaterError(ErrorCode.INVALID_REQUEST, "producer is closed")
        if self._buffered_bytes + size <= self.buffer_bytes_max or self._buffered_bytes == 0:
            self._buffered_bytes += size
            return
        deadline = time.monotonic() + self.max_block_s
        while self._buffered_bytes + size > self.buffer_bytes_max and self._buffered_bytes > 0:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise buffer_full(self._buffered_bytes, self.buffer_bytes_max, self.max_block_s)
            self._cond.wait(remaining)
        self._buffered_bytes += size

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
        if partition is None and key is None:  # the common case, kept to two lookups
            target = self._sticky.partition(topic, self.cluster.layout(topic).partitions)
        else:
            target = self._partition_for(topic, key, partition)
        stamp = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        size = RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0)
        if key is not None:
            size += len(key)
        slot = (topic, target)
        with self._lock:
            if self._closing or self._buffered_bytes + size > self.buffer_bytes_max:
                self._reserve(size)
            else:
                self._buffered_bytes += size
            open_batch = self._open.get(slot)
            if open_batch is None:
                open_batch = _OpenBatch(BatchResult(topic, target), time.monotonic())
                self._open[slot] = open_batch
                self._cond.notify_all()
            values = open_batch.values
            index = len(values)
            values.append(value)
            open_batch.timestamps.append(stamp)
            if key is not None or open_batch.keys is not None:
                if open_batch.keys is None:
                    open_batch.keys = [None] * index
                open_batch.keys.append(key)
            if headers or open_batch.headers is not None:
                if open_batch.headers is None:
                    open_batch.headers = [None] * index
                open_batch.headers.append(headers)
            open_batch.size += size
            if open_batch.size >= self.batch_bytes:
                self._close_open(slot)
        return RecordFuture(open_batch.result, index, stamp)

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
        if not values:
            return []
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(keys)} keys for {len(values)} values")
        if headers is not None and len(headers) != len(values):
            raise ValueError(f"{len(headers)} header lists for {len(values)} values")
        stamp = time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        groups: dict[int, list[int]] | None = None
        if keys is not None and partition is None and any(k is not None for k in keys):
            count = self.cluster.layout(topic).partitions
            sticky = self._sticky.partition(topic, count)
            groups = {}
            for i, key in enumerate(keys):
                target = partition_for_key(key, count) if key is not None else sticky
                groups.setdefault(target, []).append(i)
        else:
            target = self._partition_for(topic, None, partition)
        futures: list[BatchFuture] = []
        if groups is None:
            futures += self._queue_records(topic, target, values, keys, headers, stamp)
        else:
            for target, indexes in sorted(groups.items()):
                futures += self._queue_records(
                    topic,
                    target,
                    [values[i] for i in indexes],
                    [keys[i] for i in indexes] if keys is not None else None,
                    [headers[i] for i in indexes] if headers is not None else None,
                    stamp,
                )
        return futures

    def send_encoded(self, topic: str, partition: int, batch: bytes) -> BatchFuture:
        """Queue one batch encoded beforehand (``headwater.log.batch.encode_batch``, with
        its producer id, base sequence and timestamps as the caller set them) for
        ``partition``, after what is already queued for it; it is sent as it is, with the
        same retries, order and acknowledgement as batches this producer encodes. The
        broker checks it as any produced batch (docs/record-batch-format.md).

        Raises CORRUPT_MESSAGE when ``batch`` is not exactly one batch with a sound header;
        UNKNOWN_TOPIC_OR_PARTITION for a partition the topic does not have.
        """
        header = read_header(batch)
        if header.total_size != len(batch):
            raise CorruptBatchError(
                f"send_encoded takes one batch: its header says {header.total_size} bytes, "
                f"{len(batch)} were given"
            )
        check_partition(topic, partition, self.cluster.layout(topic).partitions)
        result = BatchResult(topic, partition)
        result.record_count = header.record_count
        pending = _Pending(
            result=result,
            values=(),
            keys=None,
            headers=None,
            timestamps=0,
            size=len(batch),
            deadline=time.monotonic() + self.delivery_timeout_s,
            payload=batch,
        )
        slot = (topic, partition)
        self._enqueue(slot, pending)
        return BatchFuture(result)

    def _enqueue(self, slot: tuple[str, int], pending: _Pending) -> None:
        """Queue a closed batch for ``slot`` behind what is already queued for it."""
        with self._cond:
            self._reserve(pending.size)
            if slot in self._open:
                self._close_open(slot)  # keep the partition's records in send order
            self._ready.setdefault(slot, deque()).append(pending)
            self._cond.notify_all()

    def _queue_records(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[HeaderPairs | None] | None,
        stamp: int,
    ) -> list[BatchFuture]:
        total = sum(len(v) for v in values if v is not None) + RECORD_OVERHEAD_BYTES * len(values)
        pieces = max(1, -(-total // self.batch_bytes))
        step = -(-len(values) // pieces)
        futures = []
        slot = (topic, partition)
        deadline = time.monotonic() + self.delivery_timeout_s
        for start in range(0, len(values), step):
            end = min(start + step, len(values))
            size = total * (end - start) // len(values)
            result = BatchResult(topic, partition)
            result.record_count = end - start
            pending = _Pending(
                result=result,
                values=values[start:end],
                keys=keys[start:end] if keys is not None else None,
                headers=headers[start:end] if headers is not None else None,
                timestamps=stamp,
                size=size,
                deadline=deadline,
            )
            self._enqueue(slot, pending)
            futures.append(BatchFuture(result))
        self._sticky.on_batch_sent(topic, partition, self.cluster.cached_partitions(topic))
        return futures

    def _close_open(self, slot: tuple[str, int]) -> None:
        """Move the open batch of ``slot`` to its ready queue (caller holds the condition)."""
        open_batch = self._open.pop(slot)
        open_batch.result.record_count = len(open_batch.values)
        pending = _Pending(
            result=open_batch.result,
            values=open_batch.values,
            keys=open_batch.keys,
            headers=open_batch.headers,
            timestamps=open_batch.timestamps,
            size=open_batch.size,
            deadline=time.monotonic() + self.delivery_timeout_s,
        )
        self._ready.setdefault(slot, deque()).append(pending)
        self._sticky.on_batch_sent(slot[0], slot[1], self.cluster.cached_partitions(slot[0]))
        self._cond.notify_all()

    # ------------------------------------------------------------------ sender thread

    def _next_sendable(self) -> list[tuple[tuple[str, int], _Pending]] | None:
        """Batches that may be sent now, after waiting at most once (until a record, an
        answer or a deadline arrives); an empty list lets the caller check stream expiry
        outside the lock; None once closed and drained."""
        with self._cond:
            for _attempt in range(2):
                now = time.monotonic()
                wake_at = now + STREAM_CHECK_S
                for slot, open_batch in list(self._open.items()):
                    # While the partition has a request in flight or batches queued, its
                    # open batch keeps filling (as Kafka's accumulator does): closing it on
                    # linger alone would queue one tiny batch per record behind the wire.
                    if slot in self._in_flight or self._ready.get(slot):
                        continue
                    due = open_batch.created + self.linger_s
                    if self._flush_requests or self._closing or due <= now:
                        self._close_open(slot)
                    else:
                        wake_at = min(wake_at, due)
                sendable = []
                for slot, queue in self._ready.items():
                    if queue and slot not in self._in_flight:
                        if queue[0].not_before <= now:
                            sendable.append((slot, queue.popleft()))
                            self._in_flight.add(slot)
                        else:
                            wake_at = min(wake_at, queue[0].not_before)
                if sendable:
                    return sendable
                if self._closing and not self._in_flight and not any(self._ready.values()):
                    return None
                if _attempt == 0:
                    self._cond.wait(max(wake_at - now, 0.0005))
            return []

    def _run_sender(self) -> None:
        while True:
            self._expire_streams(time.monotonic())
            sendable = self._next_sendable()
            if sendable is None:
                return
            for slot, pending in sendable:
                self._send(slot, pending)

    def _send(self, slot: tuple[str, int], pending: _Pending) -> None:
        topic, partition = slot
        try:
            if pending.payload is None:
                pending.payload = encode_batch(
                    pending.values,
                    keys=pending.keys,
                    headers=pending.headers,
                    timestamps_ms=pending.timestamps,
                    compression=self.compression,
                )
                pending.values = pending.keys = pending.headers = ()  # free the record lists
            address = self.cluster.leader(topic, partition)
        except HeadwaterError as error:
            self._on_answer((slot, pending), None, error)  # retried when retriable
            return
        except ValueError as exc:
            self._finish(slot, pending, -1, HeadwaterError(ErrorCode.INVALID_RECORD, str(exc)))
            return
        request = pb.ProduceRequest(
            topic=topic,
            partition=partition,
            batch=pending.payload,
            acks=self.acks,
            timeout_ms=int(self.request_timeout_s * 1000),
            deadline_unix_ms=self._append_deadline(pending),
        )
        try:
            sent = self._stream(address).send(request, (slot, pending))
            if not sent:  # broke just now: one fresh stream, then give up to the retry path
                sent = self._stream(address).send(request, (slot, pending))
        except HeadwaterError as error:
            self._on_answer((slot, pending), None, error)
            return
        if not sent:
            self._on_answer(
                (slot, pending),
                None,
                HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{address}: produce stream unavailable"
                ),
            )
            return
        if self.acks == pb.ACKS_NONE:
            pending.result.complete(-1, None)

    def _append_deadline(self, pending: _Pending) -> int:
        """Stamp a new attempt of ``pending`` with its append deadline (Unix ms)."""
        pending.append_deadline_unix_ms = time.time_ns() // 1_000_000 + self.append_timeout_ms
        return pending.append_deadline_unix_ms

    def _stream(self, address: str) -> ProduceStream[tuple[tuple[str, int], _Pending]]:
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
        token: tuple[tuple[str, int], _Pending],
        response: pb.ProduceResponse | None,
        error: HeadwaterError | None,
    ) -> None:
        slot, pending = token
        if response is not None and response.error_code == pb.NONE:
            self._finish(slot, pending, response.results[0].base_offset, None)
            return
        if response is not None:
            error = HeadwaterError(ErrorCode(response.error_code), response.error_message)
        assert error is not None
        if self.acks == pb.ACKS_NONE:
            self._finish(slot, pending, -1, None)
            return
        if error.code in _INVALIDATING:
            self.cluster.invalidate(slot[0])
        now = time.monotonic()
        wait_s = self.retry.retry_after_s(
            error,
            response is not None,
            pending.attempts,
            now,
            pending.deadline,
            pending.append_deadline_unix_ms - time.time_ns() // 1_000_000,
            self._rng,
        )
        if wait_s is not None:
            pending.attempts += 1
            pending.not_before = now + wait_s
            with self._cond:
                self._ready.setdefault(slot, deque()).appendleft(pending)
                self._in_flight.discard(slot)
                self._cond.notify_all()
            return
        self._finish(slot, pending, -1, error)

    def _finish(
        self,
        slot: tuple[str, int],
        pending: _Pending,
        base_offset: int,
        error: HeadwaterError | None,
    ) -> None:
        if not pending.result.done():
            pending.result.complete(base_offset, error)
        with self._cond:
            self._in_flight.discard(slot)
            self._buffered_bytes -= pending.size
            self._cond.notify_all()

    # ------------------------------------------------------------------ flush and close

    def flush(self, timeout_s: float | None = None) -> None:
        """Send every queued record now and wait until all are acknowledged or failed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            self._flush_requests += 1
            self._cond.notify_all()
            try:
                while self._open or self._in_flight or any(self._ready.values()):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise HeadwaterError(
                            ErrorCode.REQUEST_TIMED_OUT,
                            f"flush did not finish within {timeout_s} s",
                        )
                    self._cond.wait(remaining)
            finally:
                self._flush_requests -= 1

    def close(self, timeout_s: float | None = None) -> None:
        """Flush, stop the sender thread and close the channels."""
        try:
            self.flush(timeout_s)
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._sender.join(timeout_s)
            with self._streams_lock:
                streams = list(self._streams.values())
                self._streams.clear()
            for stream in streams:
                stream.close()
            self.cluster.close()
