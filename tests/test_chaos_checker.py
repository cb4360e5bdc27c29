"""The chaos checker (headwater.tools.chaos.checker): a table of small histories, each with the
anomalies it must report, and property tests: a history of a correct log reports nothing,
one broken in a known way reports that, and random histories agree with a dumb oracle."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.tools.chaos import nemesis
from headwater.tools.chaos.checker import (
    ANOMALIES,
    TOLERATED_DEFAULT,
    UNKNOWN_OFFSET,
    AbortedRead,
    Duplicate,
    FinalReadGap,
    InconsistentOffset,
    LostWrite,
    NonMonotonicPoll,
    NonMonotonicSend,
    PollSkip,
    Report,
    UnexpectedValue,
    Unseen,
    case_json,
    check,
    summary_lines,
)
from headwater.tools.chaos.history import (
    Event,
    FinalRead,
    Nemesis,
    Note,
    Outcome,
    Poll,
    Record,
    Seek,
    Send,
    from_json,
    parse_lines,
    to_json,
)

# ----------------------------------------------------------------------------- helpers


def ok(value: str, partition: int, offset: int, producer: str = "p", index: int = 0) -> Send:
    return Send(producer, index, partition, value, Outcome.OK, offset)


def failed(value: str, partition: int, producer: str = "p", index: int = 0) -> Send:
    return Send(producer, index, partition, value, Outcome.FAIL, error="NOT_ENOUGH_REPLICAS")


def info(value: str, partition: int, producer: str = "p", index: int = 0) -> Send:
    return Send(producer, index, partition, value, Outcome.INFO, error="REQUEST_TIMED_OUT")


def poll(consumer: str, *records: tuple[int, int, str], time_ms: int = 0) -> Poll:
    return Poll(consumer, tuple(Record(p, o, v) for p, o, v in records), time_ms)


def final(partition: int, *values: str, start: int = 0) -> FinalRead:
    records = tuple(Record(partition, start + i, v) for i, v in enumerate(values))
    return FinalRead(partition, records, start + len(values))


def ok_unplaced(value: str, partition: int, producer: str = "p", index: int = 0) -> Send:
    """Acknowledged without an offset (librdkafka's implicit ack)."""
    return Send(producer, index, partition, value, Outcome.OK, None, "implicit ack")


def sends(partition: int, *values: str, producer: str = "p") -> list[Send]:
    """Acknowledged sends of ``values`` at offsets 0, 1, ... in send order."""
    return [ok(v, partition, i, producer, i) for i, v in enumerate(values)]


# ----------------------------------------------------------------------------- table


@dataclass(frozen=True)
class Case:
    name: str
    history: list[Event]
    expected: dict[str, list[object]]
    """{anomaly: its cases}; anomalies not named must have none."""


CASES = [
    Case(
        "a correct history",
        [
            *sends(0, "a", "b", "c"),
            Seek("c1", 0, 0),
            poll("c1", (0, 0, "a"), (0, 1, "b")),
            poll("c1", (0, 2, "c")),
            final(0, "a", "b", "c"),
        ],
        {},
    ),
    Case(
        "an acknowledged write missing from the final read, never polled",
        [*sends(0, "a", "b"), final(0, "a")],
        {
            "lost-write": [LostWrite(0, "b", 1, True, ())],
            "unseen": [Unseen(0, "b", 1)],
        },
    ),
    Case(
        "an acknowledged write polled, then gone from the final read (truncated)",
        [*sends(0, "a", "b"), poll("c1", (0, 0, "a"), (0, 1, "b")), final(0, "a")],
        {"lost-write": [LostWrite(0, "b", 1, True, (1,))]},
    ),
    Case(
        "an unacknowledged write that a consumer saw is committed: losing it counts",
        [ok("a", 0, 0), info("b", 0, index=1), poll("c1", (0, 0, "a"), (0, 1, "b")), final(0, "a")],
        {"lost-write": [LostWrite(0, "b", 1, False, (1,))]},
    ),
    Case(
        "an unacknowledged write never seen may be lost",
        [ok("a", 0, 0), info("b", 0, index=1), final(0, "a")],
        {},
    ),
    Case(
        "an acknowledged write seen only by the final read is not unseen",
        [*sends(0, "a", "b"), poll("c1", (0, 0, "a")), final(0, "a", "b")],
        {},
    ),
    Case(
        "two values at one offset: the acknowledged one was replaced",
        [
            ok("a", 0, 0),
            ok("b", 0, 1, index=1),
            ok("c", 0, 1, producer="q"),
            final(0, "a", "c"),
        ],
        {
            "inconsistent-offsets": [InconsistentOffset(0, 1, ("b", "c"))],
            "lost-write": [LostWrite(0, "b", 1, True, ())],
            "unseen": [Unseen(0, "b", 1)],
        },
    ),
    Case(
        "consumers disagree on an offset",
        [*sends(0, "a", "b"), poll("c1", (0, 1, "b")), poll("c2", (0, 1, "x")), final(0, "a", "b")],
        {
            "inconsistent-offsets": [InconsistentOffset(0, 1, ("b", "x"))],
            "unexpected-value": [UnexpectedValue(0, 1, "x")],
            "lost-write": [LostWrite(0, "x", 1, False, (1,))],
        },
    ),
    Case(
        "a retried batch stored twice",
        [ok("a", 0, 2), ok("b", 0, 1, index=1), final(0, "a", "b", "a")],
        {
            "duplicate": [Duplicate(0, "a", (0, 2))],
            "non-monotonic-send": [NonMonotonicSend("p", 0, "a", 2, "b", 1)],
        },
    ),
    Case(
        "a later send acknowledged at an earlier offset",
        [
            ok("a", 0, 1, index=0),
            ok("b", 0, 0, index=1),
            ok("c", 1, 0, index=2),  # another partition: its own order
            final(0, "b", "a"),
            final(1, "c"),
        ],
        {"non-monotonic-send": [NonMonotonicSend("p", 0, "a", 1, "b", 0)]},
    ),
    Case(
        "send order is the producer's index, not the order of completions",
        [ok("b", 0, 1, index=1), ok("a", 0, 0, index=0), final(0, "a", "b")],
        {},
    ),
    Case(
        "failed and unknown sends do not take part in send order",
        [ok("a", 0, 0, index=0), info("x", 0, index=1), ok("b", 0, 1, index=2), final(0, "a", "b")],
        {},
    ),
    Case(
        "a consumer goes back without seeking",
        [
            *sends(0, "a", "b", "c"),
            poll("c1", (0, 0, "a"), (0, 1, "b"), (0, 2, "c")),
            poll("c1", (0, 1, "b")),
            final(0, "a", "b", "c"),
        ],
        {"non-monotonic-poll": [NonMonotonicPoll("c1", 0, 2, 1, "b")]},
    ),
    Case(
        "a consumer reads one offset twice within a poll",
        [
            *sends(0, "a", "b"),
            poll("c1", (0, 0, "a"), (0, 0, "a"), (0, 1, "b")),
            final(0, "a", "b"),
        ],
        {"non-monotonic-poll": [NonMonotonicPoll("c1", 0, 0, 0, "a")]},
    ),
    Case(
        "a seek back is not a non-monotonic poll",
        [
            *sends(0, "a", "b"),
            poll("c1", (0, 0, "a"), (0, 1, "b")),
            Seek("c1", 0, 0),
            poll("c1", (0, 0, "a")),
            final(0, "a", "b"),
        ],
        {},
    ),
    Case(
        "a consumer skips an offset between two polls",
        [
            *sends(0, "a", "b", "c"),
            poll("c1", (0, 0, "a")),
            poll("c1", (0, 2, "c"), time_ms=7),
            final(0, "a", "b", "c"),
        ],
        {"poll-skip": [PollSkip("c1", 0, 0, 2, (1,), 1, False, 7)]},
    ),
    Case(
        "a consumer skips within one poll",
        [*sends(0, "a", "b", "c"), poll("c1", (0, 0, "a"), (0, 2, "c")), final(0, "a", "b", "c")],
        {"poll-skip": [PollSkip("c1", 0, 0, 2, (1,), 1, False)]},
    ),
    Case(
        "the first read after a seek must be at the seek's offset",
        [
            *sends(0, "a", "b", "c"),
            Seek("c1", 0, 0),
            poll("c1", (0, 2, "c")),
            final(0, "a", "b", "c"),
        ],
        {"poll-skip": [PollSkip("c1", 0, -1, 2, (0, 1), 2, True)]},
    ),
    Case(
        "a seek forward skips nothing",
        [
            *sends(0, "a", "b", "c"),
            poll("c1", (0, 0, "a")),
            Seek("c1", 0, 2),
            poll("c1", (0, 2, "c")),
            final(0, "a", "b", "c"),
        ],
        {},
    ),
    Case(
        "a gap that no one ever saw filled is no skip",
        [
            ok("a", 0, 0),
            ok("c", 0, 2, index=1),
            poll("c1", (0, 0, "a"), (0, 2, "c")),
            FinalRead(0, (Record(0, 0, "a"), Record(0, 2, "c")), 3),
        ],
        {"final-read-gap": [FinalReadGap(0, 3, (1,), 1, ())]},
    ),
    Case(
        "a value acknowledged at an offset the log no longer reaches is lost there",
        [
            ok("a", 0, 0),
            ok("v", 0, 2, index=1),
            poll("c1", (0, 0, "a"), (0, 1, "v"), (0, 2, "v")),
            FinalRead(0, (Record(0, 0, "a"), Record(0, 1, "v")), 2),
        ],
        {
            "duplicate": [Duplicate(0, "v", (1, 2))],
            "lost-write": [LostWrite(0, "v", 2, True, (1, 2), (1,))],
        },
    ),
    Case(
        "a polled value that moved to another offset is lost where it was read",
        [
            ok("a", 0, 0),
            info("v", 0, index=1),
            poll("c1", (0, 0, "a"), (0, 1, "v")),
            FinalRead(0, (Record(0, 0, "a"), Record(0, 1, "w"), Record(0, 2, "v")), 3),
        ],
        {
            "inconsistent-offsets": [InconsistentOffset(0, 1, ("v", "w"))],
            "duplicate": [Duplicate(0, "v", (1, 2))],
            "lost-write": [LostWrite(0, "v", 1, False, (1,), (2,))],
            "unexpected-value": [UnexpectedValue(0, 1, "w")],
        },
    ),
    Case(
        "a value sent in one attempt at two offsets: a request appended twice",
        [
            Send("p", 0, 0, "a", Outcome.OK, 1, may_resend=False),
            final(0, "a", "a"),
        ],
        {"duplicate-single-send": [Duplicate(0, "a", (0, 1))]},
    ),
    Case(
        "a value its producer sent again under a new epoch, at two offsets",
        [
            Send("p", 0, 0, "a", Outcome.OK, 1, epoch_bumped=True),
            ok("b", 0, 2, index=1),
            final(0, "a", "a", "b"),
        ],
        {"duplicate-epoch-bump": [Duplicate(0, "a", (0, 1))]},
    ),
    Case(
        "a final read that repeats an offset",
        [
            ok("a", 0, 0),
            FinalRead(0, (Record(0, 0, "a"), Record(0, 0, "a")), 1),
        ],
        {"final-read-gap": [FinalReadGap(0, 1, (), 0, (0,))]},
    ),
    Case(
        "consumers are checked each on its own, partitions each on their own",
        [
            *sends(0, "a", "b"),
            *sends(1, "x", "y", producer="q"),
            poll("c1", (0, 0, "a"), (1, 0, "x")),
            poll("c2", (0, 1, "b")),
            poll("c1", (0, 1, "b"), (1, 1, "y")),
            final(0, "a", "b"),
            final(1, "x", "y"),
        ],
        {},
    ),
    Case(
        "a value whose send failed was read",
        [
            ok("a", 0, 0),
            failed("b", 0, index=1),
            poll("c1", (0, 0, "a"), (0, 1, "b")),
            final(0, "a", "b"),
        ],
        {"aborted-read": [AbortedRead("p", 0, "b", (1,))]},
    ),
    Case(
        "a value read on a partition it was not sent to",
        [ok("a", 0, 0), final(0, "a"), final(1, "a")],
        {"unexpected-value": [UnexpectedValue(1, 0, "a")]},
    ),
    Case(
        "acknowledged writes on a partition with no final read cannot be checked",
        [*sends(0, "a"), ok("x", 1, 0, producer="q")],
        {"missing-final-read": [0, 1], "unseen": [Unseen(0, "a", 0), Unseen(1, "x", 0)]},
    ),
    Case(
        "the last final read of a partition counts",
        [*sends(0, "a"), final(0), final(0, "a")],
        {},
    ),
    Case(
        "a send acknowledged without an offset may be at any offset of its partition",
        [
            ok("a", 0, 0),
            ok_unplaced("b", 0, index=1),
            ok("c", 0, 2, index=2),
            final(0, "a", "b", "c"),
        ],
        {},
    ),
    Case(
        "a send acknowledged without an offset and missing from the final read is lost",
        [ok("a", 0, 0), ok_unplaced("b", 0, index=1), final(0, "a")],
        {
            "lost-write": [LostWrite(0, "b", UNKNOWN_OFFSET, True, ())],
            "unseen": [Unseen(0, "b", UNKNOWN_OFFSET)],
        },
    ),
    Case(
        "a send acknowledged without an offset, polled, then gone from the final read",
        [ok("a", 0, 0), ok_unplaced("b", 0, index=1), poll("c1", (0, 1, "b")), final(0, "a")],
        {
            "lost-write": [
                LostWrite(0, "b", UNKNOWN_OFFSET, True, (1,)),
                LostWrite(0, "b", 1, False, (1,)),
            ]
        },
    ),
    Case(
        "a send acknowledged without an offset, in another partition only",
        [ok_unplaced("b", 0), final(0), final(1, "b")],
        {
            "lost-write": [LostWrite(0, "b", UNKNOWN_OFFSET, True, ())],
            "unseen": [Unseen(0, "b", UNKNOWN_OFFSET)],
            "unexpected-value": [UnexpectedValue(1, 0, "b")],
        },
    ),
    Case(
        "a send acknowledged without an offset, found twice",
        [ok_unplaced("b", 0), final(0, "b", "b")],
        {"duplicate": [Duplicate(0, "b", (0, 1))]},
    ),
    # Group consumers (the Kafka-client workload) record a seek at each assignment, to
    # the committed offset: the rules are the same as for consumers of every partition.
    Case(
        "a group member resumes at the committed offset, behind what it read",
        [
            *sends(0, "a", "b", "c"),
            Seek("c1", 0, 0),
            poll("c1", (0, 0, "a"), (0, 1, "b"), (0, 2, "c")),
            Note("consumer c1: revoked partitions [0]"),
            Seek("c1", 0, 1),  # the group committed 1 only: c1 reads b and c again
            poll("c1", (0, 1, "b"), (0, 2, "c")),
            final(0, "a", "b", "c"),
        ],
        {},
    ),
    Case(
        "a group member takes over a partition mid-log at the committed offset",
        [
            *sends(0, "a", "b", "c", "d"),
            Seek("c1", 0, 0),
            poll("c1", (0, 0, "a"), (0, 1, "b")),
            Note("consumer c1: revoked partitions [0]"),
            Seek("c2", 0, 2),
            poll("c2", (0, 2, "c"), (0, 3, "d")),
            final(0, "a", "b", "c", "d"),
        ],
        {},
    ),
    Case(
        "a revoked partition is read no more, and later again from a new assignment",
        [
            *sends(0, "a", "b", "c", "d"),
            Seek("c1", 0, 0),
            poll("c1", (0, 0, "a")),
            Note("consumer c1: revoked partitions [0]"),
            Seek("c2", 0, 1),
            poll("c2", (0, 1, "b"), (0, 2, "c")),
            Seek("c1", 0, 3),
            poll("c1", (0, 3, "d")),
            final(0, "a", "b", "c", "d"),
        ],
        {},
    ),
    Case(
        "a group member that starts past its committed offset skips records",
        [
            *sends(0, "a", "b", "c"),
            Seek("c2", 0, 1),
            poll("c2", (0, 2, "c"), time_ms=4),
            final(0, "a", "b", "c"),
        ],
        {"poll-skip": [PollSkip("c2", 0, 0, 2, (1,), 1, True, 4)]},
    ),
    Case(
        "a group member moving back within one assignment (a reset, no seek)",
        [
            *sends(0, "a", "b", "c"),
            Seek("c1", 0, 1),
            poll("c1", (0, 1, "b"), (0, 2, "c")),
            poll("c1", (0, 0, "a"), time_ms=6),
            final(0, "a", "b", "c"),
        ],
        {"non-monotonic-poll": [NonMonotonicPoll("c1", 0, 2, 0, "a", 6)]},
    ),
    Case(
        "nemesis and note events are ignored",
        [
            Nemesis(1, "kill-leader", "start", (2,)),
            *sends(0, "a"),
            Note("node 2 slow"),
            final(0, "a"),
        ],
        {},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_checker_table(case: Case) -> None:
    report = check(case.history)
    found = {name: list(cases) for name, cases in report.cases().items() if cases}
    assert found == case.expected


def test_case_sets_are_named_in_anomalies() -> None:
    assert tuple(Report(sends=check([]).sends, polled_records=0, final_records=0).cases()) == (
        ANOMALIES
    )
    for case in CASES:
        assert set(case.expected) <= set(ANOMALIES), case.name


def test_duplicates_across_a_producer_epoch_bump_are_reported_but_tolerated() -> None:
    report = check(
        [
            Send("p", 0, 0, "a", Outcome.OK, 1, epoch_bumped=True),
            final(0, "a", "a"),
        ]
    )
    assert report.counts()["duplicate-epoch-bump"] == 1
    assert report.counts()["duplicate"] == 0
    assert "duplicate-epoch-bump" in TOLERATED_DEFAULT
    assert report.valid()
    assert not report.valid(tolerated=())
    assert any(
        "duplicate-epoch-bump" in line and "(tolerated)" in line for line in summary_lines(report)
    )
    # The same value sent within one epoch: the broker wrote a retry twice.
    strict = check([ok("a", 0, 1), final(0, "a", "a")])
    assert strict.failures() == {"duplicate": 1}


def test_counts_failures_and_tolerated_duplicates() -> None:
    report = check([ok("a", 0, 0), ok("b", 0, 1, index=1), final(0, "a", "b", "a")])
    assert report.counts()["duplicate"] == 1
    # The producers are idempotent: a duplicate fails a run unless tolerated by name.
    assert report.failures() == {"duplicate": 1}
    assert not report.valid()
    assert report.failures(tolerated=("duplicate",)) == {}
    assert report.valid(tolerated=("duplicate",))
    lines = summary_lines(report, tolerated=("duplicate",))
    assert lines[0].startswith("sends: 2 acknowledged, 0 failed, 0 unknown")
    assert any("duplicate" in line and "(tolerated)" in line for line in lines)


def test_send_counts_and_read_counts() -> None:
    report = check(
        [
            ok("a", 0, 0),
            failed("b", 0, index=1),
            info("c", 0, index=2),
            poll("c1", (0, 0, "a")),
            final(0, "a"),
        ]
    )
    assert (report.sends.ok, report.sends.fail, report.sends.info) == (1, 1, 1)
    assert report.sends.ok_without_offset == 0
    assert (report.polled_records, report.final_records) == (1, 1)


def test_sends_acknowledged_without_an_offset_are_counted_and_take_no_part_in_order() -> None:
    report = check(
        [
            ok("a", 0, 1, index=0),
            ok_unplaced("b", 0, index=1),  # at offset 0: no non-monotonic send
            ok("c", 0, 2, index=2),
            FinalRead(0, (Record(0, 0, "b"), Record(0, 1, "a"), Record(0, 2, "c")), 3),
        ]
    )
    assert report.valid(), report.counts()
    assert (report.sends.ok, report.sends.ok_without_offset) == (3, 1)
    assert summary_lines(report)[0].startswith("sends: 3 acknowledged (1 at an unknown offset)")


def test_a_value_sent_twice_is_a_programmer_error() -> None:
    with pytest.raises(AssertionError, match="sent twice"):
        check([ok("a", 0, 0), ok("a", 0, 1, index=1)])


def test_skipped_offsets_kept_are_bounded() -> None:
    values = [f"v{i}" for i in range(100)]
    report = check(
        [*sends(0, *values), Seek("c", 0, 0), poll("c", (0, 99, "v99")), final(0, *values)]
    )
    (skip,) = report.poll_skips
    assert skip.skipped_count == 99
    assert skip.skipped == tuple(range(16))


def test_case_json_is_plain_data() -> None:
    report = check([*sends(0, "a", "b"), final(0, "a")])
    assert case_json(report.lost_writes[0]) == {
        "partition": 0,
        "value": "b",
        "offset": 1,
        "acknowledged": True,
        "polled_at": [],
        "final_at": [],
    }
    assert case_json(3) == 3
    json.dumps([case_json(c) for cases in report.cases().values() for c in cases])


# ----------------------------------------------------------------------------- history JSON

EVENTS: list[Event] = [
    ok("a", 0, 5, "p1", 3),
    Send("p2", 0, 1, "b", Outcome.INFO, None, "REQUEST_TIMED_OUT: x", 17),
    Send("p3", 4, 1, "d", Outcome.OK, None, "DUPLICATE_SEQUENCE_NUMBER", 18),
    Send("p4", 5, 2, "e", Outcome.OK, 3, "", 19, may_resend=True, epoch_bumped=True),
    failed("c", 2),
    poll("c1", (0, 5, "a"), (1, 0, "b"), time_ms=9),
    Seek("c1", 1, 0, 10),
    FinalRead(0, (Record(0, 5, "a"),), 6, 11),
    Nemesis(4, "pause-two", "end", (1, 3), "12:00:00", 12),
    Note("consumer c1 went back on partition 0", 13),
]


@pytest.mark.parametrize("event", EVENTS, ids=[type(e).__name__ for e in EVENTS])
def test_history_events_round_trip_through_json(event: Event) -> None:
    assert from_json(json.loads(json.dumps(to_json(event)))) == event


def test_history_json_lines() -> None:
    lines = [json.dumps(to_json(e)) for e in EVENTS]
    assert list(parse_lines(["", *lines, "  "])) == EVENTS
    with pytest.raises(ValueError, match="unknown history event type"):
        from_json({"type": "bogus"})


def test_send_offset_matches_outcome() -> None:
    with pytest.raises(AssertionError):
        Send("p", 0, 0, "a", Outcome.INFO, 3)
    with pytest.raises(AssertionError):
        Send("p", 0, 0, "a", Outcome.FAIL, 3)
    # Acknowledged without an offset (librdkafka's implicit ack).
    assert Send("p", 0, 0, "a", Outcome.OK, None).offset is None


# ----------------------------------------------------------------------------- nemesis plan


def test_plan_runs_every_fault_in_each_round() -> None:
    cycles = nemesis.plan(random.Random(7), nemesis.ALL_FAULTS, 2 * len(nemesis.ALL_FAULTS) + 3)
    assert [c.number for c in cycles] == list(range(1, len(cycles) + 1))
    n = len(nemesis.ALL_FAULTS)
    for start in (0, n):
        assert {c.fault for c in cycles[start : start + n]} == set(nemesis.ALL_FAULTS)
    for c in cycles:
        low, high = nemesis.DURATION_MS[c.fault]
        assert low <= c.duration_ms <= high
        assert nemesis.QUIET_MS[0] <= c.quiet_ms <= nemesis.QUIET_MS[1]
    assert cycles == nemesis.plan(random.Random(7), nemesis.ALL_FAULTS, len(cycles))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all", nemesis.ALL_FAULTS),
        ("kill-leader", (nemesis.Fault.KILL_LEADER,)),
        ("pause-*,restart", (*(f for f in nemesis.Fault if f.startswith("pause-")), "restart")),
        ("restart, restart", (nemesis.Fault.RESTART,)),
    ],
)
def test_parse_faults(text: str, expected: tuple[str, ...]) -> None:
    assert nemesis.parse_faults(text) == expected


@pytest.mark.parametrize("text", ["", "kill-nobody", "zzz*"])
def test_parse_faults_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="nemesis"):
        nemesis.parse_faults(text)


def test_network_faults() -> None:
    assert {f for f in nemesis.Fault if f.needs_network} == {
        nemesis.Fault.PARTITION_ISOLATE,
        nemesis.Fault.PARTITION_LEADER,
        nemesis.Fault.PARTITION_BRIDGE,
        nemesis.Fault.PARTITION_ONE_WAY,
    }


# ----------------------------------------------------------------------------- properties


@st.composite
def correct_runs(draw: st.DrawFn) -> list[Event]:
    """A history of a system that behaves: every log is append-only, acknowledged sends
    carry their true offsets, consumers read each partition in order from a seek, and the
    final read holds every log whole. Unknown sends may or may not be in the log."""
    partitions = draw(st.integers(1, 3))
    producers = draw(st.integers(1, 3))
    logs: list[list[str]] = [[] for _ in range(partitions)]
    events: list[Event] = []
    counters = [0] * producers
    for n in range(draw(st.integers(0, 40))):
        producer = draw(st.integers(0, producers - 1))
        partition = draw(st.integers(0, partitions - 1))
        value = f"v{n}"
        outcome = draw(st.sampled_from(list(Outcome)))
        index = counters[producer]
        counters[producer] += 1
        appended = outcome is Outcome.OK or (outcome is Outcome.INFO and draw(st.booleans()))
        offset = len(logs[partition])
        if appended:
            logs[partition].append(value)
        events.append(
            Send(
                f"p{producer}",
                index,
                partition,
                value,
                outcome,
                offset if outcome is Outcome.OK else None,
            )
        )
    for consumer in range(draw(st.integers(0, 2))):
        name = f"c{consumer}"
        positions = [0] * partitions
        events += [Seek(name, p, 0) for p in range(partitions)]
        for _ in range(draw(st.integers(0, 6))):
            records = []
            for p in range(partitions):
                take = draw(st.integers(0, 3))
                for _ in range(take):
                    if positions[p] < len(logs[p]):
                        records.append(Record(p, positions[p], logs[p][positions[p]]))
                        positions[p] += 1
            events.append(Poll(name, tuple(records)))
            if draw(st.integers(0, 9)) == 0:  # sometimes start over
                p = draw(st.integers(0, partitions - 1))
                positions[p] = 0
                events.append(Seek(name, p, 0))
    for p, log in enumerate(logs):
        events.append(final(p, *log))
    return events


@settings(max_examples=200)
@given(correct_runs())
def test_a_correct_history_has_no_anomalies(history: list[Event]) -> None:
    report = check(history)
    assert report.counts() == dict.fromkeys(ANOMALIES, 0)
    assert report.valid(tolerated=())


@settings(max_examples=200)
@given(correct_runs(), st.data())
def test_dropping_an_acknowledged_record_from_the_final_read_is_a_lost_write(
    history: list[Event], data: st.DataObject
) -> None:
    acknowledged = [e for e in history if isinstance(e, Send) and e.outcome is Outcome.OK]
    if not acknowledged:
        return
    victim = data.draw(st.sampled_from(acknowledged))
    broken: list[Event] = []
    for e in history:
        if isinstance(e, FinalRead) and e.partition == victim.partition:
            kept = tuple(r for r in e.records if r.value != victim.value)
            broken.append(FinalRead(e.partition, kept, e.end_offset))
        else:
            broken.append(e)
    report = check(broken)
    assert [(w.partition, w.value) for w in report.lost_writes] == [
        (victim.partition, victim.value)
    ]
    assert not report.valid()


@st.composite
def arbitrary_runs(draw: st.DrawFn) -> list[Event]:
    """Histories of a broken system: offsets and values anywhere (values unique per send)."""
    offsets = st.integers(0, 6)
    values = [f"v{i}" for i in range(draw(st.integers(0, 8)))]
    partitions = st.integers(0, 1)
    events: list[Event] = []
    for i, value in enumerate(values):
        outcome = draw(st.sampled_from(list(Outcome)))
        events.append(
            Send(
                "p",
                i,
                draw(partitions),
                value,
                outcome,
                draw(offsets) if outcome is Outcome.OK else None,
            )
        )
    pool = [*values, "stray"]
    for _ in range(draw(st.integers(0, 4))):
        records = draw(
            st.lists(st.builds(Record, partitions, offsets, st.sampled_from(pool)), max_size=5)
        )
        events.append(Poll(draw(st.sampled_from(["c1", "c2"])), tuple(records)))
    for p in draw(st.sets(partitions)):
        rows = draw(st.lists(st.sampled_from(pool), max_size=6))
        events.append(final(p, *rows))
    return events


def oracle(history: list[Event]) -> dict[str, int]:
    """The simplest reading of the definitions, for the anomalies that need no order."""
    sends = [e for e in history if isinstance(e, Send)]
    polls = [r for e in history if isinstance(e, Poll) for r in e.records]
    finals = {e.partition: e for e in history if isinstance(e, FinalRead)}
    final_records = [r for f in finals.values() for r in f.records]
    seen: dict[tuple[int, int], set[str]] = defaultdict(set)
    for s in sends:
        if s.offset is not None:
            seen[s.partition, s.offset].add(s.value)
    for r in polls + final_records:
        seen[r.partition, r.offset].add(r.value)
    inconsistent = sum(1 for values in seen.values() if len(values) > 1)
    duplicates = 0
    for p in {p for p, _ in seen}:
        for v in {v for (q, _), vs in seen.items() if q == p for v in vs}:
            if sum(1 for (q, _), vs in seen.items() if q == p and v in vs) > 1:
                duplicates += 1
    ok_sends = [s for s in sends if s.outcome is Outcome.OK]
    in_final = {(r.partition, r.value) for r in final_records}
    at_final = {(r.partition, r.offset, r.value) for r in final_records}
    polled = {(r.partition, r.value) for r in polls}
    lost = sum(
        1
        for s in ok_sends
        if s.partition in finals and (s.partition, s.offset, s.value) not in at_final
    )
    acknowledged = {(s.partition, s.offset, s.value) for s in ok_sends}
    lost += sum(
        1
        for p, o, v in {(r.partition, r.offset, r.value) for r in polls}
        if p in finals and (p, o, v) not in at_final and (p, o, v) not in acknowledged
    )
    unseen = sum(1 for s in ok_sends if (s.partition, s.value) not in in_final | polled)
    return {
        "inconsistent-offsets": inconsistent,
        "duplicate": duplicates,
        "lost-write": lost,
        "unseen": unseen,
    }


@settings(max_examples=300)
@given(arbitrary_runs())
def test_checker_agrees_with_the_oracle(history: list[Event]) -> None:
    counts = check(history).counts()
    expected = oracle(history)
    assert {name: counts[name] for name in expected} == expected


def test_read_gaps_measure_how_long_each_group_went_without_reading_after_each_fault() -> None:
    from headwater.tools.chaos.history import Nemesis, Poll, Record
    from headwater.tools.chaos.read_gaps import longest_by_group, read_gaps

    def read(consumer: str, at_ms: int) -> Poll:
        return Poll(consumer, (Record(0, at_ms, "v"),), at_ms)

    history = [
        read("c0", 1000),
        read("n0", 1000),
        Nemesis(1, "kill-leader", "start", (1,), "", 2000),
        read("c0", 2500),  # c's group reads on at once
        read("c1", 9000),
        read("n0", 14_000),  # n's group waits 13 s after its last read
        Nemesis(2, "pause", "start", (2,), "", 20_000),
        read("c0", 21_000),
        read("n0", 20_500),
        read("x9", 30_000),  # a consumer of no group named: left out
    ]
    gaps = read_gaps(history, {"c0": "classic", "c1": "classic", "n0": "consumer"})
    by = {(g.group, g.cycle): g for g in gaps}
    # From its read at 9 s to the next at 21 s: a stretch that began before the next
    # fault counts for both.
    assert by[("classic", 1)].gap_ms == 12_000 and by[("consumer", 1)].gap_ms == 13_000
    assert by[("classic", 2)].gap_ms == 12_000
    assert by[("consumer", 2)].gap_ms == 6500
    longest = longest_by_group(gaps)
    assert (longest["consumer"].cycle, longest["consumer"].gap_ms) == (1, 13_000)
    silent = read_gaps([read("c0", 1000), Nemesis(1, "kill", "start", (), "", 2000)], {"c0": "g"})
    assert silent[0].open and silent[0].gap_ms == 1000
