"""Which ISR changes a partition leader asks the controller for, and what it does with the
answers (pure: the time comes in as arguments, the requests go out as values).

``ReplicaManager`` (gRPC, every ``ISR_CHECK_MS``) and the simulated cluster
(``tests/sim_cluster.py``, on a virtual clock) drive the same object:

- ``due`` returns the requests to send now. For each partition this node leads: a request
  whose outcome is unknown (no answer yet, or one that did not say what was committed) is
  sent again, the same, never another change, until an answer says what was committed; a
  request the partition has moved past (a newer leader or partition epoch) is dropped,
  since it can never commit. Otherwise the wanted ISR is the current one less followers
  that fell behind (``replication.isr_after_shrink``), or, when none did, plus followers
  that caught up (``replication.isr_after_expand``) and may join (``may_join``). A new
  request makes the partition count the joining followers towards its high watermark
  from the moment of asking (``Partition.expect_isr``).
- ``answered`` takes the controller's answer: the committed state is taken at once
  (``Partition.take_committed_state``); a refusal (``ISR_CHANGE_REFUSALS``: no copy of
  the request can commit) stops the joining followers counting; any other failure leaves
  the outcome unknown, and the same request goes out again after ``ALTER_RETRY_MS``.

Thread-safety: one caller at a time (the node's event loop, or the simulation).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from headwater.node.replicas import replication
from headwater.node.replicas.partition import Partition
from headwater.raft.metadata.image import MetadataImage, PartitionState
from headwater.shared.errors import ErrorCode, HeadwaterError

ISR_CHECK_MS: Final = 250
ALTER_RETRY_MS: Final = 2000
# Answers to AlterPartition that mean the change was not, and will not be, committed.
# (A timeout, an unreachable controller or NOT_CONTROLLER leaves the outcome unknown: a
# controller that lost its term mid-proposal may still see it committed by the next.)
ISR_CHANGE_REFUSALS: Final = frozenset(
    {
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.PARTITION_OUT_OF_RANGE,
        ErrorCode.STALE_BROKER_EPOCH,
    }
)
Key = tuple[str, int]


@dataclass(frozen=True, eq=False, slots=True)
class IsrRequest:
    """One AlterPartition request: ``isr`` asked of the partition as ``made_at`` showed it.
    Compared by identity: a resend is a new copy, and only the latest copy's answer (or
    refusal) resolves the request."""

    partition: Partition
    made_at: PartitionState
    isr: tuple[int, ...]

    @property
    def key(self) -> Key:
        return (self.partition.topic, self.partition.index)

    @property
    def shrink(self) -> bool:
        return len(self.isr) < len(self.made_at.isr)


class IsrProposals:
    def __init__(self, node_id: int, lag_ms_max: int) -> None:
        self.node_id = node_id
        self.lag_ms_max = lag_ms_max
        self._unresolved: dict[Key, IsrRequest] = {}
        self._next_ask_ms: dict[Key, int] = {}  # on the caller's monotonic clock
        self._fenced_since: dict[int, int] = {}

    def due(
        self,
        image: MetadataImage,
        partitions: Iterable[Partition],
        now_ms: int,
        clock_ms: int,
    ) -> list[IsrRequest]:
        """The requests to send now. ``now_ms`` is the clock of follower progress
        (``Partition.followers``); ``clock_ms`` a monotonic clock for retry pauses."""
        self._note_fenced(image, now_ms)
        requests = []
        for partition in partitions:
            state = partition.state
            if not partition.is_leader or state is None:
                continue
            key = (partition.topic, partition.index)
            if clock_ms < self._next_ask_ms.get(key, 0):
                continue
            unresolved = self._unresolved.get(key)
            if unresolved is not None:
                made_at = unresolved.made_at
                if (
                    unresolved.partition is partition
                    and made_at.leader_epoch == state.leader_epoch
                    and made_at.partition_epoch >= state.partition_epoch
                ):
                    # Its outcome is unknown: ask the same again, never another change,
                    # until an answer says what was committed. Each copy is its own
                    # request: only the latest copy's answer resolves it.
                    self._next_ask_ms[key] = clock_ms + ALTER_RETRY_MS
                    again = IsrRequest(partition, made_at, unresolved.isr)
                    self._unresolved[key] = again
                    requests.append(again)
                    continue
                del self._unresolved[key]  # the partition moved on: it can never commit
            wanted = self._wanted(image, partition, state, now_ms)
            if wanted == state.isr:
                continue
            self._next_ask_ms[key] = clock_ms + ALTER_RETRY_MS
            partition.expect_isr(wanted)
            request = IsrRequest(partition, state, wanted)
            self._unresolved[key] = request
            requests.append(request)
        return requests

    def _wanted(
        self, image: MetadataImage, partition: Partition, state: PartitionState, now_ms: int
    ) -> tuple[int, ...]:
        end = partition.log.log_end_offset
        wanted = replication.isr_after_shrink(
            self.node_id, state.isr, partition.followers, end, now_ms, self.lag_ms_max
        )
        if wanted != state.isr:
            return wanted
        wanted = replication.isr_after_expand(
            self.node_id,
            state.replicas,
            state.isr,
            partition.followers,
            partition.high_watermark,
            partition.epoch_start_offset,
            now_ms,
            self.lag_ms_max,
        )
        return tuple(
            b
            for b in wanted
            if b in state.isr or self._may_join(image, b, partition.followers.get(b))
        )

    def _note_fenced(self, image: MetadataImage, now_ms: int) -> None:
        """Remember when this node's image first showed each broker not live."""
        for broker_id, broker in image.brokers.items():
            if broker.live:
                self._fenced_since.pop(broker_id, None)
            else:
                self._fenced_since.setdefault(broker_id, now_ms)

    def _may_join(
        self, image: MetadataImage, broker_id: int, progress: replication.FollowerProgress | None
    ) -> bool:
        """Is a caught-up follower worth proposing for the ISR? A live broker is. So is one
        this node's image shows fenced but that has fetched since the image first showed
        it: the image may be behind the controller's (the broker was unfenced since), and
        the controller decides. A follower that has not fetched since it was fenced (a
        dead broker's last fetch) is not."""
        broker = image.brokers.get(broker_id)
        if broker is None:
            return False
        if broker.live:
            return True
        fenced_since = self._fenced_since.get(broker_id)
        return (
            progress is not None
            and fenced_since is not None
            and (progress.last_fetch_ms > fenced_since)
        )

    def answered(
        self,
        request: IsrRequest,
        committed: PartitionState | None,
        error: HeadwaterError | None,
        clock_ms: int,
    ) -> bool:
        """Take the controller's answer to ``request``: the committed state, or the error
        the call failed with. Returns whether the committed state changed the ISR."""
        key = request.key
        partition = request.partition
        if committed is None:
            assert error is not None
            if error.code in ISR_CHANGE_REFUSALS:
                # Refused for good (no copy of it can commit): the joining followers stop
                # counting towards the high watermark. Otherwise the outcome is unknown:
                # they keep counting, and the same request is made again (``due``).
                if self._unresolved.get(key) is request:
                    del self._unresolved[key]
                if partition.state is request.made_at:
                    partition.expect_isr(None)
            return False
        if self._unresolved.get(key) is request:
            del self._unresolved[key]
        # Taken now: this node's image may lag behind the controller's, or stand still.
        partition.take_committed_state(committed)
        # Joining brokers the controller does not consider live were left out: ask again
        # after a pause, not on the next check.
        left_out = not set(request.isr) <= set(committed.isr)
        self._next_ask_ms[key] = clock_ms + (ALTER_RETRY_MS if left_out else ISR_CHECK_MS)
        return committed.isr != request.made_at.isr
