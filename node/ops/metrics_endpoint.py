"""The HTTP endpoint of a node's Prometheus metrics (``metrics_listen``), kept apart from
``headwater.node.ops.metrics`` so that it imports only prometheus_client: ``headwater
serve`` binds it before it imports the server, so that the endpoint answers as early in
the process as it can (a restarted container is scraped at once), first with what needs
no running node (``headwater_node_info``, ``headwater_node_serving``, the process, platform
and GC series); the node registers the rest when it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from headwater import __version__
from headwater.shared.addresses import parse_address


class MetricsListenError(Exception):
    """The metrics port cannot be bound."""


class NodeIdentityCollector(Collector):
    """What is known without the event loop, so a scrape has it even while the node
    starts (its loop busy opening logs and joining the quorum) or stops:
    ``headwater_node_info`` and ``headwater_node_serving``."""

    def __init__(self, node_id: int, roles: str, serving: Callable[[], bool]) -> None:
        self.node_id = node_id
        self.roles = roles
        self.serving = serving

    def collect(self) -> Iterator[Metric]:
        yield InfoMetricFamily(
            "headwater_node",
            "This node: its id, roles and version (served as headwater_node_info, value 1).",
            value={"node_id": str(self.node_id), "roles": self.roles, "version": __version__},
        )
        yield GaugeMetricFamily(
            "headwater_node_serving",
            "1 while the node answers its health check with SERVING, 0 while it starts or "
            "stops (the other state series are absent while its loop is too busy to answer "
            "within 5 s).",
            value=int(self.serving()),
        )

    def describe(self) -> Iterable[Metric]:
        return ()


class MetricsEndpoint:
    """A registry served over HTTP on ``address`` (HOST:PORT) by prometheus_client's
    server, in a daemon thread (GET /metrics; any path answers the metrics). Raises
    MetricsListenError when the port cannot be bound. ``serving`` is what
    ``headwater_node_serving`` reports; the node sets it."""

    def __init__(self, address: str, node_id: int, roles: str) -> None:
        self.serving = False
        self.registry = CollectorRegistry(auto_describe=True)
        identity = NodeIdentityCollector(node_id, roles, lambda: self.serving)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR, identity):
            self.registry.register(collector)
        host, port = parse_address(address, "metrics_listen")
        try:
            self._server: WSGIServer
            self._server, self._thread = start_http_server(
                port, host.strip("[]"), registry=self.registry
            )
        except OSError as exc:
            raise MetricsListenError(
                f"cannot serve metrics on {address}: {exc.strerror or exc}; choose another "
                "with --metrics-listen HOST:PORT (empty turns metrics off)"
            ) from exc
        self.port: int = self._server.server_port

    def add(self, collector: Collector) -> None:
        self.registry.register(collector)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
