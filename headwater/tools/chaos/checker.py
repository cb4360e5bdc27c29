"""The chaos checker: the anomalies of Jepsen's Kafka workload, found in a history (pure).

Input: a history (``headwater.tools.chaos.history``) of sends with unique values and their
outcomes, consumers' polls and seeks in the order they happened, and a final read of
every partition taken after the faults healed. Output: a ``Report`` listing each case.

The *version order* of a partition maps each offset to the set of values seen there by
anyone: acknowledged sends (their acknowledged offset), every poll, and the final read.
Offsets are Headwater's own: contiguous, with no transaction markers, so unlike Jepsen
the checker works on offsets directly rather than on dense indices.

Anomalies (names as in Jepsen's ``jepsen.tests.kafka``, where it has them):

- ``lost-write``: a committed value that the final read of its partition does not hold
  at the offset where it was committed. Committed means acknowledged ``ok`` with
  acks=all (at the acknowledged offset), or returned by any poll (at each offset it was
  read at: consumers read only below the high watermark). A value found at another
  offset only, or an offset at or past the final high watermark, is lost all the same.
  A value acknowledged ``ok`` without an offset (librdkafka's implicit ack after a later
  batch's success, or its success for a retry the broker answered
  DUPLICATE_SEQUENCE_NUMBER: appended, where not said) is lost when the final read of its
  partition does not hold it at any offset; its case has ``offset`` -1. Jepsen infers
  loss from later reads; here the final read after healing is the authority.
- ``unseen``: acknowledged ``ok`` but returned by no poll and not in the final read
  (Jepsen's final ``unseen`` set; ``offset`` -1 for one acknowledged without an offset).
  With a complete final read every unseen value is also a lost write; it is reported too
  because it says the value was never visible at all.
- ``inconsistent-offsets``: two or more values at one (partition, offset) in the version
  order.
- ``duplicate``: one value, from a producer that retries, at two or more offsets of a
  partition (the producers are idempotent: a retry is appended once).
- ``duplicate-single-send``: the same, for a value its producer sent in one attempt
  (``may_resend`` False): a node appended one request twice.
- ``duplicate-epoch-bump``: the same, for a value whose send was unanswered when its
  producer bumped its producer epoch (``epoch_bumped``; librdkafka's idempotent producer
  does so producer-wide, e.g. after OUT_OF_ORDER_SEQUENCE_NUMBER on a pipelined request
  behind one that failed). librdkafka then sends such a value again under the new epoch
  with a new sequence, even when an attempt under the old epoch may have been appended
  (a connection to a leader that died); idempotence holds per producer epoch, so no
  broker can tell that send from a new record (confluentinc/librdkafka#4953). Reported,
  not a failure by default (``TOLERATED_DEFAULT``): the broker kept its promise; a
  duplicate of a value sent within one epoch is a ``duplicate``.
- ``non-monotonic-send``: one producer's acknowledged sends to a partition, taken in send
  order, where a later send was acknowledged at an offset not above the earlier one's
  (sends acknowledged without an offset take no part).
- ``non-monotonic-poll``: a consumer read, on one partition, an offset not above the one
  it read before there, without a seek in between (within one poll or across polls).
- ``poll-skip``: between two consecutive reads of one partition by one consumer (or
  between a seek to ``s`` and the first read after it, which counts as having read
  ``s - 1``), an offset exists in the version order that the consumer did not read.
- ``aborted-read``: a value whose send certainly failed was read (Jepsen's G1a).
- ``unexpected-value``: a value was read on a partition that no send addressed.
- ``missing-final-read``: a partition holds committed values but has no final read, so
  none of them can be checked.
- ``final-read-gap``: a final read whose offsets are not each offset from its first to
  its high watermark exactly once (Headwater's offsets are contiguous).

Consumers in a group (the Kafka-client workload, ``headwater.tools.chaos.kafka_workload``)
read only the partitions the group assigns them, from the group's committed offset, and
lose partitions in rebalances. No rule changes for them, because of what they record: a
``Seek`` per partition at each assignment, to the offset the client was told to start
from (the committed offset, or the log start), before any record of that assignment.
So a move back to a committed offset after a rebalance is a seek, not a
``non-monotonic-poll``, and the first read after it must be at the committed offset (a
``poll-skip`` otherwise: the group's committed offset must not pass records the group
never read). A revoked partition is simply read no more (``poll-skip`` compares a
consumer's consecutive reads of a partition, never a read with the log's end), and a
group consumer need not read every partition: ``unseen`` asks for any poll or the final
read. What stays checked, per consumer and partition, is that within one assignment it
reads on from its seek without gaps or repeats, and that everything any member read is in
the final read where it was read.

The checker does no I/O and reads no clock; the same history gives the same report.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Final

from headwater.tools.chaos.history import (
    Event,
    FinalRead,
    Outcome,
    Poll,
    Seek,
    Send,
)

SKIPPED_KEPT_MAX: Final = 16
"""Skipped offsets kept per poll-skip case (``skipped_count`` has them all)."""

ANOMALIES: Final = (
    "lost-write",
    "unseen",
    "inconsistent-offsets",
    "duplicate",
    "duplicate-single-send",
    "duplicate-epoch-bump",
    "non-monotonic-send",
    "non-monotonic-poll",
    "poll-skip",
    "aborted-read",
    "unexpected-value",
    "missing-final-read",
    "final-read-gap",
)
TOLERATED_DEFAULT: Final[frozenset[str]] = frozenset({"duplicate-epoch-bump"})
"""Anomalies that do not fail a run by default: only a duplicate that the client made by
sending a value again under a new producer epoch (the producers are idempotent, so a
retried batch is never written twice within one epoch)."""


UNKNOWN_OFFSET: Final = -1
"""The ``offset`` of a lost-write or unseen case whose send was acknowledged without an
offset."""


@dataclass(frozen=True, slots=True)
class LostWrite:
    partition: int
    value: str
    offset: int
    """Where it was committed: the acknowledged offset, or an offset a poll read it at;
    UNKNOWN_OFFSET for a send acknowledged without one."""
    acknowledged: bool
    polled_at: tuple[int, ...]
    """Offsets at which polls returned the value (empty if none did)."""
    final_at: tuple[int, ...] = ()
    """Offsets at which the final read holds the value (empty if none)."""


@dataclass(frozen=True, slots=True)
class Unseen:
    partition: int
    value: str
    offset: int


@dataclass(frozen=True, slots=True)
class InconsistentOffset:
    partition: int
    offset: int
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Duplicate:
    partition: int
    value: str
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FinalReadGap:
    """The final read of ``partition`` lacks ``missing`` offsets (first ones kept; all
    counted) or holds ``repeated`` ones more than once."""

    partition: int
    end_offset: int
    missing: tuple[int, ...]
    missing_count: int
    repeated: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NonMonotonicSend:
    """``value`` was sent after ``previous_value`` but acknowledged at ``offset`` <=
    ``previous_offset``."""

    producer: str
    partition: int
    previous_value: str
    previous_offset: int
    value: str
    offset: int


@dataclass(frozen=True, slots=True)
class NonMonotonicPoll:
    consumer: str
    partition: int
    previous_offset: int
    offset: int
    value: str
    time_ms: int = 0
    """When the poll happened (the Poll event's time_ms)."""


@dataclass(frozen=True, slots=True)
class PollSkip:
    """Offsets in (``previous_offset``, ``offset``) that exist but were not read;
    ``after_seek``: ``previous_offset`` is a seek target minus one."""

    consumer: str
    partition: int
    previous_offset: int
    offset: int
    skipped: tuple[int, ...]
    skipped_count: int
    after_seek: bool
    time_ms: int = 0
    """When the poll happened (the Poll event's time_ms)."""


@dataclass(frozen=True, slots=True)
class AbortedRead:
    producer: str
    partition: int
    value: str
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UnexpectedValue:
    partition: int
    offset: int
    value: str


@dataclass(frozen=True, slots=True)
class SendCounts:
    ok: int = 0
    fail: int = 0
    info: int = 0
    ok_without_offset: int = 0
    """Of ``ok``: acknowledged without an offset."""


@dataclass(frozen=True, slots=True)
class Report:
    """Every anomaly case found, with the counts of what the history holds."""

    sends: SendCounts
    polled_records: int
    final_records: int
    lost_writes: tuple[LostWrite, ...] = ()
    unseen: tuple[Unseen, ...] = ()
    inconsistent_offsets: tuple[InconsistentOffset, ...] = ()
    duplicates: tuple[Duplicate, ...] = ()
    single_send_duplicates: tuple[Duplicate, ...] = ()
    epoch_bump_duplicates: tuple[Duplicate, ...] = ()
    non_monotonic_sends: tuple[NonMonotonicSend, ...] = ()
    non_monotonic_polls: tuple[NonMonotonicPoll, ...] = ()
    poll_skips: tuple[PollSkip, ...] = ()
    aborted_reads: tuple[AbortedRead, ...] = ()
    unexpected_values: tuple[UnexpectedValue, ...] = ()
    missing_final_reads: tuple[int, ...] = field(default=())
    final_read_gaps: tuple[FinalReadGap, ...] = ()

    def cases(self) -> dict[str, tuple[object, ...]]:
        """{anomaly name: its cases}, for every name in ANOMALIES."""
        return {
            "lost-write": self.lost_writes,
            "unseen": self.unseen,
            "inconsistent-offsets": self.inconsistent_offsets,
            "duplicate": self.duplicates,
            "duplicate-single-send": self.single_send_duplicates,
            "duplicate-epoch-bump": self.epoch_bump_duplicates,
            "non-monotonic-send": self.non_monotonic_sends,
            "non-monotonic-poll": self.non_monotonic_polls,
            "poll-skip": self.poll_skips,
            "aborted-read": self.aborted_reads,
            "unexpected-value": self.unexpected_values,
            "missing-final-read": self.missing_final_reads,
            "final-read-gap": self.final_read_gaps,
        }

    def counts(self) -> dict[str, int]:
        """{anomaly name: number of cases}, for every name in ANOMALIES."""
        return {name: len(cases) for name, cases in self.cases().items()}

    def failures(self, tolerated: Iterable[str] = TOLERATED_DEFAULT) -> dict[str, int]:
        """The counts of the anomalies found that are not ``tolerated``."""
        allowed = frozenset(tolerated)
        return {n: c for n, c in self.counts().items() if c and n not in allowed}

    def valid(self, tolerated: Iterable[str] = TOLERATED_DEFAULT) -> bool:
        return not self.failures(tolerated)


def case_json(case: object) -> object:
    """A case as JSON-ready data (a dict of its fields; tuples as lists)."""
    if isinstance(case, int):
        return case
    out: dict[str, object] = {}
    for f in fields(case):  # type: ignore[arg-type]
        value = getattr(case, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


# ----------------------------------------------------------------------------- analysis


VersionOrder = dict[int, dict[int, set[str]]]
"""{partition: {offset: values seen there}}."""


@dataclass(slots=True)
class _Index:
    """What the analyses share, built in one pass over the history."""

    sends: dict[str, Send] = field(default_factory=dict)
    addressed: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))
    polled: dict[int, dict[str, list[int]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    finals: dict[int, FinalRead] = field(default_factory=dict)
    versions: VersionOrder = field(default_factory=lambda: defaultdict(lambda: defaultdict(set)))
    consumer_events: list[Poll | Seek] = field(default_factory=list)
    polled_records: int = 0


def _index(history: Iterable[Event]) -> _Index:
    index = _Index()
    for event in history:
        if isinstance(event, Send):
            assert event.value not in index.sends, f"value {event.value!r} sent twice"
            index.sends[event.value] = event
            index.addressed[event.partition].add(event.value)
            if event.offset is not None:
                index.versions[event.partition][event.offset].add(event.value)
        elif isinstance(event, Poll):
            index.consumer_events.append(event)
            index.polled_records += len(event.records)
            for r in event.records:
                index.polled[r.partition][r.value].append(r.offset)
                index.versions[r.partition][r.offset].add(r.value)
        elif isinstance(event, Seek):
            index.consumer_events.append(event)
        elif isinstance(event, FinalRead):
            index.finals[event.partition] = event  # the last final read of a partition counts
    for final in index.finals.values():
        for r in final.records:
            index.versions[r.partition][r.offset].add(r.value)
    return index


def _lost_and_unseen(
    index: _Index,
) -> tuple[list[LostWrite], list[Unseen], list[int]]:
    lost: list[LostWrite] = []
    unseen: list[Unseen] = []
    missing: set[int] = set()
    final_at: dict[int, dict[int, str]] = {
        p: {r.offset: r.value for r in f.records} for p, f in index.finals.items()
    }
    final_offsets: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for p, f in index.finals.items():
        for r in f.records:
            final_offsets[p][r.value].append(r.offset)

    def where_final(partition: int, value: str) -> tuple[int, ...]:
        return tuple(final_offsets[partition].get(value, ()))

    acknowledged = sorted(
        (s for s in index.sends.values() if s.outcome is Outcome.OK),
        key=lambda s: (
            s.partition,
            UNKNOWN_OFFSET if s.offset is None else s.offset,
            s.value,
        ),
    )
    for send in acknowledged:
        offset = UNKNOWN_OFFSET if send.offset is None else send.offset
        polled_at = tuple(index.polled[send.partition].get(send.value, ()))
        finals = final_at.get(send.partition)
        held = where_final(send.partition, send.value)
        if finals is None:
            missing.add(send.partition)
        elif (not held) if send.offset is None else finals.get(send.offset) != send.value:
            # acknowledged without an offset: lost only if nowhere in the partition
            lost.append(LostWrite(send.partition, send.value, offset, True, polled_at, held))
        if not polled_at and not held:
            unseen.append(Unseen(send.partition, send.value, offset))
    for partition, values in sorted(index.polled.items()):
        finals = final_at.get(partition)
        for value, offsets in sorted(values.items(), key=lambda kv: (min(kv[1]), kv[0])):
            writer = index.sends.get(value)
            acknowledged_here = (
                writer is not None
                and writer.outcome is Outcome.OK
                and writer.partition == partition
            )
            if finals is None:
                missing.add(partition)
                continue
            for offset in sorted(set(offsets)):
                if acknowledged_here and writer is not None and offset == writer.offset:
                    continue  # judged above
                if finals.get(offset) != value:
                    lost.append(
                        LostWrite(
                            partition,
                            value,
                            offset,
                            False,
                            tuple(offsets),
                            where_final(partition, value),
                        )
                    )
    return lost, unseen, sorted(missing)


def _inconsistent_and_duplicates(
    versions: VersionOrder, sends: dict[str, Send]
) -> tuple[list[InconsistentOffset], list[Duplicate], list[Duplicate], list[Duplicate]]:
    """Inconsistent offsets, duplicates of values that may have been sent again within
    one producer epoch, duplicates of values sent once, and duplicates of values sent
    again under a new producer epoch."""
    inconsistent: list[InconsistentOffset] = []
    duplicates: list[Duplicate] = []
    single: list[Duplicate] = []
    bumped: list[Duplicate] = []
    for partition, offsets in sorted(versions.items()):
        where: dict[str, list[int]] = defaultdict(list)
        for offset, values in sorted(offsets.items()):
            if len(values) > 1:
                inconsistent.append(InconsistentOffset(partition, offset, tuple(sorted(values))))
            for value in values:
                where[value].append(offset)
        for value, at in sorted(where.items(), key=lambda kv: (kv[1][0], kv[0])):
            if len(at) > 1:
                send = sends.get(value)
                case = Duplicate(partition, value, tuple(at))
                if send is not None and not send.may_resend:
                    single.append(case)
                elif send is not None and send.epoch_bumped:
                    bumped.append(case)
                else:
                    duplicates.append(case)
    return inconsistent, duplicates, single, bumped


def _final_read_gaps(finals: dict[int, FinalRead]) -> list[FinalReadGap]:
    gaps = []
    for partition, final in sorted(finals.items()):
        offsets = [r.offset for r in final.records]
        start = min(offsets, default=final.end_offset)
        counts: dict[int, int] = defaultdict(int)
        for offset in offsets:
            counts[offset] += 1
        missing = [o for o in range(start, final.end_offset) if o not in counts]
        repeated = sorted(o for o, n in counts.items() if n > 1)
        beyond = sorted(o for o in counts if o >= final.end_offset)
        if missing or repeated or beyond:
            gaps.append(
                FinalReadGap(
                    partition,
                    final.end_offset,
                    tuple(missing[:SKIPPED_KEPT_MAX]),
                    len(missing),
                    tuple(repeated + beyond),
                )
            )
    return gaps


def _non_monotonic_sends(sends: Iterable[Send]) -> list[NonMonotonicSend]:
    by_stream: dict[tuple[str, int], list[Send]] = defaultdict(list)
    for send in sends:
        if send.outcome is Outcome.OK and send.offset is not None:
            by_stream[send.producer, send.partition].append(send)
    cases = []
    for (producer, partition), stream in sorted(by_stream.items()):
        stream.sort(key=lambda s: s.index)
        for before, after in itertools.pairwise(stream):
            assert before.offset is not None
            assert after.offset is not None
            if after.offset <= before.offset:
                cases.append(
                    NonMonotonicSend(
                        producer,
                        partition,
                        before.value,
                        before.offset,
                        after.value,
                        after.offset,
                    )
                )
    return cases


def _poll_order(
    events: Iterable[Poll | Seek], versions: VersionOrder
) -> tuple[list[NonMonotonicPoll], list[PollSkip]]:
    known = {p: sorted(offsets) for p, offsets in versions.items()}
    last: dict[tuple[str, int], tuple[int, bool]] = {}  # (offset read, set by a seek)
    non_monotonic: list[NonMonotonicPoll] = []
    skips: list[PollSkip] = []
    for event in events:
        if isinstance(event, Seek):
            last[event.consumer, event.partition] = (event.offset - 1, True)
            continue
        for record in event.records:
            key = (event.consumer, record.partition)
            previous = last.get(key)
            last[key] = (record.offset, False)
            if previous is None:
                continue
            before, after_seek = previous
            if record.offset <= before:
                non_monotonic.append(
                    NonMonotonicPoll(
                        event.consumer,
                        record.partition,
                        before,
                        record.offset,
                        record.value,
                        event.time_ms,
                    )
                )
            elif record.offset > before + 1:
                offsets = known.get(record.partition, [])
                low = bisect.bisect_right(offsets, before)
                high = bisect.bisect_left(offsets, record.offset)
                if high > low:
                    skips.append(
                        PollSkip(
                            event.consumer,
                            record.partition,
                            before,
                            record.offset,
                            tuple(offsets[low : min(high, low + SKIPPED_KEPT_MAX)]),
                            high - low,
                            after_seek,
                            event.time_ms,
                        )
                    )
    return non_monotonic, skips


def _aborted_and_unexpected(
    index: _Index,
) -> tuple[list[AbortedRead], list[UnexpectedValue]]:
    aborted: list[AbortedRead] = []
    unexpected: list[UnexpectedValue] = []
    read_at: dict[tuple[int, str], list[int]] = defaultdict(list)
    for partition, values in index.polled.items():
        for value, offsets in values.items():
            read_at[partition, value] += offsets
    for partition, final in index.finals.items():
        for r in final.records:
            read_at[partition, r.value].append(r.offset)
    for (partition, value), offsets in sorted(read_at.items()):
        send = index.sends.get(value)
        if send is None or send.partition != partition:
            unexpected += [UnexpectedValue(partition, o, value) for o in sorted(set(offsets))]
        elif send.outcome is Outcome.FAIL:
            aborted.append(
                AbortedRead(send.producer, partition, value, tuple(sorted(set(offsets))))
            )
    return aborted, unexpected


def check(history: Iterable[Event]) -> Report:
    """Find every anomaly of the module docstring in ``history``."""
    index = _index(history)
    lost, unseen, missing = _lost_and_unseen(index)
    inconsistent, duplicates, single, bumped = _inconsistent_and_duplicates(
        index.versions, index.sends
    )
    non_monotonic_polls, skips = _poll_order(index.consumer_events, index.versions)
    aborted, unexpected = _aborted_and_unexpected(index)
    outcomes = [s.outcome for s in index.sends.values()]
    return Report(
        sends=SendCounts(
            ok=outcomes.count(Outcome.OK),
            fail=outcomes.count(Outcome.FAIL),
            info=outcomes.count(Outcome.INFO),
            ok_without_offset=sum(
                1 for s in index.sends.values() if s.outcome is Outcome.OK and s.offset is None
            ),
        ),
        polled_records=index.polled_records,
        final_records=sum(len(f.records) for f in index.finals.values()),
        lost_writes=tuple(lost),
        unseen=tuple(unseen),
        inconsistent_offsets=tuple(inconsistent),
        duplicates=tuple(duplicates),
        single_send_duplicates=tuple(single),
        epoch_bump_duplicates=tuple(bumped),
        non_monotonic_sends=tuple(_non_monotonic_sends(index.sends.values())),
        non_monotonic_polls=tuple(non_monotonic_polls),
        poll_skips=tuple(skips),
        aborted_reads=tuple(aborted),
        unexpected_values=tuple(unexpected),
        missing_final_reads=tuple(missing),
        final_read_gaps=tuple(_final_read_gaps(index.finals)),
    )


def summary_lines(report: Report, tolerated: Iterable[str] = TOLERATED_DEFAULT) -> list[str]:
    """Human-readable lines: send outcomes, reads, and each anomaly's count."""
    allowed = frozenset(tolerated)
    s = report.sends
    unplaced = f" ({s.ok_without_offset} at an unknown offset)" if s.ok_without_offset else ""
    lines = [
        f"sends: {s.ok} acknowledged{unplaced}, {s.fail} failed, {s.info} unknown; "
        f"{report.polled_records} records polled, {report.final_records} in the final read",
    ]
    for name, count in report.counts().items():
        note = " (tolerated)" if name in allowed and count else ""
        lines.append(f"  {name:<22} {count}{note}")
    return lines
