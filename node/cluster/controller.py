"""The controller driver: runs the pure decisions of ``headwater.raft.metadata.decisions`` on the
node's event loop and commits their records through the quorum.

A voter is the *active* controller while (1) its Raft state is leader, and (2) its image
holds its own ``ControllerActivated`` record for the current term. It writes that record
as soon as it wins an election; because the record is applied after every earlier entry,
the new controller decides from a complete image. Decisions are serialized (one at a time,
each on the image that includes the previous one's records), so none is computed from a
stale image.

Broker sessions (the time of each broker's last heartbeat) are soft state of the active
controller, as in KRaft: a new controller gives every broker a full session timeout from
its activation (less one election timeout for the broker of the controller it replaced,
which has been silent at least that long), and a controller whose own loop stalled for
half a session (a SIGSTOP, a long pause) restarts every session rather than fence
brokers for its own silence.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol, TypeVar

from headwater.node.cluster.broker_liveness import BrokerLiveness
from headwater.node.cluster.broker_session import (
    controller_staleness_ms_max,
)
from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.config import NodeConfig, canonical_topic_configs
from headwater.node.groups.records import OFFSETS_TOPIC
from headwater.node.tasks import cancel_and_wait
from headwater.raft.metadata import decisions
from headwater.raft.metadata.image import MetadataImage, PartitionState
from headwater.raft.metadata.records import Record, encode_batch
from headwater.raft.quorum import MetadataQuorum, ProposalFailedError
from headwater.shared.errors import ErrorCode, HeadwaterError

T = TypeVar("T")


class AlterPartitionRequestView(Protocol):
    """The fields of headwater.v1.AlterPartitionRequest the controller reads."""

    broker_id: int
    broker_epoch: int
    topic_id: str
    partition: int
    leader_epoch: int
    partition_epoch: int

    @property
    def new_isr(self) -> Sequence[int]: ...


TICK_S: Final = 0.05
REASSIGNMENT_CHECK_MS: Final = 500
_log = logging.getLogger(__name__)


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def not_controller(image: MetadataImage) -> HeadwaterError:
    where = (
        f"the active controller is node {image.controller_id} at {image.controller_address}"
        if image.controller_id >= 0
        else "no controller is active yet"
    )
    return HeadwaterError(
        ErrorCode.NOT_CONTROLLER, f"this node is not the active controller; {where}"
    )


class ControllerDriver:
    def __init__(
        self,
        config: NodeConfig,
        quorum: MetadataQuorum,
        state: ClusterState,
        internal_address: str = "",
    ) -> None:
        self.config = config
        self.internal_address = internal_address
        """This node's inter-broker listener, named in the activation record."""
        self.quorum = quorum
        self.state = state
        self.limits = decisions.TopicLimits(
            partitions_max=config.partitions_max,
            topics_max=config.topics_max,
            default_partitions=config.default_partitions,
            default_replication_factor=config.default_replication_factor,
            check_configs=self._check_topic_configs,
        )
        self.rng = random.Random()
        self._lock = asyncio.Lock()
        self.liveness = BrokerLiveness(
            config.node_id, config.broker_session_timeout_ms, config.raft_election_timeout_ms
        )
        self._activating = False
        self._replaced_controller = -1
        self._next_reassignment_check_ms = 0
        self._next_rebalance_ms = 0
        self._task: asyncio.Task[None] | None = None
        self._pulse: asyncio.Task[None] | None = None
        # The Raft term in which this controller last committed its activation and has
        # not stalled since: it answers only while that is the current term.
        self._confirmed_epoch = 0
        self._loop_alive_ms = monotonic_ms()
        self._stall_ms = controller_staleness_ms_max(config)

    def _check_topic_configs(self, configs: Mapping[str, str]) -> Mapping[str, str]:
        return canonical_topic_configs(configs, self.config)

    # ------------------------------------------------------------------ role

    def is_active(self) -> bool:
        """The active controller: the Raft leader, holding its own activation record of
        the current term, confirmed by a commit since its loop last stalled (a SIGSTOP, a
        long pause), and not stalled now. A controller that wakes from a pause may still
        believe it leads Raft for a moment; it answers nothing (NOT_CONTROLLER) until it
        has committed its activation again, which a deposed leader cannot."""
        image = self.state.image
        status = self.quorum.status()
        return (
            status.is_leader
            and image.controller_id == self.config.node_id
            and image.controller_epoch == status.term
            and self._confirmed_epoch == status.term
            and not self._stalled()
        )

    def _stalled(self) -> bool:
        """Has the loop gone without running ``_keep_pulse`` for ``_stall_ms``? Then the
        confirmation is gone (see ``is_active``)."""
        if monotonic_ms() - self._loop_alive_ms > self._stall_ms:
            self._confirmed_epoch = 0
            return True
        return False

    async def _keep_pulse(self) -> None:
        while True:
            self._stalled()
            self._loop_alive_ms = monotonic_ms()
            await asyncio.sleep(TICK_S)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._pulse = loop.create_task(self._keep_pulse())
        self._task = loop.create_task(self._tick_forever())

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        await cancel_and_wait(self._pulse)

    async def _tick_forever(self) -> None:
        while True:
            try:
                await self.tick()
            except HeadwaterError as error:
                _log.debug("controller tick: %s", error)
            except Exception:
                _log.exception("controller tick failed")
            await asyncio.sleep(TICK_S)

    async def tick(self) -> None:
        now = monotonic_ms()
        self.liveness.ticked(now)
        status = self.quorum.status()
        image = self.state.image
        if not status.is_leader:
            self.liveness.not_leading()
            return
        if (
            image.controller_id != self.config.node_id
            or image.controller_epoch != status.term
            or self._confirmed_epoch != status.term
        ):
            await self._maybe_activate(status.term)
            return
        if self.liveness.leading(image, status.term, self._replaced_controller, now):
            _log.info(
                "node %d is the active controller (epoch %d)", self.config.node_id, status.term
            )
        fenced, _ = await self.run(
            lambda img, epoch: self.liveness.expired(img, epoch, monotonic_ms())
        )
        for node_id in fenced:
            silent_ms = self.liveness.silent_ms(node_id, monotonic_ms())
            _log.info("fenced broker %d: no heartbeat for %d ms", node_id, silent_ms)
        if now >= self._next_reassignment_check_ms:
            self._next_reassignment_check_ms = now + REASSIGNMENT_CHECK_MS
            await self.run(decisions.maybe_complete_reassignments)
        interval = self.config.leader_rebalance_interval_ms
        if interval > 0 and now >= self._next_rebalance_ms:
            self._next_rebalance_ms = now + interval
            imbalance = self.config.leader_imbalance_per_broker_percent
            moved, _ = await self.run(
                lambda image, epoch: decisions.elect_preferred_leaders(image, epoch, imbalance)
            )
            if moved:
                _log.info("moved leadership of %d partition(s) to preferred replicas", moved)

    async def _maybe_activate(self, term: int) -> None:
        if self._activating:
            return
        self._activating = True
        try:
            async with self._lock:
                self._replaced_controller = self.state.image.controller_id
                record = decisions.activate(
                    self.state.image,
                    term,
                    self.config.node_id,
                    self.config.client_address,
                    self.rng,
                    self.internal_address,
                )
                await self._propose(record.records)
                if self.quorum.status().term == term:
                    self._confirmed_epoch = term
        except HeadwaterError as error:
            _log.info("activation for epoch %d failed: %s", term, error)
        finally:
            self._activating = False

    # ------------------------------------------------------------------ decisions

    async def run(
        self, decide: Callable[[MetadataImage, int], decisions.ControllerResult[T]]
    ) -> tuple[T, int]:
        """Decide on the current image and commit the records; return (response, the
        metadata offset that holds them). Raises NOT_CONTROLLER unless active."""
        async with self._lock:
            if not self.is_active():
                raise not_controller(self.state.image)
            image = self.state.image
            # is_active() holds, so the image's controller epoch is the current Raft term
            # (a re-election may have raised it since this node's last tick). Decided in a
            # worker thread: a decision is a pure function of the (immutable) image, and a
            # large one (10,000 topics to create or check) must not hold the event loop
            # that answers the brokers' heartbeats.
            result = await asyncio.to_thread(decide, image, image.controller_epoch)
            if not self.is_active():  # the role moved while it decided
                raise not_controller(self.state.image)
            if not result.records:
                return result.response, image.offset
            offset = await self._propose(result.records)
            return result.response, offset

    async def create_offsets_topic(self) -> str:
        """Create ``__consumer_offsets`` unless it exists; its topic id. The replication
        factor is ``offsets_topic_replication_factor`` capped by the live brokers, with
        min_insync_replicas 2 from 3 replicas up (else 1), compacted and never deleted
        by time: the log cleaner keeps the newest record of each group key (see
        headwater.node.groups.records)."""
        config = self.config

        def decide(image: MetadataImage, epoch: int) -> decisions.ControllerResult[str]:
            existing = image.topics.get(OFFSETS_TOPIC)
            if existing is not None:
                return decisions.ControllerResult((), existing.topic_id)
            replicas = max(
                1, min(config.offsets_topic_replication_factor, len(image.live_broker_ids()))
            )
            wanted = decisions.NewTopic(
                OFFSETS_TOPIC,
                partitions=config.offsets_topic_partitions,
                replication_factor=replicas,
                configs={
                    "min_insync_replicas": "2" if replicas >= 3 else "1",
                    "cleanup_policy": "compact",
                },
                internal=True,
            )
            result = decisions.create_topics(image, epoch, [wanted], self.limits, self.rng)
            outcome = result.response[0]
            if outcome.error is not None:
                raise outcome.error
            return decisions.ControllerResult(result.records, outcome.topic_id)

        topic_id, _ = await self.run(decide)
        return topic_id

    async def allocate_producer_ids(self, node_id: int, broker_epoch: int) -> tuple[int, int]:
        """The next block of producer ids for broker ``node_id``, committed first."""
        block, _ = await self.run(
            lambda image, epoch: decisions.allocate_producer_ids(
                image, epoch, node_id, broker_epoch
            )
        )
        return block

    async def _propose(self, records: tuple[Record, ...]) -> int:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[str | None, int, ProposalFailedError | None]] = (
            loop.create_future()
        )

        def done(refusal: str | None, offset: int, failure: ProposalFailedError | None) -> None:
            loop.call_soon_threadsafe(_resolve, future, (refusal, offset, failure))

        self.quorum.propose(encode_batch(records), done)
        timeout_s = self.config.request_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                refusal, offset, failure = await future
        except TimeoutError:
            raise HeadwaterError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"the metadata change was not committed within {timeout_s:g} s (no quorum?)",
            ) from None
        if failure is not None:
            raise HeadwaterError(
                ErrorCode.NOT_CONTROLLER, f"the metadata change was not committed: {failure}"
            )
        if refusal is not None:
            raise HeadwaterError(
                ErrorCode.NOT_CONTROLLER, f"the metadata change was refused: {refusal}"
            )
        await self.state.wait_for_offset(offset, timeout_s)
        return offset

    # ------------------------------------------------------------------ brokers

    async def register(
        self,
        node_id: int,
        incarnation_id: str,
        address: str,
        rack: str,
        internal_address: str,
        partition_capacity: int = 0,
        kafka_address: str = "",
    ) -> int:
        self.liveness.heard(node_id, monotonic_ms())
        broker_epoch, _ = await self.run(
            lambda image, epoch: decisions.register_broker(
                image,
                epoch,
                node_id,
                incarnation_id,
                address,
                rack,
                internal_address,
                partition_capacity,
                kafka_address,
            )
        )
        self.liveness.heard(node_id, monotonic_ms())
        return broker_epoch

    async def heartbeat(
        self, node_id: int, broker_epoch: int, want_shutdown: bool, log_dir_problem: str = ""
    ) -> decisions.HeartbeatOutcome:
        if not self.is_active():
            raise not_controller(self.state.image)
        self.liveness.heard(node_id, monotonic_ms())
        outcome, _ = await self.run(
            lambda image, epoch: decisions.heartbeat(
                image, epoch, node_id, broker_epoch, want_shutdown, log_dir_problem
            )
        )
        return outcome

    async def alter_partition(self, request: AlterPartitionRequestView) -> PartitionState:
        state, _ = await self.run(
            lambda image, epoch: decisions.alter_partition_isr(
                image,
                epoch,
                request.broker_id,
                request.broker_epoch,
                request.topic_id,
                request.partition,
                request.leader_epoch,
                request.partition_epoch,
                tuple(request.new_isr),
            )
        )
        return state


def _resolve(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)
