"""The coordinator's decisions (pure): what a heartbeat, a commit, a deletion or an
expired session changes in a group, as the group records to append, and the answer.

Every function takes the groups image as the log has it (``headwater.node.groups.image``),
checks the request against it, and returns ``Decision(records, answer)``: the records,
applied in order with ``apply``, give the image after the request; the caller appends
them to the group's partition and answers once they are replicated. A request that is
refused raises HeadwaterError and changes nothing. Nothing here reads a clock or does
I/O: the time and the topics' partition counts come in as arguments.

The protocol is Kafka's KIP-848 (``ConsumerGroupHeartbeat``):

- a member joins with epoch 0; every change of membership or subscription, and every
  change of the subscribed topics' partition counts, raises the **group epoch**;
- when the group epoch passes the target assignment's, the assignor computes a new
  **target** (sticky: it starts from the previous target);
- each member is moved toward its target by ``reconcile``: partitions it must give up go
  to ``revoking`` first; once its heartbeat no longer reports them it takes its new
  partitions, and its **member epoch** becomes the target's. A partition another member
  still holds is given on a later heartbeat, once released.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Generic, TypeVar

import re2  # type: ignore[import-untyped]

from headwater.node.groups.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, reconcile
from headwater.node.groups.image import GroupsImage, GroupState, apply, apply_offsets
from headwater.node.groups.records import (
    ClassicGeneration,
    GroupDeleted,
    GroupEpochBumped,
    GroupRecord,
    GroupRecordError,
    MemberJoined,
    MemberLeft,
    OffsetCommitted,
    OffsetDeleted,
    TargetAssignment,
    TopicPartitionKey,
)
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.topics import INTERNAL_PREFIX, TOPIC_NAME_LENGTH_MAX, check_group_id

T = TypeVar("T")
JOIN_EPOCH: Final = 0
LEAVE_EPOCH: Final = -1
STATIC_LEAVE_EPOCH: Final = -2
ADMIN_MEMBER_EPOCH: Final = -1
"""OffsetCommit's member epoch from outside the group (with member id "")."""
OFFSET_METADATA_BYTES_MAX: Final = 4096
COMMIT_PARTITIONS_MAX: Final = 10_000
OWNED_PARTITIONS_MAX: Final = 100_000
"""Partitions one heartbeat may say its member owns (over either front)."""
COMMIT_METADATA_BYTES_MAX: Final = 1 << 20
PATTERN_LENGTH_MAX: Final = 1000
SUBSCRIBED_TOPICS_MAX: Final = 10_000
SUBSCRIPTION_BYTES_MAX: Final = 256 << 10
SESSION_TIMEOUT_RANGE_MS: Final = (1000, 1_800_000)
REBALANCE_TIMEOUT_RANGE_MS: Final = (1000, 3_600_000)
REBALANCE_TIMEOUT_DEFAULT_MS: Final = 300_000
ID_BYTES_MAX: Final = 255
"""Longest member id, instance id and client id."""


@dataclass(frozen=True, slots=True)
class Decision(Generic[T]):
    records: tuple[GroupRecord, ...]
    answer: T
    image: GroupsImage
    """The image after ``records`` (what ``apply`` gives, computed once)."""


@dataclass(frozen=True, slots=True)
class GroupLimits:
    members_max: int = 1000
    session_timeout_ms: int = 45_000


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A ConsumerGroupHeartbeat, checked for form (``check_heartbeat``)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str = ""
    client_id: str = ""
    client_host: str = ""
    subscribed_topics: tuple[str, ...] = ()
    subscribed_pattern: str = ""
    assignor: str = ""
    owned: frozenset[TopicPartitionKey] = frozenset()
    session_timeout_ms: int = 0
    rebalance_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    member_id: str
    member_epoch: int
    group_epoch: int
    assigned: tuple[TopicPartitionKey, ...]
    reconciling: bool
    """The member has partitions to take or give up (it should heartbeat again soon)."""
    session_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class CommitItem:
    topic: str
    partition: int
    offset: int
    metadata: str = ""
    leader_epoch: int = -1
    """The leader epoch of the record before ``offset`` as the client saw it (KIP-320;
    -1: not given), kept so a consumer resuming there can tell whether the log was
    truncated under it."""


def _error(code: ErrorCode, message: str) -> HeadwaterError:
    return HeadwaterError(code, message)


def compile_pattern(pattern: str) -> re2._Regexp:
    """The RE2 regular expression of a subscription (linear-time matching: a pattern
    cannot make the coordinator spin)."""
    if len(pattern) > PATTERN_LENGTH_MAX:
        raise _error(
            ErrorCode.INVALID_REGULAR_EXPRESSION,
            f"subscribed_pattern is {len(pattern)} characters; at most {PATTERN_LENGTH_MAX}",
        )
    try:
        return re2.compile(pattern)
    except re2.error as exc:
        raise _error(
            ErrorCode.INVALID_REGULAR_EXPRESSION,
            f"subscribed_pattern {pattern!r} is not a valid RE2 regular expression: {exc}",
        ) from None


def check_heartbeat(request: Heartbeat, limits: GroupLimits) -> Heartbeat:
    """``request`` with its defaults filled in; INVALID_REQUEST and the like naming the
    field and its valid range for anything out of bounds."""
    check_group_id(request.group_id)
    for name in ("member_id", "instance_id", "client_id", "client_host"):
        size = len(getattr(request, name).encode())
        if size > ID_BYTES_MAX:
            raise _error(
                ErrorCode.INVALID_REQUEST, f"{name} is {size} bytes; at most {ID_BYTES_MAX}"
            )
    if request.member_epoch < STATIC_LEAVE_EPOCH:
        raise _error(
            ErrorCode.INVALID_REQUEST,
            f"member_epoch is {request.member_epoch}; valid: 0 (join), -1 (leave), -2 "
            "(static leave) or the epoch of the last answer",
        )
    if request.member_epoch != JOIN_EPOCH and not request.member_id:
        raise _error(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"member_epoch {request.member_epoch} needs the member_id the join answered",
        )
    if request.member_epoch == STATIC_LEAVE_EPOCH and not request.instance_id:
        raise _error(
            ErrorCode.INVALID_REQUEST, "member_epoch -2 (static leave) needs an instance_id"
        )
    if len(request.subscribed_topics) > SUBSCRIBED_TOPICS_MAX:
        raise _error(
            ErrorCode.INVALID_REQUEST,
            f"{len(request.subscribed_topics)} subscribed topics; at most {SUBSCRIBED_TOPICS_MAX}",
        )
    names_bytes = sum(len(t) for t in request.subscribed_topics)
    if names_bytes > SUBSCRIPTION_BYTES_MAX:
        raise _error(
            ErrorCode.INVALID_REQUEST,
            f"the subscribed topic names hold {names_bytes} characters in all; at most "
            f"{SUBSCRIPTION_BYTES_MAX} (subscribe to a pattern instead)",
        )
    if request.member_epoch >= JOIN_EPOCH:
        if not request.subscribed_topics and not request.subscribed_pattern:
            raise _error(
                ErrorCode.INVALID_REQUEST,
                "the subscription is empty: name at least one topic or a pattern",
            )
        for topic in request.subscribed_topics:
            if not 1 <= len(topic) <= TOPIC_NAME_LENGTH_MAX:
                raise _error(
                    ErrorCode.INVALID_REQUEST,
                    f"a subscribed topic name is {len(topic)} characters; valid: 1 to "
                    f"{TOPIC_NAME_LENGTH_MAX}",
                )
        if request.subscribed_pattern:
            compile_pattern(request.subscribed_pattern)
    if request.assignor and request.assignor not in ASSIGNORS:
        raise _error(
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"assignor {request.assignor!r}; valid: {', '.join(sorted(ASSIGNORS))}",
        )
    session = request.session_timeout_ms or limits.session_timeout_ms
    rebalance = request.rebalance_timeout_ms or REBALANCE_TIMEOUT_DEFAULT_MS
    for name, value, (low, high) in (
        ("session_timeout_ms", session, SESSION_TIMEOUT_RANGE_MS),
        ("rebalance_timeout_ms", rebalance, REBALANCE_TIMEOUT_RANGE_MS),
    ):
        if not low <= value <= high:
            raise _error(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"{name} is {value}; valid range is [{low}, {high}] (0: the default)",
            )
    return replace(
        request,
        subscribed_topics=tuple(sorted(set(request.subscribed_topics))),
        session_timeout_ms=session,
        rebalance_timeout_ms=rebalance,
    )


class _Changes:
    """Records applied one by one to a working image (``apply`` checks each)."""

    def __init__(self, image: GroupsImage, group_id: str) -> None:
        self.image = image
        self.group_id = group_id
        self.records: list[GroupRecord] = []

    @property
    def group(self) -> GroupState:
        return self.image.group(self.group_id) or GroupState(self.group_id)

    def add(self, record: GroupRecord) -> None:
        try:
            self.image = apply(self.image, record)
        except GroupRecordError as exc:  # a decision that breaks an invariant is a bug
            raise HeadwaterError(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)) from exc
        self.records.append(record)

    def bump(self) -> None:
        self.add(GroupEpochBumped(self.group_id, self.group.epoch + 1))

    def add_offsets(self, records: list[OffsetCommitted]) -> None:
        self.image = apply_offsets(self.image, records)
        self.records += records

    def decision(self, answer: T) -> Decision[T]:
        return Decision(tuple(self.records), answer, self.image)


def subscribed_partitions(
    member: MemberJoined, partition_counts: Mapping[str, int]
) -> frozenset[str]:
    """The topics ``member`` subscribes to that exist (named, or matching its pattern;
    internal topics never match a pattern)."""
    topics = {t for t in member.subscribed_topics if t in partition_counts}
    if member.subscribed_pattern:
        pattern = compile_pattern(member.subscribed_pattern)
        topics |= {
            t
            for t in partition_counts
            if not t.startswith(INTERNAL_PREFIX) and pattern.fullmatch(t)
        }
    return frozenset(topics)


def group_assignor(group: GroupState) -> str:
    """The assignor most members ask for (ties: by name), else the default."""
    votes: dict[str, int] = {}
    for member in group.members.values():
        if member.assignor:
            votes[member.assignor] = votes.get(member.assignor, 0) + 1
    if not votes:
        return DEFAULT_ASSIGNOR
    return min(votes, key=lambda name: (-votes[name], name))


def _target_fits(
    group: GroupState, subscriptions: Mapping[str, frozenset[str]], counts: Mapping[str, int]
) -> bool:
    """Does the target still cover exactly the partitions the subscriptions name, each
    with a member that subscribes to its topic?"""
    if set(group.target) != set(group.members):
        return False
    wanted = {(t, p) for topics in subscriptions.values() for t in topics for p in range(counts[t])}
    covered: set[TopicPartitionKey] = set()
    for member_id, partitions in group.target.items():
        for topic, _ in partitions:
            if topic not in subscriptions.get(member_id, ()):
                return False
        covered |= partitions
    return covered == wanted


def _update_target(changes: _Changes, counts: Mapping[str, int], check_fit: bool) -> None:
    """Compute a new target when the group epoch is past it. With ``check_fit``, first
    bump the epoch when the topics changed under the target (a pattern matches a new
    topic, partitions were added): that costs a pass over every member's subscription,
    so heartbeats leave it to the coordinator's timer (``stale_targets``), which runs it
    when the metadata changes."""
    group = changes.group
    if not group.members:
        return
    if not check_fit and group.epoch == group.target_epoch > 0:
        return
    subscriptions = {m: subscribed_partitions(j, counts) for m, j in group.members.items()}
    if group.target_epoch == group.epoch and not _target_fits(group, subscriptions, counts):
        changes.bump()
        group = changes.group
    if group.target_epoch == group.epoch and group.target_epoch > 0:
        return
    used = {t: counts[t] for topics in subscriptions.values() for t in topics}
    assignor = ASSIGNORS[group_assignor(group)]
    target = assignor(subscriptions, used, group.target)
    changes.add(
        TargetAssignment(
            group.group_id,
            group.epoch,
            tuple((m, tuple(sorted(target.get(m, frozenset())))) for m in sorted(group.members)),
        )
    )


def heartbeat(
    image: GroupsImage,
    request: Heartbeat,
    partition_counts: Mapping[str, int],
    new_member_id: str,
    limits: GroupLimits,
) -> Decision[HeartbeatAnswer]:
    """Decide a ConsumerGroupHeartbeat (already ``check_heartbeat``-ed).
    ``partition_counts``: every topic's partition count; ``new_member_id``: the id a
    joining member without one gets."""
    changes = _Changes(image, request.group_id)
    group = changes.group
    member_id = request.member_id
    if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
        if member_id not in group.members:
            return changes.decision(
                HeartbeatAnswer(member_id, request.member_epoch, group.epoch, (), False)
            )
        if request.member_epoch == LEAVE_EPOCH:
            changes.add(MemberLeft(group.group_id, member_id))
            changes.bump()
            _update_target(changes, partition_counts, check_fit=False)
        else:
            # A static leave keeps the member's place and partitions until its instance
            # comes back or its session runs out, and frees its instance id.
            changes.add(replace(group.members[member_id], released=True))
        return changes.decision(
            HeartbeatAnswer(member_id, request.member_epoch, changes.group.epoch, (), False)
        )
    if request.member_epoch == JOIN_EPOCH:
        member_id = _join(changes, request, new_member_id, limits)
    else:
        _check_member(group, member_id, request.member_epoch, request.owned)
        _maybe_resubscribe(changes, request)
    _update_target(changes, partition_counts, check_fit=False)
    group = changes.group
    current = group.current.get(member_id)
    owned = request.owned if request.member_epoch != JOIN_EPOCH else frozenset()
    if current is not None and request.member_epoch == JOIN_EPOCH:
        owned = frozenset(current.assigned)  # a static member's new incarnation keeps these
    following = reconcile(group, member_id, owned)
    if following != current:
        changes.add(following)
    group = changes.group
    reconciling = (
        bool(following.revoking)
        or following.member_epoch < group.target_epoch
        or set(following.assigned) != set(group.target.get(member_id, frozenset()))
    )
    return changes.decision(
        HeartbeatAnswer(
            member_id,
            following.member_epoch,
            group.epoch,
            following.assigned,
            reconciling,
            group.members[member_id].session_timeout_ms,
        ),
    )


def _joined(request: Heartbeat, member_id: str, joined_epoch: int) -> MemberJoined:
    return MemberJoined(
        request.group_id,
        member_id,
        request.instance_id,
        request.client_id,
        request.subscribed_topics,
        request.subscribed_pattern,
        request.session_timeout_ms,
        request.rebalance_timeout_ms,
        request.assignor,
        joined_epoch,
        request.client_host,
    )


def _join(changes: _Changes, request: Heartbeat, new_member_id: str, limits: GroupLimits) -> str:
    """Add the member (a static member takes its instance's place); its id."""
    group = changes.group
    if request.instance_id:
        previous = next(
            (m for m in group.members.values() if m.instance_id == request.instance_id), None
        )
        if previous is not None and not previous.released:
            raise _error(
                ErrorCode.UNRELEASED_INSTANCE_ID,
                f"instance id {request.instance_id!r} is held by member "
                f"{previous.member_id!r}, which has not left (a static leave frees it; "
                "otherwise it is free once that member's session ends)",
            )
        if previous is not None:
            return _replace_static(changes, previous, request, new_member_id)
    member_id = request.member_id or new_member_id
    if member_id in group.members:
        # The member lost its place (its epoch was fenced) and joins again: it starts over.
        changes.add(MemberLeft(group.group_id, member_id))
    elif len(group.members) >= limits.members_max:
        raise _error(
            ErrorCode.GROUP_MAX_SIZE_REACHED,
            f"group {group.group_id!r} has {len(group.members)} members; at most "
            f"{limits.members_max} (group_members_max)",
        )
    changes.add(_joined(request, member_id, changes.group.epoch + 1))
    changes.bump()
    return member_id


def _replace_static(
    changes: _Changes, previous: MemberJoined, request: Heartbeat, new_member_id: str
) -> str:
    """A static member's new incarnation takes over its predecessor's id-less place: the
    target and the current assignment move to the new member id, with no new epoch."""
    group = changes.group
    member_id = request.member_id or new_member_id
    if member_id == previous.member_id:
        member_id = new_member_id
    current = group.current.get(previous.member_id)
    target = group.target.get(previous.member_id, frozenset())
    changes.add(MemberLeft(group.group_id, previous.member_id))
    changes.add(_joined(request, member_id, previous.joined_epoch))
    if group.target_epoch > 0:
        changes.add(
            TargetAssignment(
                group.group_id,
                group.target_epoch,
                tuple(
                    sorted(
                        (member_id if m == previous.member_id else m, tuple(sorted(p)))
                        for m, p in {**group.target, member_id: target}.items()
                        if m != previous.member_id
                    )
                ),
            )
        )
    if current is not None:
        changes.add(replace(current, member_id=member_id))
    if previous.subscribed_topics != request.subscribed_topics or (
        previous.subscribed_pattern != request.subscribed_pattern
    ):
        changes.bump()
    return member_id


def _check_member(
    group: GroupState, member_id: str, epoch: int, owned: frozenset[TopicPartitionKey]
) -> None:
    """A heartbeat from a member of the group at its epoch, or at an older one when what
    it owns is all still its own (KIP-848: the answer to its last heartbeat was lost, and
    it sends that heartbeat again); anything else is fenced."""
    if member_id not in group.members:
        raise _error(
            ErrorCode.UNKNOWN_MEMBER_ID,
            f"member {member_id!r} is not in group {group.group_id!r} (it left or its "
            "session expired); join again with member_epoch 0",
        )
    current = group.current.get(member_id)
    known = current.member_epoch if current is not None else 0
    held = set(current.assigned) | set(current.revoking) if current is not None else set()
    earlier_incarnation = epoch < group.members[member_id].joined_epoch
    if epoch > known or (epoch < known and (earlier_incarnation or not owned <= held)):
        raise _error(
            ErrorCode.FENCED_MEMBER_EPOCH,
            f"member {member_id!r} sent epoch {epoch}; the coordinator has {known}: give up "
            "every partition and join again with member_epoch 0",
        )


def _maybe_resubscribe(changes: _Changes, request: Heartbeat) -> None:
    joined = changes.group.members[request.member_id]
    fresh = _joined(request, request.member_id, joined.joined_epoch)
    fresh = replace(fresh, instance_id=joined.instance_id)
    if fresh == joined:
        return
    changes.add(fresh)
    if (joined.subscribed_topics, joined.subscribed_pattern, joined.assignor) != (
        fresh.subscribed_topics,
        fresh.subscribed_pattern,
        fresh.assignor,
    ):
        changes.bump()


def remove_members(
    image: GroupsImage,
    group_id: str,
    member_ids: Sequence[str],
    partition_counts: Mapping[str, int],
) -> Decision[None]:
    """Members whose session or rebalance timeout ran out leave the group."""
    changes = _Changes(image, group_id)
    gone = [m for m in member_ids if m in changes.group.members]
    if not gone:
        return changes.decision(None)
    for member_id in gone:
        changes.add(MemberLeft(group_id, member_id))
    changes.bump()
    _update_target(changes, partition_counts, check_fit=False)
    return changes.decision(None)


def refresh_target(
    image: GroupsImage, group_id: str, partition_counts: Mapping[str, int]
) -> Decision[None]:
    """A new target when the subscribed topics changed under the group (created,
    deleted, partitions added)."""
    changes = _Changes(image, group_id)
    _update_target(changes, partition_counts, check_fit=True)
    return changes.decision(None)


def commit_offsets(
    image: GroupsImage,
    group_id: str,
    member_id: str,
    member_epoch: int,
    items: Sequence[CommitItem],
    partition_counts: Mapping[str, int],
    now_ms: int,
    classic_member: bool = False,
) -> Decision[list[HeadwaterError | None]]:
    """Decide an OffsetCommit: one answer per item (None: stored). A commit from outside
    the group (no member id, epoch -1) is refused while the group has members of either
    protocol, unless ``classic_member``: a member of Kafka's classic protocol, whose
    generation the Kafka front checked."""
    check_group_id(group_id)
    if not 1 <= len(items) <= COMMIT_PARTITIONS_MAX:
        raise _error(
            ErrorCode.INVALID_REQUEST,
            f"OffsetCommit names {len(items)} partitions; valid: 1 to {COMMIT_PARTITIONS_MAX}",
        )
    metadata_bytes = sum(len(item.metadata.encode()) for item in items)
    if metadata_bytes > COMMIT_METADATA_BYTES_MAX:
        raise _error(
            ErrorCode.INVALID_REQUEST,
            f"the commit's metadata strings hold {metadata_bytes} bytes in all; at most "
            f"{COMMIT_METADATA_BYTES_MAX} per request",
        )
    group = image.group(group_id)
    held: frozenset[TopicPartitionKey] | None = None  # None: an admin commit
    stale = False
    if member_id or member_epoch != ADMIN_MEMBER_EPOCH:
        if group is None:
            raise _error(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
        if member_id not in group.members:
            raise _error(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"member {member_id!r} is not in group {group_id!r} (it left or its session "
                "expired): its partitions may be another member's now",
            )
        current = group.current.get(member_id)
        known = current.member_epoch if current is not None else 0
        if member_epoch > known:
            raise _error(
                ErrorCode.FENCED_MEMBER_EPOCH,
                f"member {member_id!r} sent epoch {member_epoch}; the coordinator has {known}",
            )
        if member_epoch < group.members[member_id].joined_epoch:
            raise _error(
                ErrorCode.STALE_MEMBER_EPOCH,
                f"member {member_id!r} sent epoch {member_epoch}, from before it joined again "
                f"at epoch {group.members[member_id].joined_epoch}: what it committed then is "
                "not its to commit now",
            )
        held = (
            frozenset(current.assigned) | frozenset(current.revoking)
            if current is not None
            else frozenset()
        )
        stale = member_epoch < known
    elif group is not None and (
        group.members or (group.has_classic_members and not classic_member)
    ):
        raise _error(
            ErrorCode.NON_EMPTY_GROUP,
            f"group {group_id!r} has members; offsets can be set from outside the group only "
            "while it has none (stop its consumers first)",
        )
    changes = _Changes(image, group_id)
    answers: list[HeadwaterError | None] = []
    stored: list[OffsetCommitted] = []
    for item in items:
        problem = _commit_problem(item, partition_counts)
        key = (item.topic, item.partition)
        if problem is None and held is not None and key not in held:
            problem = _error(
                ErrorCode.STALE_MEMBER_EPOCH if stale else ErrorCode.PARTITION_NOT_ASSIGNED,
                f"{item.topic}-{item.partition} is not assigned to member {member_id!r} "
                f"(epoch {member_epoch}); only a partition's owner commits its offset",
            )
        if problem is None:
            stored.append(
                OffsetCommitted(
                    group_id,
                    item.topic,
                    item.partition,
                    item.offset,
                    item.metadata,
                    now_ms,
                    item.leader_epoch,
                )
            )
        answers.append(problem)
    changes.add_offsets(stored)
    return changes.decision(answers)


def _commit_problem(item: CommitItem, partition_counts: Mapping[str, int]) -> HeadwaterError | None:
    count = partition_counts.get(item.topic)
    if count is None:
        return _error(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"{item.topic}-{item.partition} does not exist (partitions: none: no such topic)",
        )
    if not 0 <= item.partition < count:
        return _error(
            ErrorCode.PARTITION_OUT_OF_RANGE,
            f"{item.topic}-{item.partition} does not exist (partitions: [0, {count}))",
        )
    if item.offset < 0:
        return _error(ErrorCode.INVALID_REQUEST, f"offset is {item.offset}; must be >= 0")
    size = len(item.metadata.encode())
    if size > OFFSET_METADATA_BYTES_MAX:
        return _error(
            ErrorCode.OFFSET_METADATA_TOO_LARGE,
            f"metadata is {size} bytes; at most {OFFSET_METADATA_BYTES_MAX}",
        )
    return None


def save_classic(image: GroupsImage, record: ClassicGeneration) -> Decision[None]:
    """Record a classic group's generation; refused while the group has members of the
    consumer protocol (a group id takes one protocol at a time)."""
    group = image.group(record.group_id)
    if group is not None and group.members:
        raise _error(
            ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
            f"group {record.group_id!r} has members of the consumer (KIP-848) protocol",
        )
    changes = _Changes(image, record.group_id)
    changes.add(record)
    return changes.decision(None)


def delete_group(image: GroupsImage, group_id: str) -> Decision[None]:
    check_group_id(group_id)
    group = image.group(group_id)
    if group is None:
        raise _error(ErrorCode.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")
    if group.members or group.has_classic_members:
        raise _error(
            ErrorCode.NON_EMPTY_GROUP,
            f"group {group_id!r} has members; only an empty group can be deleted",
        )
    changes = _Changes(image, group_id)
    for topic, partition in sorted(group.offsets):  # a tombstone on each offset's key
        changes.add(OffsetDeleted(group_id, topic, partition))
    changes.add(GroupDeleted(group_id))
    return changes.decision(None)


def expire_offsets(image: GroupsImage, now_ms: int, retention_ms: int) -> Decision[None]:
    """Offsets of groups without members, committed more than ``retention_ms`` ago, are
    deleted; a group left with neither members nor offsets is deleted."""
    changes = _Changes(image, "")
    for group_id, group in sorted(image.groups.items()):
        if group.members or group.has_classic_members:
            continue
        old = [
            k for k, v in group.offsets.items() if v.commit_timestamp_ms + retention_ms <= now_ms
        ]
        for topic, partition in sorted(old):
            changes.add(OffsetDeleted(group_id, topic, partition))
        if len(old) == len(group.offsets):
            changes.add(GroupDeleted(group_id))
    return changes.decision(None)


def stale_targets(image: GroupsImage, partition_counts: Mapping[str, int]) -> list[str]:
    """Groups whose target no longer fits the topics (see ``refresh_target``)."""
    stale = []
    for group_id, group in image.groups.items():
        if not group.members or group.target_epoch < group.epoch:
            continue
        subscriptions = {
            m: subscribed_partitions(j, partition_counts) for m, j in group.members.items()
        }
        if not _target_fits(group, subscriptions, partition_counts):
            stale.append(group_id)
    return sorted(stale)
