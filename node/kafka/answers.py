"""What every Kafka handler answers with: Kafka's error code for a refusal, an answer
that is ready at once, and topics by Kafka's topic ids (the metadata's 32-hex-digit
``topic_id`` as a UUID)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any, Final

from headwater.node.groups.classic import GroupProtocolError
from headwater.raft.metadata.image import MetadataImage
from headwater.shared.errors import ErrorCode, HeadwaterError

UNKNOWN_SERVER_ERROR: Final = -1
_OWN_CODES: Final = {
    ErrorCode.PARTITION_OUT_OF_RANGE: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.FETCH_RESPONSE_TOO_LARGE: ErrorCode.MESSAGE_TOO_LARGE,
    ErrorCode.SASL_SESSION_EXPIRED: ErrorCode.SASL_AUTHENTICATION_FAILED,
}
"""Headwater's codes of its own (1000 up) that have a Kafka code saying the same."""


def kafka_code(code: ErrorCode | int) -> int:
    """Kafka's error code for one of Headwater's (they are Kafka's below 1000; its own
    map to the nearest Kafka code, else UNKNOWN_SERVER_ERROR)."""
    if isinstance(code, ErrorCode):
        code = _OWN_CODES.get(code, code)
    return int(code) if int(code) < 1000 else UNKNOWN_SERVER_ERROR


def code_of(error: HeadwaterError | GroupProtocolError) -> int:
    """Kafka's error code for a refusal."""
    if isinstance(error, GroupProtocolError):
        return int(error.code)
    return kafka_code(error.code)


def message_of(error: HeadwaterError | GroupProtocolError) -> str:
    """A refusal's message as an answer carries it (the code is the answer's own field)."""
    if isinstance(error, HeadwaterError):
        return error.message
    return str(error)


def ready(value: Any) -> Awaitable[Any]:
    """An answer already computed (phase two of a handler has nothing to wait for)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def topic_uuid(image: MetadataImage, name: str) -> uuid.UUID | None:
    """The Kafka topic id of topic ``name`` (None when ``image`` has no such topic)."""
    topic = image.topics.get(name)
    return uuid.UUID(hex=topic.topic_id) if topic is not None else None


_names_by_id: tuple[MetadataImage | None, Mapping[uuid.UUID, str]] = (None, {})


def names_by_id(image: MetadataImage) -> Mapping[uuid.UUID, str]:
    """Topic id -> name in ``image`` (built once per image: the handlers run on one loop)."""
    global _names_by_id
    if _names_by_id[0] is not image:
        _names_by_id = (image, {uuid.UUID(hex=t.topic_id): n for n, t in image.topics.items()})
    return _names_by_id[1]
