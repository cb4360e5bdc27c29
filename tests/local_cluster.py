"""A cluster of real ``headwater serve`` processes on loopback, for multi-process tests."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import grpc

from headwater.ports import free_port
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess, wait_until

CLUSTER_SECRET = "test-secret"


class LocalCluster:
    """``size`` combined nodes (ids 1..size) sharing one quorum and a Raft secret."""

    def __init__(
        self,
        root: Path,
        size: int,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        raft_ports = {i: free_port() for i in range(1, size + 1)}
        self.quorum = ",".join(f"{i}@127.0.0.1:{port}" for i, port in raft_ports.items())
        self.env = {"HEADWATER_CLUSTER_SECRET": CLUSTER_SECRET, **(env or {})}
        self.nodes = {
            i: NodeProcess(
                root / f"n{i}" / "data",
                node_id=i,
                quorum=self.quorum,
                env=self.env,
                extra_args=extra_args,
            )
            for i in range(1, size + 1)
        }

    def start(self) -> None:
        """Start every node and wait until all serve (all are killed if one fails)."""
        try:
            for node in self.nodes.values():
                node.start(wait=False)
            for node in self.nodes.values():
                node.wait_serving()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for node in self.nodes.values():
            node.kill()

    def alive(self) -> list[NodeProcess]:
        return [
            n for n in self.nodes.values() if n.process is not None and n.process.poll() is None
        ]

    def bootstrap(self, nodes: list[NodeProcess] | None = None) -> str:
        return ",".join(n.address for n in (nodes if nodes is not None else self.alive()))

    def metadata(self, node: NodeProcess, topics: tuple[str, ...] = ()) -> pb.MetadataResponse:
        with grpc.insecure_channel(node.address) as channel:
            response: pb.MetadataResponse = pb_grpc.BrokerStub(channel).Metadata(
                pb.MetadataRequest(topics=list(topics)), timeout=5
            )
            return response

    def controller_id(self, via: NodeProcess) -> int:
        return self.metadata(via).controller_id

    def wait_controller(self, excluding: tuple[int, ...] = (), deadline_s: float = 20) -> int:
        """The id of an active controller that all live nodes agree on."""

        def agreed() -> int | None:
            ids = {self.controller_id(n) for n in self.alive()}
            (only,) = ids if len(ids) == 1 else (None,)
            return only if only is not None and only >= 0 and only not in excluding else None

        return int(wait_until(agreed, deadline_s, f"a controller other than {excluding}"))

    def partitions(self, via: NodeProcess, topic: str) -> list[Any]:
        (described,) = self.metadata(via, (topic,)).topics
        return sorted(described.partitions, key=lambda p: p.partition)

    def broker_states(self, via: NodeProcess) -> dict[int, str]:
        return {b.node_id: b.state for b in self.metadata(via).brokers}

    def pause(self, node_id: int) -> None:
        self._signal(node_id, signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        self._signal(node_id, signal.SIGCONT)

    def _signal(self, node_id: int, sig: int) -> None:
        process = self.nodes[node_id].process
        assert process is not None
        process.send_signal(sig)
