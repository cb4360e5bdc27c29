"""ConsumerGroupHeartbeat (KIP-848, librdkafka ``group.protocol=consumer``) in the
coordinator's terms, and back (pure: no I/O).

Kafka's request names topics by id in what the member owns, and leaves a field null when
it has not changed since the member's last heartbeat (the subscribed names, the regular
expression, the server assignor, the owned partitions; a rebalance timeout of -1). The
coordinator's ``decisions.Heartbeat`` carries every field, so a null one is filled from
what the group holds for the member:

- subscription, regular expression, assignor, rebalance timeout, instance id: the member's
  last ``MemberJoined``;
- owned partitions: everything the coordinator still counts as the member's (assigned
  and being revoked). Partitions are handed to another member only once their owner
  reports them gone, so reading a null as "owns all of them still" can delay a
  rebalance by one heartbeat, never hand a partition to two members.

An owned topic id the metadata does not know (its topic was deleted) is left out. The
answer names the member's whole assignment by topic id in every response (Kafka allows
that; the client compares it with what it has).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from headwater.node.groups import decisions
from headwater.node.groups.records import MemberAssignment, MemberJoined, TopicPartitionKey
from headwater.node.kafka import protocol


class HeartbeatShapeError(ValueError):
    """The request cannot be read as a heartbeat (answered INVALID_REQUEST)."""


def heartbeat_of(
    body: Any,
    client_id: str,
    client_host: str,
    joined: MemberJoined | None,
    current: MemberAssignment | None,
    names_by_id: Mapping[uuid.UUID, str],
) -> decisions.Heartbeat:
    """The coordinator's heartbeat for a Kafka ConsumerGroupHeartbeat request ``body``
    (v0 or v1) from a member the group holds as ``joined``/``current`` (None for a
    member it does not know: a null field is then empty)."""
    names = body.subscribed_topic_names
    regex = getattr(body, "subscribed_topic_regex", None)
    rebalance_ms = protocol.milliseconds(body.rebalance_timeout)
    return decisions.Heartbeat(
        group_id=body.group_id,
        member_id=body.member_id,
        member_epoch=int(body.member_epoch),
        instance_id=(
            body.instance_id
            if body.instance_id is not None
            else (joined.instance_id if joined else "")
        ),
        client_id=client_id,
        client_host=client_host,
        subscribed_topics=(
            tuple(names) if names is not None else (joined.subscribed_topics if joined else ())
        ),
        subscribed_pattern=(
            regex if regex is not None else (joined.subscribed_pattern if joined else "")
        ),
        assignor=(
            body.server_assignor
            if body.server_assignor is not None
            else (joined.assignor if joined else "")
        ),
        owned=_owned(body.topic_partitions, current, names_by_id),
        session_timeout_ms=joined.session_timeout_ms if joined else 0,
        rebalance_timeout_ms=(
            rebalance_ms if rebalance_ms >= 0 else (joined.rebalance_timeout_ms if joined else 0)
        ),
    )


def _owned(
    topic_partitions: Any,
    current: MemberAssignment | None,
    names_by_id: Mapping[uuid.UUID, str],
) -> frozenset[TopicPartitionKey]:
    if topic_partitions is None:
        if current is None:
            return frozenset()
        return frozenset(current.assigned) | frozenset(current.revoking)
    owned: set[TopicPartitionKey] = set()
    count = 0
    for item in topic_partitions:
        count += len(item.partitions)
        if count > decisions.OWNED_PARTITIONS_MAX:
            raise HeartbeatShapeError(
                f"the owned partitions number more than {decisions.OWNED_PARTITIONS_MAX}"
            )
        name = names_by_id.get(item.topic_id) if item.topic_id is not None else None
        if name is None:
            continue  # a deleted topic's partitions are no one's
        for partition in item.partitions:
            if partition < 0:
                raise HeartbeatShapeError(f"owned partition {partition} of {name!r} is negative")
            owned.add((name, int(partition)))
    return frozenset(owned)


def assignment_of(
    assigned: tuple[TopicPartitionKey, ...], ids_by_name: Mapping[str, uuid.UUID]
) -> dict[str, Any]:
    """The response's ``assignment``: the member's partitions by topic id (a topic whose
    id is unknown here, deleted meanwhile, is left out)."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(assigned):
        by_topic.setdefault(topic, []).append(partition)
    return {
        "topic_partitions": [
            {"topic_id": ids_by_name[topic], "partitions": partitions}
            for topic, partitions in by_topic.items()
            if topic in ids_by_name
        ]
    }
