"""``headwater debug``: checks for operators and tests, through the nodes' own answers.

``compare-replicas`` has each replica's node hash its stored batches below the high
watermark; ``compare-metadata`` compares every node's metadata image (offset and
SHA-256). Both exit 1 when what must be identical is not, or a node cannot be asked
(``headwater.tools.chaos.replicas`` does the comparing, for the chaos suite too).
"""

from __future__ import annotations

import json
import sys

import click

from headwater.cli.options import json_and_bootstrap_options
from headwater.cli.output import Table, echo, print_table
from headwater.client import Admin
from headwater.tools.chaos.replicas import (
    compare_metadata,
    compare_replicas,
    comparison_json,
    metadata_comparison_json,
)


@click.group()
def debug() -> None:
    """Checks for operators and tests (replica and metadata consistency)."""


@debug.command("compare-replicas")
@click.argument("topic")
@json_and_bootstrap_options
def debug_compare_replicas(topic: str, as_json: bool, bootstrap: str | None) -> None:
    """Compare every replica of TOPIC byte for byte below the high watermark.

    For each partition, each replica's node hashes its stored batches in [the largest
    log start, the smallest high watermark) over the replicas. Exits 1 when replicas
    differ or a replica cannot be asked.
    """
    with Admin(bootstrap) as admin:
        comparisons = compare_replicas(admin, topic)
    identical = all(c.identical for c in comparisons)
    if as_json:
        print(
            json.dumps(
                {
                    "topic": topic,
                    "identical": identical,
                    "partitions": [comparison_json(c) for c in comparisons],
                }
            )
        )
    else:
        table = Table("partition", "range", "replica", "hw", "end", "batches", "bytes", "sha256")
        for c in comparisons:
            for view in c.views:
                table.add_row(
                    str(c.partition),
                    f"[{c.start_offset}, {c.end_offset})",
                    f"{view.node_id}{' (leader)' if view.is_leader else ''}",
                    str(view.high_watermark),
                    str(view.log_end_offset),
                    str(view.batch_count),
                    str(view.size_bytes),
                    view.sha256[:16],
                )
        print_table(table)
        for c in comparisons:
            for view in c.views:
                if view.damage:
                    echo(
                        f"partition {c.partition}: node {view.node_id} set aside: {view.damage}",
                    )
            for node_id, error in c.errors:
                echo(f"partition {c.partition}: node {node_id}: {error}")
            if c.differences:
                echo(f"partition {c.partition}: replicas differ:")
                for line in c.differences:
                    echo(f"  {line}")
        differing = sum(1 for c in comparisons if not c.identical)
        echo(
            f"{len(comparisons)} partition(s): "
            + ("replicas identical" if identical else f"{differing} with differences"),
        )
    if not identical:
        sys.exit(1)


@debug.command("compare-metadata")
@click.option(
    "--wait",
    type=click.FloatRange(0, 600),
    default=10.0,
    show_default=True,
    help="Seconds to wait for every node to reach one metadata offset.",
)
@json_and_bootstrap_options
def debug_compare_metadata(wait: float, as_json: bool, bootstrap: str | None) -> None:
    """Compare every node's metadata image (offset and SHA-256).

    Nodes at one offset must hold the same image. Waits up to --wait seconds for a change
    in flight to reach every node. Exits 1 when images differ or a node cannot be asked.
    """
    with Admin(bootstrap) as admin:
        addresses = {b.node_id: b.address for b in admin.metadata().brokers}
        comparison = compare_metadata(admin, addresses, deadline_s=wait)
    if as_json:
        print(json.dumps(metadata_comparison_json(comparison)))
    else:
        table = Table("node", "metadata offset", "sha256")
        for view in comparison.views:
            table.add_row(str(view.node_id), str(view.offset), view.digest)
        print_table(table)
        for node_id, error in comparison.errors:
            echo(f"node {node_id}: {error}")
        for line in comparison.differences:
            echo(line)
        echo(
            "metadata images identical" if comparison.identical else "metadata images differ",
        )
    if not comparison.identical:
        sys.exit(1)
