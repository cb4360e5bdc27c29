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

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain, repeat
from typing import Final, NamedTuple

import grpc
import pyarrow as pa
import pyarrow.compute as pc

from headwater.client import offsets
from headwater.client.connection import Cluster
from headwater.client.groups import GroupCalls
from headwater.client.heartbeat import HeartbeatThread
from headwater.client.membership import (
    Membership,
    RebalanceListener,
    subscription_of,
    uncommitted,
)
from headwater.client.positions import FetchPositions, TopicPartition
from headwater.log.batch import decode_batches_within
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.shared.tls import ClientSecurity
from headwater.v1 import headwater_pb2 as pb

_log = logging.getLogger(__name__)
GROUP_POLL_STEP_S: Final = 0.05
"""In a group, how often a waiting poll acts on revocations and new assignments (both
engines)."""
ARRIVALS_MAX: Final = 64
"""Fetch responses waiting for ``poll``, across partitions; full, the streams pause."""


class ConsumerRecord(NamedTuple):
    """One consumed record. A named tuple: fields are read by name (``record.value``),
    records compare by value and cannot be changed, and one is built at C speed while a
    PollResult is iterated (see ``records_of``). ``headers`` is a new list per record."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


_new_record: Final[Callable[[Iterable[object]], ConsumerRecord]] = partial(
    tuple.__new__,
    ConsumerRecord,
)
"""``ConsumerRecord`` from its 7 fields in order: ``tuple.__new__`` without the Python
frames of ``ConsumerRecord(...)``, so that iterating records costs about what the tuples
cost."""


def records_of(topic: str, partition: int, records: pa.RecordBatch) -> Iterator[ConsumerRecord]:
    """The records of one fetched batch (RECORD_SCHEMA) as ConsumerRecords, in order.

    Each column is turned into Python objects at once, at C speed (Arrow's ``to_pylist``
    for keys and values; a ``range`` for the offsets, which are consecutive within a
    batch; one timestamp repeated when every record has it), and the records are built
    by ``map`` over ``zip``: no Python frame per record."""
    count = records.num_rows
    if count == 0:
        return iter(())
    offsets_column = records.column("offset")
    first = offsets_column[0].as_py()
    offsets: Iterable[int] = (
        range(first, first + count)
        if offsets_column[count - 1].as_py() == first + count - 1
        else offsets_column.to_pylist()
    )
    stamps_column = records.column("timestamp").cast(pa.int64())
    extremes = pc.min_max(stamps_column).as_py()
    stamps: Iterable[int] = (
        repeat(extremes["min"], count)
        if extremes["min"] == extremes["max"]
        else stamps_column.to_pylist()
    )
    keys_column = records.column("key")
    keys: Iterable[bytes | None] = (
        repeat(None, count) if keys_column.null_count == count else keys_column.to_pylist()
    )
    headers_column = records.column("headers")
    headers: Iterable[list[tuple[str, bytes | None]]] = (
        map(list, repeat((), count))  # a new empty list per record
        if headers_column.null_count == count
        else [
            [(pair["key"], pair["value"]) for pair in pairs] if pairs else []
            for pairs in headers_column.to_pylist()
        ]
    )
    return map(
        _new_record,
        zip(
            repeat(topic, count),
            repeat(partition, count),
            offsets,
            stamps,
            keys,
            records.column("value").to_pylist(),
            headers,
            strict=True,
        ),
    )


@dataclass(frozen=True, slots=True)
class FetchedBatch:
    """Records of one partition, columnar (RECORD_SCHEMA), all at or after the position."""

    topic: str
    partition: int
    records: pa.RecordBatch


def fetched_from(
    partition: TopicPartition, data: bytes, position: int, check_crcs: bool
) -> tuple[list[FetchedBatch], int | None]:
    """Decode fetched batches into columnar views, dropping records below ``position``
    (a fetch returns whole batches, so the first may start before it) and control
    batches (markers, not records: docs/record-batch-format.md).

    Decodes at most ``decoded_records_max(len(data))`` records (and always the first
    batch): compressed batches can hold far more records than their bytes suggest. The
    second value is None when every batch was decoded, else the offset to read on from
    (the batches after it are fetched again)."""
    fetched = []
    decoded, resume = decode_batches_within(data, verify_crc=check_crcs)
    for batch in decoded:
        if batch.header.is_control:
            continue
        records = batch.records
        if batch.header.base_offset < position:
            records = records.slice(position - batch.header.base_offset)
        if records.num_rows:
            fetched.append(FetchedBatch(partition.topic, partition.partition, records))
    return fetched, resume


class PollResult:
    """What one ``poll`` returned: columnar ``batches``; iterate for ConsumerRecords."""

    def __init__(self, batches: list[FetchedBatch]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return sum(b.records.num_rows for b in self.batches)

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return chain.from_iterable(
            records_of(fetched.topic, fetched.partition, fetched.records)
            for fetched in self.batches
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
        security: ClientSecurity | None = None,
        group_id: str | None = None,
    ) -> None:
        positions = FetchPositions(auto_offset_reset)
        if fetch_max_bytes < 1 or fetch_max_wait_ms < 0 or fetch_min_bytes < 0:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                "fetch_max_bytes must be >= 1, fetch_max_wait_ms and fetch_min_bytes >= 0",
            )
        self.cluster = Cluster(
            bootstrap, request_timeout_s=request_timeout_ms / 1000, security=security
        )
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.fetch_min_bytes = fetch_min_bytes
        self.auto_offset_reset = auto_offset_reset
        self.check_crcs = check_crcs
        self._positions = positions
        self._subscriptions: dict[TopicPartition, _Subscription] = {}
        self._arrivals: queue.Queue[Arrival] = queue.Queue(maxsize=ARRIVALS_MAX)
        self._group: _Group | None = None
        self.group_id = group_id
        """The group ``subscribe`` joins when it names none (Kafka's ``group.id``)."""

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ assignment

    def assign(self, partitions: str | Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume a whole topic (a name) or the given partitions; positions start unset."""
        if self._group is not None:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                "this consumer is subscribed to a group; assign() and subscribe() do not mix",
            )
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
        self._positions.assign(wanted)

    def assignment(self) -> list[TopicPartition]:
        return self._positions.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Next poll reads ``partition`` from ``offset`` (checked by the broker)."""
        self._positions.seek(partition, offset)
        self._cancel(partition)

    def _seek_spec(
        self,
        partitions: Iterable[TopicPartition] | None,
        spec: pb.OffsetSpec.ValueType,
        timestamp_ms: int = 0,
    ) -> None:
        keys = [(tp.topic, tp.partition) for tp in self._positions.check_assigned(partitions)]
        stamps = offsets.one_timestamp(keys, spec, timestamp_ms)
        found = offsets.list_offsets(
            self.cluster, keys, spec, stamps, retry_s=self.cluster.request_timeout_s
        )
        for (topic, partition), offset in found.items():
            self.seek(TopicPartition(topic, partition), offset)

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
        if self._positions.offset(partition) is None:
            self._reset(partition)
        position = self._positions.offset(partition)
        assert position is not None
        return position

    def _reset(self, partition: TopicPartition, cause: HeadwaterError | None = None) -> None:
        to = self._positions.reset_to(partition, cause)
        spec = pb.OFFSET_SPEC_EARLIEST if to == "earliest" else pb.OFFSET_SPEC_LATEST
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
            max_response_bytes=self.cluster.message_bytes_max,
        )
        call = self.cluster.broker(address).FetchStream(request)
        generation = self._positions.generation(partition)
        self._subscriptions[partition] = _Subscription(
            partition, generation, call, self._arrivals, address
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
        position = self._positions.accept(partition, generation)
        if position is None:
            return []
        if not records:  # past a gap compaction left, or nothing new
            self._positions.advance(partition, response.next_offset)
            return []
        fetched, resume = fetched_from(partition, records, position, self.check_crcs)
        if resume is None:
            self._positions.advance(partition, response.next_offset)
        else:  # the rest of the answer is fetched again, by a new stream from ``resume``
            self.seek(partition, resume)
        return fetched

    def poll(self, timeout_ms: float = 1000) -> PollResult:
        """Return whatever arrives within ``timeout_ms`` (possibly nothing). In a group,
        this is also where partitions are revoked and assigned (and, under auto-commit,
        where the positions handed out by the last poll are committed)."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        if self._group is not None:
            self._group_step()
            while not self._positions and time.monotonic() < deadline:
                time.sleep(min(GROUP_POLL_STEP_S, max(deadline - time.monotonic(), 0)))
                self._group_step()
        elif not self._positions:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "no partitions assigned; call assign() first"
            )
        batches: list[FetchedBatch] = []
        while not batches and self._positions:
            for tp in self._positions:
                if tp not in self._subscriptions:
                    self._subscribe(tp)
            remaining = deadline - time.monotonic()
            if self._group is not None:
                remaining = min(remaining, GROUP_POLL_STEP_S)  # react to revocations soon
            try:
                arrival = (
                    self._arrivals.get(timeout=max(remaining, 0))
                    if remaining > 0
                    else (self._arrivals.get_nowait())
                )
            except queue.Empty:
                if self._group is not None and time.monotonic() < deadline:
                    self._group_step()
                    continue
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

    # ------------------------------------------------------------------ groups

    def subscribe(
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
        """Join consumer group ``group_id`` (default: the consumer's), reading its share
        of ``topics`` (names) and/or of the topics matching ``pattern`` (a regular
        expression, RE2 syntax): the coordinator assigns partitions to the members, and
        moves them as members come and go (docs/groups.md). A partition starts from the
        group's committed offset, else per ``auto_offset_reset``.

        At-least-once by default: with ``enable_auto_commit``, the positions of what
        ``poll`` handed out are committed at a later poll (every
        ``auto_commit_interval_ms``), before a partition is given up, and on ``close``;
        a crash re-delivers what was handed out after the last commit. With it off,
        call ``commit()`` after processing (or before, for at-most-once).
        ``session_timeout_ms`` 0 takes the cluster's (45 s by default);
        ``max_poll_interval_ms``: without a poll for this long the member leaves the
        group (its partitions go to others) and joins again at its next poll."""
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
        calls = GroupCalls(self.cluster, subscription.group_id)
        membership = Membership(subscription)
        self._group = _Group(
            calls,
            membership,
            HeartbeatThread(calls, membership, max_poll_interval_ms / 1000),
            listener,
            enable_auto_commit,
            auto_commit_interval_ms / 1000,
        )

    def _group_step(self) -> None:
        """Act on what the coordinator said since the last poll (see Membership)."""
        group = self._group
        assert group is not None
        group.heartbeats.polled()
        if group.heartbeats.error is not None:
            error, group.heartbeats.error = group.heartbeats.error, None
            raise error
        if group.auto_commit and time.monotonic() >= group.next_auto_commit_s:
            group.next_auto_commit_s = time.monotonic() + group.auto_commit_interval_s
            self._commit_quietly(None)
        with group.heartbeats.lock:
            lost = group.membership.lost()
        if lost:
            with group.heartbeats.lock:
                gone = sorted(group.membership.owned)
            self._drop(gone)
            if group.listener is not None:
                group.listener.on_lost(gone)
            with group.heartbeats.lock:
                group.membership.forget_owned(time.monotonic())
                group.last_committed.clear()
            group.heartbeats.wake()
        with group.heartbeats.lock:
            revoke = group.membership.to_revoke()
        if revoke:
            if group.listener is not None:
                group.listener.on_revoked(revoke)
            if group.auto_commit:
                self._commit_quietly(revoke)
            self._drop(revoke)
            with group.heartbeats.lock:
                group.membership.released(revoke, time.monotonic())
            group.heartbeats.wake()
        with group.heartbeats.lock:
            assign = group.membership.to_assign()
            # Owned from now on, before any call: the heartbeats report them, so the
            # coordinator cannot give them to another member until this one releases
            # them (a revocation during the offset lookup is acted on at the next step).
            group.membership.taken(assign)
        if assign:
            try:
                committed = group.calls.committed(assign)
            except HeadwaterError:
                with group.heartbeats.lock:
                    group.membership.released(assign, time.monotonic())
                raise
            self._positions.add(assign)
            for tp in assign:
                if tp in committed:
                    self._positions.seek(tp, committed[tp].offset)
            if group.listener is not None:
                group.listener.on_assigned(assign)

    def _drop(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._cancel(tp)
        self._positions.remove(partitions)

    def _commit_quietly(self, partitions: list[TopicPartition] | None) -> None:
        try:
            self._submit_commit(self._uncommitted(partitions)).result()
        except HeadwaterError as error:
            _log.warning("auto-commit of group offsets failed: %s", error)

    def _uncommitted(
        self, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, int]:
        """Positions (of ``partitions``, or all) that differ from what was last committed."""
        group = self._require_group()
        return uncommitted(self._positions.known(), group.last_committed, partitions)

    def _submit_commit(
        self,
        offsets: dict[TopicPartition, int],
        callback: Callable[[HeadwaterError | None], None] | None = None,
    ) -> concurrent.futures.Future[None]:
        """Every commit, from any method, goes through the group's one commit thread, so
        they reach the coordinator in the order they were asked for: a partition's
        committed offset never goes back to an older request's."""
        group = self._require_group()
        snapshot = dict(offsets)

        def run() -> None:
            error: HeadwaterError | None = None
            try:
                with group.heartbeats.lock:
                    member_id = group.membership.member_id
                    member_epoch = group.membership.member_epoch
                group.calls.commit(snapshot, member_id, member_epoch)
                group.last_committed.update(snapshot)
            except HeadwaterError as exc:
                error = exc
            if callback is not None:
                callback(error)
            if error is not None:
                raise error

        return group.committer.submit(run)

    def _require_group(self) -> _Group:
        if self._group is None:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "this consumer is not in a group; call subscribe()"
            )
        return self._group

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (the next offset to read per partition), or the positions of
        everything ``poll`` handed out; waits until stored (replicated). Raises
        CommitFailedError naming partitions that were not stored (one this member no longer
        owns: PARTITION_NOT_ASSIGNED or STALE_MEMBER_EPOCH). Commits are applied in the
        order they are asked for, ``commit_async`` ones included."""
        self._submit_commit(self._uncommitted(None) if offsets is None else offsets).result()

    def commit_async(
        self,
        offsets: dict[TopicPartition, int] | None = None,
        callback: Callable[[HeadwaterError | None], None] | None = None,
    ) -> concurrent.futures.Future[None]:
        """``commit`` in the background: the positions are taken now; the future (and
        ``callback``, with the error or None) completes when the commit does."""
        return self._submit_commit(
            self._uncommitted(None) if offsets is None else offsets, callback
        )

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where it has none)."""
        group = self._require_group()
        wanted = list(partitions)
        found = group.calls.committed(wanted)
        return {tp: (found[tp].offset if tp in found else None) for tp in wanted}

    def close(self) -> None:
        """In a group: commit (under auto-commit) and leave, so that the partitions move
        to other members at once."""
        group = self._group
        if group is not None:
            self._group = None
            if group.auto_commit:
                self._group = group
                self._commit_quietly(None)
                self._group = None
            group.committer.shutdown(wait=True)
            group.heartbeats.stop(leave=True)
        self._cancel_all()
        self.cluster.close()


@dataclass(slots=True)
class _Group:
    calls: GroupCalls
    membership: Membership
    heartbeats: HeartbeatThread
    listener: RebalanceListener | None
    auto_commit: bool
    auto_commit_interval_s: float
    next_auto_commit_s: float = 0.0
    last_committed: dict[TopicPartition, int] = field(default_factory=dict)
    committer: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "commit")
    )
