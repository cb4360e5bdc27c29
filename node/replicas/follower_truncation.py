"""A follower's truncation against its leader, as steps without I/O.

When a replica starts following a leader at a leader epoch it asks that leader, round by
round, where its own latest epoch ends in the leader's log (OffsetForLeaderEpoch) and
cuts its log to where the two agree (KIP-101 as amended by KIP-279:
``replication.truncation_step``); once they agree it moves to the leader's log start if
its log ends before it. ``FollowerTruncation`` holds that exchange for one partition and
one leadership: ``question()`` is the epoch to ask about, ``answer(...)`` acts on what
the leader said. The node's fetcher (``headwater.node.replicas.follower_fetcher``) sends the
questions over gRPC; the simulated cluster (``tests/sim_cluster.py``) over its simulated
network, so the seeded fault search runs this code, not a copy of it.

Invariants, each checked here for every answer:

- an answer is acted on only while the replica still follows that leader at that epoch
  (``Partition.check_following``): a leader deposed since it was asked (a paused node
  that answers on waking) cuts nothing;
- the leader answers about the epoch asked or an older one, never a newer (a newer one
  is a broken leader: UNKNOWN_SERVER_ERROR, nothing cut);
- nothing below the high watermark is cut (``Partition.truncate_as_follower`` refuses);
- at most TRUNCATION_ROUNDS_MAX rounds (each moves to a strictly older epoch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from headwater.node.replicas import replication
from headwater.node.replicas.partition import Partition
from headwater.shared.errors import ErrorCode, HeadwaterError

TRUNCATION_ROUNDS_MAX: Final = 64
NOT_ASKED: Final = -2
"""``FollowerTruncation.asked`` before the first question."""


@dataclass(frozen=True, slots=True)
class Cut:
    """What one answer did: ``done`` when the logs agree (fetching may start), the log
    end offset ``before`` and ``after`` it."""

    done: bool
    before: int
    after: int


class FollowerTruncation:
    """The truncation exchange of ``partition`` with ``leader_id`` at ``leader_epoch``
    (module docstring): ``question()``, send it, ``answer(...)``, until a Cut is done."""

    def __init__(self, partition: Partition, leader_id: int, leader_epoch: int) -> None:
        self.partition = partition
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.rounds = 0
        self.asked = NOT_ASKED

    @property
    def name(self) -> str:
        return f"{self.partition.topic}-{self.partition.index}"

    def question(self) -> int:
        """The epoch to ask the leader the end offset of: this replica's latest (-1 for
        none). UNKNOWN_SERVER_ERROR once TRUNCATION_ROUNDS_MAX rounds went by."""
        if self.rounds >= TRUNCATION_ROUNDS_MAX:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{self.name}: no agreement with node {self.leader_id} after "
                f"{TRUNCATION_ROUNDS_MAX} rounds of OffsetForLeaderEpoch",
            )
        self.rounds += 1
        self.asked = self.partition.log.latest_epoch
        return self.asked

    def answer(self, epoch: int, end_offset: int, log_start_offset: int, now_ms: int) -> Cut:
        """Act on the leader's answer to the last ``question()``: its epoch and where that
        epoch ends, and its log start offset. FENCED_LEADER_EPOCH when the replica no
        longer follows this leadership; the other refusals are in the module docstring."""
        partition = self.partition
        partition.check_following(self.leader_id, self.leader_epoch)
        if self.asked == NOT_ASKED:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR, f"{self.name}: an answer to no question"
            )
        if epoch > self.asked:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{self.name}: node {self.leader_id} answered epoch {epoch} to a question "
                f"about epoch {self.asked}",
            )
        log = partition.log
        before = log.log_end_offset
        if self.asked < 0 and log.log_end_offset == log.log_start_offset:
            done, after = True, before  # an empty log has nothing to cut
        else:
            step = replication.truncation_step(
                log.end_offset_for_epoch,
                log.log_end_offset,
                partition.high_watermark,
                epoch,
                end_offset,
            )
            after = partition.truncate_as_follower(
                self.leader_id, self.leader_epoch, step.offset, now_ms
            )
            done = step.done
        if done and log.log_end_offset < log_start_offset:
            log.reset_to(log_start_offset, now_ms)
        return Cut(done, before, after)
