"""Whether a node serves: the standard gRPC health check (grpc.health.v1) over one call.

A node answers SERVING once it has opened its logs and joined the cluster, and NOT_SERVING
while it starts or stops (see the README's health section).
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def node_serving(address: str, timeout_s: float = 1.0) -> bool:
    """True when the node at ``address`` answers its health check with SERVING; False when
    it answers otherwise or cannot be reached within ``timeout_s``."""
    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
