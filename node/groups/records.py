"""Group records: the only way a consumer group's state changes (pure).

A group lives in one partition of the internal topic ``__consumer_offsets``
(``coordinator_partition``). The coordinator turns every change into records and appends
them to that partition; whoever leads the partition replays them, in order, into the
group image (``headwater.node.groups.image``). Nothing in memory is the only copy.

Each record is one log record: its **key** names what it sets (``record_key``: the type
and the group, plus the member or the partition), so that compaction keeps the newest
record per key; its **value** is the record as UTF-8 JSON::

    {"type": "OffsetCommitted", "version": 1, "group_id": "g", "topic": "t", ...}

``type`` names the dataclass below and ``version`` is ``RECORD_VERSION`` (a decoder
refuses a newer one rather than guess); tuples are JSON arrays.

The partition is compacted (cleanup_policy compact): the cleaner keeps only the newest
record of each key, in log order. So every piece of state has exactly one key, and a
removal is a **tombstone** (a null value) on the key of what it removes (``log_entries``):
a member that leaves is a tombstone on its member key and one on its assignment key
(``AssignmentCleared``), a deleted offset one on its offset key, a deleted group (empty,
its offsets deleted first) tombstones on its group, epoch and target keys;
``removal_of`` turns a tombstone back into the removal record for replay. Tombstones go,
with everything they removed, delete_retention_ms after compaction reaches them: a group
that is gone leaves nothing behind.
Replaying a compacted log gives the same final image as replaying the whole log
(tests/test_groups_core.py), with ``apply(..., trusted=True)``: a compacted log skips
intermediate states, so replay sets state as the log says without the checks a decision
passes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Final

from headwater.shared.json_records import json_object
from headwater.shared.partitioning import murmur2

RECORD_VERSION: Final = 1
RECORD_BYTES_MAX: Final = 16 << 20
"""Larger than any record the coordinator writes (a target of 100,000 partitions)."""
OFFSETS_TOPIC: Final = "__consumer_offsets"
OFFSETS_TOPIC_PARTITIONS: Final = 50

TopicPartitionKey = tuple[str, int]


class GroupRecordError(ValueError):
    """Bytes that are not a group record this version can read, or a record that does not
    fit the group's state (``apply``)."""


def coordinator_partition(group_id: str, partitions: int = OFFSETS_TOPIC_PARTITIONS) -> int:
    """The partition of ``__consumer_offsets`` that holds ``group_id``: murmur2 of its
    UTF-8 bytes, made non-negative, modulo the partition count."""
    return (murmur2(group_id.encode()) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True, slots=True)
class GroupEpochBumped:
    """The group's membership or subscriptions changed: its epoch is now ``epoch``."""

    group_id: str
    epoch: int


@dataclass(frozen=True, slots=True)
class MemberJoined:
    """A member joined, or changed its subscription (the same ``member_id`` again)."""

    group_id: str
    member_id: str
    instance_id: str  # static membership ("" for none)
    client_id: str
    subscribed_topics: tuple[str, ...]
    subscribed_pattern: str  # a regular expression over topic names ("" for none)
    session_timeout_ms: int
    rebalance_timeout_ms: int
    assignor: str = ""  # the assignor the member asks for ("" for the default)
    joined_epoch: int = 0
    """The group epoch this incarnation of the member joined at: every epoch it is given
    is at least this, and every epoch an earlier incarnation (the same member id, before
    it was fenced or timed out) had is below it."""
    host: str = ""
    """The address the member connects from, as its node saw it ("" if unknown)."""
    released: bool = False
    """A static member that left with a static leave (member epoch -2): it keeps its
    place and partitions until its session ends, and its instance id is free for a new
    incarnation to take over (KIP-848)."""


@dataclass(frozen=True, slots=True)
class MemberLeft:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class AssignmentCleared:
    """Replay only (a tombstone on a member's assignment key, written when it left): the
    member holds no partitions. Never written as a value."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class TargetAssignment:
    """The assignor's answer for group epoch ``epoch``: each member's partitions."""

    group_id: str
    epoch: int
    members: tuple[tuple[str, tuple[TopicPartitionKey, ...]], ...]


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """What member ``member_id`` owns now, at ``member_epoch``: ``assigned`` it may read;
    ``revoking`` it must give up (stop reading, commit) before anyone else may have them."""

    group_id: str
    member_id: str
    member_epoch: int
    assigned: tuple[TopicPartitionKey, ...]
    revoking: tuple[TopicPartitionKey, ...]


@dataclass(frozen=True, slots=True)
class OffsetCommitted:
    group_id: str
    topic: str
    partition: int
    offset: int
    metadata: str
    commit_timestamp_ms: int
    leader_epoch: int = -1
    """The committed leader epoch (KIP-320); -1: none given (and every record written
    before it was kept)."""


@dataclass(frozen=True, slots=True)
class OffsetDeleted:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupDeleted:
    group_id: str


ClassicMemberEntry = tuple[str, str, str, int, int, str, str]
"""A classic member as stored: member id, client id, host, session and rebalance
timeouts (ms), and its protocol metadata and assignment, base64."""


@dataclass(frozen=True, slots=True)
class ClassicGeneration:
    """A group of Kafka's classic protocol at a generation its leader completed (its
    SyncGroup), or emptied (no members): what a new coordinator serves the members from,
    so that they carry on without joining again. ``rebalancing``: written when members
    left or expired after that generation (those are gone from ``members``): a new
    coordinator starts a rebalance of the members left instead of waiting out the
    sessions of members that are gone."""

    group_id: str
    generation: int
    protocol_type: str
    protocol_name: str
    leader: str
    members: tuple[ClassicMemberEntry, ...]
    rebalancing: bool = False
    instance_ids: tuple[str, ...] = ()
    """Each member's static instance id ("" for a dynamic member), in ``members``' order
    (empty in records without it)."""


GroupRecord = (
    GroupEpochBumped
    | MemberJoined
    | MemberLeft
    | TargetAssignment
    | MemberAssignment
    | OffsetCommitted
    | OffsetDeleted
    | GroupDeleted
    | AssignmentCleared
    | ClassicGeneration
)
RECORD_TYPES: Final[dict[str, type[GroupRecord]]] = {
    cls.__name__: cls
    for cls in (
        GroupEpochBumped,
        MemberJoined,
        MemberLeft,
        TargetAssignment,
        MemberAssignment,
        OffsetCommitted,
        OffsetDeleted,
        GroupDeleted,
        ClassicGeneration,
    )
}
_KEY_KIND: Final[dict[type[GroupRecord], str]] = {
    GroupEpochBumped: "epoch",
    MemberJoined: "member",
    MemberLeft: "member",
    TargetAssignment: "target",
    MemberAssignment: "assignment",
    AssignmentCleared: "assignment",
    OffsetCommitted: "offset",
    OffsetDeleted: "offset",
    GroupDeleted: "group",
    ClassicGeneration: "classic",
}


def record_key(record: GroupRecord) -> bytes:
    """The log key of ``record``: records that set the same thing share a key."""
    parts: list[Any] = [_KEY_KIND[type(record)], record.group_id]
    if isinstance(record, MemberJoined | MemberLeft | MemberAssignment | AssignmentCleared):
        parts.append(record.member_id)
    elif isinstance(record, OffsetCommitted | OffsetDeleted):
        parts += [record.topic, record.partition]
    return json.dumps(parts, separators=(",", ":")).encode()


def log_entries(record: GroupRecord) -> list[tuple[bytes, bytes | None]]:
    """The (key, value) log records that write ``record``: a removal is a tombstone (a
    None value) on each key it removes (see the module docstring)."""
    if isinstance(record, MemberLeft):
        cleared = AssignmentCleared(record.group_id, record.member_id)
        return [(record_key(record), None), (record_key(cleared), None)]
    if isinstance(record, OffsetDeleted | AssignmentCleared):
        return [(record_key(record), None)]
    if isinstance(record, GroupDeleted):
        # Tombstones on the group's own keys (its members, assignments and offsets are
        # gone by then, each with its tombstone): nothing of it outlives them.
        return [
            (_key("group", record.group_id), None),
            (_key("epoch", record.group_id), None),
            (_key("target", record.group_id), None),
            (_key("classic", record.group_id), None),
        ]
    return [(record_key(record), encode_record(record))]


def _key(kind: str, group_id: str) -> bytes:
    return json.dumps([kind, group_id], separators=(",", ":")).encode()


def removal_of(key: bytes) -> GroupRecord:
    """The removal a tombstone on ``key`` stands for (MemberLeft, AssignmentCleared,
    OffsetDeleted, or GroupDeleted for the group's own keys); GroupRecordError for a key
    that names no removable state."""
    if len(key) > RECORD_BYTES_MAX:
        raise GroupRecordError(f"group record key is {len(key)} bytes; at most {RECORD_BYTES_MAX}")
    try:
        parts = json.loads(key)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GroupRecordError(f"tombstone key is not JSON: {type(exc).__name__}") from exc
    if (
        isinstance(parts, list)
        and len(parts) == 2
        and parts[0] in ("group", "epoch", "target", "classic")
        and isinstance(parts[1], str)
    ):
        # Written only when the group is deleted (``log_entries``).
        return GroupDeleted(parts[1])
    if isinstance(parts, list) and len(parts) == 3 and all(isinstance(v, str) for v in parts):
        kind, group_id, member_id = parts
        if kind == "member":
            return MemberLeft(group_id, member_id)
        if kind == "assignment":
            return AssignmentCleared(group_id, member_id)
    if (
        isinstance(parts, list)
        and len(parts) == 4
        and parts[0] == "offset"
        and isinstance(parts[1], str)
        and _is_partition_key(parts[2:])
    ):
        return OffsetDeleted(parts[1], parts[2], parts[3])
    raise GroupRecordError(f"a tombstone on key {key[:80]!r} removes nothing known")


def encode_record(record: GroupRecord) -> bytes:
    body: dict[str, Any] = {"type": type(record).__name__, "version": RECORD_VERSION}
    for field in dataclasses.fields(record):
        body[field.name] = getattr(record, field.name)
    return json.dumps(body, separators=(",", ":")).encode()


def decode_record(data: bytes) -> GroupRecord:
    """The record in ``data``; GroupRecordError for anything else (bad JSON, an unknown
    type or version, a missing field or one of the wrong type, or more than
    ``RECORD_BYTES_MAX`` bytes)."""
    body = json_object(
        data, bytes_max=RECORD_BYTES_MAX, what="group record", error=GroupRecordError
    )
    cls = RECORD_TYPES.get(str(body.get("type")))
    if cls is None:
        raise GroupRecordError(f"unknown group record type {body.get('type')!r}")
    if body.get("version") != RECORD_VERSION:
        raise GroupRecordError(
            f"{cls.__name__} version {body.get('version')!r}; this code reads {RECORD_VERSION}"
        )
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in body and field.default is not dataclasses.MISSING:
            values[field.name] = field.default
            continue
        if field.name not in body:
            raise GroupRecordError(f"{cls.__name__} lacks field {field.name!r}")
        values[field.name] = _typed(cls.__name__, field.name, str(field.type), body[field.name])
    return cls(**values)


def _typed(kind: str, name: str, annotation: str, value: Any) -> Any:
    """``value`` checked against the field's annotation (as written in this module)."""
    if annotation == "str":
        ok = isinstance(value, str)
    elif annotation == "bool":
        ok = isinstance(value, bool)
    elif annotation == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation == "tuple[str, ...]":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif annotation == "tuple[TopicPartitionKey, ...]":
        ok = isinstance(value, list) and all(_is_partition_key(v) for v in value)
    elif annotation == "tuple[ClassicMemberEntry, ...]":
        kinds = (str, str, str, int, int, str, str)
        ok = isinstance(value, list) and all(
            isinstance(m, list)
            and len(m) == len(kinds)
            and all(
                isinstance(v, k) and not isinstance(v, bool) for v, k in zip(m, kinds, strict=True)
            )
            for m in value
        )
    else:  # TargetAssignment.members
        ok = isinstance(value, list) and all(
            isinstance(m, list)
            and len(m) == 2
            and isinstance(m[0], str)
            and isinstance(m[1], list)
            and all(_is_partition_key(v) for v in m[1])
            for m in value
        )
    if not ok:
        raise GroupRecordError(f"{kind}.{name} is {value!r}; expected {annotation}")
    return _tuples(value) if isinstance(value, list) else value


def _is_partition_key(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) == 2
        and isinstance(value[0], str)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
        and value[1] >= 0
    )


def _tuples(value: list[Any]) -> tuple[Any, ...]:
    return tuple(_tuples(v) if isinstance(v, list) else v for v in value)
