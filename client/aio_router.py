"""Where an asyncio client's requests go: ``LeaderRouter`` keeps one ``grpc.aio`` channel
per node and each partition's leader, from Metadata asked of the bootstrap node and asked
again after a retriable error (``AsyncProducer`` and ``AsyncConsumer`` share it)."""

from __future__ import annotations

import asyncio
import time
from typing import Final

import grpc

from headwater.client.connection import (
    MESSAGE_BYTES_MAX,
    RETRY_BACKOFF_MAX_S,
    RETRY_BACKOFF_MIN_S,
    TRANSPORT_ERRORS,
    LayoutCache,
    broker_addresses,
    partition_leaders,
)
from headwater.client.sessions import AioSession, aio_session_interceptors
from headwater.shared.grpc_channels import open_aio_channel
from headwater.shared.grpc_errors import from_rpc_error
from headwater.shared.tls import RECONNECT_OPTIONS, ClientSecurity
from headwater.shared.topics import check_partition
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

_OPTIONS: Final = [
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    *RECONNECT_OPTIONS,
]


class LeaderRouter:
    """Where each partition's requests go: its leader's address, from Metadata asked of
    the bootstrap node (cached per topic until ``invalidate``, with the stale fallback of
    ``LayoutCache``), and one channel per node. A partition without a leader goes to the
    bootstrap node, which forwards or explains."""

    def __init__(
        self, bootstrap_address: str, timeout_s: float, security: ClientSecurity | None = None
    ) -> None:
        self.bootstrap_address = bootstrap_address
        self.timeout_s = timeout_s
        self.security = ClientSecurity.resolve(security)
        self._credentials = self.security.credentials()
        self._options = [*_OPTIONS, *self.security.channel_options()]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._layouts: LayoutCache[list[str]] = LayoutCache()  # leader address by partition

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            session = (
                AioSession(self.security.username, self.security.password, address)
                if self.security.uses_sessions
                else None
            )
            channel = open_aio_channel(
                address,
                self._credentials,
                self._options,
                aio_session_interceptors(session) if session is not None else None,
                call_metadata=self.security.call_metadata(),
            )
            if session is not None:
                session.channel = channel
            self._channels[address] = channel
        return channel

    def stub(self, address: str) -> pb_grpc.BrokerAsyncStub:
        return pb_grpc.BrokerStub(self.channel(address))

    def cached(self, topic: str) -> list[str] | None:
        """The leader address of each partition of ``topic`` as last asked, or None."""
        return self._layouts.get(topic)

    async def leaders(self, topic: str) -> list[str]:
        """The leader address of each partition of ``topic`` (its length: the count).

        While the bootstrap node cannot be reached (a transport error: it is restarting,
        or this process's shared connection to it is still backing off from an earlier
        failure), the stale layout routes if one was known; else Metadata is asked again,
        with backoff, for up to ``timeout_s`` (as Kafka's producer waits ``max.block.ms``
        for metadata) before the transport error is raised. Any answer is taken as it is."""
        layout = self._layouts.get(topic)
        if layout is None:
            deadline = time.monotonic() + self.timeout_s
            backoff_s = RETRY_BACKOFF_MIN_S
            while True:
                try:
                    response = await self.stub(self.bootstrap_address).Metadata(
                        pb.MetadataRequest(topics=[topic]), timeout=self.timeout_s
                    )
                    break
                except grpc.RpcError as exc:
                    error = from_rpc_error(exc, topic)
                if (
                    self._layouts.stale(topic)
                    or error.code not in TRANSPORT_ERRORS
                    or time.monotonic() + backoff_s > deadline
                ):
                    return self._layouts.fallback(topic, error)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)
            (described,) = response.topics
            leaders = partition_leaders(described, broker_addresses(response))
            layout = [address or self.bootstrap_address for address in leaders]
            self._layouts.store(topic, layout)
        return layout

    def invalidate(self, topic: str) -> None:
        self._layouts.invalidate(topic)

    async def checked_leaders(self, topic: str, partition: int) -> list[str]:
        """``leaders(topic)``, once the topic has ``partition``: a partition number past the
        cached count asks again (partitions may have been added since), then raises
        PARTITION_OUT_OF_RANGE (not retriable) if the topic still lacks it."""
        leaders = await self.leaders(topic)
        if partition >= len(leaders):
            self.invalidate(topic)
            leaders = await self.leaders(topic)
        check_partition(topic, partition, len(leaders))
        return leaders

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()
