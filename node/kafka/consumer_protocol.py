"""Kafka's consumer protocol: what classic-group members of protocol type ``consumer``
put in JoinGroup's protocol metadata (a subscription) and what their leader hands out
in SyncGroup (an assignment). The broker stores and passes these bytes on unread; it
decodes them only to describe a group.

Both start with an int16 version, then the fields of ``ConsumerProtocolSubscription`` or
``ConsumerProtocolAssignment`` at that version (Kafka's message schemas; not flexible).
A version newer than the newest known (3) is read as the newest: later versions only add
fields at the end. A null array (length -1) reads as empty. Bytes that do not decode give
``None``: they come from clients, and a description shows what it can.
"""

from __future__ import annotations

import importlib
import struct
from typing import Any, Final

from kio.schema.consumer_protocol_assignment.v3 import ConsumerProtocolAssignment
from kio.schema.consumer_protocol_subscription.v3 import ConsumerProtocolSubscription
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
