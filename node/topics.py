"""Topic names and topic metadata records (pure).

A topic name is 1 to 249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or ``..`` (Kafka's
rules, so names move between the systems), and does not start with ``__``, which is
reserved for internal topics.

``TopicRecord`` is what a node persists per topic; its JSON form (``to_json``) is one
object with the fields below, and ``topic_id`` changes when a topic is deleted and
created again (so readers can tell a recreated topic from the old one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Final

from headwater.errors import ErrorCode, HeadwaterError

TOPIC_NAME_LENGTH_MAX: Final = 249
_LEGAL_NAME: Final = re.compile(r"[a-zA-Z0-9._-]+")
INTERNAL_PREFIX: Final = "__"


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
            ErrorCode.INVALID_TOPIC_EXCEPTION, f"topic name {name!r} is not allowed"
        )
    if not _LEGAL_NAME.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL_NAME.fullmatch(c)})
        raise HeadwaterError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} has illegal character(s) {''.join(bad)!r}; "
            "allowed: letters, digits, '.', '_' and '-'",
        )
    if name.startswith(INTERNAL_PREFIX) and not allow_internal:
        raise HeadwaterError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"topic name {name!r} starts with {INTERNAL_PREFIX!r}, reserved for internal topics",
        )


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """One topic: id, partition count, replication factor and explicit config overrides."""

    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "topic_id": self.topic_id,
            "partitions": self.partitions,
            "replication_factor": self.replication_factor,
            "configs": dict(self.configs),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TopicRecord:
        return cls(
            name=str(data["name"]),
            topic_id=str(data["topic_id"]),
            partitions=int(data["partitions"]),
            replication_factor=int(data["replication_factor"]),
            configs={str(k): str(v) for k, v in dict(data.get("configs", {})).items()},
        )

    def check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {self.name!r} has no partition {partition}; valid partitions are "
                f"[0, {self.partitions})",
            )


def unknown_topic(name: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
