"""``headwater cluster status`` and ``headwater dev-cluster``.

``dev-cluster`` runs N combined nodes (controller and broker) on loopback, each a child
``headwater serve`` process: node i (1-based) serves gRPC on ``base_port + 2(i-1)`` and
Raft on the port after it, keeps its data in ``DIR/node-i`` and its log in
``DIR/node-i.log``. The nodes share a random Raft secret. Ctrl-C (or SIGTERM) stops them
all with SIGTERM (controlled shutdown) and waits for them.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from headwater.errors import ErrorCode, HeadwaterError

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


@dataclass
class DevNode:
    node_id: int
    address: str
    raft_address: str
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None


def plan(nodes: int, base_port: int, data_dir: Path) -> list[DevNode]:
    if base_port + 2 * nodes > 65535:
        raise HeadwaterError(
            ErrorCode.INVALID_CONFIG,
            f"--base-port {base_port} leaves no room for {nodes} nodes (2 ports each)",
        )
    return [
        DevNode(
            node_id=i,
            address=f"127.0.0.1:{base_port + 2 * (i - 1)}",
            raft_address=f"127.0.0.1:{base_port + 2 * (i - 1) + 1}",
            data_dir=data_dir / f"node-{i}",
            log_path=data_dir / f"node-{i}.log",
        )
        for i in range(1, nodes + 1)
    ]


def run_dev_cluster(nodes: int, base_port: int, data_dir: Path) -> None:
    cluster = plan(nodes, base_port, data_dir)
    quorum = ",".join(f"{n.node_id}@{n.raft_address}" for n in cluster)
    data_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HEADWATER_CLUSTER_SECRET": secrets.token_hex(16)}
    stopping = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for node in cluster:
            node.process = spawn(node, quorum, env)
        wait_ready(cluster, lambda: stopping)
        bootstrap = ",".join(n.address for n in cluster)
        for node in cluster:
            click.echo(
                f"node {node.node_id}: {node.address} (raft {node.raft_address}, data "
                f"{node.data_dir}, log {node.log_path})"
            )
        click.echo(f"bootstrap: {bootstrap}")
        click.echo(f"export HEADWATER_BOOTSTRAP={bootstrap}")
        click.echo("Ctrl-C stops the cluster.")
        sys.stdout.flush()
        reported: set[int] = set()
        while not stopping:
            for node in cluster:
                code = node.process.poll() if node.process else None
                if code is not None and node.node_id not in reported:
                    reported.add(node.node_id)
                    click.echo(f"node {node.node_id} exited with status {code}")
            time.sleep(0.2)
    finally:
        stop_all(cluster)


def spawn(node: DevNode, quorum: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    node.data_dir.mkdir(parents=True, exist_ok=True)
    log: IO[bytes] = open(node.log_path, "ab")  # noqa: SIM115 (the child keeps it)
    try:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headwater.cli",
                "serve",
                "--node-id",
                str(node.node_id),
                "--listen",
                node.address,
                "--quorum",
                quorum,
                "--data-dir",
                str(node.data_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches this process, which stops the nodes
        )
    finally:
        log.close()


def wait_ready(cluster: list[DevNode], stopping: Any) -> None:
    deadline = time.monotonic() + READY_DEADLINE_S
    pending = {n.node_id: n for n in cluster}
    while pending and not stopping():
        for node in list(pending.values()):
            assert node.process is not None
            if node.process.poll() is not None:
                raise HeadwaterError(
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"node {node.node_id} exited with status {node.process.returncode}; "
                    f"see {node.log_path}",
                )
            try:
                with grpc.insecure_channel(node.address) as channel:
                    reply = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(), timeout=1
                    )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    del pending[node.node_id]
            except grpc.RpcError:
                pass
        if time.monotonic() > deadline:
            raise HeadwaterError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"node(s) {sorted(pending)} not ready after {READY_DEADLINE_S:g} s; see their logs",
            )
        time.sleep(0.1)


def stop_all(cluster: list[DevNode]) -> None:
    running = [n for n in cluster if n.process is not None and n.process.poll() is None]
    for node in running:
        assert node.process is not None
        node.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_DEADLINE_S
    for node in running:
        assert node.process is not None
        try:
            node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()
    if running:
        _out.print(f"stopped {len(running)} node(s)", markup=False)


def print_json(data: Any) -> None:
    print(json.dumps(data))
