"""``headwater groups``: list, describe (with lag), reset offsets, delete.

``reset-offsets`` works like Kafka's ``kafka-consumer-groups --reset-offsets``: it prints
the plan (topic, partition, current committed offset, new offset) and changes nothing
unless ``--execute`` is given; executing needs the group to have no members
(NON_EMPTY_GROUP otherwise), since its members would commit over the new offsets.
New offsets are clamped to the partition's [log start, high watermark].
"""

from __future__ import annotations

import datetime
import json
from dataclasses import asdict
from typing import Any

import click

from headwater.cli.options import bootstrap_option, json_and_bootstrap_options
from headwater.cli.output import Table, echo, fail, print_table
from headwater.client.admin import Admin
from headwater.client.admin_types import GroupListing, TopicPartitions
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError


@click.group()
def groups() -> None:
    """Consumer groups: list, describe (with lag), reset offsets, delete."""


@groups.command("list")
@json_and_bootstrap_options
def groups_list(as_json: bool, bootstrap: str | None) -> None:
    """List the cluster's consumer groups."""
    with Admin(bootstrap) as admin:
        response = admin.list_groups()
    rows = list_rows(response)
    if as_json:
        print(json.dumps({"groups": rows, "unreachable_nodes": list(response.unreachable_nodes)}))
        return
    table = Table("group", "state", "members", "coordinator")
    for row in rows:
        table.add_row(
            row["group_id"], row["state"], str(row["members"]), str(row["coordinator_id"])
        )
    print_table(table)
    if response.unreachable_nodes:
        click.echo(
            f"warning: nodes {list(response.unreachable_nodes)} did not answer; their groups "
            "are missing",
            err=True,
        )


@groups.command("describe")
@click.argument("group")
@json_and_bootstrap_options
def groups_describe(group: str, as_json: bool, bootstrap: str | None) -> None:
    """A group's state, members, assignments, and per partition its committed offset,
    log end and lag."""
    with Admin(bootstrap) as admin:
        described = describe_json(admin, group)
    if as_json:
        print(json.dumps(described))
        return
    epoch = "generation" if described["protocol"] == "classic" else "epoch"
    echo(
        f"group {described['group_id']} ({described['protocol']} protocol): "
        f"{described['state']}, {epoch} {described['group_epoch']}, "
        f"{len(described['members'])} member(s), assignor {described['assignor']}, "
        f"coordinator node {described['coordinator_id']}, total lag {described['total_lag']}",
    )
    if described["members"]:
        members = Table("member", "client id", "host", "assigned")
        for member in described["members"]:
            assigned = ", ".join(
                f"{item['topic']}-{','.join(map(str, item['partitions']))}"
                for item in member["assigned"]
            )
            members.add_row(
                member["member_id"],
                member["client_id"] or "-",
                member["host"] or "-",
                assigned or "-",
            )
        print_table(members)
    table = Table("topic", "partition", "committed", "log end", "lag", "member")
    for row in described["partitions"]:
        table.add_row(
            row["topic"],
            str(row["partition"]),
            "-" if row["committed"] is None else str(row["committed"]),
            str(row["log_end"]),
            "-" if row["lag"] is None else str(row["lag"]),
            row["member_id"] or "-",
        )
    print_table(table)


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", required=True, help="The topic whose offsets to reset (all partitions).")
@click.option("--to-earliest", is_flag=True, help="To the log start.")
@click.option("--to-latest", is_flag=True, help="To the high watermark.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None, help="To offset N.")
@click.option(
    "--to-datetime", default=None, metavar="ISO", help="To the first record at or after ISO."
)
@click.option("--shift-by", type=int, default=None, help="Move the committed offsets by N.")
@click.option("--execute", is_flag=True, help="Apply the plan (without it: a dry run).")
@json_and_bootstrap_options
def groups_reset_offsets(
    group: str,
    topic: str,
    to_earliest: bool,
    to_latest: bool,
    to_offset: int | None,
    to_datetime: str | None,
    shift_by: int | None,
    execute: bool,
    as_json: bool,
    bootstrap: str | None,
) -> None:
    """Reset GROUP's committed offsets of TOPIC (the group must have no members to
    --execute). Prints the plan; changes nothing without --execute."""
    chosen: list[tuple[str, int | str | None]] = [
        (name, value)
        for name, value, given in (
            ("earliest", None, to_earliest),
            ("latest", None, to_latest),
            ("offset", to_offset, to_offset is not None),
            ("datetime", to_datetime, to_datetime is not None),
            ("shift", shift_by, shift_by is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        fail(
            "choose exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
            "--shift-by",
            status=2,
        )
    to, value = chosen[0]
    with Admin(bootstrap) as admin:
        plan = reset_plan(admin, group, topic, to, value)
        if execute:
            execute_plan(admin, group, plan)
    for warning in clamp_warnings(plan):
        click.echo(warning, err=True)
    if as_json:
        print(json.dumps({"executed": execute, "partitions": plan}))
        return
    table = Table("topic", "partition", "current", "new")
    for row in plan:
        current = "-" if row["current"] is None else str(row["current"])
        table.add_row(row["topic"], str(row["partition"]), current, str(row["new"]))
    print_table(table)
    if not execute:
        click.echo("dry run: nothing changed; add --execute to apply", err=True)


@groups.command("delete")
@click.argument("group")
@bootstrap_option
def groups_delete(group: str, bootstrap: str | None) -> None:
    """Delete an empty group and its committed offsets."""
    with Admin(bootstrap) as admin:
        admin.delete_group(group)
    echo(f"deleted group {group}")


def _partitions(items: tuple[TopicPartitions, ...]) -> list[dict[str, Any]]:
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


def list_rows(response: GroupListing) -> list[dict[str, Any]]:
    return [
        {
            "group_id": g.group_id,
            "state": g.state,
            "members": g.members,
            "coordinator_id": g.coordinator_id,
        }
        for g in response.groups
    ]
