"""``headwater groups``: list, describe (with lag), reset offsets, delete.

``reset-offsets`` works like Kafka's ``kafka-consumer-groups --reset-offsets``: it prints
the plan (topic, partition, current committed offset, new offset) and changes nothing
unless ``--execute`` is given; executing needs the group to have no members
(NON_EMPTY_GROUP otherwise), since its members would commit over the new offsets.
New offsets are clamped to the partition's [log start, high watermark].
"""

from __future__ import annotations

import datetime
from dataclasses import asdict
from typing import Any

from headwater.client.admin import Admin
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb


def _partitions(items: Any) -> list[dict[str, Any]]:
    return [{"topic": i.topic, "partitions": list(i.partitions)} for i in items]


def describe_json(admin: Admin, group_id: str) -> dict[str, Any]:
    """The JSON of ``groups describe``: state, epochs, members with their assignments, and
    per partition the committed offset, log end and lag."""
    description = admin.describe_group(group_id)
    lags = admin.group_lag(description)
    return {
        "group_id": description.group_id,
        "protocol": description.protocol,
        "state": description.state,
        "group_epoch": description.group_epoch,
        "target_epoch": description.target_epoch,
        "assignor": description.assignor,
        "coordinator_id": description.coordinator_id,
        "members": [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "client_id": m.client_id,
                "host": m.host,
                "member_epoch": m.member_epoch,
                "subscribed_topics": list(m.subscribed_topics),
                "subscribed_pattern": m.subscribed_pattern,
                "assigned": _partitions(m.assigned),
                "revoking": _partitions(m.revoking),
                "target": _partitions(m.target),
            }
            for m in description.members
        ],
        "partitions": [asdict(lag) for lag in lags],
        "total_lag": sum(lag.lag for lag in lags if lag.lag is not None),
    }


def parse_datetime(text: str) -> int:
    """ISO 8601 to ms since the epoch (UTC when no zone is given)."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"--to-datetime {text!r} is not ISO 8601 (e.g. 2026-11-25T08:00:00Z)",
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def reset_plan(
    admin: Admin,
    group_id: str,
    topic: str,
    to: str,
    value: int | str | None,
) -> list[dict[str, Any]]:
    """Per partition of ``topic``: current committed offset (None without one), the offset
    ``to`` asks for (``requested``) and the new one: the requested one kept within the
    log's start and end. ``to``: earliest, latest, offset (value N), datetime (value ISO)
    or shift (value N)."""
    count = admin.cluster.layout(topic).partitions
    keys = [(topic, p) for p in range(count)]
    starts = admin.beginning_offsets(keys)
    ends = admin.end_offsets(keys)
    current = admin.group_offsets(group_id)
    if to == "datetime":
        assert isinstance(value, str)
        stamp = parse_datetime(value)
        by_time = admin.offsets_for_times(dict.fromkeys(keys, stamp))
    plan = []
    for key in keys:
        committed = current.get(TopicPartition(*key))
        if to == "earliest":
            wanted = starts[key]
        elif to == "latest":
            wanted = ends[key]
        elif to == "offset":
            assert isinstance(value, int)
            wanted = value
        elif to == "datetime":
            wanted = by_time[key]
        else:
            assert isinstance(value, int)
            wanted = (committed if committed is not None else starts[key]) + value
        new = min(max(wanted, starts[key]), ends[key])
        plan.append(
            {
                "topic": topic,
                "partition": key[1],
                "current": committed,
                "new": new,
                "requested": wanted,
            }
        )
    return plan


def clamp_warnings(plan: list[dict[str, Any]]) -> list[str]:
    """A line for each partition whose requested offset was outside its log and was set
    to the nearest end instead (as kafka-consumer-groups warns)."""
    return [
        f"warning: {row['topic']}-{row['partition']}: offset {row['requested']} is "
        f"{'past the log end' if row['requested'] > row['new'] else 'before the log start'}"
        f"; it is set to {row['new']}"
        for row in plan
        if row["requested"] != row["new"]
    ]


def execute_plan(admin: Admin, group_id: str, plan: list[dict[str, Any]]) -> None:
    admin.alter_group_offsets(
        group_id, {TopicPartition(row["topic"], row["partition"]): row["new"] for row in plan}
    )


def list_rows(response: pb.ListGroupsResponse) -> list[dict[str, Any]]:
    return [
        {
            "group_id": g.group_id,
            "state": g.state,
            "members": g.members,
            "coordinator_id": g.coordinator_id,
        }
        for g in response.groups
    ]
