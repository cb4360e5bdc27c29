"""``headwater cluster status`` and ``headwater dev-cluster``.

``dev-cluster`` runs N combined nodes (controller and broker) on loopback, each a child
``headwater serve`` process: node i (1-based) serves gRPC on ``base_port + 2(i-1)`` and
Raft on the port after it, keeps its data in ``DIR/node-i`` and its log in
``DIR/node-i.log``. The nodes share a random Raft secret. The nodes are
``headwater.devcluster``'s, as the tests' and the benchmarks' are. Ctrl-C (or SIGTERM) stops them
all with SIGTERM (controlled shutdown) and waits for them.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click
from rich.console import Console
from rich.table import Table

from headwater.devcluster import (
    LocalCluster,
    NodeExitedError,
    PortPlan,
    WaitTimeoutError,
)
from headwater.errors import ErrorCode, HeadwaterError

if TYPE_CHECKING:
    from headwater.tls_certs import DevPki

READY_DEADLINE_S: Final = 60.0
STOP_DEADLINE_S: Final = 30.0
_out = Console(highlight=False)


def status_json(metadata: Any) -> dict[str, Any]:
    """The JSON of ``cluster status``: controller, quorum view, brokers, partition health."""
    partitions = [p for t in metadata.topics for p in t.partitions]
    return {
        "cluster_id": metadata.cluster_id,
        "controller_id": metadata.controller_id,
        "raft_term": metadata.raft_term,
        "raft_commit_index": metadata.raft_commit_index,
        "metadata_offset": metadata.metadata_offset,
        "answered_by": metadata.node_id,
        "brokers": [
            {"id": b.node_id, "address": b.address, "rack": b.rack, "state": b.state}
            for b in metadata.brokers
        ],
        "topics": len(metadata.topics),
        "partitions": len(partitions),
        "offline_partitions": sum(1 for p in partitions if p.leader < 0),
        "under_replicated_partitions": sum(1 for p in partitions if len(p.isr) < len(p.replicas)),
    }


def print_status(data: dict[str, Any]) -> None:
    controller = data["controller_id"]
    _out.print(
        f"cluster {data['cluster_id'] or '(unnamed)'}  controller "
        f"{'none' if controller < 0 else f'node {controller}'}  raft term {data['raft_term']}  "
        f"commit index {data['raft_commit_index']}  (answered by node {data['answered_by']})",
        markup=False,
    )
    table = Table("broker", "address", "rack", "state")
    for broker in data["brokers"]:
        table.add_row(str(broker["id"]), broker["address"], broker["rack"], broker["state"])
    _out.print(table)
    _out.print(
        f"{data['topics']} topic(s), {data['partitions']} partition(s): "
        f"{data['offline_partitions']} offline, "
        f"{data['under_replicated_partitions']} under-replicated",
        markup=False,
    )


# ---------------------------------------------------------------------- dev-cluster


def dev_layout(root: Path, node_id: int) -> tuple[Path, Path]:
    """``dev-cluster``'s node folders: data in ``DIR/node-i``, log in ``DIR/node-i.log``."""
    return root / f"node-{node_id}", root / f"node-{node_id}.log"


def start_dev_cluster(
    nodes: int,
    base_port: int,
    data_dir: Path,
    stopping: Callable[[], bool],
    metrics_base_port: int = 0,
    tls: bool = False,
) -> LocalCluster:
    """Start ``nodes`` nodes on the fixed port plan and wait until each serves (or
    ``stopping()``); on failure every node is killed and HeadwaterError names the cause.
    ``tls``: mutual TLS with the PKI under ``data_dir/tls`` (``dev_pki``)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    pki = dev_pki(data_dir / "tls", nodes) if tls else None
    cluster = LocalCluster(
        data_dir,
        nodes,
        ports=PortPlan(base_port),
        internal_listener=False,
        layout=dev_layout,
        metrics_base_port=metrics_base_port or None,
        tls=pki,
        tls_client_auth=tls,
    )
    try:
        cluster.start(wait=False, own_session=True)  # Ctrl-C reaches this process only
        cluster.wait_serving(READY_DEADLINE_S, stopping)
    except (NodeExitedError, WaitTimeoutError) as error:
        cluster.close()
        raise HeadwaterError(ErrorCode.UNKNOWN_SERVER_ERROR, str(error)) from None
    except BaseException:  # a Ctrl-C while waiting: no node outlives this process
        cluster.close()
        raise
    return cluster


def dev_pki(folder: Path, nodes: int) -> DevPki:
    """The development PKI under ``folder``: kept from an earlier run when every file is
    there and the certificates are still valid for a day, so that exported client
    settings keep working across restarts; made anew otherwise."""
    from headwater.tls_certs import create_dev_pki, load_dev_pki  # noqa: PLC0415 (server extra)

    node_ids = tuple(range(1, nodes + 1))
    kept = load_dev_pki(folder.resolve(), node_ids)
    return kept if kept is not None else create_dev_pki(folder.resolve(), node_ids)


def run_dev_cluster(
    nodes: int, base_port: int, data_dir: Path, metrics_base_port: int, tls: bool = False
) -> None:
    stopping = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cluster = start_dev_cluster(
        nodes, base_port, data_dir, lambda: stopping, metrics_base_port, tls
    )
    try:
        for node in cluster.nodes.values():
            click.echo(
                f"node {node.node_id}: {node.address} (raft {node.raft_address}, "
                f"metrics {node.metrics_address or 'off'}, data {node.data_dir}, "
                f"log {node.log_path})"
            )
        click.echo(f"bootstrap: {cluster.bootstrap(list(cluster.nodes.values()))}")
        click.echo(f"export HEADWATER_BOOTSTRAP={cluster.bootstrap(list(cluster.nodes.values()))}")
        security = cluster.client_security
        if security.tls:
            click.echo("mutual TLS: clients present a certificate signed by the cluster's CA")
            click.echo("export HEADWATER_SECURITY_PROTOCOL=SSL")
            click.echo(f"export HEADWATER_TLS_CA_FILE={Path(security.ca_file).resolve()}")
            click.echo(f"export HEADWATER_TLS_CERT_FILE={Path(security.cert_file).resolve()}")
            click.echo(f"export HEADWATER_TLS_KEY_FILE={Path(security.key_file).resolve()}")
        click.echo("Ctrl-C stops the cluster.")
        sys.stdout.flush()
        reported: set[int] = set()
        while not stopping:
            for node in cluster.nodes.values():
                code = node.process.poll() if node.process else None
                if code is not None and node.node_id not in reported:
                    reported.add(node.node_id)
                    click.echo(f"node {node.node_id} exited with status {code}")
            time.sleep(0.2)
    finally:
        stop(cluster)


def stop(cluster: LocalCluster) -> None:
    """Stop every node with SIGTERM (controlled shutdown), SIGKILL after STOP_DEADLINE_S."""
    stopped = cluster.stop_all(STOP_DEADLINE_S)
    cluster.close()
    if stopped:
        _out.print(f"stopped {stopped} node(s)", markup=False)


def print_json(data: Any) -> None:
    print(json.dumps(data))
