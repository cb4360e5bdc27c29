"""Start and stop one node: the gRPC server with Broker, Admin, health and reflection.

``serve(config)`` blocks until SIGTERM or SIGINT, then stops accepting calls, lets
in-flight calls finish (up to ``SHUTDOWN_GRACE_S``) and closes every log cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from headwater.config import NodeConfig
from headwater.node.log_manager import LogManager
from headwater.node.service import AdminService, BrokerService
from headwater.runtime_tuning import tune_runtime
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

SHUTDOWN_GRACE_S: Final = 5.0
_log = logging.getLogger(__name__)


class ListenError(Exception):
    """The gRPC port cannot be bound (in use, or not an address of this machine)."""


def grpc_options(config: NodeConfig) -> list[tuple[str, int]]:
    return [
        # A second server on a taken port must fail, not share it silently.
        ("grpc.so_reuseport", 0),
        ("grpc.max_send_message_length", config.request_bytes_max),
        ("grpc.max_receive_message_length", config.request_bytes_max),
    ]


class Node:
    """One running node on an asyncio event loop. ``start`` binds and serves; ``stop``
    shuts down cleanly. Both must run on the loop that serves."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.logs = LogManager(config)
        self.server = grpc.aio.server(
            options=grpc_options(config),
            maximum_concurrent_rpcs=config.concurrent_calls_max,
        )
        pb_grpc.add_BrokerServicer_to_server(BrokerService(config, self.logs), self.server)
        pb_grpc.add_AdminServicer_to_server(AdminService(config, self.logs), self.server)
        # grpc_health.v1.health.aio is public API; its stubs lack the attribute.
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (
                pb.DESCRIPTOR.services_by_name["Broker"].full_name,
                pb.DESCRIPTOR.services_by_name["Admin"].full_name,
                health.SERVICE_NAME,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        self.port = 0

    async def start(self) -> None:
        cause: RuntimeError | None = None
        try:
            self.port = self.server.add_insecure_port(self.config.listen)
        except RuntimeError as exc:
            self.port = 0
            cause = exc
        if not self.port:
            self.logs.close()
            raise ListenError(
                f"cannot listen on {self.config.listen}: the port is in use or the address is "
                "not on this machine; choose another with --listen HOST:PORT"
            ) from cause
        await self.server.start()
        for service in ("", "headwater.v1.Broker", "headwater.v1.Admin"):
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        _log.info(
            "node %d serving on %s (data in %s)",
            self.config.node_id,
            self.config.listen,
            self.logs.data_dir,
        )

    async def stop(self) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(SHUTDOWN_GRACE_S)
        self.logs.close()
        _log.info("node %d stopped", self.config.node_id)


async def _run(config: NodeConfig) -> None:
    node = Node(config)
    await node.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_signal, signum, stopping)
    await stopping.wait()
    await node.stop()


def _on_signal(signum: int, stopping: asyncio.Event) -> None:
    _log.info("received %s, stopping", signal.Signals(signum).name)
    stopping.set()


def serve(config: NodeConfig) -> None:
    """Run a node until SIGTERM/SIGINT."""
    tune_runtime()
    asyncio.run(_run(config))
