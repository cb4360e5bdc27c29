"""The producer's record accumulator (sans-I/O), shared by the threaded Producer and the
asyncio AsyncProducer. The engines feed it records and answers and ask it what to send
now; it does no I/O and starts no thread. ``now_s`` (monotonic seconds) and
``now_unix_ms`` (the wall clock) are passed in; ``append``, the per-record path, reads the
injected monotonic ``clock`` only when it opens a batch. So it runs on a virtual clock in
tests.

Per partition (a *slot*, ``(topic, partition)``):

- an **open batch** collects records. It closes when the next record would take it past
  ``batch_bytes`` (a record larger than that goes alone), when it reaches ``batch_bytes``,
  on ``flush``, or once ``linger_s`` has passed since its first record and the partition
  has nothing queued or in flight. While a request of the partition is in flight, the open
  batch keeps filling (as Kafka's accumulator does): closing it on linger alone would
  queue one tiny batch per record behind the wire.
- closed batches wait in a **queue** and are sent in order: without idempotence one at a
  time (one batch per partition in flight, so a partition's records are appended in the
  order they were sent, retries included); with idempotence up to ``max_in_flight``
  (the leader appends a partition's batches only in sequence order, so order holds
  without waiting for each answer). A batch sent again (a retry) goes alone: nothing
  else of its partition is in flight with it; batches come back to the queue in the
  order they were first queued; and no batch of a new epoch leaves while batches of the
  old one are in flight (they would be answered after it, out of order).
- after a batch fails for good with an **unknown outcome** (no answer: it may still be
  appended somewhere), nothing more of the partition is sent before that attempt's append
  deadline has passed plus the clock margin (``RetryPolicy``), so the lost request can
  never land after a later batch.

**Idempotence** (``idempotent``): every batch carries the producer id (``producer_id``,
from InitProducerId; nothing is sent before the engine sets it), a producer epoch and the
sequence number of its first record, per partition. A batch gets its epoch and sequence
when it is first handed out and keeps them through its retries, so the leader appends a
retried batch once and answers a copy of one it has with the original offsets. A
partition starts a new epoch at sequence 0 (``SlotSequence``) when a batch of it failed
for good (a hole may follow it) and when the leader answers OUT_OF_ORDER_SEQUENCE_NUMBER
or UNKNOWN_PRODUCER_ID (its state was lost or expired): the batch is then stamped again
at the new epoch and resent at once. Both answers mean nothing of the batch was appended
(a batch appended before would be answered as a duplicate), so stamping it again never
writes it twice. With several batches in flight, a batch answered OUT_OF_ORDER while an
earlier batch of its partition is still pending waits for that one instead (the gap is
the earlier batch); a batch refused with INVALID_PRODUCER_EPOCH because its partition
moved to a newer epoch while it was in flight is stamped again at that epoch.

Every batch has a **delivery deadline**, ``delivery_timeout_s`` after it opened: a batch
still queued (never sent) at its deadline expires; no retry starts after it
(``RetryPolicy.retry_after_s``). ``buffered_bytes`` counts the records of every batch from
``append`` until the batch is settled; the engines block ``send`` while ``fits`` is false.

A batch's life: ``append``/``add_batch`` → ``drain`` hands it out (in flight, its attempt
stamped with an append deadline) → an answer: ``settle`` after success, or ``retry_after``
(queued again at the front, or None: final) and then ``settle`` once its completion has
been told. Expired batches come out of ``drain`` and are settled the same way.

``C`` is the engine's completion handle for a batch (the threaded engine's BatchResult,
the asyncio engine's futures); the accumulator only carries it.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Generic, TypeVar

from headwater.client.partitioner import partition_for_key
from headwater.client.retry import OUTCOME_UNKNOWN, RetryPolicy
from headwater.log.batch import PRODUCER_EPOCH_MAX, HeaderPairs, stamp_producer
from headwater.shared.errors import ErrorCode, HeadwaterError

if TYPE_CHECKING:
    import random  # the caller passes a seeded random.Random

C = TypeVar("C")
Slot = tuple[str, int]
"""(topic, partition)"""

RECORD_OVERHEAD_BYTES: Final = 12
"""What a record costs in the buffer besides its key and value bytes."""
NEVER: Final = float("inf")
SEQUENCE_SPACE: Final = 1 << 31
RESTAMPED: Final = frozenset(
    {ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID}
)
"""Answers after which a batch is stamped at a new epoch of its partition and resent."""


RECORD_BYTES_MAX: Final = (256 - 1) << 20
"""The largest record a producer takes: no node takes a batch past its max_message_bytes,
which is at most request_bytes_max (256 MiB by default) less 1 MiB. Larger records are
refused by ``send`` itself, before anything is copied or encoded (a 300 MB record used to
cost seconds and gigabytes before the channel refused the request)."""


def check_record_size(size: int) -> None:
    """MESSAGE_TOO_LARGE for a record of ``size`` bytes (``record_size``) that no node
    could take."""
    if size > RECORD_BYTES_MAX:
        raise HeadwaterError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"a record of {size} bytes; at most {RECORD_BYTES_MAX} (a node's largest "
            "max_message_bytes with request_bytes_max at its default of 256 MiB)",
        )


def record_size(value: bytes | None, key: bytes | None) -> int:
    """Bytes of the buffer one record holds."""
    size = RECORD_OVERHEAD_BYTES + (len(value) if value is not None else 0)
    return size + len(key) if key is not None else size


@dataclass(frozen=True, slots=True)
class AccumulatorSettings:
    batch_bytes: int
    linger_s: float
    delivery_timeout_s: float
    append_timeout_ms: int
    retry: RetryPolicy


@dataclass(slots=True)
class ProducerBatch(Generic[C]):
    """A closed batch, from its first attempt until it is settled. ``timestamps`` is one
    stamp for all records or one per record; ``payload`` is the encoded batch once the
    engine has encoded it (the record lists may then be dropped)."""

    slot: Slot
    completion: C
    values: Sequence[bytes | None]
    keys: Sequence[bytes | None] | None
    headers: Sequence[HeaderPairs | None] | None
    timestamps: int | Sequence[int]
    record_count: int
    size: int
    delivery_deadline_s: float
    payload: bytes | None = None
    attempts: int = 0  # attempts already failed and retried
    not_before_s: float = 0.0  # a retry waits until then
    sent_s: float = 0.0  # monotonic time of the latest attempt
    # ProduceRequest.deadline_unix_ms of the latest attempt: no node appends it later.
    append_deadline_unix_ms: int = 0
    # Idempotence: the epoch and first sequence it is sent with (-1: not yet, or none).
    producer_epoch: int = -1
    base_sequence: int = -1
    restamps: int = 0  # times it was stamped again at a new epoch
    order: int = 0  # queueing order: a partition's batches go out, and come back, in it

    def stamped_payload(self, producer_id: int) -> bytes:
        """The encoded batch with this attempt's producer fields (stamped again, CRC
        included, only when they differ from the payload's)."""
        payload = self.payload
        assert payload is not None
        if self.base_sequence < 0:
            return payload
        if _PRODUCER_FIELDS.unpack_from(payload, 56) == (
            producer_id,
            self.base_sequence,
            self.producer_epoch,
        ):
            return payload
        self.payload = stamp_producer(payload, producer_id, self.producer_epoch, self.base_sequence)
        return self.payload


_PRODUCER_FIELDS: Final = struct.Struct("<qih")


@dataclass(slots=True)
class SlotSequence:
    """A partition's idempotence state in the producer: the epoch its batches are sent
    at and the sequence of the next batch's first record; ``restart``: the next batch
    starts a new epoch at sequence 0."""

    epoch: int = 0
    next_sequence: int = 0
    restart: bool = False


class OpenBatch(Generic[C]):
    """Records accumulating for one partition. ``keys`` and ``headers`` stay None until
    the first record that has one (then they are back-filled with None), which saves two
    list appends per record on the common keyless path.

    **Direct appends** (the threaded producer's per-record path): a record of ``size``
    buffer bytes with no key and no headers, stamped within an int32 delta of
    ``first_timestamp``, may be added by ``add_direct``, skipping ``append``, exactly when
    ``size < direct_room``; the batch then comes out as ``append`` would have made it.
    The accumulator keeps ``direct_room`` at ``batch_bytes - size`` while the batch is
    open and holds no key and no header, and at 0 otherwise (a record is never 0 bytes),
    so a direct append never takes a batch to ``batch_bytes`` (where ``append`` closes
    it), never adds to a closed batch, and never leaves a keyed batch's key list short.
    The caller checks its own limits (the buffer) and adds ``size`` to the accumulator's
    ``buffered_bytes``, under the lock that guards the accumulator."""

    __slots__ = (
        "completion",
        "created_s",
        "direct_room",
        "first_timestamp",
        "headers",
        "keys",
        "size",
        "timestamps",
        "values",
    )

    def __init__(self, completion: C, created_s: float, first_timestamp: int) -> None:
        self.completion = completion
        self.values: list[bytes | None] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[HeaderPairs | None] | None = None
        self.timestamps: list[int] = []
        self.first_timestamp = first_timestamp
        self.size = 0
        self.direct_room = 0
        self.created_s = created_s

    def add_direct(self, value: bytes | None, timestamp_ms: int, size: int) -> int:
        """Add a record the direct-append rule admits (see the class); return its index.
        ``Producer.send`` has this inlined."""
        values = self.values
        index = len(values)
        values.append(value)
        self.timestamps.append(timestamp_ms)
        self.direct_room -= size
        self.size += size
        return index


@dataclass(slots=True)
class Drained(Generic[C]):
    """What ``drain`` hands out: batches to send now (each now in flight), batches that
    expired unsent (to fail with ``error``, then settle), and when to drain next at the
    latest (``NEVER`` when nothing waits on time)."""

    sendable: list[ProducerBatch[C]] = field(default_factory=list)
    expired: list[ProducerBatch[C]] = field(default_factory=list)
    wake_at_s: float = NEVER


class RecordAccumulator(Generic[C]):
    """Open batches, queues and in-flight batches per partition (see the module). Not
    thread-safe: the threaded engine calls it under its lock."""

    def __init__(
        self,
        settings: AccumulatorSettings,
        rng: random.Random,
        new_completion: Callable[[Slot], C],
        clock: Callable[[], float],
        on_batch_closed: Callable[[Slot], None] = lambda _slot: None,
        idempotent: bool = False,
        max_in_flight: int = 1,
    ) -> None:
        self.settings = settings
        self.idempotent = idempotent
        self.max_in_flight = max_in_flight if idempotent else 1
        """Batches of one partition in flight at once (1 without idempotence)."""
        self._order = 0
        self.producer_id = -1
        """Set by the engine from InitProducerId; nothing is sent before (idempotent)."""
        self._sequences: dict[Slot, SlotSequence] = {}
        self._clock = clock
        self._batch_bytes = settings.batch_bytes
        self.buffered_bytes = 0
        self._rng = rng
        self._new_completion = new_completion
        self._on_batch_closed = on_batch_closed
        self._open: dict[Slot, OpenBatch[C]] = {}
        self._queued: dict[Slot, deque[ProducerBatch[C]]] = {}
        self._in_flight: dict[Slot, list[ProducerBatch[C]]] = {}  # in send order
        self._barrier_s: dict[Slot, float] = {}  # nothing of the slot is sent before it

    # ------------------------------------------------------------------ records in

    def fits(self, size: int, buffer_bytes_max: int) -> bool:
        """Whether ``size`` more bytes fit the buffer (anything fits an empty buffer)."""
        return self.buffered_bytes + size <= buffer_bytes_max or self.buffered_bytes == 0

    def append(
        self,
        slot: Slot,
        value: bytes | None,
        key: bytes | None,
        headers: HeaderPairs | None,
        timestamp_ms: int,
        size: int,
    ) -> tuple[C, int, bool]:
        """Add one record of ``size`` buffer bytes to the slot's open batch. Returns the
        batch's completion, the record's index in it, and whether a batch was opened or
        closed (an engine that sleeps until the next deadline must wake). The clock is
        read only when a batch opens: this is the per-record path.

        The open batch closes first when the record would take it past ``batch_bytes``
        or lies further than an int32 delta from its first timestamp (the format's
        limit); it closes after when it reaches ``batch_bytes``. An engine may add the
        records ``OpenBatch`` admits by ``OpenBatch.add_direct`` instead: the same
        batches come out."""
        open_batch = self._open.get(slot)
        changed = False
        if open_batch is not None and (
            open_batch.size + size > self._batch_bytes
            # The format's TIMESTAMP_DELTA_MIN and _MAX, here as literals: cheaper than
            # globals on this per-record path.
            or not -2147483648 <= timestamp_ms - open_batch.first_timestamp <= 2147483647
        ):
            self._close(slot, open_batch)
            open_batch = None
        if open_batch is None:
            open_batch = OpenBatch(self._new_completion(slot), self._clock(), timestamp_ms)
            self._open[slot] = open_batch
            changed = True
        values = open_batch.values
        index = len(values)
        values.append(value)
        open_batch.timestamps.append(timestamp_ms)
        if key is not None or open_batch.keys is not None:
            if open_batch.keys is None:
                open_batch.keys = [None] * index
            open_batch.keys.append(key)
        if headers or open_batch.headers is not None:
            if open_batch.headers is None:
                open_batch.headers = [None] * index
            open_batch.headers.append(headers)
        open_batch.size += size
        self.buffered_bytes += size
        if open_batch.size >= self._batch_bytes:
            self._close(slot, open_batch)
            changed = True
        elif open_batch.keys is None and open_batch.headers is None:
            open_batch.direct_room = self._batch_bytes - open_batch.size
        else:
            open_batch.direct_room = 0
        return open_batch.completion, index, changed

    def open_batch(self, slot: Slot) -> OpenBatch[C] | None:
        """The slot's open batch, for an engine's direct appends (``OpenBatch``)."""
        return self._open.get(slot)

    def stop_direct_appends(self) -> None:
        """No batch open now admits a direct append any more: every record goes through
        the engine's own checks (such as whether it is closing) and ``append``. A batch
        ``append`` opens or adds to later admits them again: the engine calls this when
        it stops appending altogether."""
        for open_batch in self._open.values():
            open_batch.direct_room = 0

    def add_batch(
        self,
        slot: Slot,
        completion: C,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        headers: Sequence[HeaderPairs | None] | None,
        timestamps: int | Sequence[int],
        record_count: int,
        size: int,
        now_s: float,
        payload: bytes | None = None,
    ) -> ProducerBatch[C]:
        """Queue a batch made whole by the caller (``send_batch``, or ``payload`` already
        encoded) behind what is queued for the slot; the open batch closes first, so the
        partition's records keep their send order."""
        assert size > 0, "a batch holds buffer bytes until it is settled"
        open_batch = self._open.get(slot)
        if open_batch is not None:
            self._close(slot, open_batch)
        batch = ProducerBatch(
            slot=slot,
            completion=completion,
            values=values,
            keys=keys,
            headers=headers,
            timestamps=timestamps,
            record_count=record_count,
            size=size,
            delivery_deadline_s=now_s + self.settings.delivery_timeout_s,
            payload=payload,
            order=self._next_order(),
        )
        self.buffered_bytes += size
        self._queued.setdefault(slot, deque()).append(batch)
        return batch

    def _close(self, slot: Slot, open_batch: OpenBatch[C]) -> None:
        del self._open[slot]
        open_batch.direct_room = 0
        batch = ProducerBatch(
            slot=slot,
            completion=open_batch.completion,
            values=open_batch.values,
            keys=open_batch.keys,
            headers=open_batch.headers,
            timestamps=open_batch.timestamps,
            record_count=len(open_batch.values),
            size=open_batch.size,
            delivery_deadline_s=open_batch.created_s + self.settings.delivery_timeout_s,
            order=self._next_order(),
        )
        self._queued.setdefault(slot, deque()).append(batch)
        self._on_batch_closed(slot)

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    # ------------------------------------------------------------------ batches out

    def _room(self, slot: Slot, head: ProducerBatch[C]) -> bool:
        """May ``head``, the front of the slot's queue, be sent now beside what is in
        flight? A retry goes alone, and so does everything while one is in flight."""
        flying = self._in_flight.get(slot)
        if not flying:
            return True
        if head.attempts or any(b.attempts for b in flying):
            return False
        if self._epoch_of(head) != flying[-1].producer_epoch:
            return False  # a new epoch starts once the old one's batches are answered
        return len(flying) < self.max_in_flight

    def _epoch_of(self, batch: ProducerBatch[C]) -> int:
        """The epoch ``batch`` is (or will be, once stamped) sent at."""
        if batch.base_sequence >= 0 or not self.idempotent:
            return batch.producer_epoch
        sequence = self._sequences.get(batch.slot)
        if sequence is None:
            return 0
        return sequence.epoch + 1 if sequence.restart else sequence.epoch

    def drain(self, now_s: float, now_unix_ms: int, flushing: bool) -> Drained[C]:
        """Close the open batches that are due, expire queued batches past their delivery
        deadline, and hand out the next batches of every partition (as many as
        ``_room`` allows)."""
        drained: Drained[C] = Drained()
        wake_at_s = NEVER
        linger_s = self.settings.linger_s
        for slot, open_batch in list(self._open.items()):
            if slot in self._in_flight or slot in self._queued:
                # It keeps filling behind the wire (see the module) until its delivery
                # deadline, when it is closed to expire below.
                expires_s = open_batch.created_s + self.settings.delivery_timeout_s
                if expires_s <= now_s:
                    self._close(slot, open_batch)
                elif expires_s < wake_at_s:
                    wake_at_s = expires_s
                continue
            due_s = open_batch.created_s + linger_s
            if flushing or due_s <= now_s:
                self._close(slot, open_batch)
            elif due_s < wake_at_s:
                wake_at_s = due_s
        for slot, queue in list(self._queued.items()):
            # Deadlines grow along a queue (a retried batch, at the front, never expires
            # here), so the whole queue is searched only when its front has one passed.
            front = queue[0] if queue[0].attempts == 0 or len(queue) == 1 else queue[1]
            expired = (
                [b for b in queue if b.attempts == 0 and b.delivery_deadline_s <= now_s]
                if front.delivery_deadline_s <= now_s
                else None
            )
            if expired:
                for batch in expired:
                    queue.remove(batch)
                drained.expired += expired
                if not queue:
                    del self._queued[slot]
                    continue
            if not self._room(slot, queue[0]):
                wake_at_s = min(wake_at_s, queue[0].delivery_deadline_s)
                continue
            barrier_s = self._barrier_s.get(slot)
            if barrier_s is not None:
                if barrier_s > now_s:
                    wake_at_s = min(wake_at_s, barrier_s)
                    continue
                del self._barrier_s[slot]
            while queue and self._room(slot, queue[0]):
                head = queue[0]
                if head.not_before_s > now_s:
                    wake_at_s = min(wake_at_s, head.not_before_s)
                    break
                if self.idempotent and (
                    self.producer_id < 0 or (head.base_sequence < 0 and not self._stamp(head))
                ):
                    # The engine is asking for a producer id (or the partition has no
                    # epoch left): the batch waits, and expires at its deadline.
                    wake_at_s = min(wake_at_s, head.delivery_deadline_s)
                    break
                queue.popleft()
                head.sent_s = now_s
                head.append_deadline_unix_ms = now_unix_ms + self.settings.append_timeout_ms
                self._in_flight.setdefault(slot, []).append(head)
                drained.sendable.append(head)
            if not queue:
                del self._queued[slot]
        drained.wake_at_s = wake_at_s
        return drained

    def _stamp(self, batch: ProducerBatch[C]) -> bool:
        """Give ``batch`` its epoch and first sequence (its partition's next); False when
        the partition has used up its epochs (the batch is left to expire)."""
        sequence = self._sequences.setdefault(batch.slot, SlotSequence())
        if sequence.restart:
            if sequence.epoch >= PRODUCER_EPOCH_MAX:
                return False
            sequence.epoch += 1
            sequence.next_sequence = 0
            sequence.restart = False
        batch.producer_epoch = sequence.epoch
        batch.base_sequence = sequence.next_sequence
        sequence.next_sequence = (sequence.next_sequence + batch.record_count) % SEQUENCE_SPACE
        return True

    def _restamp(self, batch: ProducerBatch[C]) -> bool:
        """Stamp ``batch`` again (nothing of it was appended): at the partition's current
        epoch when the partition moved to a newer epoch since the batch was stamped, else
        at a new epoch, sequence 0. False when no epoch is left or it was restamped too
        often."""
        if batch.restamps >= self.settings.retry.retries:
            return False
        sequence = self._sequences.setdefault(batch.slot, SlotSequence())
        if batch.producer_epoch >= sequence.epoch:
            sequence.restart = True
        if not self._stamp(batch):
            return False
        batch.restamps += 1
        return True

    def _earlier_pending(self, batch: ProducerBatch[C]) -> bool:
        """Is a batch of the same partition queued before ``batch`` still unsettled (in
        flight, or queued again after a failed attempt)?"""
        slot = batch.slot
        if any(b.order < batch.order for b in self._in_flight.get(slot, ())):
            return True
        return any(b.order < batch.order for b in self._queued.get(slot, ()))

    def _requeue(self, batch: ProducerBatch[C], not_before_s: float) -> None:
        """Take ``batch`` out of flight and queue it again at its place (queueing order)."""
        flying = self._in_flight.get(batch.slot)
        if flying is not None and batch in flying:
            flying.remove(batch)
            if not flying:
                del self._in_flight[batch.slot]
        batch.not_before_s = not_before_s
        queue = self._queued.setdefault(batch.slot, deque())
        place = next((i for i, b in enumerate(queue) if b.order > batch.order), len(queue))
        queue.insert(place, batch)

    def retry_after(
        self,
        batch: ProducerBatch[C],
        error: HeadwaterError,
        answered: bool,
        now_s: float,
        now_unix_ms: int,
    ) -> float | None:
        """An attempt of ``batch`` (in flight) failed with ``error`` (``answered``: the node
        said so; False: no answer, the outcome is unknown). Returns the seconds until its
        retry, having queued it again at the front of its partition; or None when the
        failure is final (the batch stays in flight until ``settle``)."""
        if self.idempotent and now_s < batch.delivery_deadline_s:
            sequence = self._sequences.get(batch.slot)
            moved_on = sequence is not None and batch.producer_epoch < sequence.epoch
            refused = error.code in RESTAMPED or (
                error.code is ErrorCode.INVALID_PRODUCER_EPOCH and moved_on
            )
            if refused and self._earlier_pending(batch):
                # The gap is an earlier batch still on its way: wait for it.
                batch.attempts += 1
                self._requeue(batch, now_s)
                return 0.0
            if refused and self._restamp(batch):
                # Nothing was appended (see the module docstring): resend at once.
                batch.attempts += 1
                self._requeue(batch, now_s)
                return 0.0
        wait_s = self.settings.retry.retry_after_s(
            error,
            answered,
            batch.attempts,
            now_s,
            batch.delivery_deadline_s,
            batch.append_deadline_unix_ms - now_unix_ms,
            self._rng,
        )
        if wait_s is None:
            return None
        batch.attempts += 1
        self._requeue(batch, now_s + wait_s)
        return wait_s

    def settle(
        self,
        batch: ProducerBatch[C],
        now_s: float,
        now_unix_ms: int,
        error: HeadwaterError | None = None,
        answered: bool = True,
    ) -> None:
        """``batch`` is done (acknowledged, or failed for good with ``error`` after its
        completion was told): free its buffer bytes and let its partition send the next
        batch, after the unknown-outcome barrier when the failure leaves the outcome
        unknown."""
        slot = batch.slot
        flying = self._in_flight.get(slot)
        if flying is not None and batch in flying:
            flying.remove(batch)
            if not flying:
                del self._in_flight[slot]
        self.buffered_bytes -= batch.size
        if error is not None and self.idempotent and batch.base_sequence >= 0:
            # The failed batch may or may not be in the log: the next one cannot follow
            # its sequence, so the partition starts a new epoch.
            self._sequences.setdefault(slot, SlotSequence()).restart = True
        unknown = error is not None and (not answered or error.code in OUTCOME_UNKNOWN)
        if unknown and batch.append_deadline_unix_ms:
            retry = self.settings.retry
            left_ms = batch.append_deadline_unix_ms - now_unix_ms + retry.clock_margin_ms
            if left_ms > 0:
                self._barrier_s[slot] = max(self._barrier_s.get(slot, 0.0), now_s + left_ms / 1000)

    # ------------------------------------------------------------------ state

    def idle(self) -> bool:
        """No batch is open, queued or in flight."""
        return self.buffered_bytes == 0 and not self._in_flight

    def completions(self) -> Iterator[C]:
        """The completion of every batch not yet settled (open, queued or in flight)."""
        for open_batch in self._open.values():
            yield open_batch.completion
        for queue in self._queued.values():
            for batch in queue:
                yield batch.completion
        for flying in self._in_flight.values():
            for batch in flying:
                yield batch.completion


def group_by_partition(
    keys: Sequence[bytes | None], partitions: int, sticky_partition: int
) -> dict[int, list[int]]:
    """Indexes of ``keys`` by partition: keyed records by murmur2, keyless ones to
    ``sticky_partition``."""
    groups: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        target = partition_for_key(key, partitions) if key is not None else sticky_partition
        groups.setdefault(target, []).append(i)
    return groups


def cut_batches(values: Sequence[bytes | None], batch_bytes: int) -> list[tuple[int, int, int]]:
    """``(start, end, buffer bytes)`` of each batch of about ``batch_bytes`` that
    ``values`` (at least one) are cut into, in order."""
    total = sum(len(v) for v in values if v is not None) + RECORD_OVERHEAD_BYTES * len(values)
    pieces = max(1, -(-total // batch_bytes))
    step = -(-len(values) // pieces)
    cuts = []
    for start in range(0, len(values), step):
        end = min(start + step, len(values))
        cuts.append((start, end, total * (end - start) // len(values)))
    return cuts


def delivery_timed_out(delivery_timeout_s: float) -> HeadwaterError:
    """The error of a batch that expired unsent at its delivery deadline."""
    return HeadwaterError(
        ErrorCode.REQUEST_TIMED_OUT,
        f"delivery_timeout_ms={int(delivery_timeout_s * 1000)} passed before the batch "
        "could be sent",
    )
