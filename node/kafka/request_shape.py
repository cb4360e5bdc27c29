"""Walking a Kafka request by its lengths and counts before anything is decoded (pure: no
I/O).

kio's reader sizes its buffers from the counts a request states (a count of 2^31 would
ask for an allocation of 240 GB), and a 4 MiB request of tiny entries holds hundreds of
thousands of them: decoded and handled one by one, 400,000 group ids in one
DescribeGroups would hold a node's event loop for 12 s, long enough for it to be fenced.
So ``check_shape`` walks a message by its schema first, reading only lengths and counts:

- every length and count is checked against the bytes left in the frame;
- every array's count is checked against what one request may name
  (``RequestLimits``), by what the array holds (``ARRAY_KINDS``): topics, group ids and
  config resources at most ``topics_max`` an array (as the gRPC front takes at most that
  many names); partitions at most ``partitions_max`` in the whole request; configs of one
  resource, members, protocols and replicas each at most their own bound; and all the
  entries the walk has to visit one by one at most ``topics_max + partitions_max`` (an
  array of fixed-size entries, such as partition numbers, is passed over in one step and
  counted by its own bound only). The count is checked as soon as it is read, before the
  array is walked, so a refused request costs its walk up to that count only;
- a tagged field the schema does not know (a newer client's) is noted, so that the frame
  kio reads is the request without it (Kafka's protocol requires it to be skipped), at
  most ``UNKNOWN_TAGS_MAX`` of them.

Failures raise ``MalformedRequestError`` naming what is wrong: the listener closes the
connection with one log line, as Kafka closes a connection whose request does not parse.
The walk of one schema is planned once (``_plan``), so each entry costs a few dict and
struct operations: about 1 µs, so at most ~20 ms for the largest request the bounds allow.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, Final

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from headwater.node.groups.classic import PROTOCOLS_MAX
from headwater.node.groups.decisions import OWNED_PARTITIONS_MAX, SUBSCRIBED_TOPICS_MAX


class MalformedRequestError(Exception):
    """The frame cannot be read as a request: the connection is closed (the message says
    why, for the one log line)."""


TOPICS: Final = "topics"
PARTITIONS: Final = "partitions"
GROUPS: Final = "group ids"
RESOURCES: Final = "config resources"
CONFIGS: Final = "configs"
MEMBERS: Final = "members"
PROTOCOLS: Final = "protocols"
REPLICAS: Final = "replicas"
SUBSCRIBED: Final = "subscribed topics"
OWNED: Final = "owned partitions"
CUMULATIVE_KINDS: Final = frozenset({PARTITIONS, OWNED})
"""Kinds counted over the whole request rather than per array."""

ARRAY_KINDS: Final[dict[tuple[str, str], str]] = {
    ("ProduceRequest", "topic_data"): TOPICS,
    ("TopicProduceData", "partition_data"): PARTITIONS,
    ("FetchRequest", "topics"): TOPICS,
    ("FetchRequest", "forgotten_topics_data"): TOPICS,
    ("FetchTopic", "partitions"): PARTITIONS,
    ("ForgottenTopic", "partitions"): PARTITIONS,
    ("ListOffsetsRequest", "topics"): TOPICS,
    ("ListOffsetsTopic", "partitions"): PARTITIONS,
    ("MetadataRequest", "topics"): TOPICS,
    ("OffsetCommitRequest", "topics"): TOPICS,
    ("OffsetCommitRequestTopic", "partitions"): PARTITIONS,
    ("OffsetFetchRequest", "topics"): TOPICS,
    ("OffsetFetchRequestTopic", "partition_indexes"): PARTITIONS,
    ("JoinGroupRequest", "protocols"): PROTOCOLS,
    ("LeaveGroupRequest", "members"): MEMBERS,
    ("SyncGroupRequest", "assignments"): MEMBERS,
    ("DescribeGroupsRequest", "groups"): GROUPS,
    ("DeleteGroupsRequest", "groups_names"): GROUPS,
    ("CreateTopicsRequest", "topics"): TOPICS,
    ("CreatableTopic", "assignments"): PARTITIONS,
    ("CreatableTopic", "configs"): CONFIGS,
    ("CreatableReplicaAssignment", "broker_ids"): REPLICAS,
    ("DeleteTopicsRequest", "topic_names"): TOPICS,
    ("DescribeConfigsRequest", "resources"): RESOURCES,
    ("DescribeConfigsResource", "configuration_keys"): CONFIGS,
    ("AlterConfigsRequest", "resources"): RESOURCES,
    ("IncrementalAlterConfigsRequest", "resources"): RESOURCES,
    ("AlterConfigsResource", "configs"): CONFIGS,
    ("CreatePartitionsRequest", "topics"): TOPICS,
    ("CreatePartitionsTopic", "assignments"): PARTITIONS,
    ("CreatePartitionsAssignment", "broker_ids"): REPLICAS,
    ("ConsumerGroupHeartbeatRequest", "subscribed_topic_names"): SUBSCRIBED,
    ("ConsumerGroupHeartbeatRequest", "topic_partitions"): TOPICS,
    ("TopicPartitions", "partitions"): OWNED,
}
"""What each array of each served request holds, by (message, field): the bound that
applies (``RequestLimits.bound``). A test checks that every array of every served request
is listed."""

CONFIGS_PER_RESOURCE_MAX: Final = 1000
"""Configs one resource of a request may name (Kafka has a few hundred broker configs;
a topic has fewer than 30)."""
REPLICAS_MAX: Final = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may name (see the module doc); the node's settings where it has
    them, so that both fronts refuse at the same counts."""

    topics_max: int = 10_000
    partitions_max: int = 10_000
    members_max: int = 1000
    entries_max: int = 20_000
    """Entries walked one by one, all arrays together: ``topics_max + partitions_max``."""

    @classmethod
    def of(cls, topics_max: int, partitions_max: int, members_max: int) -> RequestLimits:
        """The limits of a node with these settings."""
        return cls(topics_max, partitions_max, members_max, topics_max + partitions_max)

    def bound(self, kind: str) -> tuple[int, str]:
        """(the most an array of ``kind`` may hold, or all of them in a request for a
        cumulative kind; the setting or constant that says so)."""
        if kind in (TOPICS, GROUPS, RESOURCES):
            return self.topics_max, "topics_max"
        if kind == PARTITIONS:
            return self.partitions_max, "partitions_max"
        if kind == MEMBERS:
            return self.members_max, "group_members_max"
        return {
            CONFIGS: (CONFIGS_PER_RESOURCE_MAX, "configs of one resource"),
            PROTOCOLS: (PROTOCOLS_MAX, "protocols of one JoinGroup"),
            REPLICAS: (REPLICAS_MAX, "replicas of one assignment"),
            SUBSCRIBED: (SUBSCRIBED_TOPICS_MAX, "subscribed topics of one member"),
            OWNED: (OWNED_PARTITIONS_MAX, "owned partitions of one member"),
        }[kind]


_FIXED_SIZES: Final = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_VARINT_BYTES_MAX: Final = 5
UNKNOWN_TAGS_MAX: Final = 64
"""Most tagged fields a request may carry that its schema does not know (Kafka's own
requests carry none that a broker of their version does not know)."""
_I8: Final = struct.Struct(">b")
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_PRIMITIVE, _ENTITY, _PRIMITIVES, _ENTITIES = range(4)


@dataclasses.dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    shape: int  # _PRIMITIVE, _ENTITY, _PRIMITIVES or _ENTITIES
    kafka_type: str  # of a primitive, or of an array's items
    nested: type[Any] | None  # the schema of an entity, or of an array's items
    nullable: bool
    legacy_string: bool  # the request header's client id: a non-compact string always
    array_kind: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class _SchemaPlan:
    name: str
    flexible: bool
    fields: tuple[_FieldPlan, ...]  # in order, tagged fields apart
    tagged: dict[int, _FieldPlan]
    fixed_size: int | None  # every instance's size, when it has no variable part


_plans: dict[type[Any], _SchemaPlan] = {}


def _plan(schema: type[Any]) -> _SchemaPlan:
    """How to walk ``schema`` (made once per schema)."""
    plan = _plans.get(schema)
    if plan is None:
        plan = _plans[schema] = _make_plan(schema)
    return plan


def _make_plan(schema: type[Any]) -> _SchemaPlan:
    header = schema.__name__ == "RequestHeader"
    fields: list[_FieldPlan] = []
    tagged: dict[int, _FieldPlan] = {}
    for field in dataclasses.fields(schema):
        kind = classify_field(field)
        kafka_type = nested = None
        if isinstance(kind, PrimitiveField):
            shape, kafka_type = _PRIMITIVE, get_schema_field_type(field)
        elif isinstance(kind, EntityField):
            shape, nested = _ENTITY, kind.type_
        elif isinstance(kind, PrimitiveTupleField):
            shape, kafka_type = _PRIMITIVES, get_schema_field_type(field)
        else:
            assert isinstance(kind, EntityTupleField), kind
            shape, nested = _ENTITIES, kind.type_
        planned = _FieldPlan(
            field.name,
            shape,
            kafka_type or "",
            nested,
            is_optional(field),
            header and field.name == "client_id",
            ARRAY_KINDS.get((schema.__name__, field.name)),
        )
        tag = get_field_tag(field)
        if tag is not None:
            tagged[int(tag)] = planned
        else:
            fields.append(planned)
    flexible = bool(schema.__flexible__)
    return _SchemaPlan(
        schema.__name__, flexible, tuple(fields), tagged, _fixed_size(flexible, fields)
    )


def _fixed_size(flexible: bool, fields: list[_FieldPlan]) -> int | None:
    if flexible:  # every instance ends with its own tagged-field section
        return None
    size = 0
    for field in fields:
        if field.shape == _PRIMITIVE and field.kafka_type in _FIXED_SIZES:
            size += _FIXED_SIZES[field.kafka_type]
        elif field.shape == _ENTITY and not field.nullable:
            assert field.nested is not None
            inner = _plan(field.nested).fixed_size
            if inner is None:
                return None
            size += inner
        else:
            return None
    return size


class _Shape:
    """One walk of a request (see the module doc). ``unknown_tags``: (start, end,
    replacement) of each byte range to change so that the tagged fields the schema does
    not know are gone (a section's count rewritten, each unknown field removed);
    ``entries``: the array entries walked one by one."""

    def __init__(self, frame: bytes | memoryview, limits: RequestLimits | None) -> None:
        self.frame = memoryview(frame)
        self.position = 0
        self.limits = limits
        self.unknown_tags: list[tuple[int, int, bytes]] = []
        self.entries = 0
        self.counted: dict[str, int] = {}  # cumulative kinds so far

    def fail(self, what: str) -> MalformedRequestError:
        return MalformedRequestError(
            f"{what} at byte {self.position} runs past the request's {len(self.frame)} bytes"
        )

    def take(self, size: int, what: str) -> int:
        if size < 0 or self.position + size > len(self.frame):
            raise self.fail(f"{what} of {size} bytes")
        start = self.position
        self.position += size
        return start

    def uvarint(self, what: str) -> int:
        value = shift = 0
        for _ in range(_VARINT_BYTES_MAX):
            byte = self.frame[self.take(1, what)]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise self.fail(f"{what}: a varint longer than {_VARINT_BYTES_MAX} bytes")

    def length(self, flexible: bool, legacy: struct.Struct, what: str) -> int:
        """A length or count (-1: null), checked to fit what is left of the frame."""
        if flexible:
            found = self.uvarint(what) - 1
        else:
            (found,) = legacy.unpack_from(self.frame, self.take(legacy.size, what))
        if found < -1 or found > len(self.frame) - self.position:
            raise self.fail(f"{what} {found}")
        return int(found)

    def primitive(self, kafka_type: str, flexible: bool, what: str, legacy_string: bool) -> None:
        size = _FIXED_SIZES.get(kafka_type)
        if size is not None:
            self.take(size, what)
        elif kafka_type == "string":
            flexible_string = flexible and not legacy_string
            self.take(max(self.length(flexible_string, _I16, what), 0), what)
        elif kafka_type in ("bytes", "records"):
            self.take(max(self.length(flexible, _I32, what), 0), what)
        else:
            raise MalformedRequestError(f"{what}: type {kafka_type!r} is not known here")

    def entity(self, plan: _SchemaPlan, nullable: bool = False) -> None:
        if nullable:
            (marker,) = _I8.unpack_from(self.frame, self.take(1, plan.name))
            if marker < 0:
                return
        if plan.fixed_size is not None:
            self.take(plan.fixed_size, plan.name)
            return
        for field in plan.fields:
            self.field(field, plan.flexible)
        if plan.flexible:
            self.tagged_fields(plan)

    def tagged_fields(self, plan: _SchemaPlan) -> None:
        count_start = self.position
        number = self.uvarint(f"{plan.name}'s tagged fields")
        count_end = self.position
        if number > len(self.frame) - self.position:
            raise self.fail(f"{number} tagged fields")
        unknown = 0
        for _ in range(number):
            field_start = self.position
            tag_number = self.uvarint("a tag")
            size = self.uvarint("a tagged field's size")
            end = self.take(size, "a tagged field") + size
            known = plan.tagged.get(tag_number)
            if known is not None:  # walked within its own bytes
                inner = _Shape(self.frame[:end], self.limits)
                inner.position = end - size
                inner.entries, inner.counted = self.entries, self.counted
                inner.field(known, True)
                self.entries = inner.entries
                if inner.unknown_tags:  # its size would have to be rewritten too
                    raise MalformedRequestError(
                        f"{plan.name}'s tagged field {tag_number} holds tagged fields "
                        "this broker does not know"
                    )
            else:
                unknown += 1
                if len(self.unknown_tags) >= UNKNOWN_TAGS_MAX:
                    raise MalformedRequestError(
                        f"more than {UNKNOWN_TAGS_MAX} tagged fields this broker does not know"
                    )
                self.unknown_tags.append((field_start, end, b""))
        if unknown:
            self.unknown_tags.append((count_start, count_end, _uvarint(number - unknown)))

    def field(self, field: _FieldPlan, flexible: bool) -> None:
        if field.shape == _PRIMITIVE:
            self.primitive(field.kafka_type, flexible, field.name, field.legacy_string)
            return
        if field.shape == _ENTITY:
            assert field.nested is not None
            self.entity(_plan(field.nested), nullable=field.nullable)
            return
        count = self.length(flexible, _I32, f"{field.name} count")
        if count <= 0:
            return
        self.check_count(field, count)
        if field.shape == _PRIMITIVES:
            size = _FIXED_SIZES.get(field.kafka_type)
            if size is not None:
                self.take(count * size, field.name)
                return
            self.walked(count)
            for _ in range(count):
                self.primitive(field.kafka_type, flexible, field.name, False)
            return
        assert field.nested is not None
        items = _plan(field.nested)
        if items.fixed_size is not None:
            self.take(count * items.fixed_size, field.name)
            return
        self.walked(count)
        for _ in range(count):
            self.entity(items)

    def check_count(self, field: _FieldPlan, count: int) -> None:
        kind = field.array_kind
        if self.limits is None or kind is None:
            return
        limit, what = self.limits.bound(kind)
        if kind in CUMULATIVE_KINDS:
            count = self.counted[kind] = self.counted.get(kind, 0) + count
        if count > limit:
            raise MalformedRequestError(
                f"{field.name} holds {count} {kind} in one request; at most {limit} ({what})"
            )

    def walked(self, count: int) -> None:
        self.entries += count
        if self.limits is not None and self.entries > self.limits.entries_max:
            raise MalformedRequestError(
                f"more than {self.limits.entries_max} entries in one request (topics_max + "
                "partitions_max)"
            )

    def without_unknown_tags(self) -> bytes:
        """The frame with every unknown tagged field taken out (``unknown_tags``, at most
        UNKNOWN_TAGS_MAX and the count rewrites that go with them)."""
        out = bytearray()
        copied = 0
        for start, end, replacement in sorted(self.unknown_tags):
            out += self.frame[copied:start]
            out += replacement
            copied = end
        out += self.frame[copied:]
        return bytes(out)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclasses.dataclass(frozen=True, slots=True)
class Walked:
    """A request walked whole: the frame for kio (without the tagged fields its schema
    does not know), where its body starts, and how many entries were walked one by one
    (what decoding and handling it will cost)."""

    frame: bytes | memoryview
    entries: int


def walk_request(
    header_schema: type[Any],
    schema: type[Any],
    frame: bytes | memoryview,
    limits: RequestLimits | None,
) -> Walked:
    """Walk a whole request frame: its header, then its body (see the module doc)."""
    shape = _Shape(frame, limits)
    shape.entity(_plan(header_schema))
    shape.entity(_plan(schema))
    kept = shape.without_unknown_tags() if shape.unknown_tags else frame
    return Walked(kept, shape.entries)


def check_shape(
    schema: type[Any],
    frame: bytes | memoryview,
    position: int,
    limits: RequestLimits | None = None,
) -> int:
    """Walk the message of ``schema`` at ``position`` (see the module doc); the position
    after it, or MalformedRequestError. Nothing is built, and nothing is read beyond the
    frame."""
    shape = _Shape(frame, limits)
    shape.position = position
    shape.entity(_plan(schema))
    return shape.position
