"""The consumer: assign partitions, seek, and poll records or columnar batches.

Each assigned partition has one FetchStream, read by its own thread: the node pushes each
batch as soon as it is committed, so the next data is already on its way while the caller
processes the last. Responses wait in one queue of ARRIVALS_MAX; when it is full, the
streams stop reading and gRPC flow control pauses the node.
``poll`` returns a PollResult: ``batches`` is the columnar view (one Arrow RecordBatch
per fetched record batch, schema ``headwater.log.batch.RECORD_SCHEMA``, no per-record
Python objects); iterating it yields ConsumerRecord objects.

Positions: a partition without a position starts per ``auto_offset_reset``
(``earliest``, ``latest``, or ``none`` to raise OFFSET_OUT_OF_RANGE); the same policy
applies when a position falls out of the log (retention). Consumers only see records
below the high watermark.

Thread-safety: a Consumer is used from one thread at a time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import grpc
import pyarrow as pa

from headwater.client.connection import Cluster
from headwater.errors import ErrorCode, HeadwaterError
from headwater.grpc_errors import from_rpc_error
from headwater.log.batch import columns_without_timestamps, decode_batches, timestamps_ms
from headwater.v1 import headwater_pb2 as pb

RESET_POLICIES: Final = ("earliest", "latest", "none")
ARRIVALS_MAX: Final = 64
"""Fetch responses waiting for ``poll``, across partitions; full, the streams pause."""


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """Records of one partition, columnar (RECORD_SCHEMA), all at or after the position."""

    topic: str
    partition: int
    records: pa.RecordBatch


def fetched_from(
    partition: TopicPartition, data: bytes, position: int, check_crcs: bool
) -> list[FetchedBatch]:
    """Decode fetched batches into columnar views, dropping records below ``position``
    (a fetch returns whole batches, so the first may start before it)."""
    fetched = []
    for batch in decode_batches(data, verify_crc=check_crcs):
        records = batch.records
        if batch.header.base_offset < position:
            records = records.slice(position - batch.header.base_offset)
        if records.num_rows:
            fetched.append(FetchedBatch(partition.topic, partition.partition, records))
    return fetched


class PollResult:
    """What one ``poll`` returned: columnar ``batches``; iterate for ConsumerRecords."""

    def __init__(self, batches: list[FetchedBatch]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return sum(b.records.num_rows for b in self.batches)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        for fetched in self.batches:
            columns = columns_without_timestamps(fetched.records)
            stamps = timestamps_ms(fetched.records)
            for offset, stamp, key, value, headers in zip(
                columns["offset"],
                stamps,
                columns["key"],
                columns["value"],
                columns["headers"],
                strict=True,
            ):
                yield ConsumerRecord(
                    fetched.topic,
                    fetched.partition,
                    offset,
                    stamp,
                    key,
                    value,
                    [(h["key"], h["value"]) for h in headers or []],
                )


Arrival = tuple[TopicPartition, int, "pb.FetchResponse | None", "HeadwaterError | None"]
"""(partition, generation, response, error): what a subscription hands to ``poll``."""


class _Subscription:
    """A FetchStream of one partition, read by its own thread into the consumer's queue.

    ``generation`` tags everything it delivers, so that after a seek (which cancels this
    subscription and starts another) stale responses are recognised and dropped.
    """

    def __init__(
        self,
        partition: TopicPartition,
        generation: int,
        call: grpc.CallIterator[pb.FetchResponse],
        arrivals: queue.Queue[Arrival],
        address: str,
    ) -> None:
        self.partition = partition
        self.generation = generation
        self._call = call
        self._arrivals = arrivals
        self._address = address
        self._cancelled = threading.Event()
        self._reader = threading.Thread(
            target=self._read, name=f"fetch-{partition.topic}-{partition.partition}", daemon=True
        )
        self._reader.start()

    def _put(self, item: Arrival) -> None:
        while not self._cancelled.is_set():
            try:
                self._arrivals.put(item, timeout=0.2)  # bounded: a slow consumer slows the node
                return
            except queue.Full:
                continue

    def _read(self) -> None:
        try:
            for response in self._call:
                self._put((self.partition, self.generation, response, None))
        except grpc.RpcError as exc:
            if not self._cancelled.is_set():
                self._put(
                    (self.partition, self.generation, None, from_rpc_error(exc, self._address))
                )

    def cancel(self) -> None:
        self._cancelled.set()
        self._call.cancel()  # type: ignore[no-untyped-call]


class Consumer:
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        fetch_max_bytes: int = 4 << 20,
        fetch_max_wait_ms: int = 500,
        fetch_min_bytes: int = 1,
        auto_offset_reset: str = "latest",
        request_timeout_ms: int = 30_000,
        check_crcs: bool = True,
    ) -> None:
        if auto_offset_reset not in RESET_POLICIES:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                f"auto_offset_reset is {auto_offset_reset!r}; valid: {', '.join(RESET_POLICIES)}",
            )
        if fetch_max_bytes < 1 or fetch_max_wait_ms < 0 or fetch_min_bytes < 0:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                "fetch_max_bytes must be >= 1, fetch_max_wait_ms and fetch_min_bytes >= 0",
            )
        self.cluster = Cluster(bootstrap, request_timeout_s=request_timeout_ms / 1000)
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.auto_offset_reset = auto_offset_reset
        self.check_crcs = check_crcs
        self._positions: dict[TopicPartition, int | None] = {}
        self._subscriptions: dict[TopicPartition, _Subscription] = {}
        self._generation = 0
        self._arrivals: queue.Queue[Arrival] = queue.Queue(maxsize=ARRIVALS_MAX)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: str | Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume a whole topic (a name) or the given partitions; positions start unset."""
        if isinstance(partitions, str):
            layout = self.cluster.layout(partitions)
            wanted = [TopicPartition(partitions, p) for p in range(layout.partitions)]
        else:
            wanted = [
                p if isinstance(p, TopicPartition) else TopicPartition(*p) for p in partitions
            ]
            for tp in wanted:
                self.cluster.leader(tp.topic, tp.partition)  # raises for unknown ones
        self._cancel_all()
        self._positions = dict.fromkeys(wanted)

    def assignment(self) -> list[TopicPartition]:
        return sorted(self._positions)

    def _targets(self, partitions: Iterable[TopicPartition] | None) -> list[TopicPartition]:
        targets = list(self._positions) if partitions is None else list(partitions)
        for tp in targets:
            if tp not in self._positions:
                raise HeadwaterError(
                    ErrorCode.INVALID_REQUEST, f"{tp} is not assigned to this consumer"
                )
        return targets

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Next poll reads ``partition`` from ``offset`` (checked by the broker)."""
        if offset < 0:
            raise HeadwaterError(
                ErrorCode.OFFSET_OUT_OF_RANGE, f"offset {offset} is negative; offsets start at 0"
            )
        self._targets([partition])
        self._cancel(partition)
        self._positions[partition] = offset

    def _list_offsets(
        self,
        topic: str,
        partitions: list[int],
        spec: pb.OffsetSpec.ValueType,
        timestamp_ms: int = 0,
    ) -> dict[int, int]:
        request = pb.ListOffsetsRequest(
            topic=topic, partitions=partitions, spec=spec, timestamp_ms=timestamp_ms
        )
        response: pb.ListOffsetsResponse = self.cluster.call_leader(
            topic,
            partitions[0],
            lambda address: self.cluster.broker(address).ListOffsets(
                request, timeout=self.cluster.request_timeout_s
            ),
            retry_s=self.cluster.request_timeout_s,
        )
        return {o.partition: o.offset for o in response.offsets}

    def _seek_spec(
        self,
        partitions: Iterable[TopicPartition] | None,
        spec: pb.OffsetSpec.ValueType,
        timestamp_ms: int = 0,
    ) -> None:
        by_topic: dict[str, list[int]] = {}
        for tp in self._targets(partitions):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        for topic, indexes in by_topic.items():
            for partition, offset in self._list_offsets(topic, indexes, spec, timestamp_ms).items():
                tp = TopicPartition(topic, partition)
                self._cancel(tp)
                self._positions[tp] = offset

    def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_spec(partitions, pb.OFFSET_SPEC_EARLIEST)

    def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        self._seek_spec(partitions, pb.OFFSET_SPEC_LATEST)

    def seek_to_timestamp(
        self, timestamp_ms: int, partitions: Iterable[TopicPartition] | None = None
    ) -> None:
        """Position at the first record with timestamp >= timestamp_ms (else the end)."""
        self._seek_spec(partitions, pb.OFFSET_SPEC_TIMESTAMP, timestamp_ms)

    def position(self, partition: TopicPartition) -> int:
        self._targets([partition])
        if self._positions[partition] is None:
            self._reset(partition)
        position = self._positions[partition]
        assert position is not None
        return position

    def _reset(self, partition: TopicPartition, cause: HeadwaterError | None = None) -> None:
        if self.auto_offset_reset == "none":
            raise cause or HeadwaterError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{partition} has no position and auto_offset_reset is 'none'",
            )
        spec = (
            pb.OFFSET_SPEC_EARLIEST
            if self.auto_offset_reset == "earliest"
            else pb.OFFSET_SPEC_LATEST
        )
        self._seek_spec([partition], spec)

    # ------------------------------------------------------------------ fetching

    def _cancel(self, partition: TopicPartition) -> None:
        subscription = self._subscriptions.pop(partition, None)
        if subscription is not None:
            subscription.cancel()

    def _cancel_all(self) -> None:
        for tp in list(self._subscriptions):
            self._cancel(tp)

    def _subscribe(self, partition: TopicPartition) -> None:
        """Start a FetchStream from the partition's position."""
        offset = self.position(partition)
        address = self.cluster.leader(partition.topic, partition.partition)
        request = pb.FetchRequest(
            topic=partition.topic,
            partition=partition.partition,
            offset=offset,
            max_bytes=self.fetch_max_bytes,
            max_wait_ms=self.fetch_max_wait_ms,
            min_bytes=self.fetch_min_bytes,
            replica_id=-1,
        )
        self._generation += 1
        call = self.cluster.broker(address).FetchStream(request)
        self._subscriptions[partition] = _Subscription(
            partition, self._generation, call, self._arrivals, address
        )

    def _accept(self, arrival: Arrival) -> list[FetchedBatch]:
        """Turn one arrival into batches at or after the position (or handle its error)."""
        partition, generation, response, error = arrival
        subscription = self._subscriptions.get(partition)
        if subscription is None or subscription.generation != generation:
            return []  # from before a seek or reassignment
        if error is not None:
            del self._subscriptions[partition]
            if error.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                self._reset(partition, error)
                return []
            if error.retriable:
                self.cluster.invalidate(partition.topic)
                return []  # the next poll subscribes again
            raise error
        assert response is not None
        records = response.records  # each read of a bytes field copies it
        if not records:
            return []
        position = self._positions[partition]
        assert position is not None
        fetched = fetched_from(partition, records, position, self.check_crcs)
        self._positions[partition] = max(position, response.next_offset)
        return fetched

    def poll(self, timeout_ms: float = 1000) -> PollResult:
        """Return whatever arrives within ``timeout_ms`` (possibly nothing)."""
        if not self._positions:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "no partitions assigned; call assign() first"
            )
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        batches: list[FetchedBatch] = []
        while not batches:
            for tp in self._positions:
                if tp not in self._subscriptions:
                    self._subscribe(tp)
            remaining = deadline - time.monotonic()
            try:
                arrival = (
                    self._arrivals.get(timeout=max(remaining, 0))
                    if remaining > 0
                    else (self._arrivals.get_nowait())
                )
            except queue.Empty:
                break
            batches += self._accept(arrival)
            while True:  # take whatever else has already arrived, without waiting
                try:
                    batches += self._accept(self._arrivals.get_nowait())
                except queue.Empty:
                    break
            if remaining <= 0:
                break
        return PollResult(batches)

    def close(self) -> None:
        self._cancel_all()
        self.cluster.close()
