"""Idempotent producers' state of one partition (pure): which sequence each producer
may append next, and the offsets of its last batches, so that a retried batch is
answered with its original offsets instead of being written twice.

A producer is a (producer id, producer epoch); each of its batches carries the sequence
number of its first record (``base_sequence``, in the batch header) and holds
``record_count`` consecutive sequences. Per partition the leader keeps, per producer id,
the epoch it knows and the last ``DUPLICATE_WINDOW`` batches it appended (first and last
sequence and offset). ``check`` decides a batch against that state:

- ``Append``: the batch's first sequence is the next expected one (0 for a producer id
  new to the partition, or for a new epoch): append it, then ``record`` it;
- ``Duplicate``: the batch is one of the last ``DUPLICATE_WINDOW`` appended (same first
  and last sequence): answer with its original offsets, write nothing;
- ``Refused`` with a ``reason``: ``stale_epoch`` (an epoch older than the one the
  partition knows: the producer was fenced), ``out_of_order`` (a gap: the first
  sequence is past the next expected one, or a new epoch that does not start at 0),
  ``old_duplicate`` (a sequence already appended, older than the window: its offsets are
  no longer known), ``unknown_producer`` (a first sequence other than 0 from a producer
  id the partition has never seen, or has expired).

Sequences are int32 and wrap from 2^31 - 1 to 0. Followers build the same state from the
batches they copy (``record``), snapshots carry it across restarts (``encode_snapshot``,
``decode_snapshot``), and ``expire`` drops producers silent for
``producer_id_expiration_ms``.

Invariant (tests/test_producer_state.py, against an oracle): for any history, a batch
is appended only if every earlier sequence of its producer and epoch was appended before
it, and never twice.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from headwater.log.batch import BatchHeader
from headwater.shared.errors import ErrorCode, HeadwaterError

DUPLICATE_WINDOW: Final = 5
SEQUENCE_MAX: Final = (1 << 31) - 1
NO_PRODUCER: Final = -1
SNAPSHOT_VERSION: Final = 1
PRODUCERS_MAX: Final = 20_000
"""Most producers one partition tracks (see ``record_header``)."""
SNAPSHOT_PRODUCERS_MAX: Final = 1_000_000


class SnapshotError(ValueError):
    """Bytes that are not a producer-state snapshot this version can read."""


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """An appended batch: its sequences [first_sequence, last_sequence] and offsets."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    epoch: int
    batches: tuple[BatchSpan, ...]
    """The last DUPLICATE_WINDOW batches, oldest first."""
    last_timestamp_ms: int

    @property
    def next_sequence(self) -> int:
        return next_sequence(self.batches[-1].last_sequence) if self.batches else 0


ProducerStates = Mapping[int, ProducerEntry]
"""producer id -> its entry"""
EMPTY: Final[ProducerStates] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Append:
    pass


@dataclass(frozen=True, slots=True)
class Duplicate:
    original: BatchSpan


RefusalReason = Literal["stale_epoch", "out_of_order", "old_duplicate", "unknown_producer"]


@dataclass(frozen=True, slots=True)
class Refused:
    reason: RefusalReason
    message: str


Verdict = Append | Duplicate | Refused


def next_sequence(sequence: int) -> int:
    return 0 if sequence == SEQUENCE_MAX else sequence + 1


def last_sequence(first_sequence: int, record_count: int) -> int:
    """The sequence of a batch's last record (wrapping past SEQUENCE_MAX)."""
    return (first_sequence + record_count - 1) % (SEQUENCE_MAX + 1)


def _behind(sequence: int, expected: int) -> bool:
    """Is ``sequence`` before ``expected`` (within half the sequence space, so that
    wrapping is handled)?"""
    distance = (expected - sequence) % (SEQUENCE_MAX + 1)
    return 0 < distance <= (SEQUENCE_MAX + 1) // 2


def check(
    states: ProducerStates,
    producer_id: int,
    epoch: int,
    first_sequence: int,
    record_count: int,
) -> Verdict:
    """Decide a batch of ``record_count`` records starting at ``first_sequence`` (see
    the module docstring). A batch without a producer id is always appended."""
    if producer_id == NO_PRODUCER:
        return Append()
    last = last_sequence(first_sequence, record_count)
    entry = states.get(producer_id)
    if entry is None:
        if first_sequence == 0:
            return Append()
        return Refused(
            "unknown_producer",
            f"producer {producer_id} is not known to this partition (new, or expired after "
            f"silence) and its batch starts at sequence {first_sequence}, not 0",
        )
    if epoch < entry.epoch:
        return Refused(
            "stale_epoch",
            f"producer {producer_id} epoch {epoch} is older than epoch {entry.epoch}: "
            "a newer instance of the producer fenced it",
        )
    if epoch > entry.epoch:
        if first_sequence == 0:
            return Append()
        return Refused(
            "out_of_order",
            f"producer {producer_id} epoch {epoch} is new here; its first batch must start "
            f"at sequence 0, not {first_sequence}",
        )
    for span in entry.batches:
        if span.first_sequence == first_sequence and span.last_sequence == last:
            return Duplicate(span)
    expected = entry.next_sequence
    if first_sequence == expected:
        return Append()
    if _behind(first_sequence, expected):
        return Refused(
            "old_duplicate",
            f"producer {producer_id} sequence {first_sequence} was appended before and is "
            f"older than the last {DUPLICATE_WINDOW} batches; expected {expected}",
        )
    return Refused(
        "out_of_order",
        f"producer {producer_id} sent sequence {first_sequence}; expected {expected} "
        f"(records {expected} to {first_sequence - 1} are missing)",
    )


def record(
    states: ProducerStates,
    producer_id: int,
    epoch: int,
    first_sequence: int,
    record_count: int,
    first_offset: int,
    timestamp_ms: int,
) -> ProducerStates:
    """The state after appending the batch (leader after ``Append``, followers for every
    batch they copy)."""
    entry = updated_entry(
        states, producer_id, epoch, first_sequence, record_count, first_offset, timestamp_ms
    )
    if entry is None:
        return states
    return MappingProxyType({**states, producer_id: entry})


def updated_entry(
    states: ProducerStates,
    producer_id: int,
    epoch: int,
    first_sequence: int,
    record_count: int,
    first_offset: int,
    timestamp_ms: int,
) -> ProducerEntry | None:
    """The producer's entry after appending the batch, or None when the state does not
    change (no producer id, or an older epoch than the one known). A log keeps its state
    in a dict and sets the entry in place: ``record`` copies the whole mapping."""
    if producer_id == NO_PRODUCER:
        return None
    span = BatchSpan(
        first_sequence,
        last_sequence(first_sequence, record_count),
        first_offset,
        first_offset + record_count - 1,
    )
    entry = states.get(producer_id)
    if entry is not None and epoch < entry.epoch:
        return None  # never in log order: an older epoch's batch after a newer one's
    if entry is None or epoch > entry.epoch:
        batches: tuple[BatchSpan, ...] = (span,)
    else:
        batches = (*entry.batches, span)[-DUPLICATE_WINDOW:]
    return ProducerEntry(epoch, batches, timestamp_ms)


def check_header(states: ProducerStates, header: BatchHeader) -> Verdict:
    """``check`` for a batch, by its header."""
    return check(
        states,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.record_count,
    )


def record_header(states: dict[int, ProducerEntry], header: BatchHeader) -> None:
    """Update ``states`` in place for a stamped batch (its base offset assigned), by its
    header; the producer's last timestamp is the batch's ``max_timestamp``, so that every
    replica, and a replay of the log, computes the same state. A partition tracks at most
    PRODUCERS_MAX producers: a new one beyond that replaces the least recently active
    (the oldest last timestamp, then the smallest id), which then counts as expired."""
    entry = updated_entry(
        states,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.record_count,
        header.base_offset,
        header.max_timestamp,
    )
    if entry is not None:
        if header.producer_id not in states and len(states) >= PRODUCERS_MAX:
            oldest = min(states.items(), key=lambda item: (item[1].last_timestamp_ms, item[0]))
            del states[oldest[0]]
        states[header.producer_id] = entry


REFUSAL_CODES: Final[dict[RefusalReason, ErrorCode]] = {
    "stale_epoch": ErrorCode.INVALID_PRODUCER_EPOCH,
    "out_of_order": ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
    "old_duplicate": ErrorCode.DUPLICATE_SEQUENCE_NUMBER,
    "unknown_producer": ErrorCode.UNKNOWN_PRODUCER_ID,
}


def refusal_error(refused: Refused) -> HeadwaterError:
    """The error a leader answers a refused batch with (nothing of it was appended)."""
    return HeadwaterError(REFUSAL_CODES[refused.reason], refused.message + "; nothing was appended")


def expire(states: ProducerStates, now_ms: int, expiration_ms: int) -> ProducerStates:
    """Without the producers silent for ``expiration_ms`` or longer."""
    kept = {p: e for p, e in states.items() if now_ms - e.last_timestamp_ms < expiration_ms}
    return states if len(kept) == len(states) else MappingProxyType(kept)


def encode_snapshot(states: ProducerStates, end_offset: int) -> bytes:
    """The state as of log offset ``end_offset`` (everything below it applied), as JSON."""
    body = {
        "version": SNAPSHOT_VERSION,
        "end_offset": end_offset,
        "producers": [
            [
                producer_id,
                entry.epoch,
                entry.last_timestamp_ms,
                [
                    [s.first_sequence, s.last_sequence, s.first_offset, s.last_offset]
                    for s in entry.batches
                ],
            ]
            for producer_id, entry in sorted(states.items())
        ],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_snapshot(data: bytes) -> tuple[ProducerStates, int]:
    """(states, end offset) of a snapshot; SnapshotError for anything else."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise SnapshotError(f"producer snapshot is not JSON: {type(exc).__name__}") from None
    if not isinstance(body, dict) or body.get("version") != SNAPSHOT_VERSION:
        raise SnapshotError(f"producer snapshot version is not {SNAPSHOT_VERSION}")
    end_offset = body.get("end_offset")
    producers = body.get("producers")
    if not isinstance(end_offset, int) or isinstance(end_offset, bool) or end_offset < 0:
        raise SnapshotError("producer snapshot lacks a valid end_offset")
    if not isinstance(producers, list):
        raise SnapshotError("producer snapshot lacks its producers")
    if len(producers) > SNAPSHOT_PRODUCERS_MAX:
        raise SnapshotError(
            f"producer snapshot holds {len(producers)} producers; at most {SNAPSHOT_PRODUCERS_MAX}"
        )
    states: dict[int, ProducerEntry] = {}
    for item in producers:
        if not (
            isinstance(item, list)
            and len(item) == 4
            and all(_is_int(v) for v in item[:3])
            and isinstance(item[3], list)
            and 0 < len(item[3]) <= DUPLICATE_WINDOW
            and all(
                isinstance(s, list) and len(s) == 4 and all(_is_int(v) for v in s) for s in item[3]
            )
        ):
            raise SnapshotError(f"producer snapshot entry {str(item)[:80]!r} is malformed")
        producer_id, epoch, timestamp, spans = item
        states[producer_id] = ProducerEntry(epoch, tuple(BatchSpan(*s) for s in spans), timestamp)
    return MappingProxyType(states), end_offset


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
