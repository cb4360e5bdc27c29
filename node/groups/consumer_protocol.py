"""Kafka's consumer protocol: what classic-group members of protocol type ``consumer``
put in JoinGroup's protocol metadata (a subscription) and what their leader hands out
in SyncGroup (an assignment). The broker stores and passes these bytes on unread; it
decodes them only to describe a group.

Both start with an int16 version, then the fields of ``ConsumerProtocolSubscription`` or
``ConsumerProtocolAssignment`` at that version (Kafka's message schemas; not flexible).
A version newer than the newest known (3) is read as the newest: later versions only add
fields at the end. A null array (length -1) reads as empty. Bytes that do not decode give
``None``: they come from clients, and a description shows what it can. A description
for a caller who may not describe every topic re-encodes them with only the topics it
may (``subscription_within``, ``assignment_within``).
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import struct
from collections.abc import Callable
from typing import Any, Final

from kio.schema.consumer_protocol_assignment.v3 import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v3 import ConsumerProtocolSubscription
from kio.serial import entity_writer
from kio.serial.errors import SerialError

from headwater.node.groups.classic import ASSIGNMENT_BYTES_MAX, PROTOCOL_METADATA_BYTES_MAX
from headwater.node.kafka import protocol, request_shape

NEWEST_VERSION: Final = 3
_VERSION: Final = struct.Struct(">h")
TopicPartitions = tuple[tuple[str, tuple[int, ...]], ...]


def subscribed_topics(metadata: bytes) -> tuple[str, ...] | None:
    """The topics a member's subscription names (None: not a consumer subscription)."""
    subscription = _read(metadata, "consumer_protocol_subscription", ConsumerProtocolSubscription)
    if subscription is None:
        return None
    return tuple(str(t) for t in subscription.topics or () if t is not None)


def assigned_partitions(assignment: bytes) -> TopicPartitions | None:
    """The partitions an assignment gives, by topic (None: not a consumer assignment)."""
    decoded = _read(assignment, "consumer_protocol_assignment", ConsumerProtocolAssignment)
    if decoded is None:
        return None
    return tuple(
        (str(item.topic), tuple(int(p) for p in item.partitions or ()))
        for item in decoded.assigned_partitions or ()
        if item.topic is not None
    )


def subscription_within(metadata: bytes, visible: Callable[[str], bool]) -> bytes:
    """A subscription with only the topics ``visible`` allows (its owned partitions too),
    re-encoded at its own version; its opaque user data is dropped when anything was
    left out (an assignor's user data may name topics). b"" when it is not a consumer
    subscription: what the broker cannot read, it does not show."""
    return _within(
        metadata, "consumer_protocol_subscription", ConsumerProtocolSubscription, visible
    )


def assignment_within(assignment: bytes, visible: Callable[[str], bool]) -> bytes:
    """An assignment with only the partitions of topics ``visible`` allows, as
    ``subscription_within`` does."""
    return _within(assignment, "consumer_protocol_assignment", ConsumerProtocolAssignment, visible)


def _within(
    data: bytes, schema_name: str, newest: type[Any], visible: Callable[[str], bool]
) -> bytes:
    value = _read(data, schema_name, newest)
    if value is None:
        return b""
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(value):
        items = getattr(value, field.name)
        if field.name == "topics":
            kept = tuple(t for t in items or () if t is not None and visible(t))
        elif field.name in ("owned_partitions", "assigned_partitions"):
            kept = tuple(i for i in items or () if i.topic is not None and visible(i.topic))
        else:
            continue
        if len(kept) != len(items or ()):
            changes[field.name] = kept
    if not changes:
        return data
    if hasattr(value, "user_data"):
        changes["user_data"] = None
    out = io.BytesIO()
    (version,) = _VERSION.unpack_from(data)
    out.write(_VERSION.pack(min(version, NEWEST_VERSION)))  # a newer one was read as this
    entity_writer(type(value))(out, dataclasses.replace(value, **changes))
    return out.getvalue()


def _read(data: bytes, schema_name: str, newest: type[Any]) -> Any:
    if not _VERSION.size <= len(data) <= max(ASSIGNMENT_BYTES_MAX, PROTOCOL_METADATA_BYTES_MAX):
        return None
    (version,) = _VERSION.unpack_from(data)
    if version < 0:
        return None
    schema = newest
    if version < NEWEST_VERSION:
        module = importlib.import_module(f"kio.schema.{schema_name}.v{version}")
        schema = getattr(module, newest.__name__)
    try:
        request_shape.check_shape(schema, data, _VERSION.size)  # before kio's native reader
        value, _used = protocol.reader_of(schema)(memoryview(data), _VERSION.size)
    except (
        request_shape.MalformedRequestError,
        SerialError,
        KeyError,
        ValueError,
        TypeError,
        OverflowError,
        IndexError,
    ):
        return None
    return value
