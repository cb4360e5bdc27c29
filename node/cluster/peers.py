"""Calls from this node to other nodes: forwarded requests and internal RPCs.

Any node accepts any request (DESIGN.md): a produce or fetch for a partition led
elsewhere is forwarded to its leader, an admin call to the active controller. A forwarded
call carries the ``headwater-forwarded`` metadata key; a node that receives a forwarded
call it cannot serve answers NOT_LEADER_OR_FOLLOWER / NOT_CONTROLLER instead of forwarding
again, so a request makes at most one hop and stale metadata cannot make it loop.

Broker and Admin calls go to a peer's client listener; Controller and Replica calls go
to its inter-broker listener, on channels that sign every call with the cluster secret
(``headwater.node.security.cluster_auth``). Channels (``grpc.aio``, one per peer address and
kind) are opened lazily and kept.
"""

from __future__ import annotations

from typing import Any, Final

import grpc

from headwater.node.config import NodeConfig
from headwater.node.security.authorizer import current_caller
from headwater.node.security.cluster_auth import signed_metadata, signing_interceptors
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_channels import open_aio_channel
from headwater.shared.grpc_errors import from_rpc_error
from headwater.shared.tls import RECONNECT_OPTIONS
from headwater.v1 import headwater_pb2_grpc as pb_grpc

FORWARDED_KEY: Final = "headwater-forwarded"
LOCAL_ONLY_KEY: Final = "headwater-local-only"
FORWARDED: Final = ((FORWARDED_KEY, "1"),)


def is_forwarded(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
    """Was the call forwarded by another node? Only a call on the inter-broker listener
    (a trusted caller) can be: a client that sends the key is not believed."""
    if not current_caller().trusted:
        return False
    return any(key == FORWARDED_KEY for key, _ in (context.invocation_metadata() or ()))


def is_local_only(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
    return any(key == LOCAL_ONLY_KEY for key, _ in (context.invocation_metadata() or ()))


class Peers:
    """Channels to other nodes. ``secret`` is the cluster secret, which signs every call
    to an inter-broker listener; ``internal_address`` is this node's own, once bound."""

    def __init__(
        self,
        config: NodeConfig,
        secret: bytes,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        """``credentials``: TLS to other nodes (this node's certificate as the client's,
        theirs verified against tls_ca_file); None for plaintext."""
        self.config = config
        self.secret = secret
        self.credentials = credentials
        self.internal_address = ""
        self._channels: dict[tuple[str, bool, bool], grpc.aio.Channel] = {}
        self.timeout_s = config.request_timeout_ms / 1000

    def channel(
        self, address: str, internal: bool = False, forwarding: bool = False
    ) -> grpc.aio.Channel:
        """The channel to ``address``; ``forwarding`` calls (client requests passed on)
        get a connection of their own, so that bulk client data never shares HTTP/2 flow
        control with heartbeats and replication."""
        key = (address, internal, forwarding)
        channel = self._channels.get(key)
        if channel is None:
            options: list[tuple[str, Any]] = [
                ("grpc.max_send_message_length", self.config.request_bytes_max),
                ("grpc.max_receive_message_length", self.config.request_bytes_max),
                *RECONNECT_OPTIONS,
                # Channels with the same target and options share connections
                # (gRPC's global subchannel pool): this keeps forwarding's apart.
                *((("grpc.use_local_subchannel_pool", 1),) if forwarding else ()),
            ]
            interceptors = (
                signing_interceptors(self.secret, self.config.node_id) if internal else None
            )
            channel = open_aio_channel(address, self.credentials, options, interceptors)
            self._channels[key] = channel
        return channel

    def broker(self, address: str) -> pb_grpc.BrokerAsyncStub:
        """Broker service at an inter-broker ``address`` (a forwarded request), calls
        signed. Nodes reach each other only there: a client address is the one clients
        are told (advertised_address), which another node may not be able to dial (a
        published container port on the host's loopback)."""
        return pb_grpc.BrokerStub(self.channel(address, internal=True, forwarding=True))

    def admin(self, address: str) -> pb_grpc.AdminAsyncStub:
        """Admin service at an inter-broker ``address``, calls signed."""
        return pb_grpc.AdminStub(self.channel(address, internal=True, forwarding=True))

    def groups(self, address: str) -> pb_grpc.GroupsAsyncStub:
        """Groups service at an inter-broker ``address``, calls signed."""
        return pb_grpc.GroupsStub(self.channel(address, internal=True, forwarding=True))

    def replica(self, address: str) -> pb_grpc.ReplicaAsyncStub:
        """Replica service at an inter-broker ``address``, calls signed (but Fetch, which
        ``replica_fetch`` opens)."""
        return pb_grpc.ReplicaStub(self.channel(address, internal=True))

    def replica_fetch(self, address: str) -> Any:
        """A Replica.Fetch stream to an inter-broker ``address``, signed, to be written
        and read (``write``/``read``)."""
        stub = self.replica(address)
        metadata = signed_metadata(self.secret, self.config.node_id, REPLICA_FETCH_METHOD)
        # grpc-stubs lacks the no-iterator form (write/read) of a stream-stream call.
        return stub.Fetch(metadata=metadata)  # type: ignore[call-arg]

    def controller(self, address: str) -> pb_grpc.ControllerAsyncStub:
        """Controller service at an inter-broker ``address``, calls signed."""
        return pb_grpc.ControllerStub(self.channel(address, internal=True))

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close(None)


REPLICA_FETCH_METHOD: Final = "/headwater.v1.Replica/Fetch"


def peer_error(error: grpc.RpcError, address: str) -> HeadwaterError:
    """The HeadwaterError a peer answered with, or BROKER_NOT_AVAILABLE when unreachable
    (a failed TLS handshake with the peer included)."""
    converted = from_rpc_error(error, f"node at {address}")
    if converted.code in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.TLS_HANDSHAKE_FAILED):
        # A handshake between two nodes that failed is theirs to fix, not the client's
        # (TLS_HANDSHAKE_FAILED is a client-side code that no node sends).
        return HeadwaterError(ErrorCode.BROKER_NOT_AVAILABLE, converted.message)
    return converted
