"""A consumer group member's side of the heartbeat protocol (sans-I/O), for both consumer
engines. The protocol is described in ``proto/headwater/v1/headwater.proto`` (service
Groups) and docs/groups.md.

``Membership`` holds what the coordinator last said (member id, epoch, the partitions
the member may read) and what the consumer reads now (``owned``). The engine drives it:

- ``request()`` is the next ConsumerGroupHeartbeat; send it when ``due(now)`` or when
  ``owned`` changed; hand the answer to ``answered`` and errors to ``failed``;
- between polls, ``to_revoke()`` are partitions the consumer must stop reading (commit
  them, call ``on_revoked``, then ``released``), and ``to_assign()`` partitions it may
  start reading (look up their committed offsets, call ``on_assigned``, then ``taken``);
- after ``failed`` with UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH, ``lost()`` is true and
  no heartbeat is due: the consumer stops reading every partition without committing
  (``on_lost``) and calls ``forget_owned``; only then does the next heartbeat join again,
  so a commit can never carry a new membership's identity for an old one's partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.topics import check_group_id
from headwater.v1 import headwater_pb2 as pb

JOIN_EPOCH: Final = 0
LEAVE_EPOCH: Final = -1
STATIC_LEAVE_EPOCH: Final = -2
FENCING_ERRORS: Final = frozenset({ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH})
RETRY_HEARTBEAT_S: Final = 0.1
SESSION_EXPIRED: Final = HeadwaterError(
    ErrorCode.FENCED_MEMBER_EPOCH,
    "no heartbeat succeeded for the session timeout: the partitions may be another "
    "member's; joining again",
)
"""What ``failed`` is told when ``session_expired``: fenced, keeping the member id (the
join that follows releases the old membership's partitions at once)."""


class RebalanceListener(Protocol):
    """Called from the thread that polls (the event loop for AsyncConsumer), between
    polls. ``on_revoked`` runs before the partitions are given up (their offsets are
    committed right after it under auto-commit); ``on_lost`` when they were taken away
    without a chance to commit (the member was fenced or timed out)."""

    def on_assigned(self, partitions: list[TopicPartition]) -> None: ...

    def on_revoked(self, partitions: list[TopicPartition]) -> None: ...

    def on_lost(self, partitions: list[TopicPartition]) -> None: ...


@dataclass(frozen=True, slots=True)
class Subscription:
    group_id: str
    topics: tuple[str, ...] = ()
    pattern: str = ""
    instance_id: str = ""
    client_id: str = ""
    assignor: str = ""
    session_timeout_ms: int = 0
    rebalance_timeout_ms: int = 0


def subscription_of(
    group_id: str | None,
    topics: str | Sequence[str] | None,
    pattern: str | None,
    *,
    subscribed: bool,
    assigned: bool,
    instance_id: str = "",
    client_id: str = "",
    assignor: str = "",
    session_timeout_ms: int = 0,
    max_poll_interval_ms: int = 300_000,
) -> Subscription:
    """A checked Subscription for a consumer that is ``subscribed`` already or has
    ``assigned`` partitions (both refused: INVALID_REQUEST), or INVALID_CONFIG for an
    empty subscription or no group id (None: neither the consumer nor the call named
    one), INVALID_GROUP_ID for a bad group id."""
    if subscribed:
        raise HeadwaterError(ErrorCode.INVALID_REQUEST, "this consumer is already subscribed")
    if assigned:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            "this consumer has assigned partitions; subscribe() and assign() do not mix",
        )
    names = (topics,) if isinstance(topics, str) else tuple(topics or ())
    if not names and not pattern:
        raise HeadwaterError(
            ErrorCode.INVALID_CONFIG, "subscribe to at least one topic or a pattern"
        )
    if group_id is None:
        raise HeadwaterError(
            ErrorCode.INVALID_CONFIG,
            "a group subscription needs a group id: Consumer(..., group_id=...) or "
            "subscribe(..., group_id=...)",
        )
    check_group_id(group_id)
    return Subscription(
        group_id,
        tuple(sorted(set(names))),
        pattern or "",
        instance_id,
        client_id,
        assignor,
        session_timeout_ms,
        max_poll_interval_ms,
    )


def uncommitted(
    positions: Mapping[TopicPartition, int],
    last_committed: Mapping[TopicPartition, int],
    partitions: Iterable[TopicPartition] | None = None,
) -> dict[TopicPartition, int]:
    """The ``positions`` (of ``partitions``, or all) that differ from what was last
    committed: what a commit of the consumer's positions sends."""
    wanted = (
        positions if partitions is None else {p: positions[p] for p in partitions if p in positions}
    )
    return {p: o for p, o in wanted.items() if last_committed.get(p) != o}


def _partitions(items: Iterable[pb.TopicPartitions]) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(i.topic, p) for i in items for p in i.partitions)


def topic_partitions(partitions: Iterable[TopicPartition]) -> list[pb.TopicPartitions]:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return [pb.TopicPartitions(topic=t, partitions=p) for t, p in by_topic.items()]


class Membership:
    def __init__(self, subscription: Subscription, heartbeat_interval_s: float = 1.0) -> None:
        self.subscription = subscription
        self.member_id = ""
        self.member_epoch = JOIN_EPOCH
        self.assigned: frozenset[TopicPartition] = frozenset()
        """What the coordinator last said the member may read."""
        self.owned: frozenset[TopicPartition] = frozenset()
        """What the consumer reads now."""
        self.interval_s = heartbeat_interval_s
        self.next_heartbeat_s = 0.0
        self._lost = False
        self._forget_member = False
        self.session_timeout_s: float | None = None
        self._alive_since_s: float | None = None
        self._owned_changed = False  # since the last request() was built

    def due(self, now_s: float) -> bool:
        """Is a heartbeat due? Never while fenced and the consumer has not yet given its
        partitions up (``forget_owned``)."""
        return not self._lost and now_s >= self.next_heartbeat_s

    def request(self) -> pb.ConsumerGroupHeartbeatRequest:
        s = self.subscription
        self._owned_changed = False
        return pb.ConsumerGroupHeartbeatRequest(
            group_id=s.group_id,
            member_id=self.member_id,
            member_epoch=self.member_epoch,
            instance_id=s.instance_id,
            client_id=s.client_id,
            subscribed_topics=s.topics,
            subscribed_pattern=s.pattern,
            assignor=s.assignor,
            owned=topic_partitions(self.owned),
            session_timeout_ms=s.session_timeout_ms,
            rebalance_timeout_ms=s.rebalance_timeout_ms,
        )

    def leave_request(self) -> pb.ConsumerGroupHeartbeatRequest | None:
        """The heartbeat that leaves the group (None when not a member): -2 for a static
        member, which keeps its partitions for its session timeout."""
        if not self.member_id or self.member_epoch < JOIN_EPOCH:
            return None
        epoch = STATIC_LEAVE_EPOCH if self.subscription.instance_id else LEAVE_EPOCH
        return pb.ConsumerGroupHeartbeatRequest(
            group_id=self.subscription.group_id,
            member_id=self.member_id,
            member_epoch=epoch,
            instance_id=self.subscription.instance_id,
        )

    def answered(
        self, response: pb.ConsumerGroupHeartbeatResponse, now_s: float, sent_s: float
    ) -> None:
        """The answer to the heartbeat sent at ``sent_s``."""
        if response.member_epoch >= JOIN_EPOCH:
            self._alive_since_s = sent_s
            self.session_timeout_s = response.session_timeout_ms / 1000 or None
        self.member_id = response.member_id
        self.member_epoch = response.member_epoch
        self.assigned = _partitions(response.assignment)
        self.interval_s = max(response.heartbeat_interval_ms, 10) / 1000
        # Partitions released while the call was out are reported at once.
        self.next_heartbeat_s = now_s if self._owned_changed else now_s + self.interval_s

    def failed(self, error: HeadwaterError, now_s: float) -> None:
        """A heartbeat failed: fenced (``lost``: no heartbeat until the consumer gave its
        partitions up), or retried soon; other errors are the caller's to raise."""
        if error.code in FENCING_ERRORS:
            self._lost = True
            self._forget_member = error.code is ErrorCode.UNKNOWN_MEMBER_ID
        self.next_heartbeat_s = now_s + min(RETRY_HEARTBEAT_S, self.interval_s)

    def lost(self) -> bool:
        return self._lost

    def session_expired(self, now_s: float) -> bool:
        """Has no heartbeat succeeded for the session timeout, counted from when the last
        successful one was sent (so never later than the coordinator counts)? Then the
        coordinator may already have given the partitions away: stop reading them."""
        return (
            self.session_timeout_s is not None
            and self._alive_since_s is not None
            and bool(self.owned)
            and not self._lost
            and now_s - self._alive_since_s >= self.session_timeout_s
        )

    def forget_owned(self, now_s: float) -> list[TopicPartition]:
        """After a fencing: what the consumer must stop reading (without committing: its
        commits would be refused). The next heartbeat joins again. Until this is called
        the member id and epoch stay those of the fenced membership, so that nothing the
        consumer still holds is committed under a new one."""
        gone = sorted(self.owned)
        self.owned = frozenset()
        self.assigned = frozenset()
        self.member_epoch = JOIN_EPOCH
        if self._forget_member:
            self.member_id = ""
        self._lost = False
        self._alive_since_s = None
        self.next_heartbeat_s = now_s
        return gone

    def to_revoke(self) -> list[TopicPartition]:
        return sorted(self.owned - self.assigned)

    def to_assign(self) -> list[TopicPartition]:
        return sorted(self.assigned - self.owned)

    def released(self, partitions: Iterable[TopicPartition], now_s: float) -> None:
        self.owned = self.owned - frozenset(partitions)
        self._owned_changed = True
        self.next_heartbeat_s = now_s  # tell the coordinator at once: others wait for them

    def taken(self, partitions: Iterable[TopicPartition]) -> None:
        self.owned = self.owned | frozenset(partitions)
