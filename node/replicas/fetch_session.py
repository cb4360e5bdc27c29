"""A leader's fetch session with one follower, as steps without I/O.

A follower keeps one session per leader (the node's ``ReplicaService.Fetch`` stream). Each
request it sends reports the partitions whose position moved (``FetchPosition``: topic,
partition, the leader epoch it follows, its log end offset) and those it stopped
following; the leader answers it once, with data and high watermarks
(``ReplicaData``) or a refusal per partition (``ReplicaRefusal``). ``FetchSession`` holds
what the leader knows of the session between requests and decides each step:

- ``take`` a request: each position passes the replica checks (``replica_checks``: the
  node may lead, the follower's registration is current, the leader epoch is exactly the
  partition's, the follower is a replica, the offset is not past the log end) before it
  counts as the follower's progress (``Partition.on_follower_fetch``, which moves the high
  watermark); a refused position leaves the session. At most every
  ``SESSION_REFRESH_MS`` the partitions the request does not name count as fetched again
  at their last reported position: silence means "still there", so an idle follower that
  caught up stays eligible for the ISR.
- ``collect`` an answer: for each partition, the stored batches past the follower's
  position (up to the byte budget, at least one batch), or news of a high watermark the
  follower has not been sent (only ``with_news``: news alone waits a little for data to
  travel with), or a refusal once the partition can no longer be served at the epoch the
  follower named (closed, or its leadership moved on).

Invariants: the leader learns that a follower *has* records only from a position the
follower reported, never from having sent them; no position is counted unless it passed
every replica check at the moment it was taken; a partition in the session is served
only at the leader epoch its position named. The node drives this over gRPC and the
simulated cluster (``tests/sim_cluster.py``) over its virtual network, so the seeded fault
search runs these steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from headwater.node.replicas.replica_checks import (
    fetch_position_error,
    leader_partition,
    stale_registration,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

if TYPE_CHECKING:
    from headwater.node.replicas.partition import Partition
    from headwater.raft.metadata.image import MetadataImage

# How often a session counts the partitions a request does not name as fetched again
# (``FetchSession.take``); well within replica_lag_ms_max.
SESSION_REFRESH_MS: Final = 1000

Key = tuple[str, int]


class FetchPosition(Protocol):
    """A follower's position in one partition, as a request reports it."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...
    @property
    def fetch_offset(self) -> int: ...


class PartitionRef(Protocol):
    """A partition a follower no longer follows from this leader."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...


@dataclass(frozen=True, slots=True)
class ReplicaData:
    """One partition's part of an answer: stored batches from the follower's position
    (``records``, possibly empty: news of the high watermark alone) and the leader's
    offsets."""

    topic: str
    partition: int
    records: bytes
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


@dataclass(frozen=True, slots=True)
class ReplicaRefusal:
    """One partition refused: it has left the session."""

    topic: str
    partition: int
    error: HeadwaterError


class EpochQuestion(Protocol):
    """A follower asks where ``leader_epoch`` ends in the log of a leader it follows at
    ``current_leader_epoch`` (``OffsetForLeaderEpoch``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def replica_id(self) -> int: ...
    @property
    def current_leader_epoch(self) -> int: ...
    @property
    def leader_epoch(self) -> int: ...


@dataclass(frozen=True, slots=True)
class EpochEnd:
    """The answer: the largest epoch of the leader's log not above the one asked, the
    offset where it ends, and the leader's log start."""

    leader_epoch: int
    end_offset: int
    log_start_offset: int


def epoch_end(
    partition: Partition | None, question: EpochQuestion, *, node_id: int, may_lead: bool
) -> EpochEnd:
    """Answer ``question`` from ``partition`` (this node's replica, None if not hosted)
    once the replica checks pass (``replica_checks.leader_partition``); raises their
    refusal otherwise."""
    leader = leader_partition(
        partition,
        question.topic,
        question.partition,
        question.current_leader_epoch,
        question.replica_id,
        node_id=node_id,
        may_lead=may_lead,
    )
    epoch, end_offset = leader.log.end_offset_for_epoch(question.leader_epoch)
    return EpochEnd(epoch, end_offset, leader.log.log_start_offset)


@dataclass(slots=True)
class _Entry:
    partition: Partition
    leader_epoch: int
    fetch_offset: int
    sent_high_watermark: int = -1


class FetchSession:
    """What node ``node_id``, as a leader, knows of one follower's fetch session.

    ``hosted`` finds this node's replica of a partition (None if not hosted);
    ``listener`` is registered on every partition in the session
    (``Partition.replica_listeners``) so the driver wakes when one has news, and removed
    when it leaves (``close`` removes it everywhere)."""

    def __init__(
        self,
        node_id: int,
        hosted: Callable[[str, int], Partition | None],
        listener: Callable[[], None],
    ) -> None:
        self.node_id = node_id
        self._hosted = hosted
        self._listener = listener
        self._entries: dict[Key, _Entry] = {}
        self._refreshed_ms: int | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def take(
        self,
        *,
        replica_id: int,
        broker_epoch: int,
        positions: Iterable[FetchPosition],
        removed: Iterable[PartitionRef],
        image: MetadataImage,
        may_lead: bool,
        now_ms: int,
    ) -> list[ReplicaRefusal]:
        """Take one request of follower ``replica_id`` (registered with ``broker_epoch``)
        at ``now_ms``; ``may_lead``: may this node act as a leader now. Returns the
        positions refused (each has left the session); the rest count as the follower's
        progress."""
        for ref in removed:
            self._drop((ref.topic, ref.partition))
        refusals = []
        reported = set()
        # The same for every position of the request: checked once.
        stale = stale_registration(image, replica_id, broker_epoch)
        for position in positions:
            key = (position.topic, position.partition)
            reported.add(key)
            error = stale
            if error is None:
                try:
                    partition = leader_partition(
                        self._hosted(position.topic, position.partition),
                        position.topic,
                        position.partition,
                        position.leader_epoch,
                        replica_id,
                        node_id=self.node_id,
                        may_lead=may_lead,
                    )
                except HeadwaterError as refused:
                    error = refused
                else:
                    error = fetch_position_error(partition, position.fetch_offset)
            if error is not None:
                self._drop(key)
                refusals.append(ReplicaRefusal(position.topic, position.partition, error))
                continue
            partition.on_follower_fetch(replica_id, position.fetch_offset, now_ms)
            old = self._entries.get(key)
            if old is not None and old.partition is not partition:
                old.partition.replica_listeners.discard(self._listener)
            partition.replica_listeners.add(self._listener)
            self._entries[key] = _Entry(
                partition,
                position.leader_epoch,
                position.fetch_offset,
                old.sent_high_watermark if old is not None else -1,
            )
        if not refusals and (
            self._refreshed_ms is None or now_ms - self._refreshed_ms >= SESSION_REFRESH_MS
        ):
            self._refreshed_ms = now_ms
            self._refresh(replica_id, reported, now_ms)
        return refusals

    def _refresh(self, replica_id: int, reported: set[Key], now_ms: int) -> None:
        """Count a request as a fetch of every partition of the session at the position
        the follower last reported (a follower reports a partition only when its position
        moves, so silence means "still there"). Without this, a follower that caught up and
        then sat idle had "not fetched" for longer than ``replica_lag_ms_max`` and was
        never proposed for the ISR again: an idle partition whose acks=all writes are
        refused below ``min_insync_replicas`` stayed so until a leader change."""
        for key, entry in self._entries.items():
            partition = entry.partition
            if (
                key not in reported
                and partition.is_leader
                and partition.leader_epoch == entry.leader_epoch
            ):
                partition.on_follower_fetch(replica_id, entry.fetch_offset, now_ms)

    def collect(
        self, budget: int, *, with_news: bool
    ) -> tuple[list[ReplicaData | ReplicaRefusal], bool]:
        """One answer: the data of the session (up to ``budget`` bytes, at least one
        batch) with each partition's high watermark; partitions that can no longer be
        served leave the session with a refusal. High watermark news alone (no data) is
        answered only ``with_news``. Returns the answer's parts (empty: nothing to say
        yet) and whether news was left out."""
        parts: list[ReplicaData | ReplicaRefusal] = []
        news_pending = False
        for key, entry in list(self._entries.items()):
            partition = entry.partition
            try:
                partition.check_open()
                if not partition.is_leader or partition.leader_epoch != entry.leader_epoch:
                    raise HeadwaterError(
                        ErrorCode.FENCED_LEADER_EPOCH,
                        f"{key[0]}-{key[1]}: leadership moved on (epoch {partition.leader_epoch})",
                    )
                log = partition.log
                if entry.fetch_offset < log.log_end_offset and budget > 0:
                    records = partition.read_for_replica(entry.fetch_offset, budget).data
                    budget -= len(records)
                elif entry.sent_high_watermark == partition.high_watermark:
                    continue
                elif with_news:
                    records = b""
                else:
                    news_pending = True
                    continue
            except HeadwaterError as error:
                self._drop(key)
                parts.append(ReplicaRefusal(key[0], key[1], error))
                continue
            entry.sent_high_watermark = partition.high_watermark
            parts.append(
                ReplicaData(
                    key[0],
                    key[1],
                    records,
                    partition.high_watermark,
                    log.log_start_offset,
                    log.log_end_offset,
                )
            )
        return parts, news_pending

    def close(self) -> None:
        """The session ended: no partition wakes its driver any more."""
        for entry in self._entries.values():
            entry.partition.replica_listeners.discard(self._listener)
        self._entries.clear()

    def _drop(self, key: Key) -> None:
        gone = self._entries.pop(key, None)
        if gone is not None:
            gone.partition.replica_listeners.discard(self._listener)
