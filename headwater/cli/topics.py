"""``headwater topics``: create, list, describe, alter, reassign and delete topics.

Configs are given as ``KEY=VALUE`` (``--config``, repeatable), by the node's name or
Kafka's (``retention_ms`` or ``retention.ms``); ``describe_json`` is the JSON of
``topics describe --json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from headwater.cli.options import F, bootstrap_option, json_and_bootstrap_options
from headwater.cli.output import Table, echo, print_table
from headwater.client import Admin, TopicDescription


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics."""


def _partitions_option(help_text: str) -> Callable[[F], F]:
    """``--partitions N``, at least 1 (None when not given)."""
    return click.option("--partitions", type=click.IntRange(min=1), default=None, help=help_text)


def _configs_option(help_text: str) -> Callable[[F], F]:
    """``--config KEY=VALUE``, repeatable, passed as ``configs`` (``_parse_configs``)."""
    return click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help=help_text)


def _parse_configs(pairs: Sequence[str]) -> dict[str, str]:
    configs = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--config")
        configs[key.strip()] = value.strip()
    return configs


@topics.command("create")
@click.argument("name")
@_partitions_option("Number of partitions, at least 1 (default: the node's default_partitions).")
@click.option(
    "--replication-factor",
    type=click.IntRange(min=1),
    default=None,
    help="Replicas per partition, at least 1 (default: the node's).",
)
@_configs_option("Topic config override (repeatable).")
@bootstrap_option
def topics_create(
    name: str,
    partitions: int | None,
    replication_factor: int | None,
    configs: tuple[str, ...],
    bootstrap: str | None,
) -> None:
    """Create topic NAME."""
    with Admin(bootstrap) as admin:
        topic_id = admin.create_topic(name, partitions, replication_factor, _parse_configs(configs))
    echo(f"created topic {name} (id {topic_id})")


@topics.command("list")
@click.option("--internal", is_flag=True, help="Include internal topics.")
@json_and_bootstrap_options
def topics_list(internal: bool, as_json: bool, bootstrap: str | None) -> None:
    """List topics."""
    with Admin(bootstrap) as admin:
        listed = admin.list_topics(include_internal=internal)
    rows: list[dict[str, Any]] = [
        {
            "name": t.name,
            "topic_id": t.topic_id,
            "partitions": t.partitions,
            "replication_factor": t.replication_factor,
        }
        for t in listed
    ]
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("topic", "partitions", "replication", "id")
    for row in rows:
        table.add_row(
            row["name"], str(row["partitions"]), str(row["replication_factor"]), row["topic_id"]
        )
    print_table(table)


def describe_json(description: TopicDescription) -> dict[str, Any]:
    return {
        "name": description.name,
        "topic_id": description.topic_id,
        "configs": dict(sorted(description.configs.items())),
        "config_overrides": list(description.config_overrides),
        "partitions": [
            {
                "partition": p.partition,
                "leader": p.leader,
                "replicas": list(p.replicas),
                "isr": list(p.isr),
                "leader_epoch": p.leader_epoch,
                "partition_epoch": p.partition_epoch,
                "adding_replicas": list(p.adding_replicas),
                "removing_replicas": list(p.removing_replicas),
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "high_watermark": p.high_watermark,
                "size_bytes": p.size_bytes,
                "segment_count": p.segment_count,
                "followers": [
                    {
                        "node_id": f.node_id,
                        "log_end_offset": f.log_end_offset,
                        "lag_records": f.lag_records,
                        "caught_up_ms_ago": f.caught_up_ms_ago,
                    }
                    for f in p.followers
                ],
                "damaged_replicas": [
                    {"node_id": d.node_id, "damage": d.damage} for d in p.damaged_replicas
                ],
                "cleanable_ratio": round(p.cleanable_ratio, 4),
                "cleaned_offset": p.cleaned_offset,
                "producers": [
                    {
                        "producer_id": q.producer_id,
                        "producer_epoch": q.producer_epoch,
                        "next_sequence": q.next_sequence,
                        "last_offset": q.last_offset,
                        "last_timestamp_ms": q.last_timestamp_ms,
                    }
                    for q in p.producers
                ],
            }
            for p in description.partitions
        ],
    }


@topics.command("describe")
@click.argument("name")
@click.option(
    "--all-configs", is_flag=True, help="List every config with its source, defaults included."
)
@json_and_bootstrap_options
def topics_describe(name: str, all_configs: bool, as_json: bool, bootstrap: str | None) -> None:
    """Show NAME's partitions (leader, replicas, ISR, offsets, size, a compacted topic's
    dirty ratio, replicas a node set aside damage from) and the configs set on it (as
    kafka-configs --describe does; --all-configs adds the defaults); --json adds every
    config, each follower's lag, the idempotent producers tracked and the cleaned offset."""
    with Admin(bootstrap) as admin:
        (description,) = admin.describe_topics([name])
    data = describe_json(description)
    if as_json:
        print(json.dumps(data))
        return
    echo(f"topic {data['name']}  id {data['topic_id']}")
    table = Table(
        "partition",
        "leader",
        "replicas",
        "isr",
        "epoch",
        "start",
        "end",
        "high watermark",
        "bytes",
        "segments",
    )
    compacted = any(p["cleanable_ratio"] >= 0 for p in data["partitions"])
    if compacted:
        table.add_column("dirty")
    damaged = any(p["damaged_replicas"] for p in data["partitions"])
    if damaged:
        table.add_column("damaged")
    for p in data["partitions"]:
        table.add_row(
            p["partition"],
            p["leader"],
            ",".join(map(str, p["replicas"])),
            ",".join(map(str, p["isr"])),
            p["leader_epoch"],
            p["log_start_offset"],
            p["log_end_offset"],
            p["high_watermark"],
            p["size_bytes"],
            p["segment_count"],
            *([f"{max(p['cleanable_ratio'], 0):.2f}"] if compacted else []),
            *([",".join(str(d["node_id"]) for d in p["damaged_replicas"])] if damaged else []),
        )
    print_table(table)
    for p in data["partitions"]:
        for d in p["damaged_replicas"]:
            echo(f"partition {p['partition']}, node {d['node_id']}: {d['damage']}")
    echo("")
    overrides = set(data["config_overrides"])
    shown = {k: v for k, v in data["configs"].items() if all_configs or k in overrides}
    if not shown:
        echo("configs: the node's defaults (--all-configs lists them)")
        return
    configs = Table("config", "value", *(["source"] if all_configs else []))
    for key, value in shown.items():
        source = ["override" if key in overrides else "default"] if all_configs else []
        configs.add_row(key, value, *source)
    print_table(configs)


@topics.command("delete")
@click.argument("name")
@bootstrap_option
def topics_delete(name: str, bootstrap: str | None) -> None:
    """Delete topic NAME and all its data."""
    with Admin(bootstrap) as admin:
        admin.delete_topic(name)
    echo(f"deleted topic {name}")


@topics.command("alter")
@click.argument("name")
@_partitions_option("New partition count (more than now; partitions never shrink).")
@_configs_option(
    "Set a config override, by the node's name or Kafka's: retention_ms=3600000 or "
    "retention.ms=3600000 (repeatable)."
)
@click.option(
    "--delete-config",
    "deleted",
    multiple=True,
    metavar="KEY",
    help="Remove a config override: the node's default applies again (repeatable).",
)
@bootstrap_option
def topics_alter(
    name: str,
    partitions: int | None,
    configs: tuple[str, ...],
    deleted: tuple[str, ...],
    bootstrap: str | None,
) -> None:
    """Add partitions to topic NAME or change its configs."""
    if partitions is None and not configs and not deleted:
        raise click.UsageError("give --partitions, --config or --delete-config")
    with Admin(bootstrap) as admin:
        if configs or deleted:
            overrides = admin.alter_topic_configs(name, _parse_configs(configs), deleted)
            shown = ", ".join(f"{k}={v}" for k, v in sorted(overrides.items())) or "none"
            echo(f"topic {name} config overrides: {shown}")
        if partitions is not None:
            admin.create_partitions(name, partitions)
            echo(f"topic {name} now has {partitions} partitions")


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of node ids", param_hint="--replicas"
        ) from None


@topics.command("reassign")
@click.argument("name")
@click.option("--partition", type=click.IntRange(min=0), required=True, help="Partition to move.")
@click.option(
    "--replicas",
    required=True,
    metavar="ID,ID,...",
    help="Target replicas; the first becomes the preferred leader.",
)
@bootstrap_option
def topics_reassign(name: str, partition: int, replicas: str, bootstrap: str | None) -> None:
    """Move a partition of NAME to other brokers (new replicas copy the log, then old ones
    are dropped)."""
    target = _parse_ids(replicas)
    with Admin(bootstrap) as admin:
        admin.reassign_partition(name, partition, target)
    echo(
        f"reassigning partition {partition} of {name} to {','.join(map(str, target))}",
    )
