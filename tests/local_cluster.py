"""A cluster of real ``headwater serve`` processes on loopback for multi-process tests:
headwater.tools.devcluster's LocalCluster with a known secret and metadata helpers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from headwater.tools import devcluster
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess, wait_until

CLUSTER_SECRET = "test-secret"


class LocalCluster(devcluster.LocalCluster):
    """``size`` combined nodes (ids 1..size) sharing one quorum and CLUSTER_SECRET."""

    def __init__(
        self,
        root: Path,
        size: int,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        metrics_base_port: int | None = None,
        layout: Callable[[Path, int], tuple[Path, Path]] | None = None,
        kafka_ports: dict[int, int] | None = None,
    ) -> None:
        super().__init__(
            root,
            size,
            env,
            extra_args,
            secret=CLUSTER_SECRET,
            metrics_base_port=metrics_base_port,
            layout=layout,
            kafka_ports=kafka_ports,
        )

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
        self.nodes[node_id].pause()

    def resume(self, node_id: int) -> None:
        self.nodes[node_id].resume()


class ControllerWatch(threading.Thread):
    """Samples, every 0.1 s, which controller the nodes ``node_ids`` name and which
    brokers they see fenced; keeps the longest stretch in which they named no controller
    they agree on (``longest_gap_s``), who they named (``named``: (monotonic time, id or
    -1)) and every broker seen fenced (``fenced``)."""

    def __init__(self, cluster: LocalCluster, node_ids: tuple[int, ...]) -> None:
        super().__init__(daemon=True)
        self.addresses = [cluster.nodes[i].address for i in node_ids]
        self.stop = threading.Event()
        self.longest_gap_s = 0.0
        self.named: list[tuple[float, int]] = []
        self.fenced: set[int] = set()

    def controller(self) -> int:
        ids = set()
        for address in self.addresses:
            with grpc.insecure_channel(address) as channel:
                try:
                    response = pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=1)
                except grpc.RpcError:
                    return -1
                ids.add(response.controller_id)
                self.fenced |= {b.node_id for b in response.brokers if b.state == "fenced"}
        return ids.pop() if len(ids) == 1 else -1

    def run(self) -> None:
        gap_began: float | None = None
        while not self.stop.wait(0.1):
            now = time.monotonic()
            found = self.controller()
            self.named.append((now, found))
            if found < 0:
                gap_began = gap_began if gap_began is not None else now
                self.longest_gap_s = max(self.longest_gap_s, now - gap_began)
            else:
                gap_began = None
