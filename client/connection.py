"""Channels to the cluster's nodes and a metadata cache (the client's I/O edge).

``Cluster`` keeps one gRPC channel per node address, tries the bootstrap addresses in
turn until one answers, and caches topic metadata (partition count and leader address per
partition). Callers invalidate the cache on NOT_LEADER_OR_FOLLOWER or a failed node.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

import grpc

from headwater.client.sessions import with_session
from headwater.shared.addresses import DEFAULT_LISTEN, parse_address
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_channels import open_channel
from headwater.shared.grpc_errors import from_rpc_error
from headwater.shared.tls import RECONNECT_OPTIONS, SOCKET_CLOSED_HINT, ClientSecurity
from headwater.shared.topics import check_partition
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

BOOTSTRAP_ENV: Final = "HEADWATER_BOOTSTRAP"
MESSAGE_BYTES_MAX: Final = 256 << 20
TRANSPORT_ERRORS: Final = frozenset({ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT})
_NO_SUCH_TOPIC: Final = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
RETRY_BACKOFF_MIN_S: Final = 0.05
RETRY_BACKOFF_MAX_S: Final = 1.0
T = TypeVar("T")


def resolve_bootstrap(bootstrap: str | Sequence[str] | None) -> list[str]:
    """Addresses from the argument, else $HEADWATER_BOOTSTRAP, else the local default node.

    Raises INVALID_CONFIG when an address is not HOST:PORT.
    """
    if bootstrap is None:
        bootstrap = os.environ.get(BOOTSTRAP_ENV) or DEFAULT_LISTEN
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    addresses = [a.strip() for a in items if a.strip()]
    if not addresses:
        raise HeadwaterError(ErrorCode.INVALID_CONFIG, "bootstrap lists no HOST:PORT address")
    for address in addresses:
        parse_address(address, "bootstrap address")
    return addresses


@dataclass(frozen=True, slots=True)
class TopicLayout:
    """What a client needs to route: topic id and each partition's leader address ('' if none)."""

    name: str
    topic_id: str
    leaders: tuple[str, ...]

    @property
    def partitions(self) -> int:
        return len(self.leaders)


L = TypeVar("L")


class LayoutCache(Generic[L]):
    """Topic layouts as last learned, shared by both client engines' routers. An
    invalidated layout is kept as stale: while no node answers (a transport error), the
    stale layout still routes, so sends queue and retries go on while a node restarts;
    any answer, such as "the topic does not exist", is taken as it is."""

    def __init__(self) -> None:
        self._layouts: dict[str, L] = {}
        self._stale: dict[str, L] = {}

    def get(self, topic: str) -> L | None:
        return self._layouts.get(topic)

    def store(self, topic: str, layout: L) -> None:
        self._layouts[topic] = layout
        self._stale.pop(topic, None)

    def invalidate(self, topic: str) -> None:
        layout = self._layouts.pop(topic, None)
        if layout is not None:
            self._stale[topic] = layout

    def stale(self, topic: str) -> bool:
        """Whether an invalidated layout of ``topic`` is kept to route by."""
        return topic in self._stale

    def fallback(self, topic: str, error: HeadwaterError) -> L:
        """The stale layout of ``topic`` when asking failed with a transport error and
        one was known; else ``error`` is raised."""
        stale = self._stale.get(topic)
        if stale is None or error.code not in TRANSPORT_ERRORS:
            raise error
        return stale


class Cluster:
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        request_timeout_s: float = 30.0,
        message_bytes_max: int = MESSAGE_BYTES_MAX,
        security: ClientSecurity | None = None,
    ) -> None:
        """``security``: TLS settings (headwater.shared.tls); None takes them from the
        environment (HEADWATER_SECURITY_PROTOCOL, HEADWATER_TLS_*), plaintext when unset.
        The files are read here, so a missing or bad one fails at construction."""
        self.bootstrap = resolve_bootstrap(bootstrap)
        self.request_timeout_s = request_timeout_s
        self.message_bytes_max = message_bytes_max
        """The channels' gRPC message limit: fetches declare it (max_response_bytes)."""
        self.security = ClientSecurity.resolve(security)
        self._credentials = self.security.credentials()
        self._options: list[tuple[str, int | str]] = [
            ("grpc.max_send_message_length", message_bytes_max),
            ("grpc.max_receive_message_length", message_bytes_max),
            *RECONNECT_OPTIONS,
            *self.security.channel_options(),
        ]
        self._lock = threading.Lock()
        self._channels: dict[str, grpc.Channel] = {}
        self._brokers_stubs: dict[str, pb_grpc.BrokerStub] = {}
        self._admin_stubs: dict[str, pb_grpc.AdminStub] = {}
        self._groups_stubs: dict[str, pb_grpc.GroupsStub] = {}
        self._layouts: LayoutCache[TopicLayout] = LayoutCache()
        self.layouts_changed = 0
        """Counts every change of a cached layout: a caller that keeps something derived
        from one (the producer's sticky partition) knows when to derive it again."""
        self._brokers: dict[int, str] = {}
        self._rng = random.Random()
        self._closed = False

    # ------------------------------------------------------------------ channels

    def channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if self._closed:
                raise HeadwaterError(ErrorCode.NETWORK_EXCEPTION, "client is closed")
            channel = self._channels.get(address)
            if channel is None:
                channel = open_channel(
                    address, self._credentials, self._options, self.security.call_metadata()
                )
                if self.security.uses_sessions:
                    channel = with_session(
                        channel, address, self.security.username, self.security.password
                    )
                self._channels[address] = channel
            return channel

    def broker(self, address: str) -> pb_grpc.BrokerStub:
        """Cached stub (building one costs ~40 us, too much per produce request)."""
        stub = self._brokers_stubs.get(address)
        if stub is None:
            stub = self._brokers_stubs[address] = pb_grpc.BrokerStub(self.channel(address))
        return stub

    def admin(self, address: str) -> pb_grpc.AdminStub:
        stub = self._admin_stubs.get(address)
        if stub is None:
            stub = self._admin_stubs[address] = pb_grpc.AdminStub(self.channel(address))
        return stub

    def groups(self, address: str) -> pb_grpc.GroupsStub:
        stub = self._groups_stubs.get(address)
        if stub is None:
            stub = self._groups_stubs[address] = pb_grpc.GroupsStub(self.channel(address))
        return stub

    def call_any(
        self,
        call: Callable[[str], T],
        retry_s: float = 0.0,
        final: frozenset[ErrorCode] = frozenset(),
    ) -> T:
        """Run ``call(address)`` against bootstrap nodes in turn until one is reachable.

        Transport failures (NETWORK_EXCEPTION, REQUEST_TIMED_OUT) and retriable operating
        errors (no active controller yet, a leader moving, a node starting) move on to the
        next address; once every address failed, the last error is raised, or with
        ``retry_s`` > 0 the round starts again, with backoff, for up to that many seconds.
        The codes in ``final`` (an answer that will not change, such as the active
        controller's "no such topic") and other operating errors are raised as they are.
        """
        deadline = time.monotonic() + retry_s
        backoff_s = RETRY_BACKOFF_MIN_S
        while True:
            addresses = list(self.bootstrap)
            self._rng.shuffle(addresses)
            last: HeadwaterError | None = None
            for address in addresses:
                try:
                    return call(address)
                except grpc.RpcError as exc:
                    error = from_rpc_error(exc, address)
                except HeadwaterError as exc:
                    error = exc
                transport = error.code in TRANSPORT_ERRORS
                # One node with a certificate this client refuses must not stop the
                # others from being tried: it is final only once every address failed.
                handshake = error.code is ErrorCode.TLS_HANDSHAKE_FAILED
                if not transport and not handshake and (not error.retriable or error.code in final):
                    raise error
                last = error  # the next address may answer (a node starting, moving on)
            assert last is not None
            if last.code is ErrorCode.TLS_HANDSHAKE_FAILED:
                raise last  # retrying the same handshakes cannot help
            if time.monotonic() + backoff_s > deadline:
                if last.code in TRANSPORT_ERRORS:
                    hint = f"; {SOCKET_CLOSED_HINT}" if "Socket closed" in last.message else ""
                    raise HeadwaterError(
                        last.code,
                        f"no node reachable at {','.join(self.bootstrap)} "
                        f"(last error: {last.message}){hint}",
                    )
                raise last
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)

    def call_leader(
        self, topic: str, partition: int, call: Callable[[str], T], retry_s: float
    ) -> T:
        """Run ``call(leader address)``; on a retriable error (leadership moving, a node
        starting or down) refresh the metadata and retry, with backoff, for up to
        ``retry_s`` seconds."""
        deadline = time.monotonic() + retry_s
        backoff_s = RETRY_BACKOFF_MIN_S
        while True:
            address = self.leader(topic, partition)
            try:
                return call(address)
            except grpc.RpcError as exc:
                error = from_rpc_error(exc, address)
            except HeadwaterError as exc:
                error = exc
            if not error.retriable or time.monotonic() + backoff_s > deadline:
                raise error
            self.invalidate(topic)
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)

    # ------------------------------------------------------------------ metadata

    def refresh(
        self,
        topics: Sequence[str] = (),
        retry_s: float = 0.0,
        final: frozenset[ErrorCode] = frozenset(),
    ) -> pb.MetadataResponse:
        """Metadata of ``topics`` (all when empty) from any node, cached; ``retry_s`` and
        ``final`` as in ``call_any``."""
        response: pb.MetadataResponse = self.call_any(
            lambda a: self.broker(a).Metadata(
                pb.MetadataRequest(topics=list(topics)), timeout=self.request_timeout_s
            ),
            retry_s=retry_s,
            final=final,
        )
        brokers = broker_addresses(response)
        with self._lock:
            self._brokers = brokers
            for topic in response.topics:
                leaders = partition_leaders(topic, brokers)
                self._layouts.store(topic.name, TopicLayout(topic.name, topic.topic_id, leaders))
            self.layouts_changed += 1
        return response

    def layout(self, topic: str) -> TopicLayout:
        """Cached layout of ``topic``, fetched on first use (while no node answers, asked
        again with backoff for up to ``request_timeout_s`` unless a stale layout routes).

        Raises UNKNOWN_TOPIC_OR_PARTITION when the topic does not exist."""
        layout = self._layouts.get(topic)
        if layout is None:
            # No layout to route by: wait for a node within the request timeout (Kafka's
            # producer waits max.block.ms for metadata); with a stale one, route by it.
            # "No such topic" is an answer, given at once.
            wait_s = 0.0 if self._layouts.stale(topic) else self.request_timeout_s
            try:
                self.refresh([topic], retry_s=wait_s, final=_NO_SUCH_TOPIC)
            except HeadwaterError as error:
                return self._layouts.fallback(topic, error)  # no node answers: route as before
            layout = self._layouts.get(topic)
            if layout is None:
                raise HeadwaterError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist"
                )
        return layout

    def cached_partitions(self, topic: str) -> int:
        """Partition count from the cache without any call (1 when not cached)."""
        layout = self._layouts.get(topic)
        return layout.partitions if layout is not None else 1

    def checked_layout(self, topic: str, partition: int) -> TopicLayout:
        """``topic``'s layout, once it has ``partition``: a partition number past the cached
        count asks again (partitions may have been added since), then raises
        PARTITION_OUT_OF_RANGE (not retriable) if the topic still lacks it."""
        layout = self.layout(topic)
        if partition >= layout.partitions:
            self.invalidate(topic)
            layout = self.layout(topic)
        check_partition(topic, partition, layout.partitions)
        return layout

    def leader(self, topic: str, partition: int) -> str:
        """Address of the partition's leader, or a bootstrap node (which forwards)."""
        layout = self.checked_layout(topic, partition)
        return layout.leaders[partition] or self.bootstrap[0]

    def invalidate(self, topic: str) -> None:
        """Ask for ``topic``'s layout again on next use; the old one is kept as the
        fallback while no node answers (``layout``)."""
        with self._lock:
            self._layouts.invalidate(topic)
            self.layouts_changed += 1

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._brokers_stubs.clear()
            self._admin_stubs.clear()
            self._groups_stubs.clear()
        for channel in channels:
            channel.close()


def broker_addresses(response: pb.MetadataResponse) -> dict[int, str]:
    """{node id: client address} of the brokers a Metadata response names."""
    return {b.node_id: b.address for b in response.brokers}


def partition_leaders(topic: pb.TopicMetadata, brokers: Mapping[int, str]) -> tuple[str, ...]:
    """The leader address of each partition of ``topic``, in partition order ("" where a
    partition has no leader or its broker is not among ``brokers``)."""
    return tuple(
        brokers.get(p.leader, "") for p in sorted(topic.partitions, key=lambda p: p.partition)
    )


def call(stub_call: Callable[[], T], target: str) -> T:
    """Run one RPC, translating grpc.RpcError into HeadwaterError."""
    try:
        return stub_call()
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, target) from None
