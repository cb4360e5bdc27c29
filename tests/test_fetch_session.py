"""The leader's fetch session (``node/replicas/fetch_session.py``) as steps without I/O:
what a request counts as a follower's progress, what an answer carries, and when a
partition leaves the session."""

from __future__ import annotations

import pytest

from headwater.log import batch as batch_format
from headwater.log.api import LogConfig
from headwater.log.memory_log import MemoryLog
from headwater.node.replicas.fetch_session import (
    SESSION_REFRESH_MS,
    FetchSession,
    ReplicaData,
    ReplicaRefusal,
    epoch_end,
)
from headwater.node.replicas.partition import Partition
from headwater.raft.metadata.image import BrokerState, MetadataImage, PartitionState
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests.sim_cluster import EpochQuestion as Question
from tests.sim_cluster import Position, Ref

TOPIC = "t"
LEADER, FOLLOWER, OTHER = 1, 2, 3
NOW_MS = 1_700_000_000_000
IMAGE = MetadataImage(
    brokers={FOLLOWER: BrokerState(FOLLOWER, "incarnation", 7, "address", "", fenced=False)}
)


def leading(epoch: int = 3, records: int = 10, index: int = 0) -> Partition:
    """Node LEADER's replica of ``TOPIC``-``index`` leading at ``epoch``, the ISR every
    replica, holding ``records`` one-record batches written at ``epoch``."""
    partition = Partition(TOPIC, index, MemoryLog(), LogConfig(max_message_bytes=1 << 20))
    partition.become(
        PartitionState(index, (LEADER, FOLLOWER, OTHER), (LEADER, FOLLOWER), LEADER, epoch, epoch),
        LEADER,
        NOW_MS,
    )
    for offset in range(records):
        partition.log.append_replicated(
            batch_format.encode_batch([b"r%d" % offset], base_offset=offset, leader_epoch=epoch),
            NOW_MS,
        )
    return partition


class Session:
    """A session of FOLLOWER with LEADER over ``partitions``."""

    def __init__(self, *partitions: Partition) -> None:
        self.hosted = {(p.topic, p.index): p for p in partitions}
        self.steps = FetchSession(LEADER, lambda t, i: self.hosted.get((t, i)), self.wake)

    def wake(self) -> None:
        """The driver's listener (identity is what the tests check)."""

    def take(
        self,
        *positions: Position,
        removed: tuple[Ref, ...] = (),
        broker_epoch: int = 7,
        may_lead: bool = True,
        now_ms: int = NOW_MS,
    ) -> list[ReplicaRefusal]:
        return self.steps.take(
            replica_id=FOLLOWER,
            broker_epoch=broker_epoch,
            positions=positions,
            removed=removed,
            image=IMAGE,
            may_lead=may_lead,
            now_ms=now_ms,
        )


def codes(refusals: list[ReplicaRefusal]) -> list[ErrorCode]:
    return [refusal.error.code for refusal in refusals]


def test_a_reported_position_is_the_followers_progress_and_what_it_is_sent_is_not() -> None:
    partition = leading()
    session = Session(partition)
    assert session.take(Position(TOPIC, 0, 3, 4)) == []
    assert partition.high_watermark == 4
    parts, _ = session.steps.collect(1 << 20, with_news=True)
    [data] = parts
    assert isinstance(data, ReplicaData)
    assert batch_format.read_header(data.records).base_offset == 4
    assert (data.high_watermark, data.log_end_offset) == (4, 10)
    # Sent, not yet reported: the high watermark stays where the follower's report put it.
    assert partition.high_watermark == 4
    assert session.take(Position(TOPIC, 0, 3, 10), now_ms=NOW_MS + 1) == []
    assert partition.high_watermark == 10


def test_each_check_refuses_a_position_before_it_counts_and_it_leaves_the_session() -> None:
    cases = [
        ({"broker_epoch": 6}, Position(TOPIC, 0, 3, 4), ErrorCode.STALE_BROKER_EPOCH),
        ({"may_lead": False}, Position(TOPIC, 0, 3, 4), ErrorCode.NOT_LEADER_OR_FOLLOWER),
        ({}, Position(TOPIC, 0, 2, 4), ErrorCode.FENCED_LEADER_EPOCH),
        ({}, Position(TOPIC, 0, 4, 4), ErrorCode.UNKNOWN_LEADER_EPOCH),
        ({}, Position(TOPIC, 0, 3, 11), ErrorCode.OFFSET_OUT_OF_RANGE),
        ({}, Position(TOPIC, 9, 3, 4), ErrorCode.NOT_LEADER_OR_FOLLOWER),
    ]
    for options, position, code in cases:
        partition = leading()
        session = Session(partition)
        assert session.take(Position(TOPIC, 0, 3, 2)) == []
        assert partition.high_watermark == 2
        refused = session.take(position, now_ms=NOW_MS + 1, **options)  # type: ignore[arg-type]
        assert codes(refused) == [code], (options, position)
        assert partition.high_watermark == 2, (options, position)
        if position.partition == 0:
            assert (TOPIC, 0) not in session.steps
            assert session.wake not in partition.replica_listeners


def test_an_answer_keeps_to_its_budget_but_for_one_batch() -> None:
    first, second = leading(records=10, index=0), leading(records=10, index=1)
    session = Session(first, second)
    session.take(Position(TOPIC, 0, 3, 0), Position(TOPIC, 1, 3, 0))
    parts, _ = session.steps.collect(1, with_news=True)
    assert [(p.partition, len(p.records)) for p in parts if isinstance(p, ReplicaData)] == [
        (0, len(first.log.read(0, 1).data)),
        (1, 0),  # the budget is spent: news of its high watermark only
    ]


def test_news_alone_waits_for_with_news_and_is_sent_once() -> None:
    partition = leading()
    session = Session(partition)
    session.take(Position(TOPIC, 0, 3, 10))
    parts, pending = session.steps.collect(1 << 20, with_news=False)
    assert (parts, pending) == ([], True)
    parts, pending = session.steps.collect(1 << 20, with_news=True)
    assert [(p.records, p.high_watermark) for p in parts if isinstance(p, ReplicaData)] == [
        (b"", 10)
    ]
    assert session.steps.collect(1 << 20, with_news=True) == ([], False)


def test_a_partition_whose_leadership_moved_on_is_refused_once_and_leaves() -> None:
    partition = leading(epoch=3)
    session = Session(partition)
    session.take(Position(TOPIC, 0, 3, 4))
    assert partition.replica_listeners == {session.wake}
    partition.become(
        PartitionState(0, (LEADER, FOLLOWER, OTHER), (LEADER, FOLLOWER), LEADER, 4, 4),
        LEADER,
        NOW_MS,
    )
    parts, _ = session.steps.collect(1 << 20, with_news=True)
    assert [p.error.code for p in parts if isinstance(p, ReplicaRefusal)] == [
        ErrorCode.FENCED_LEADER_EPOCH
    ]
    assert len(session.steps) == 0
    assert partition.replica_listeners == set()
    assert session.steps.collect(1 << 20, with_news=True) == ([], False)


def test_silence_counts_as_a_fetch_at_the_last_reported_position_at_most_once_a_period() -> None:
    partition = leading()
    session = Session(partition)
    session.take(Position(TOPIC, 0, 3, 4))
    assert partition.followers[FOLLOWER].last_fetch_ms == NOW_MS
    session.take(now_ms=NOW_MS + SESSION_REFRESH_MS - 1)
    assert partition.followers[FOLLOWER].last_fetch_ms == NOW_MS
    session.take(now_ms=NOW_MS + SESSION_REFRESH_MS)
    progress = partition.followers[FOLLOWER]
    assert (progress.last_fetch_ms, progress.log_end_offset) == (NOW_MS + SESSION_REFRESH_MS, 4)


def test_removed_partitions_and_a_closed_session_stop_waking_the_driver() -> None:
    first, second = leading(index=0), leading(index=1)
    session = Session(first, second)
    session.take(Position(TOPIC, 0, 3, 4), Position(TOPIC, 1, 3, 4))
    session.take(removed=(Ref(TOPIC, 0),))
    assert first.replica_listeners == set()
    assert second.replica_listeners == {session.wake}
    session.steps.close()
    assert second.replica_listeners == set()
    assert len(session.steps) == 0


def test_an_epoch_question_is_answered_after_the_replica_checks() -> None:
    partition = leading(epoch=3, records=10)
    end = epoch_end(partition, Question(TOPIC, 0, FOLLOWER, 3, 3), node_id=LEADER, may_lead=True)
    assert (end.leader_epoch, end.end_offset, end.log_start_offset) == (3, 10, 0)
    for question, may_lead, code in [
        (Question(TOPIC, 0, FOLLOWER, 2, 3), True, ErrorCode.FENCED_LEADER_EPOCH),
        (Question(TOPIC, 0, 9, 3, 3), True, ErrorCode.NOT_LEADER_OR_FOLLOWER),
        (Question(TOPIC, 0, FOLLOWER, 3, 3), False, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    ]:
        with pytest.raises(HeadwaterError) as refused:
            epoch_end(partition, question, node_id=LEADER, may_lead=may_lead)
        assert refused.value.code is code, question
