"""Topic names and consumer group ids, and the errors for unknown topics and partitions
(pure).

A topic name is 1 to 249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..`` (Kafka's
rules, so names move between the systems), and does not start with ``__``, which is
reserved for internal topics. (A topic's metadata lives in the cluster's metadata image,
``headwater.raft.metadata.image``.)
"""

from __future__ import annotations

import re
from typing import Final

from headwater.shared.errors import ErrorCode, HeadwaterError, shown

TOPIC_NAME_LENGTH_MAX: Final = 249
_LEGAL_NAME: Final = re.compile(r"[a-zA-Z0-9._-]+")
INTERNAL_PREFIX: Final = "__"
GROUP_ID_BYTES_MAX: Final = 255


def check_topic_name(name: str, allow_internal: bool = False) -> None:
    """Raise INVALID_TOPIC_EXCEPTION naming the rule ``name`` breaks."""
    if not name:
        raise HeadwaterError(ErrorCode.INVALID_TOPIC_EXCEPTION, "topic name is empty")
    if len(name) > TOPIC_NAME_LENGTH_MAX:
        raise HeadwaterError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name is {len(name)} characters; the limit is {TOPIC_NAME_LENGTH_MAX}",
        )
    if name in (".", ".."):
        raise HeadwaterError(
            ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name {shown(name)} is not allowed"
        )
    if not _LEGAL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL_NAME.fullmatch(c)})
        raise HeadwaterError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {shown(name)} has illegal character(s) {shown(''.join(bad))}; "
            "allowed: letters, digits, '.', '_' and '-'",
        )
    if name.startswith(INTERNAL_PREFIX) and not allow_internal:
        raise HeadwaterError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {shown(name)} starts with {INTERNAL_PREFIX!r}, reserved for internal "
            "topics",
        )


def check_group_id(group_id: str) -> None:
    """Raise INVALID_GROUP_ID unless ``group_id`` is 1 to GROUP_ID_BYTES_MAX bytes of
    UTF-8 (the rule of the coordinator, the clients and the Spark source alike)."""
    size = len(group_id.encode())
    if not 1 <= size <= GROUP_ID_BYTES_MAX:
        raise HeadwaterError(
            ErrorCode.INVALID_GROUP_ID,
            f"group id is {size} bytes; valid: 1 to {GROUP_ID_BYTES_MAX} bytes of UTF-8",
        )


def check_partition(topic: str, partition: int, partitions: int) -> None:
    """Raise PARTITION_OUT_OF_RANGE (not retriable), naming the valid range, unless
    ``partition`` is in [0, partitions)."""
    if not 0 <= partition < partitions:
        raise HeadwaterError(
            ErrorCode.PARTITION_OUT_OF_RANGE,
            f"topic {shown(topic)} has no partition {partition}; valid partitions are "
            f"[0, {partitions})",
        )


def unknown_topic(name: str) -> HeadwaterError:
    return HeadwaterError(
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {shown(name)} does not exist"
    )
