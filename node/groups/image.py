"""The group image: every consumer group of one ``__consumer_offsets`` partition, as its
records left it (pure, immutable). ``apply(image, record)`` returns the next image; the
coordinator and a new leader replaying the partition build the same image from the same
records.

Invariants ``apply`` keeps (a record that would break one is refused with
GroupRecordError, and the image is unchanged):

- **no partition has two owners**: among the members' current assignments, a partition is
  in at most one member's ``assigned`` or ``revoking`` set. A partition moves in two
  steps: its old owner's record moves it to ``revoking`` and then drops it; only then
  may another member's record assign it. So a consumer never reads a partition another
  member of its group may still be reading.
- **epochs only rise**: the group epoch, the target assignment's epoch and each member's
  epoch never go down; a target assignment is for an epoch the group has reached, and a
  member's epoch never passes the target's.
- a current assignment is of a member that exists; a member that leaves takes its
  current assignment with it (its partitions become free).

A replay of the log (``trusted=True``) sets state as the records say, without these
checks: the records were checked when they were decided, and a compacted log (see
``records``) skips intermediate states, so a record may meet an image its decision never
saw (a target before the epoch bump that preceded it, an assignment of a member whose
joining record was superseded). What a trusted replay gives is the image the whole log
gives (tests/test_groups_core.py, against compacted histories).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TypeVar

from headwater.node.groups.records import (
    AssignmentCleared,
    ClassicGeneration,
    GroupDeleted,
    GroupEpochBumped,
    GroupRecord,
    GroupRecordError,
    MemberAssignment,
    MemberJoined,
    MemberLeft,
    OffsetCommitted,
    OffsetDeleted,
    TargetAssignment,
    TopicPartitionKey,
    decode_record,
    removal_of,
)

K = TypeVar("K")
V = TypeVar("V")


def _frozen(items: Mapping[K, V]) -> Mapping[K, V]:
    return MappingProxyType(dict(items))


@dataclass(frozen=True, slots=True)
class GroupState:
    group_id: str
    epoch: int = 0
    members: Mapping[str, MemberJoined] = field(default_factory=lambda: MappingProxyType({}))
    target_epoch: int = 0
    target: Mapping[str, frozenset[TopicPartitionKey]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    current: Mapping[str, MemberAssignment] = field(default_factory=lambda: MappingProxyType({}))
    offsets: Mapping[TopicPartitionKey, OffsetCommitted] = field(
        default_factory=lambda: MappingProxyType({})
    )
    classic: ClassicGeneration | None = None
    """The group's last generation of Kafka's classic protocol (None: it never had one)."""

    @property
    def has_classic_members(self) -> bool:
        return self.classic is not None and bool(self.classic.members)

    @property
    def state(self) -> str:
        """``empty`` (no members), ``assigning`` (the target lags the group epoch),
        ``reconciling`` (a member lags the target) or ``stable``."""
        if not self.members:
            return "empty"
        if self.target_epoch < self.epoch:
            return "assigning"
        if any(a.member_epoch < self.target_epoch for a in self.current.values()):
            return "reconciling"
        if len(self.current) < len(self.members):
            return "reconciling"
        return "stable"

    def owner(self, partition: TopicPartitionKey) -> str | None:
        """The member that holds ``partition`` (assigned or being revoked), if any."""
        for member_id, assignment in self.current.items():
            if partition in assignment.assigned or partition in assignment.revoking:
                return member_id
        return None


@dataclass(frozen=True, slots=True)
class GroupsImage:
    groups: Mapping[str, GroupState] = field(default_factory=lambda: MappingProxyType({}))

    def group(self, group_id: str) -> GroupState | None:
        return self.groups.get(group_id)


def apply(image: GroupsImage, record: GroupRecord, trusted: bool = False) -> GroupsImage:
    """The image after ``record``; GroupRecordError if the record does not fit it (not
    checked when ``trusted``: a replay of the log, see the module docstring)."""
    if isinstance(record, GroupDeleted):
        groups = dict(image.groups)
        groups.pop(record.group_id, None)
        return GroupsImage(_frozen(groups))
    group = image.groups.get(record.group_id) or GroupState(record.group_id)
    updated = _replay_in_group(group, record) if trusted else _apply_to_group(group, record)
    return GroupsImage(_frozen({**image.groups, record.group_id: updated}))


def replay(
    image: GroupsImage, keys: Sequence[bytes | None], values: Sequence[bytes | None]
) -> tuple[GroupsImage, list[GroupRecordError]]:
    """``image`` after log records (key, value) in log order, as a new coordinator loads
    them: a value is decoded (``decode_record``), a tombstone (None) is the removal its
    key names (``removal_of``), and each is applied as the log says (``trusted``). A run
    of offset commits of one group is applied in one step (``apply_offsets``), so that a
    commit of many partitions costs no more to replay than to make. Records that cannot
    be read or applied are skipped; their errors are returned."""
    problems: list[GroupRecordError] = []
    run: list[OffsetCommitted] = []
    for key, value in zip(keys, values, strict=True):
        try:
            if value is not None:
                record: GroupRecord | None = decode_record(value)
            elif key is not None:
                record = removal_of(key)
            else:
                record = None
            if isinstance(record, OffsetCommitted) and (
                not run or run[0].group_id == record.group_id
            ):
                run.append(record)
                continue
            image = apply_offsets(image, run)
            run = []
            if isinstance(record, OffsetCommitted):
                run.append(record)
            elif record is not None:
                image = apply(image, record, trusted=True)
        except GroupRecordError as exc:
            problems.append(exc.with_traceback(None))  # no cycle through this frame
    return apply_offsets(image, run), problems


def apply_offsets(image: GroupsImage, records: list[OffsetCommitted]) -> GroupsImage:
    """The image after ``records``, offset commits of one group: what applying them one
    by one gives, with one copy of the group's offsets instead of one per record."""
    if not records:
        return image
    group_id = records[0].group_id
    if any(r.group_id != group_id for r in records):
        raise GroupRecordError("apply_offsets takes the commits of one group")
    group = image.groups.get(group_id) or GroupState(group_id)
    offsets = dict(group.offsets)
    for record in records:
        offsets[(record.topic, record.partition)] = record
    updated = replace(group, offsets=_frozen(offsets))
    return GroupsImage(_frozen({**image.groups, group_id: updated}))


def _replay_in_group(group: GroupState, record: GroupRecord) -> GroupState:
    """``record`` taken as the log says (a trusted replay)."""
    if isinstance(record, GroupEpochBumped):
        return replace(group, epoch=record.epoch)
    if isinstance(record, MemberLeft | AssignmentCleared):
        current = {k: v for k, v in group.current.items() if k != record.member_id}
        members = group.members
        if isinstance(record, MemberLeft):
            members = {k: v for k, v in group.members.items() if k != record.member_id}
        return replace(group, members=_frozen(members), current=_frozen(current))
    if isinstance(record, TargetAssignment):
        return replace(
            group,
            target_epoch=record.epoch,
            target=_frozen({m: frozenset(p) for m, p in record.members}),
        )
    if isinstance(record, MemberAssignment):
        return replace(group, current=_frozen({**group.current, record.member_id: record}))
    return _apply_to_group(group, record)


def _apply_to_group(group: GroupState, record: GroupRecord) -> GroupState:
    name = f"group {group.group_id!r}"
    if isinstance(record, GroupEpochBumped):
        if record.epoch <= group.epoch:
            raise GroupRecordError(f"{name}: epoch {record.epoch} after {group.epoch}")
        return replace(group, epoch=record.epoch)
    if isinstance(record, MemberJoined):
        return replace(group, members=_frozen({**group.members, record.member_id: record}))
    if isinstance(record, MemberLeft):
        if record.member_id not in group.members:
            raise GroupRecordError(f"{name}: member {record.member_id!r} is not a member")
        members = {k: v for k, v in group.members.items() if k != record.member_id}
        current = {k: v for k, v in group.current.items() if k != record.member_id}
        return replace(group, members=_frozen(members), current=_frozen(current))
    if isinstance(record, AssignmentCleared):
        current = {k: v for k, v in group.current.items() if k != record.member_id}
        return replace(group, current=_frozen(current))
    if isinstance(record, TargetAssignment):
        return _target(group, record, name)
    if isinstance(record, MemberAssignment):
        return _member_assignment(group, record, name)
    if isinstance(record, OffsetCommitted):
        key = (record.topic, record.partition)
        return replace(group, offsets=_frozen({**group.offsets, key: record}))
    if isinstance(record, OffsetDeleted):
        key = (record.topic, record.partition)
        return replace(group, offsets=_frozen({k: v for k, v in group.offsets.items() if k != key}))
    if isinstance(record, ClassicGeneration):
        return replace(group, classic=record)
    raise GroupRecordError(f"{name}: no rule for {type(record).__name__}")


def _target(group: GroupState, record: TargetAssignment, name: str) -> GroupState:
    if record.epoch < group.target_epoch or record.epoch > group.epoch:
        raise GroupRecordError(
            f"{name}: target assignment for epoch {record.epoch}; valid: "
            f"[{group.target_epoch}, {group.epoch}]"
        )
    target: dict[str, frozenset[TopicPartitionKey]] = {}
    seen: set[TopicPartitionKey] = set()
    for member_id, partitions in record.members:
        owned = frozenset(partitions)
        if owned & seen:
            raise GroupRecordError(f"{name}: target assigns {sorted(owned & seen)} twice")
        seen |= owned
        target[member_id] = owned
    return replace(group, target_epoch=record.epoch, target=_frozen(target))


def _member_assignment(group: GroupState, record: MemberAssignment, name: str) -> GroupState:
    member = record.member_id
    if member not in group.members:
        raise GroupRecordError(f"{name}: assignment of {member!r}, which is not a member")
    previous = group.current.get(member)
    if previous is not None and record.member_epoch < previous.member_epoch:
        raise GroupRecordError(
            f"{name}: member {member!r} epoch {record.member_epoch} after {previous.member_epoch}"
        )
    if record.member_epoch > group.target_epoch:
        raise GroupRecordError(
            f"{name}: member {member!r} epoch {record.member_epoch} past the target's "
            f"{group.target_epoch}"
        )
    held = set(record.assigned) | set(record.revoking)
    if len(held) != len(record.assigned) + len(record.revoking):
        raise GroupRecordError(f"{name}: member {member!r} holds a partition twice")
    for other, assignment in group.current.items():
        if other == member:
            continue
        clash = held & (set(assignment.assigned) | set(assignment.revoking))
        if clash:
            raise GroupRecordError(
                f"{name}: {sorted(clash)} given to {member!r} while {other!r} still holds them"
            )
    return replace(group, current=_frozen({**group.current, member: record}))
