"""The nodes of a chaos run: real ``headwater serve`` processes that it kills, pauses and
restarts by their own process ids.

On loopback, node i listens on 127.0.0.1 with ports from ``headwater.tools.ports``; in network
namespaces (``headwater.tools.chaos.netns``), node i runs inside ``<prefix>-n<i>`` and listens on
its namespace's address: gRPC for clients on 7700, Raft on 7701, the inter-broker
listener on 7702 and, when the cluster serves Kafka's protocol (``kafka=True``, for the
Kafka-client workload), the Kafka listener on 7703. The Kafka listener's advertised
address (``--kafka-advertised-address``, what Metadata answers tell Kafka clients) is
the address it listens on: 127.0.0.1 on loopback, the node's namespace address
otherwise, which the clients reach from the hub namespace as they reach the gRPC
listener. Each node keeps its data in
``ROOT/n<i>/data`` (on its own file system, ``ROOT/n<i>/disk/data``, when the run has
disk faults: ``headwater.tools.chaos.disks``) and appends its output to ``ROOT/n<i>.log`` (kept
across restarts).

Metadata questions (who leads a partition, which node is the controller, are the ISRs
full) go through ``headwater.client.Admin``, asked of one node at a time so that a
paused node costs one short timeout, not a whole call.

Thread-safety: one thread (the runner's nemesis loop) drives the processes.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

import grpc

from headwater.client import Admin, ClusterMetadata, node_serving
from headwater.shared.errors import HeadwaterError
from headwater.tools.chaos.disks import Disks
from headwater.tools.chaos.netns import Topology
from headwater.tools.ports import free_port

NETNS_CLIENT_PORT: Final = 7700
NETNS_RAFT_PORT: Final = 7701
NETNS_INTERNAL_PORT: Final = 7702
NETNS_KAFKA_PORT: Final = 7703
STOP_TIMEOUT_S: Final = 20.0
GROUP_SESSION_TIMEOUT_MS: Final = 10_000
"""The nodes' session timeout of consumer-protocol (KIP-848) members in a Kafka-client
run, the classic members' own (``kafka_workload.SESSION_TIMEOUT_MS``)."""
METADATA_TIMEOUT_S: Final = 2.0
HEALTH_TIMEOUT_S: Final = 1.0
T = TypeVar("T")


def wait_for(
    condition: Callable[[], T | None], deadline_s: float, interval_s: float = 0.1
) -> T | None:
    """Poll ``condition`` until it returns something truthy (returned) or the deadline
    passes (None). Exceptions count as "not yet"."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            value = condition()
        except (HeadwaterError, grpc.RpcError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() >= end:
            return None
        time.sleep(interval_s)


@dataclass
class Node:
    node_id: int
    host: str
    port: int
    raft_port: int
    data_dir: Path
    log_path: Path
    namespace: str | None
    internal_port: int = 0
    kafka_port: int | None = None
    """The Kafka listener's port (None: the node serves no Kafka protocol)."""
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    starts: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def kafka_address(self) -> str | None:
        return None if self.kafka_port is None else f"{self.host}:{self.kafka_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.running and self.process is not None else None


class ChaosCluster:
    def __init__(
        self,
        root: Path,
        size: int,
        topology: Topology | None,
        disks: Disks | None = None,
        kafka: bool = False,
    ) -> None:
        self.root = root
        self.topology = topology
        self.disks = disks
        self.nodes: dict[int, Node] = {}
        for i in range(1, size + 1):
            kafka_port: int | None = None
            if topology is not None:
                host, port, raft = topology.ip(i), NETNS_CLIENT_PORT, NETNS_RAFT_PORT
                internal = NETNS_INTERNAL_PORT
                if kafka:
                    kafka_port = NETNS_KAFKA_PORT
            else:
                host, port, raft, internal = "127.0.0.1", free_port(), free_port(), free_port()
                if kafka:
                    kafka_port = free_port()
            self.nodes[i] = Node(
                i,
                host,
                port,
                raft,
                disks.data_dir(i) if disks is not None else root / f"n{i}" / "data",
                root / f"n{i}.log",
                topology.namespace(i) if topology is not None else None,
                internal,
                kafka_port,
            )
        self.quorum = ",".join(f"{n.node_id}@{n.host}:{n.raft_port}" for n in self.nodes.values())
        self.env = {**os.environ, "HEADWATER_CLUSTER_SECRET": secrets.token_hex(16)}
        if kafka:  # the consumer-protocol members' session, as the classic members' own
            self.env["HEADWATER_GROUP_SESSION_TIMEOUT_MS"] = str(GROUP_SESSION_TIMEOUT_MS)
        self._admins: dict[int, Admin] = {}
        self._stopped: set[int] = set()  # nodes down because this cluster stopped them
        self.unexpected_exits: list[tuple[int, int | None]] = []
        """(node id, exit status) of nodes found dead by ``kill``, ``terminate`` or
        ``start`` before they were stopped here: crashes a later stop would hide."""

    def _note_exit(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.process is not None and not node.running and node_id not in self._stopped:
            self.unexpected_exits.append((node_id, node.process.returncode))
            self._stopped.add(node_id)  # reported once

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes.values())

    @property
    def kafka_bootstrap(self) -> str:
        """Every node's Kafka listener (``bootstrap.servers``); "" without ``kafka``."""
        return ",".join(n.kafka_address for n in self.nodes.values() if n.kafka_address)

    # ------------------------------------------------------------------ processes

    def start(self, node_id: int) -> None:
        self._note_exit(node_id)
        node = self.nodes[node_id]
        assert not node.running, f"node {node_id} is running"
        node.data_dir.mkdir(parents=True, exist_ok=True)
        prefix = ["ip", "netns", "exec", node.namespace] if node.namespace else []
        kafka = (
            ["--kafka-listen", node.kafka_address, "--kafka-advertised-address", node.kafka_address]
            if node.kafka_address
            else []
        )
        with open(node.log_path, "ab") as log:
            node.process = subprocess.Popen(
                [
                    *prefix,
                    sys.executable,
                    "-m",
                    "headwater.cli.main",
                    "serve",
                    "--node-id",
                    str(node_id),
                    "--listen",
                    node.address,
                    "--internal-listen",
                    f"{node.host}:{node.internal_port}",
                    "--quorum",
                    self.quorum,
                    "--data-dir",
                    str(node.data_dir),
                    *kafka,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**self.env, **(self.disks.env(node_id) if self.disks else {})},
                start_new_session=True,  # Ctrl-C reaches the runner, which stops the nodes
            )
        node.paused = False
        node.starts += 1
        self._stopped.discard(node_id)

    def kill(self, node_id: int) -> None:
        """SIGKILL and reap (a paused node dies too)."""
        self._note_exit(node_id)
        node = self.nodes[node_id]
        self._stopped.add(node_id)
        if node.process is not None and node.running:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(timeout=STOP_TIMEOUT_S)
        node.paused = False

    def pause(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.process is not None and node.running:
            node.process.send_signal(signal.SIGSTOP)
            node.paused = True

    def resume(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.process is not None and node.running and node.paused:
            node.process.send_signal(signal.SIGCONT)
        node.paused = False

    def terminate(self, node_id: int, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM (controlled shutdown), SIGKILL after ``timeout_s``; the exit status."""
        self._note_exit(node_id)
        node = self.nodes[node_id]
        if node.process is None or not node.running:
            return None
        self._stopped.add(node_id)
        self.resume(node_id)
        node.process.send_signal(signal.SIGTERM)
        try:
            return node.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            node.process.send_signal(signal.SIGKILL)
            return node.process.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> list[str]:
        """Stop every node this cluster started, each by its pid: SIGCONT and SIGTERM to
        all at once, SIGKILL to those still running after STOP_TIMEOUT_S; close the
        clients. Returns a line per node stopped."""
        stopping = {i: n for i, n in self.nodes.items() if n.process is not None and n.running}
        for node_id, node in stopping.items():
            self.resume(node_id)
            assert node.process is not None
            node.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        stopped = []
        for node_id, node in stopping.items():
            assert node.process is not None
            try:
                status = node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.send_signal(signal.SIGKILL)
                try:
                    status = node.process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    stopped.append(f"node {node_id} (pid {node.process.pid}) did not die")
                    continue
            stopped.append(f"stopped node {node_id} (pid {node.process.pid}, exit status {status})")
        for admin in self._admins.values():
            admin.close()
        self._admins.clear()
        return stopped

    def exited_on_their_own(self) -> dict[int, int | None]:
        """{node id: exit status} of started nodes that are down without having been
        stopped here (a crash: always worth reporting)."""
        return {
            i: n.process.returncode
            for i, n in self.nodes.items()
            if n.process is not None and not n.running and i not in self._stopped
        }

    def up(self) -> list[int]:
        """Ids of nodes that run and are not paused."""
        return [i for i, n in self.nodes.items() if n.running and not n.paused]

    # ------------------------------------------------------------------ questions

    def serving(self, node_id: int) -> bool:
        node = self.nodes[node_id]
        if not node.running or node.paused:
            return False
        return node_serving(node.address, HEALTH_TIMEOUT_S)

    def wait_serving(self, node_ids: Iterable[int], deadline_s: float) -> list[int]:
        """Wait until the nodes serve; return those that did not by the deadline."""
        pending = set(node_ids)

        def all_serving() -> bool:
            for node_id in sorted(pending):
                try:
                    if self.serving(node_id):
                        pending.discard(node_id)
                except grpc.RpcError:
                    pass
            return not pending

        wait_for(all_serving, deadline_s, 0.2)
        return sorted(pending)

    def admin(self, node_id: int) -> Admin:
        admin = self._admins.get(node_id)
        if admin is None:
            admin = Admin(self.nodes[node_id].address, request_timeout_s=METADATA_TIMEOUT_S)
            self._admins[node_id] = admin
        return admin

    def metadata(
        self, topic: str | None = None, via: Iterable[int] | None = None
    ) -> ClusterMetadata | None:
        """The first answer of the nodes ``via`` (default: every node up), or None."""
        for node_id in via if via is not None else self.up():
            try:
                return self.admin(node_id).metadata([topic] if topic else [])
            except HeadwaterError:
                continue
        return None

    def controller(self, via: Iterable[int] | None = None) -> int | None:
        metadata = self.metadata(None, via)
        if metadata is None or metadata.controller_id < 0:
            return None
        return int(metadata.controller_id)

    def leader(self, topic: str, partition: int, via: Iterable[int] | None = None) -> int | None:
        metadata = self.metadata(topic, via)
        if metadata is None:
            return None
        for t in metadata.topics:
            for p in t.partitions:
                if t.name == topic and p.partition == partition and p.leader >= 0:
                    return int(p.leader)
        return None

    def in_sync(self, topic: str) -> bool:
        """Every node up, agreeing that every partition has a leader and a full ISR."""
        up = self.up()
        if len(up) != len(self.nodes):
            return False
        for node_id in up:
            metadata = self.admin(node_id).metadata([topic])
            partitions = [p for t in metadata.topics if t.name == topic for p in t.partitions]
            if not partitions or metadata.controller_id < 0:
                return False
            for p in partitions:
                if p.leader < 0 or set(p.isr) != set(p.replicas):
                    return False
        return True
