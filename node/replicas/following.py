"""One replica following one leadership, as steps without I/O.

A replica that follows ``leader_id`` at ``leader_epoch`` first truncates its log to where
it agrees with the leader's (``FollowerTruncation``: the questions to ask, the cut each
answer makes), then fetches from where its log ends, appending what arrives and taking
the leader's high watermark. ``Following`` holds that progress for one partition; the
node's fetcher (``headwater.node.replicas.follower_fetcher``) sends the questions and fetches over
gRPC, the simulated cluster (``tests/sim_cluster.py``) over its simulated network, and
both act on the answers through it, so the seeded fault search runs this code.

Rules, each kept here:

- a fetch answer is acted on only while the replica is ready (truncated for this
  leadership) and still follows this leader at this epoch
  (``Partition.check_following``); anything else is dropped;
- a failed fetch, or an append that fails, sends the replica back to truncation: the
  leader may have changed its log since, and fetching resumes only after the logs agree
  again;
- a truncation exchange that fails (refused, or past its rounds) starts over from the
  replica's latest epoch.
"""

from __future__ import annotations

from headwater.node.replicas.follower_truncation import Cut, FollowerTruncation
from headwater.node.replicas.partition import Partition
from headwater.shared.errors import ErrorCode, HeadwaterError


class Following:
    """``partition`` following ``leader_id`` at ``leader_epoch`` (module doc): while not
    ``ready``, ``question()`` and ``answer(...)``; once ready, ``fetch_offset``,
    ``fetch_answered(...)`` and, for records it allows, ``appended(...)`` or
    ``truncate_again()``."""

    def __init__(self, partition: Partition, leader_id: int, leader_epoch: int) -> None:
        self.partition = partition
        self.leader_id = leader_id
        self.leader_epoch = leader_epoch
        self.ready = False
        self._truncation: FollowerTruncation | None = None

    def is_for(self, partition: Partition, leader_id: int, leader_epoch: int) -> bool:
        """Are these the steps of ``partition`` following ``leader_id`` at
        ``leader_epoch``? A driver starts new steps for anything else (a new leadership,
        or a replica reopened as a new ``Partition``)."""
        return (
            self.partition is partition
            and self.leader_id == leader_id
            and self.leader_epoch == leader_epoch
        )

    def begin_truncation(self) -> None:
        """Start the truncation exchange afresh (a driver that lost the previous one)."""
        self.ready = False
        self._truncation = FollowerTruncation(self.partition, self.leader_id, self.leader_epoch)

    def question(self) -> int:
        """The epoch to ask the leader the end offset of (OffsetForLeaderEpoch). Raises
        as ``FollowerTruncation.question`` does, and the exchange then starts over."""
        if self._truncation is None:
            self.begin_truncation()
        assert self._truncation is not None
        try:
            return self._truncation.question()
        except HeadwaterError:
            self._truncation = None
            raise

    def answer(self, epoch: int, end_offset: int, log_start_offset: int, now_ms: int) -> Cut:
        """Act on the leader's answer to the last ``question()``; once the logs agree the
        replica is ready to fetch. A refusal (``FollowerTruncation.answer``) ends the
        exchange: the next question starts over."""
        truncation = self._truncation
        if truncation is None:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{self.partition.topic}-{self.partition.index}: an answer to no question",
            )
        try:
            cut = truncation.answer(epoch, end_offset, log_start_offset, now_ms)
        except HeadwaterError:
            self._truncation = None
            raise
        if cut.done:
            self.ready = True
            self._truncation = None
        return cut

    @property
    def fetch_offset(self) -> int:
        """Where the next fetch reads from: the end of this replica's log."""
        return self.partition.log.log_end_offset

    def fetch_answered(self, failed: bool) -> bool:
        """A fetch answer arrived (``failed``: an error instead of records). True when its
        records may be appended now; False when the answer is dropped (not ready, or no
        longer following this leadership) or, for a failure, when the replica goes back
        to truncation."""
        if not self.ready:
            return False
        try:
            self.partition.check_following(self.leader_id, self.leader_epoch)
        except HeadwaterError:
            return False
        if failed:
            self.ready = False
            return False
        return True

    def appended(self, high_watermark: int) -> None:
        """The records of an allowed answer were appended (or there were none): take the
        leader's high watermark it carried."""
        self.partition.follower_high_watermark(high_watermark)

    def truncate_again(self) -> None:
        """The append of an allowed answer failed, or the fetch session it was in ended:
        truncate again before fetching."""
        self.ready = False
