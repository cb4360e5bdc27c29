"""The Admin client's answers (client/admin_types.py) built from the gRPC messages
(client/admin_messages.py): every field of each message, nested ones included, has a field
of the same name that carries its value (repeated fields as tuples, maps as dicts); and
the values are frozen. A field added to the .proto fails here until the client carries it.
No node: messages filled field by field from their descriptors."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from headwater.client import (
    ClusterMetadata,
    GroupDescription,
    GroupListing,
    OffsetSpec,
    ReplicaLogDescription,
    TopicDescription,
    TopicSummary,
    UserDescription,
)
from headwater.client import admin_messages as convert
from headwater.v1 import headwater_pb2 as pb

CONVERSIONS: list[tuple[type[Message], type[Any], Callable[[Any], Any]]] = [
    (pb.TopicSummary, TopicSummary, convert.topic_summary_of),
    (pb.TopicDescription, TopicDescription, convert.topic_description_of),
    (pb.MetadataResponse, ClusterMetadata, convert.cluster_metadata_of),
    (pb.DescribeReplicaLogResponse, ReplicaLogDescription, convert.replica_log_of),
    (pb.UserDescription, UserDescription, convert.user_of),
    (pb.ListGroupsResponse, GroupListing, convert.group_listing_of),
    (pb.DescribeGroupResponse, GroupDescription, convert.group_description_of),
]
_numbers = itertools.count(1)


def _scalar(field: FieldDescriptor) -> Any:
    """A value of ``field``'s type that is not its default, different at each call."""
    n = next(_numbers)
    if field.type == FieldDescriptor.TYPE_STRING:
        return f"{field.name}-{n}"
    if field.type == FieldDescriptor.TYPE_BYTES:
        return bytes([n % 256]) * 4
    if field.type == FieldDescriptor.TYPE_BOOL:
        return True
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return n + 0.25
    return n


def _fill(message: Message) -> Message:
    """``message`` with every field set (two elements in repeated ones and maps)."""
    for field in message.DESCRIPTOR.fields:
        target = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            for _ in range(2):
                target[_scalar(key)] = _scalar(value)
        elif field.message_type is not None and field.is_repeated:
            for _ in range(2):
                _fill(target.add())
        elif field.message_type is not None:
            _fill(target)
        elif field.is_repeated:
            target.extend([_scalar(field), _scalar(field)])
        else:
            setattr(message, field.name, _scalar(field))
    return message


def _same(message: Message, value: Any, where: str) -> None:
    """``value`` carries every field of ``message``, nested values recursively."""
    descriptor: Descriptor = message.DESCRIPTOR
    assert dataclasses.is_dataclass(value), where
    names = [f.name for f in dataclasses.fields(value)]
    assert names == [f.name for f in descriptor.fields], where
    for field in descriptor.fields:
        here = f"{where}.{field.name}"
        sent, got = getattr(message, field.name), getattr(value, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            assert type(got) is dict and got == dict(sent) and got, here
        elif field.message_type is not None and field.is_repeated:
            assert type(got) is tuple and len(got) == len(sent) == 2, here
            for i, (one, other) in enumerate(zip(sent, got, strict=True)):
                _same(one, other, f"{here}[{i}]")
        elif field.message_type is not None:
            _same(sent, got, here)
        elif field.is_repeated:
            assert type(got) is tuple and got == tuple(sent) and got, here
        else:
            assert type(got) is type(sent) and got == sent, here


@pytest.mark.parametrize(("message_type", "value_type", "conversion"), CONVERSIONS)
def test_every_field_is_carried(
    message_type: type[Message], value_type: type[Any], conversion: Callable[[Any], Any]
) -> None:
    message = _fill(message_type())
    value = conversion(message)
    assert type(value) is value_type
    _same(message, value, message_type.__name__)


@pytest.mark.parametrize(("message_type", "value_type", "conversion"), CONVERSIONS)
def test_values_are_frozen_and_slotted(
    message_type: type[Message], value_type: type[Any], conversion: Callable[[Any], Any]
) -> None:
    value = conversion(message_type())
    assert not hasattr(value, "__dict__")
    first = dataclasses.fields(value)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, first, None)


def test_empty_answers_are_empty_values() -> None:
    metadata = convert.cluster_metadata_of(pb.MetadataResponse())
    assert (metadata.brokers, metadata.topics, metadata.metadata_digest) == ((), (), b"")
    assert convert.group_listing_of(pb.ListGroupsResponse()) == GroupListing((), ())


def test_every_offset_spec_has_its_wire_value() -> None:
    assert set(convert.OFFSET_SPECS) == set(OffsetSpec)
    assert sorted(convert.OFFSET_SPECS.values()) == sorted(pb.OffsetSpec.values())


def test_assign_at_a_timestamp_is_refused_naming_what_to_do_instead() -> None:
    """``AsyncConsumer.assign_at`` starts at the earliest or latest offset; a time needs a
    timestamp it does not take, so OffsetSpec.TIMESTAMP is refused before any call."""
    import asyncio

    from headwater.client.aio import AsyncConsumer
    from headwater.shared.errors import ErrorCode, HeadwaterError

    async def scenario() -> HeadwaterError:
        consumer = AsyncConsumer("127.0.0.1:1")  # nothing listens: no call may be made
        try:
            with pytest.raises(HeadwaterError) as refused:
                await consumer.assign_at("t", OffsetSpec.TIMESTAMP)
            return refused.value
        finally:
            await consumer.close()

    refused = asyncio.run(scenario())
    assert refused.code is ErrorCode.INVALID_REQUEST
    assert "OffsetSpec.EARLIEST or OffsetSpec.LATEST" in refused.message
    assert "offsets_for_times" in refused.message
