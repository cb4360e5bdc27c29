"""Start and stop one node: the metadata quorum (controller role), the broker's
lifecycle (broker role), and the gRPC server with Broker, Admin, Controller, health and
reflection.

``serve(config)`` blocks until SIGTERM or SIGINT, then shuts down in order: controlled
shutdown (leadership moves to other replicas), stop accepting calls, let in-flight calls
finish (up to ``SHUTDOWN_GRACE_S``), leave the quorum, close every log cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import socket
from collections.abc import Callable
from typing import Any, Final

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from headwater.node.clock import now_ms
from headwater.node.cluster.broker_lifecycle import BrokerLifecycle, MetadataFollower
from headwater.node.cluster.broker_session import LEADER_FALLBACK_ELECTIONS
from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.controller import ControllerDriver
from headwater.node.cluster.peers import Peers
from headwater.node.cluster.producer_ids import ProducerIdAllocator
from headwater.node.config import NodeConfig
from headwater.node.core.broker_core import BrokerCore
from headwater.node.core.limits import yield_every
from headwater.node.core.throttling import Quotas
from headwater.node.groups.classic_groups import ClassicGroups
from headwater.node.groups.coordinator import GroupCoordinator
from headwater.node.groups.core import GroupCore
from headwater.node.groups.image import GroupState
from headwater.node.kafka.group_handlers import GroupHandlers
from headwater.node.kafka.handlers import KafkaHandlers
from headwater.node.kafka.listener import KafkaListener
from headwater.node.kafka.sasl import KafkaSasl
from headwater.node.ops.loop_watch import LoopWatch
from headwater.node.ops.metrics import (
    GroupSample,
    NodeMetrics,
    NodeSnapshot,
    NodeStateCollector,
    PartitionSample,
    RpcMetricsInterceptor,
)
from headwater.node.ops.metrics_endpoint import MetricsEndpoint, MetricsListenError
from headwater.node.replicas.log_manager import DataDirError, LogManager
from headwater.node.replicas.replica_manager import ReplicaManager
from headwater.node.replicas.replica_service import ReplicaService
from headwater.node.rpc.admin_service import AdminService
from headwater.node.rpc.broker_service import BrokerService
from headwater.node.rpc.controller_service import ControllerService
from headwater.node.rpc.groups_service import GroupsService, OffsetsTopicAt
from headwater.node.rpc.request_decoding import DecodeRequests, quiet_grpc_log
from headwater.node.security.authorizer import Authenticate, Authorizer, TrustMembers
from headwater.node.security.cluster_auth import ForwardedCallLimit, RequireClusterSecret
from headwater.node.security.sasl_service import SaslService, ScramLogins
from headwater.node.security.tls_setup import load_node_tls, principal_of_certificate
from headwater.raft.metadata.image import MetadataImage
from headwater.raft.metadata.records import NO_LEADER
from headwater.raft.quorum import (
    MetadataQuorum,
    QuorumBindError,
    QuorumJournalError,
    QuorumTimings,
)
from headwater.shared.addresses import parse_address
from headwater.shared.quotas import REQUEST_RATE
from headwater.shared.runtime_tuning import freeze_long_lived, tune_runtime
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

SHUTDOWN_GRACE_S: Final = 5.0
ROLE_CHECK_S: Final = 0.2
SNAPSHOT_SLICE_PARTITIONS: Final = 500
"""Partitions (or committed offsets) a metrics snapshot samples before it gives the event
loop back."""
HEALTH_SERVICES: Final = ("", "headwater.v1.Broker", "headwater.v1.Admin", "headwater.v1.Groups")
STORAGE_HEALTH_SERVICES: Final = ("", "headwater.v1.Broker", "headwater.v1.Groups")
"""NOT_SERVING while the data folder is offline (Admin, which needs no log, serves on)."""
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
    shuts down cleanly (controlled shutdown first). Both must run on the loop that serves,
    on the main thread (pysyncobj's rule for creating the quorum)."""

    def __init__(self, config: NodeConfig, metrics_endpoint: MetricsEndpoint | None = None) -> None:
        """``metrics_endpoint``: one already bound (``headwater serve`` binds it first);
        with metrics_listen set and none given, ``start`` binds one."""
        self.config = config
        self.port = 0
        self.logs: LogManager | None = None
        self.quorum: MetadataQuorum | None = None
        self.controller: ControllerDriver | None = None
        self.lifecycle: BrokerLifecycle | None = None
        self.follower: MetadataFollower | None = None
        self.replicas: ReplicaManager | None = None
        self.groups: GroupCoordinator | None = None
        self.kafka: KafkaListener | None = None
        self.classic_groups: ClassicGroups | None = None
        self.kafka_address = ""
        self._reconciling: asyncio.Task[None] | None = None
        self._reconcile_again = False
        self._stopping = False  # set once the parts are being stopped: no more reconciles
        self._reconciled_ready = False
        self._roles_allowed = False  # the leadership allowance the roles were set with
        self._serving_watch: asyncio.Task[None] | None = None
        self._kafka_gate: asyncio.Task[None] | None = None
        self._frozen = False
        """Whether the objects alive when the node first served were frozen
        (``freeze_long_lived``)."""
        self.metrics = NodeMetrics() if config.metrics_listen else None
        self.metrics_endpoint = metrics_endpoint
        self.loop_watch = LoopWatch(
            None if self.metrics is None else self.metrics.event_loop_stall.observe
        )

    async def start(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        self.state = ClusterState(loop)
        quiet_grpc_log()
        self.logs = LogManager(config)
        self.logs.on_log_dir_change = lambda: _call_soon(loop, self._on_log_dir_change)
        try:
            self.secret = self.logs.cluster_secret()
            self.tls = load_node_tls(config)
            self.peers = Peers(
                config,
                self.secret.encode(),
                self.tls.peer_credentials() if self.tls is not None else None,
            )
            self.quotas = Quotas(lambda: self.state.image)
            quotas = self.quotas
            self.authenticate = Authenticate(
                config,
                lambda: self.state.image,
                lambda caller: quotas.delay_s(REQUEST_RATE, 1.0, caller),
                None if self.metrics is None else self.metrics.failed_logins.inc,
            )
            self.server = self._build_server(interceptors=[DecodeRequests(), self.authenticate])
            self.internal_server = self._build_server(
                interceptors=[
                    RequireClusterSecret(self.secret.encode()),
                    DecodeRequests(),
                    ForwardedCallLimit(config.concurrent_calls_max // 2),
                    TrustMembers(),
                ]
            )
            self._bind()
            if self.metrics is not None:
                if self.metrics_endpoint is None:
                    try:
                        self.metrics_endpoint = MetricsEndpoint(
                            config.metrics_listen, config.node_id, config.roles
                        )
                    except MetricsListenError as exc:
                        raise ListenError(str(exc)) from exc
                self.metrics_endpoint.add(self.metrics.registry)
                self.metrics_endpoint.add(NodeStateCollector(loop, self.metrics_snapshot))
            if config.is_controller:
                self.quorum = self._start_quorum()
                self.controller = ControllerDriver(
                    config, self.quorum, self.state, self.peers.internal_address
                )
        except BaseException:
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.close()
            self.logs.close()
            raise
        self._add_services()
        self.loop_watch.start()
        self.state.add_listener(self._on_image)
        await self.server.start()
        await self.internal_server.start()
        if self.kafka is not None:
            await self._start_kafka(self.kafka)
        if self.controller is not None:
            self.controller.start()
        if not config.is_controller:
            self.follower = MetadataFollower(config, self.state, self.peers)
            self.follower.start()
        if self.lifecycle is not None and self.replicas is not None:
            self.lifecycle.start()
            self.replicas.start()
        if self.groups is not None:
            self.groups.start()
        self._ready_watch = loop.create_task(self._watch_roles())
        self._serving_watch = loop.create_task(self._serve_when_ready())
        if self.kafka is not None:
            self._kafka_gate = loop.create_task(self._open_kafka_when_registered(self.kafka))
        _log.info(
            "node %d (%s) serving clients on %s, nodes on %s (data in %s)",
            config.node_id,
            config.roles,
            config.listen,
            self.peers.internal_address,
            self.logs.data_dir,
        )

    def _build_server(
        self, interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] | None = None
    ) -> grpc.aio.Server:
        """A server with its own call limit: the client listener's calls can never use
        up the inter-broker listener's (heartbeats, replication, ISR changes)."""
        if self.metrics is not None:  # outermost: refused calls are counted too
            interceptors = [RpcMetricsInterceptor(self.metrics), *(interceptors or ())]
        return grpc.aio.server(
            options=grpc_options(self.config),
            maximum_concurrent_rpcs=self.config.concurrent_calls_max,
            interceptors=interceptors,
        )

    def _bind(self) -> None:
        tls = self.tls
        self.port = _bind(
            self.server,
            self.config.listen,
            "--listen",
            tls.client_listener_credentials() if tls is not None else None,
        )
        internal = self.config.internal_listen_address
        internal_port = _bind(
            self.internal_server,
            internal,
            "--internal-listen",
            tls.internal_listener_credentials() if tls is not None else None,
        )
        if self.config.internal_advertised_address:
            self.peers.internal_address = self.config.internal_advertised_address
            return
        host, _, _ = internal.rpartition(":")
        if host in ("0.0.0.0", "[::]", "::"):
            # A wildcard is not an address peers can dial: they get the client host.
            host = self.config.client_address.rpartition(":")[0]
        self.peers.internal_address = f"{host}:{internal_port}"

    async def _start_kafka(self, kafka: KafkaListener) -> None:
        """Bind the Kafka listener; its address (``NodeConfig.kafka_address``) goes into
        the broker's registration, so it is set before the lifecycle starts."""
        host, port = parse_address(self.config.kafka_listen, "kafka_listen")
        try:
            bound = await kafka.start(host.strip("[]"), port)
        except OSError as exc:
            raise ListenError(
                f"cannot bind the Kafka listener {self.config.kafka_listen}: {exc.strerror}; "
                "check --kafka-listen"
            ) from exc
        self.kafka_address = self.config.kafka_address(bound)
        if self.lifecycle is not None:
            self.lifecycle.kafka_address = self.kafka_address
        _log.info("node %d serving Kafka clients on %s", self.config.node_id, self.kafka_address)

    def _kafka_address_of(self, node_id: int) -> str:
        """The Kafka address broker ``node_id`` registered; this node's own at once."""
        if node_id == self.config.node_id:
            return self.kafka_address
        return self.state.image.broker_kafka_address(node_id)

    def _start_quorum(self) -> MetadataQuorum:
        config = self.config
        assert self.logs is not None
        voters = config.quorum_voters
        own = voters[config.node_id]
        election_s = config.raft_election_timeout_ms / 1000
        try:
            return MetadataQuorum(
                own,
                [
                    address
                    for node_id, address in sorted(voters.items())
                    if node_id != config.node_id
                ],
                self.logs.raft_dir,
                on_applied=lambda image, _refusal: self.state.publish(image),
                secret=self.secret,
                bind_address=config.raft_listen,
                disk_slow=self.logs.disk_slow,
                timings=QuorumTimings(
                    election_min_s=election_s,
                    election_max_s=election_s * 3,
                    heartbeat_s=election_s / 6,
                    leader_fallback_s=election_s * LEADER_FALLBACK_ELECTIONS,
                ),
            )
        except QuorumJournalError as exc:
            raise DataDirError(str(exc)) from exc
        except QuorumBindError as exc:
            raise ListenError(
                f"cannot bind the Raft address {own} of node {config.node_id}: {exc}; "
                "check --quorum"
            ) from exc

    def _add_services(self) -> None:
        assert self.logs is not None
        config, server = self.config, self.server
        if config.is_broker:
            lifecycle = self.lifecycle = BrokerLifecycle(
                config, self.state, self.peers, self.logs.partition_capacity()
            )
            self.replicas = ReplicaManager(
                config,
                self.logs,
                self.state,
                self.peers,
                lambda: lifecycle.broker_epoch,
                self.may_lead,
            )
            self.groups = GroupCoordinator(config, self.logs, lambda: self.state.image)
        # The inter-broker listener: Replica and Controller, and the client services for
        # requests other nodes forward (to a leader, the controller, a coordinator).
        pb_grpc.add_ReplicaServicer_to_server(
            ReplicaService(config, self.logs, self.state, self.may_lead), self.internal_server
        )
        metrics = self.metrics
        authorizer = Authorizer(
            config,
            lambda: self.state.image,
            None
            if metrics is None
            else lambda operation, resource_type: metrics.authorization_denied.labels(
                operation.value, resource_type.value
            ).inc(),
        )
        core = BrokerCore(
            config,
            self.logs,
            self.state,
            authorizer=authorizer,
            may_lead=self.may_lead,
            producer_ids=ProducerIdAllocator(
                config,
                self.state,
                self.peers,
                self.controller,
                lambda: self.lifecycle.broker_epoch if self.lifecycle else -1,
            )
            if config.is_broker
            else None,
            metrics=self.metrics,
            quotas=self.quotas,
        )
        broker = BrokerService(
            core,
            self.peers,
            self._quorum_status,
            controller_active=lambda: self.controller is not None and self.controller.is_active(),
        )
        admin = AdminService(
            config, self.logs, self.state, self.peers, self.controller, authorizer=authorizer
        )
        group_core = GroupCore(
            config,
            self.state,
            self.groups,
            self.controller,
            self.may_lead,
            OffsetsTopicAt(self.peers),
            authorizer=authorizer,
        )
        groups = GroupsService(group_core, self.peers)
        scram_logins = ScramLogins(
            lambda: self.state.image, self.authenticate.passwords, self.secret.encode()
        )
        pb_grpc.add_SaslServicer_to_server(
            SaslService(config, self.authenticate.sessions, scram_logins), server
        )
        if config.kafka_listen and config.is_broker:
            assert self.groups is not None  # every broker coordinates groups
            classic = self.classic_groups = ClassicGroups(config, group_core, self.groups)
            group_core.classic = classic
            kafka_protocol = config.kafka_security_protocol
            sasl = (
                KafkaSasl(
                    tuple(m for m in config.sasl_enabled_mechanisms.split(",") if m),
                    lambda: self.state.image.users,
                    self.authenticate.passwords,
                    scram_logins,
                )
                if kafka_protocol in ("SASL_PLAINTEXT", "SASL_SSL")
                else None
            )
            kafka_tls = (
                self.tls.server_context(
                    config.tls_cert_file, config.tls_key_file, config.tls_ca_file
                )
                if self.tls is not None and kafka_protocol in ("SSL", "SASL_SSL")
                else None
            )
            self.kafka = KafkaListener(
                KafkaHandlers(
                    core,
                    kafka_address=self._kafka_address_of,
                    topics=admin.topics,
                    # Kafka clients send topic changes to the "controller": any broker
                    # takes them here and passes them to the active controller.
                    controller_id=lambda: config.node_id,
                    groups=GroupHandlers(classic, group_core, self._kafka_address_of),
                    sasl=sasl is not None,
                ),
                sasl,
                kafka_tls,
                functools.partial(principal_of_certificate, mapping=config.tls_principal_mapping)
                if kafka_tls is not None and config.tls_client_auth == "required"
                else None,
            )
        for listener in (server, self.internal_server):
            pb_grpc.add_BrokerServicer_to_server(broker, listener)
            pb_grpc.add_AdminServicer_to_server(admin, listener)
            pb_grpc.add_GroupsServicer_to_server(groups, listener)
        pb_grpc.add_ControllerServicer_to_server(
            ControllerService(self.state, self.controller, self._image_current),
            self.internal_server,
        )
        # grpc_health.v1.health.aio is public API; its stubs lack the attribute.
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (
                pb.DESCRIPTOR.services_by_name["Broker"].full_name,
                pb.DESCRIPTOR.services_by_name["Admin"].full_name,
                pb.DESCRIPTOR.services_by_name["Groups"].full_name,
                health.SERVICE_NAME,
                reflection.SERVICE_NAME,
            ),
            server,
        )

    def may_lead(self) -> bool:
        """May this node act as a partition leader right now (serve produce, consumer
        fetches and replica fetches for the partitions it leads)? Only while leadership
        is allowed (``_leadership_allowed``) and the broker holds its leadership lease
        (``BrokerSession.may_lead``): a leader that was paused or cut off stops
        answering as leader before the controller can have elected another."""
        if self.lifecycle is None or not self._reconciled_ready:
            return False
        return self.lifecycle.may_lead(self.state.image, self.config.node_id)

    def _leadership_allowed(self) -> bool:
        """May partitions take the leader role the image gives this node? Only once the
        node has seen a current image (not a journal replay) and the image shows this
        process's registration unfenced: a restarted node must not take writes, or answer
        followers, for leaderships it lost while down. Once current, the node keeps
        leading through controller elections, as Kafka's brokers do: a new Raft term
        leaves the image without the new controller's activation record for a moment, but
        everything in it still holds, and a node the new controller fences learns so from
        the image (or its lease runs out first)."""
        if self.lifecycle is None or not self._reconciled_ready:
            return False
        return self.lifecycle.session.leadership_allowed(self.state.image, self.config.node_id)

    def _quorum_status(self) -> tuple[int, int]:
        if self.quorum is None:
            return 0, 0
        status = self.quorum.status()
        return status.term, status.commit_index

    # ------------------------------------------------------------------ partitions

    def _image_current(self) -> bool:
        """Is this node's image (the loop's) current: may partition logs be deleted on its
        say-so (see LogManager), may it lead? A voter's image is current once it holds the
        activation record of the controller of the current Raft term: that record is
        committed after everything committed before it, so the image then holds all the
        metadata there is. (pysyncobj's own "ready" is not enough: after a restart of
        every node, a new leader's commit index starts behind, and a reconcile on a
        partial image would delete the logs of topics it has not replayed yet.)"""
        if self.quorum is not None:
            image = self.state.image
            return (
                self.quorum.ready()
                and image.controller_id >= 0
                and image.controller_epoch == self.quorum.status().term
            )
        return self.follower is not None and self.follower.caught_up

    def _on_image(self, _image: MetadataImage) -> None:
        if not self.state.current and self._image_current():
            self.state.current = True
        if not self.config.is_broker or self._stopping:
            return
        self._reconcile_again = True
        if self._reconciling is None or self._reconciling.done():
            self._reconciling = asyncio.get_running_loop().create_task(self._reconcile())

    async def _reconcile(self) -> None:
        """Make the hosted logs and their roles follow the image. Until the node has seen
        a current image, logs are opened but no replica takes a role: a journal being
        replayed passes through old images (this node leading at epoch 0, say), and a
        node acts only on the newest metadata. Leadership is taken only where
        ``_leadership_allowed``; ``_watch_roles`` reconciles again when that changes."""
        assert self.logs is not None
        while self._reconcile_again and not self._stopping:
            self._reconcile_again = False
            image = self.state.image
            if self._image_current():
                self._reconciled_ready = True
            allowed = self._leadership_allowed()
            try:
                roles = await asyncio.to_thread(
                    self.logs.reconcile, image, self._reconciled_ready, allowed
                )
                if not self._reconciled_ready:
                    continue
                self._roles_allowed = allowed
                now = now_ms()
                for partition, role in roles:
                    led = partition.is_leader, partition.leader_epoch
                    held = partition.isr
                    partition.become(role.state, self.config.node_id, now, role.may_lead)
                    still_led = partition.is_leader and led == (True, partition.leader_epoch)
                    if self.replicas is not None and still_led:
                        self.replicas.counters.isr_changed(held, partition.isr)
                if self.replicas is not None:
                    await self.replicas.reconcile(image, roles)
                if self.groups is not None:
                    self.groups.reconcile()
            except Exception:
                # Logged, and retried with the next image; the node must keep following.
                _log.exception(
                    "applying metadata offset %d to the hosted logs failed", image.offset
                )
                continue
            self.state.mark_reconciled(image.offset)

    async def _watch_roles(self) -> None:
        """Reconcile again when the image first becomes current (so that logs the
        metadata no longer assigns here are removed even if nothing changes later), and
        whenever leadership becomes allowed or disallowed without an image change (the
        broker's registration answer can arrive after the image that records it)."""
        while True:
            await asyncio.sleep(ROLE_CHECK_S)
            behind = not self.state.current or (
                self.config.is_broker and not self._reconciled_ready
            )
            if (behind and self._image_current()) or (
                self._reconciled_ready and self._leadership_allowed() != self._roles_allowed
            ):
                self._on_image(self.state.image)

    async def _serve_when_ready(self) -> None:
        """Health turns SERVING once the node can do its job: a controller is active and,
        on brokers, this broker is registered and unfenced and its logs follow the image
        (NOT_SERVING until then)."""
        for service in HEALTH_SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        while True:
            image = self.state.image
            broker = image.brokers.get(self.config.node_id)
            if image.controller_id >= 0 and (
                not self.config.is_broker
                or (
                    self._registered_and_reconciled(image)
                    and broker is not None
                    and not broker.fenced
                    and not broker.log_dir_problem
                    and self.logs is not None
                    and not self.logs.offline_problem
                )
            ):
                break
            await self._next_image(image)
        for service in HEALTH_SERVICES:
            await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if not self._frozen:
            self._frozen = True
            freeze_long_lived()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.serving = True
        _log.info("node %d is ready", self.config.node_id)

    def _registered_and_reconciled(self, image: MetadataImage) -> bool:
        """Does ``image`` hold this process's registration, with the hosted logs following
        it (what a Metadata answer naming this broker and its partitions needs)?"""
        return (
            self.lifecycle is not None
            and self.lifecycle.session.registered_in(image, self.config.node_id)
            and self.state.reconciled_offset >= image.offset
        )

    async def _next_image(self, image: MetadataImage) -> None:
        """Wait (at most 0.2 s) for an image past ``image``, and then for the hosted logs
        to follow it: a check made at once would find every new image not yet reconciled,
        and metadata that changes more often than that would never be found caught up."""
        if await self.state.wait_for_offset(image.offset + 1, 0.2):
            await self.state.wait_reconciled(self.state.image.offset, 0.2)

    async def _open_kafka_when_registered(self, kafka: KafkaListener) -> None:
        """Let Kafka clients in once this broker is registered and its logs follow the
        image (``KafkaListener.open_requests``), whatever the data folder or health do
        meanwhile: a broker whose folder is offline still answers Metadata and
        FindCoordinator, as before it went offline."""
        while not self._registered_and_reconciled(self.state.image):
            await self._next_image(self.state.image)
        kafka.open_requests()

    def _on_log_dir_change(self) -> None:
        """The data folder went offline or came back (``LogManager``): tell the
        controller at once, follow with health, and reconcile (which closes every log,
        or opens them again through recovery)."""
        assert self.logs is not None
        problem = self.logs.offline_problem
        if self.lifecycle is not None:
            self.lifecycle.report_log_dir(problem)
        if self._serving_watch is not None:
            self._serving_watch.cancel()
        loop = asyncio.get_running_loop()
        if problem:
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.serving = False
            self._serving_watch = loop.create_task(self._not_serving(STORAGE_HEALTH_SERVICES))
        else:
            self._serving_watch = loop.create_task(self._serve_when_ready())
        self._on_image(self.state.image)

    async def _not_serving(self, services: tuple[str, ...]) -> None:
        for service in services:
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)

    # ------------------------------------------------------------------ metrics

    async def metrics_snapshot(self) -> NodeSnapshot:
        """The node's state for a metrics scrape (on the event loop: see
        ``headwater.node.ops.metrics``), a slice of partitions and groups at a time, so a
        node of thousands of partitions never holds its loop for a scrape (each
        partition's series is of one moment, the scrape's of a few milliseconds); drops
        the series of deleted topics."""
        image = self.state.image
        hosted = self.logs.hosted() if self.logs is not None else []
        partitions = []
        async for partition in yield_every(hosted, SNAPSHOT_SLICE_PARTITIONS):
            state = partition.state
            log = partition.log
            end = log.log_end_offset
            leader = partition.is_leader
            partitions.append(
                PartitionSample(
                    topic=partition.topic,
                    partition=partition.index,
                    leader=leader,
                    high_watermark=partition.high_watermark,
                    log_start_offset=log.log_start_offset,
                    log_end_offset=end,
                    size_bytes=log.size_bytes,
                    segments=log.segment_count,
                    replicas=len(state.replicas) if state is not None else 0,
                    isr=len(partition.isr),
                    min_insync_replicas=partition.min_insync_replicas,
                    follower_lag={
                        replica: max(0, end - progress.log_end_offset)
                        for replica, progress in partition.followers.items()
                        if progress.log_end_offset >= 0
                    }
                    if leader
                    else {},
                )
            )
        active = self.controller is not None and self.controller.is_active()
        term, commit_index = self._quorum_status()
        quorum = self.quorum.status() if self.quorum is not None else None
        if self.metrics is not None:
            self.metrics.forget_topics(image.topics)
        return NodeSnapshot(
            node_id=self.config.node_id,
            roles=self.config.roles,
            partitions=partitions,
            isr_shrinks=self.replicas.counters.isr_shrinks if self.replicas else 0,
            isr_expands=self.replicas.counters.isr_expands if self.replicas else 0,
            truncations=self.replicas.counters.truncations if self.replicas else 0,
            voter=self.quorum is not None,
            controller_active=active,
            raft_term=term,
            raft_commit_index=commit_index,
            metadata_offset=image.offset,
            offline_partitions=sum(
                1
                for topic in image.topics.values()
                for state in topic.partitions
                if state.leader == NO_LEADER
            )
            if active
            else 0,
            fenced_brokers=sum(1 for b in image.brokers.values() if b.fenced) if active else 0,
            registered_brokers=len(image.brokers) if active else 0,
            groups=await self._group_samples(),
            uncleanable_partitions=self.logs.uncleanable_partitions() if self.logs else 0,
            log_dir_offline=bool(self.logs and self.logs.offline_problem),
            raft_journal_failed=bool(quorum and quorum.journal_problem),
            disk_slow=bool(
                (quorum and quorum.journal_slow) or (self.logs and self.logs.disk_slow())
            ),
            log_dir_offline_brokers=sum(1 for b in image.brokers.values() if b.log_dir_problem)
            if active
            else 0,
        )

    async def _group_samples(self) -> list[GroupSample]:
        if self.groups is None or self.logs is None:
            return []
        samples = []
        for shard in list(self.groups.shards.values()):
            if not shard.loaded:
                continue
            groups = list(shard.image.groups.values())
            async for group in yield_every(groups, SNAPSHOT_SLICE_PARTITIONS, _offsets_held):
                lag = {}
                for (topic, index), committed in group.offsets.items():
                    replica = self.logs.partition(topic, index)
                    if replica is not None:
                        lag[(topic, index)] = max(0, replica.high_watermark - committed.offset)
                samples.append(GroupSample(group.group_id, len(group.members), lag))
        return samples

    # ------------------------------------------------------------------ stop

    async def stop(self, controlled: bool = True) -> None:
        if controlled and self.lifecycle is not None:
            await self.lifecycle.controlled_shutdown()
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.serving = False
        await self.health.enter_graceful_shutdown()
        # The hosted logs' roles stop following the image before the parts that act on
        # them stop: a reconcile running beside them could start a fetcher or a group
        # load after its part has stopped.
        self._stopping = True
        if self._reconciling is not None:
            await asyncio.gather(self._reconciling, return_exceptions=True)
        for part in (self.groups, self.replicas, self.lifecycle, self.follower, self.controller):
            if part is not None:
                await part.stop()
        self._ready_watch.cancel()
        for watch in (self._serving_watch, self._kafka_gate):
            if watch is not None:
                watch.cancel()
        if self.kafka is not None:
            await self.kafka.close()
        if self.classic_groups is not None:
            self.classic_groups.close()
        await asyncio.gather(
            self.server.stop(SHUTDOWN_GRACE_S), self.internal_server.stop(SHUTDOWN_GRACE_S)
        )
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        if self.quorum is not None:
            self.quorum.close()
        await self.peers.close()
        if self.logs is not None:
            self.logs.close()
        await self.loop_watch.stop()
        _log.info("node %d stopped", self.config.node_id)


def _offsets_held(group: GroupState) -> int:
    return 1 + len(group.offsets)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` on ``loop`` (from any thread); nothing once the loop has closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)


def _bind(
    server: grpc.aio.Server,
    address: str,
    flag: str,
    credentials: grpc.ServerCredentials | None,
) -> int:
    """Bind ``address``, with TLS when ``credentials`` are given; return the port
    (ListenError when it cannot be bound)."""
    _check_bindable(address, flag)
    cause: RuntimeError | None = None
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        port = 0
        cause = exc
    if not port:
        raise ListenError(
            f"cannot listen on {address}: the port is in use or the address is not on this "
            f"machine; choose another with {flag} HOST:PORT"
        ) from cause
    return port


def _check_bindable(address: str, flag: str) -> None:
    """ListenError naming the system's reason when a fixed port of ``address`` cannot be
    bound (in use, or a host not on this machine): asked before gRPC is, whose core logs
    a line of its own to stderr for such a failure. The probe binds as gRPC does
    (SO_REUSEADDR) and closes at once."""
    host, port = parse_address(address, flag)
    if port == 0:
        return
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ListenError(f"cannot listen on {address}: {exc}; check {flag} HOST:PORT") from exc
    family, kind, proto, _, where = found[0]
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {address}: {exc.strerror or exc}; choose another with "
            f"{flag} HOST:PORT"
        ) from exc


async def _run(config: NodeConfig, metrics_endpoint: MetricsEndpoint | None) -> None:
    node = Node(config, metrics_endpoint)
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


def serve(config: NodeConfig, metrics_endpoint: MetricsEndpoint | None = None) -> None:
    """Run a node until SIGTERM/SIGINT (with ``metrics_endpoint`` already bound, if
    given)."""
    tune_runtime()
    asyncio.run(_run(config, metrics_endpoint))
