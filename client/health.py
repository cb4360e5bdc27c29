"""Whether a node serves: the standard gRPC health check (grpc.health.v1) over one call.

The implementation lives in ``headwater.healthcheck``, which imports nothing else so that
a container's health probe starts fast; it is part of the client API here.
"""

from __future__ import annotations

from headwater.healthcheck import node_serving

__all__ = ["node_serving"]
