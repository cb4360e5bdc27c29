"""``headwater cluster``: ``status``, the cluster as the metadata a node answers with
describes it, and ``health``, whether one node serves (its gRPC health check)."""

from __future__ import annotations

import json
import os
from typing import Any

import click

from headwater.cli.options import json_and_bootstrap_options
from headwater.cli.output import Table, echo, fail, print_table
from headwater.client import Admin, ClusterMetadata
from headwater.healthcheck import node_serving


@click.group()
def cluster() -> None:
    """Cluster state."""


@cluster.command("status")
@json_and_bootstrap_options
def cluster_status(as_json: bool, bootstrap: str | None) -> None:
    """The active controller, the Raft term, and every broker's state."""
    with Admin(bootstrap) as admin:
        data = status_json(admin.metadata())
    if as_json:
        print(json.dumps(data))
    else:
        print_status(data)


@cluster.command("health")
@click.option(
    "--address",
    metavar="HOST:PORT",
    default=None,
    help="The node's client listener (default: the first address of HEADWATER_BOOTSTRAP, "
    "else 127.0.0.1:7700).",
)
@click.option("--timeout-ms", type=click.IntRange(1, 600_000), default=2000, show_default=True)
def cluster_health(address: str | None, timeout_ms: int) -> None:
    """Exit 0 when the node at ADDRESS answers the gRPC health check with SERVING, 1
    otherwise (a container HEALTHCHECK or a readiness probe). One node, not the cluster:
    --address, not --bootstrap."""
    if address is None:
        bootstrap = os.environ.get("HEADWATER_BOOTSTRAP", "").split(",")[0].strip()
        address = bootstrap or "127.0.0.1:7700"

    if not node_serving(address, timeout_ms / 1000):
        fail(f"node at {address} is not serving (or did not answer in {timeout_ms} ms)")
    click.echo(f"node at {address} is serving")


def status_json(metadata: ClusterMetadata) -> dict[str, Any]:
    """The JSON of ``cluster status``: controller, quorum view, brokers, partition health."""
    # Internal topics (names starting with "__", as topics list hides them) are counted
    # apart from the users' own.
    internal = [t for t in metadata.topics if t.name.startswith("__")]
    partitions = [p for t in metadata.topics for p in t.partitions]
    return {
        "cluster_id": metadata.cluster_id,
        "controller_id": metadata.controller_id,
        "raft_term": metadata.raft_term,
        "raft_commit_index": metadata.raft_commit_index,
        "metadata_offset": metadata.metadata_offset,
        "answered_by": metadata.node_id,
        "brokers": [
            {
                "id": b.node_id,
                "address": b.address,
                "rack": b.rack,
                "state": b.state,
                "log_dir_problem": b.log_dir_problem,
            }
            for b in metadata.brokers
        ],
        "topics": len(metadata.topics) - len(internal),
        "partitions": len(partitions) - sum(len(t.partitions) for t in internal),
        "internal_topics": {t.name: len(t.partitions) for t in internal},
        "offline_partitions": sum(1 for p in partitions if p.leader < 0),
        "under_replicated_partitions": sum(1 for p in partitions if len(p.isr) < len(p.replicas)),
    }


def print_status(data: dict[str, Any]) -> None:
    controller = data["controller_id"]
    echo(
        f"cluster {data['cluster_id'] or '(unnamed)'}  controller "
        f"{'none' if controller < 0 else f'node {controller}'}  raft term {data['raft_term']}  "
        f"commit index {data['raft_commit_index']}  (answered by node {data['answered_by']})",
    )
    table = Table("broker", "address", "rack", "state")
    for broker in data["brokers"]:
        table.add_row(str(broker["id"]), broker["address"], broker["rack"], broker["state"])
    print_table(table)
    for broker in data["brokers"]:
        if broker["log_dir_problem"]:
            echo(
                f"broker {broker['id']}: data folder offline: {broker['log_dir_problem']}",
            )
    echo(
        f"{data['topics']} topic(s), {data['partitions']} partition(s)"
        + "".join(
            f" (and {name}, {count} partition(s))"
            for name, count in data["internal_topics"].items()
        )
        + f"; of them all: {data['offline_partitions']} offline, "
        f"{data['under_replicated_partitions']} under-replicated",
    )
