"""The container health probe: one standard gRPC health check (grpc.health.v1), exit 0
when the node answers SERVING, 1 otherwise.

    headwater-healthcheck [HOST:PORT] [--timeout-ms MS]     (default 127.0.0.1:7700, 2000)

Docker runs a HEALTHCHECK as a new process every interval in every container, so its cost
is paid all the time, beside the node's work: this module imports only grpc and the health
stubs (about 0.1 s of CPU a check; ``headwater cluster health``, which loads the whole
command line, costs 0.34 s, and three nodes checked every 2 s spent a quarter of a 2-core
machine on it). ``node_serving`` is the one implementation; ``headwater.client`` and the
CLI use it from here.

A node answers SERVING once it has opened its logs and joined the cluster, and NOT_SERVING
while it starts or stops (see the README's health section).
"""

from __future__ import annotations

import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headwater.shared.errors import HeadwaterError
from headwater.shared.grpc_channels import open_channel
from headwater.shared.tls import ClientSecurity

DEFAULT_ADDRESS = "127.0.0.1:7700"
DEFAULT_TIMEOUT_MS = 2000
TIMEOUT_MS_RANGE = (1, 600_000)
USAGE = "usage: headwater-healthcheck [HOST:PORT] [--timeout-ms 1..600000]"


def node_serving(
    address: str, timeout_s: float = 1.0, security: ClientSecurity | None = None
) -> bool:
    """True when the node at ``address`` answers its health check with SERVING; False when
    it answers otherwise or cannot be reached within ``timeout_s``. ``security``: TLS
    settings, else the environment's (HEADWATER_SECURITY_PROTOCOL, HEADWATER_TLS_*: in a
    node's container those are the node's own, so the probe presents the node's
    certificate to a listener that requires one)."""
    settings = ClientSecurity.resolve(security)
    channel = open_channel(address, settings.credentials(), settings.channel_options())
    try:
        with channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=timeout_s
            )
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def parse_arguments(arguments: list[str]) -> tuple[str, int]:
    """``[HOST:PORT] [--timeout-ms MS]`` as (address, timeout in ms); ValueError naming the
    problem and the valid form otherwise."""
    address, timeout_ms = DEFAULT_ADDRESS, DEFAULT_TIMEOUT_MS
    positional: list[str] = []
    rest = list(arguments)
    while rest:
        argument = rest.pop(0)
        if argument == "--timeout-ms":
            if not rest:
                raise ValueError("--timeout-ms needs a value")
            text = rest.pop(0)
            low, high = TIMEOUT_MS_RANGE
            if not text.isdigit() or not low <= int(text) <= high:
                raise ValueError(f"--timeout-ms {text!r} is not an integer in {low}..{high}")
            timeout_ms = int(text)
        elif argument.startswith("-"):
            raise ValueError(f"unknown option {argument!r}")
        else:
            positional.append(argument)
    if len(positional) > 1:
        raise ValueError(f"one address expected, got {len(positional)}")
    if positional:
        address = positional[0]
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"address {address!r} is not HOST:PORT with a port in 1..65535")
    return address, timeout_ms


def main(arguments: list[str] | None = None) -> int:
    """Exit status 0 when the node serves, 1 when it does not, 2 on bad arguments."""
    try:
        address, timeout_ms = parse_arguments(sys.argv[1:] if arguments is None else arguments)
    except ValueError as problem:
        print(f"{problem}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        serving = node_serving(address, timeout_ms / 1000)
    except HeadwaterError as problem:  # a TLS setting that cannot be used
        print(problem, file=sys.stderr)
        return 2
    if serving:
        print(f"node at {address} is serving")
        return 0
    print(f"node at {address} is not serving (or did not answer in {timeout_ms} ms)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
