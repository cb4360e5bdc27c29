"""A broker's side of the cluster: registration, heartbeats, controlled shutdown, and (on
broker-only nodes) following the metadata from the controllers.

Lifecycle: the broker registers with the active controller under a fresh incarnation id
and receives a broker epoch; it heartbeats every ``broker_heartbeat_interval_ms`` with that
epoch (the first heartbeat unfences it). A STALE_BROKER_EPOCH answer (the controller lost
or replaced the registration) makes it register again. Calls go to the controller named
by the metadata image; while none is known, or the named one does not answer, the broker
retries after a short pause.

What the answers mean, the broker epoch and the leadership lease (a broker may act as a
partition leader only within ``leadership_lease_s(config)`` of sending a heartbeat the
controller answered unfenced, and why that is safe), is ``headwater.node.cluster.broker_session``:
this loop makes the calls and hands each answer to its ``BrokerSession``.

Log directory: heartbeats carry ``log_dir_problem`` (non-empty while the data folder is
offline, see ``headwater.node.replicas.log_manager``); ``report_log_dir`` sets it and sends a
heartbeat at once, so the controller moves leadership off a broker whose disk filled
without waiting for the next interval.

Controlled shutdown (SIGTERM): heartbeats carry ``want_shutdown`` until the controller
answers that leadership has moved away (or ``controlled_shutdown_timeout_ms`` passes);
only then does the node stop serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import uuid
from typing import Final

import grpc

from headwater.node.cluster.broker_session import BrokerSession, leadership_lease_s
from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.peers import Peers, peer_error
from headwater.node.config import NodeConfig
from headwater.node.tasks import cancel_and_wait
from headwater.raft.metadata.image import MetadataImage, apply
from headwater.raft.metadata.records import RecordFormatError, decode_batch
from headwater.shared.errors import ErrorCode
from headwater.v1 import headwater_pb2 as pb

RETRY_S: Final = 0.1
CALL_TIMEOUT_S: Final = 2.0
_log = logging.getLogger(__name__)


def _now_ms() -> float:
    return asyncio.get_running_loop().time() * 1000


class BrokerLifecycle:
    def __init__(
        self,
        config: NodeConfig,
        state: ClusterState,
        peers: Peers,
        partition_capacity: int = 0,
    ) -> None:
        self.config = config
        self.state = state
        self.peers = peers
        self.partition_capacity = partition_capacity
        """Most partition replicas this node can host (registered with the controller)."""
        self.kafka_address = ""
        """HOST:PORT Kafka clients are told for this node, registered with the controller
        ("": no Kafka listener). Set before ``start``: it is sent when the broker
        registers."""
        self.incarnation_id = uuid.uuid4().hex
        self.session = BrokerSession(leadership_lease_s(config) * 1000)
        self._task: asyncio.Task[None] | None = None
        self.log_dir_problem = ""
        """Sent with every heartbeat: why the data folder is offline ("" when online)."""
        self._wake = asyncio.Event()

    @property
    def broker_epoch(self) -> int:
        """This process's broker epoch (-1 until registered)."""
        return self.session.broker_epoch

    def may_lead(self, image: MetadataImage, node_id: int) -> bool:
        """May this broker act as a partition leader now (``BrokerSession.may_lead``)?"""
        return self.session.may_lead(image, node_id, _now_ms())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def report_log_dir(self, problem: str) -> None:
        """The data folder went offline (``problem``) or came back (""): heartbeat now."""
        if problem != self.log_dir_problem:
            self.log_dir_problem = problem
            self._wake.set()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    def _controller_address(self) -> str:
        return self.state.image.controller_internal_address

    async def _run(self) -> None:
        interval_s = self.config.broker_heartbeat_interval_ms / 1000
        while True:
            address = self._controller_address()
            if not address:
                await self.state.wait_until(
                    lambda image: bool(image.controller_internal_address), 1.0
                )
                continue
            self._wake.clear()  # a report from now on is sent by this call or the next
            try:
                if not self.session.registered:
                    await self._register(address)
                    continue  # heartbeat at once: the first one unfences the broker
                await self._heartbeat(address, want_shutdown=False)
            except grpc.RpcError as error:
                problem = peer_error(error, address)
                if problem.code is ErrorCode.STALE_BROKER_EPOCH:
                    _log.info("broker epoch %d is stale; registering again", self.broker_epoch)
                    self.session.stale()
                else:
                    _log.debug("controller call failed: %s", problem)
                await asyncio.sleep(RETRY_S)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval_s)

    async def _register(self, address: str) -> None:
        response = await self.peers.controller(address).RegisterBroker(
            pb.RegisterBrokerRequest(
                node_id=self.config.node_id,
                incarnation_id=self.incarnation_id,
                address=self.config.client_address,
                internal_address=self.peers.internal_address,
                partition_capacity=self.partition_capacity,
                rack=self.config.rack,
                kafka_address=self.kafka_address,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        self.session.registered_as(response.broker_epoch)
        _log.info("registered as broker %d, epoch %d", self.config.node_id, self.broker_epoch)

    async def _heartbeat(self, address: str, want_shutdown: bool) -> pb.BrokerHeartbeatResponse:
        heartbeat = self.session.heartbeat(_now_ms())
        response: pb.BrokerHeartbeatResponse = await self.peers.controller(address).BrokerHeartbeat(
            pb.BrokerHeartbeatRequest(
                node_id=self.config.node_id,
                broker_epoch=heartbeat.broker_epoch,
                want_shutdown=want_shutdown,
                log_dir_problem=self.log_dir_problem,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        if self.session.answered(heartbeat, response.fenced, want_shutdown) and not want_shutdown:
            _log.info(
                "broker %d is %s", self.config.node_id, "fenced" if response.fenced else "unfenced"
            )
        return response

    async def controlled_shutdown(self) -> bool:
        """Ask the controller to move leadership away; True once it has (False on timeout
        or when no controller answers)."""
        await self.stop()
        if not self.session.registered:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.controlled_shutdown_timeout_ms / 1000
        while loop.time() < deadline:
            address = self._controller_address()
            if address:
                try:
                    response = await self._heartbeat(address, want_shutdown=True)
                    if response.shutdown_ready:
                        _log.info("controlled shutdown: leadership moved away")
                        return True
                except grpc.RpcError as error:
                    _log.debug(
                        "controlled shutdown heartbeat failed: %s", peer_error(error, address)
                    )
            await asyncio.sleep(RETRY_S)
        _log.warning("controlled shutdown timed out; stopping anyway")
        return False


class MetadataFollower:
    """Broker-only nodes: keep the image current by streaming it from a controller node
    (``controller_addresses``, tried in turn). ``caught_up`` turns true with the first
    image received: each one is complete (a snapshot), never a partial replay."""

    def __init__(self, config: NodeConfig, state: ClusterState, peers: Peers) -> None:
        self.addresses = [a.strip() for a in config.controller_addresses.split(",") if a.strip()]
        self.state = state
        self.peers = peers
        self.caught_up = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        attempt = 0
        while True:
            address = self.addresses[attempt % len(self.addresses)]
            attempt += 1
            call = self.peers.controller(address).FetchMetadata(
                pb.FetchMetadataRequest(offset=self.state.image.offset)
            )
            try:
                async for response in call:
                    self._take(response)
            except grpc.RpcError as error:
                _log.debug("metadata stream from %s ended: %s", address, peer_error(error, address))
            finally:
                call.cancel()
            await asyncio.sleep(RETRY_S)

    def _take(self, response: pb.FetchMetadataResponse) -> None:
        try:
            records = decode_batch(response.records)
        except RecordFormatError as exc:
            _log.error("undecodable metadata snapshot at offset %d: %s", response.offset, exc)
            return
        result = apply(MetadataImage(), records)
        if result.refusal:
            _log.error(
                "metadata snapshot at offset %d refused: %s", response.offset, result.refusal
            )
            return
        self.state.publish_now(dataclasses.replace(result.image, offset=response.offset))
        self.caught_up = True
