"""``headwater serve``: run one node on the settings of its flags, the environment and a
config file (``headwater.node.config``), until Ctrl-C or SIGTERM.

The server's own modules are imported only when the node starts, once the settings are
read and the metrics listener (if any) is bound: a restarted node's metrics answer as
early as the process can, ``headwater --help`` (which loads this module) works without
the ``server`` extra, and ``serve`` without it is told which extra to install.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import click

from headwater.cli.output import fail
from headwater.node.config import load as load_config


@click.command()
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="TOML config file.")
@click.option("--node-id", type=int, help="This node's id (default 1).")
@click.option("--data-dir", help="Folder for the node's data (default ./data).")
@click.option(
    "--listen", metavar="HOST:PORT", help="Address to serve gRPC on (default 127.0.0.1:7700)."
)
@click.option("--advertised-address", metavar="HOST:PORT", help="Address clients are told to use.")
@click.option(
    "--internal-listen",
    metavar="HOST:PORT",
    help="Inter-broker listener: Controller and Replica services, for nodes holding the "
    "cluster secret (default: the --listen host, a port the system picks).",
)
@click.option(
    "--kafka-listen",
    metavar="HOST:PORT",
    help="Serve the Kafka wire protocol there, for Kafka clients (default: off).",
)
@click.option(
    "--kafka-advertised-address",
    metavar="HOST:PORT",
    help="Address Kafka clients are told to use (default: --kafka-listen, a wildcard host "
    "replaced by the --advertised-address host); needs a --kafka-listen with a fixed port.",
)
@click.option(
    "--quorum",
    metavar="ID@HOST:PORT,...",
    help="Raft addresses of the controller voters by node id (default: this node alone, "
    "on a port the system picks).",
)
@click.option(
    "--roles",
    type=click.Choice(["controller,broker", "broker,controller", "controller", "broker"]),
    help="controller, broker, or both (default: both).",
)
@click.option(
    "--controller-addresses",
    metavar="HOST:PORT,...",
    help="Inter-broker addresses (--internal-listen) of controller nodes: broker-only nodes "
    "follow the metadata there.",
)
@click.option("--rack", help="Rack of this node (replicas are spread across racks).")
@click.option(
    "--metrics-listen",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics over HTTP there (docs/metrics.md; default: off).",
)
def serve(
    config_file: Path | None,
    node_id: int | None,
    data_dir: str | None,
    listen: str | None,
    advertised_address: str | None,
    internal_listen: str | None,
    kafka_listen: str | None,
    kafka_advertised_address: str | None,
    quorum: str | None,
    roles: str | None,
    controller_addresses: str | None,
    rack: str | None,
    metrics_listen: str | None,
) -> None:
    """Run a node (Ctrl-C or SIGTERM stops it cleanly, moving its leadership away first).

    With no flags: a single local node on 127.0.0.1:7700 with data in ./data. In a cluster,
    give every node its --node-id, --listen, --data-dir and the same --quorum, and the same
    secret with HEADWATER_CLUSTER_SECRET (or cluster_secret in the config file).
    """
    flags = {
        "node_id": node_id,
        "data_dir": data_dir,
        "listen": listen,
        "advertised_address": advertised_address,
        "internal_listen": internal_listen,
        "kafka_listen": kafka_listen,
        "kafka_advertised_address": kafka_advertised_address,
        "quorum": quorum,
        "roles": roles,
        "controller_addresses": controller_addresses,
        "rack": rack,
        "metrics_listen": metrics_listen,
    }
    config = load_config(config_file, os.environ, flags)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    metrics_endpoint = None
    if config.metrics_listen:
        # Bound before the server's modules load (over half a second): a restarted
        # node's metrics answer as early as the process can.
        from headwater.node.ops.metrics_endpoint import (  # noqa: PLC0415
            MetricsEndpoint,
            MetricsListenError,
        )

        try:
            metrics_endpoint = MetricsEndpoint(config.metrics_listen, config.node_id, config.roles)
        except MetricsListenError as exc:
            fail(str(exc))
    # Here, not at the top: `headwater --help` loads this module, and the server's
    # modules need the server extra (the headwater group names it when one is missing).
    from headwater.node.replicas.log_manager import DataDirError  # noqa: PLC0415
    from headwater.node.server import ListenError  # noqa: PLC0415
    from headwater.node.server import serve as run_node  # noqa: PLC0415

    try:
        run_node(config, metrics_endpoint)
    except (DataDirError, ListenError) as exc:
        fail(str(exc))
