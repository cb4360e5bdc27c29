"""ISR maintenance of the partitions this node leads, and the followers' fetchers of the
partitions it follows (``ReplicaManager``).

**ISR maintenance** (``ReplicaManager.tick``, every ``ISR_CHECK_MS``). A leader asks the
active controller (``Controller.AlterPartition``) to drop followers that have lagged for
``replica_lag_ms_max`` and to add back followers that have caught up
(``headwater.node.replicas.replication``). The controller's answer is the partition's committed
state, which the leader takes at once (``Partition.take_committed_state``), without waiting
for its own metadata to show it: a node whose image lags, or stands still while it is cut
off from the metadata quorum, still takes back followers that caught up. Whether a
follower may join (is it a live broker?) is the controller's decision: the leader also
proposes a follower its image shows fenced once that follower has fetched since the image
first showed it so. One request per partition is in flight at a time. What to ask and what
to do with the answer is ``headwater.node.replicas.isr_proposals`` (pure: the simulated cluster in
``tests/sim_cluster.py`` drives it too); this module makes the calls.

**Following** (``ReplicaManager.reconcile``). Every hosted partition this node does not
lead is followed by the ``LeaderFetcher`` of its leader node
(``headwater.node.replicas.follower_fetcher``); the leader's side of the fetch session is
``headwater.node.replicas.replica_service``.

Everything here runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import grpc

from headwater.node.clock import now_ms
from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.controller import monotonic_ms
from headwater.node.cluster.peers import Peers
from headwater.node.config import NodeConfig
from headwater.node.replicas.follower_fetcher import LeaderFetcher
from headwater.node.replicas.isr_proposals import ISR_CHECK_MS, IsrProposals, IsrRequest
from headwater.node.replicas.log_manager import LogManager
from headwater.node.replicas.partition import Partition
from headwater.node.replicas.replica_roles import ReplicaRole
from headwater.node.tasks import cancel_and_wait
from headwater.raft.metadata.image import MetadataImage, PartitionState
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb

_log = logging.getLogger(__name__)
ISR_CHECK_SLICE: Final = 500
"""Led partitions an ISR check looks at before it gives the event loop back."""
Key = tuple[str, int]


@dataclass(slots=True)
class ReplicationCounters:
    """Counters for metrics: ISR changes of partitions this node leads (whoever made
    them: its own AlterPartition requests, or the controller removing a fenced broker),
    and follower truncations."""

    isr_shrinks: int = 0
    isr_expands: int = 0
    truncations: int = 0

    def isr_changed(self, before: tuple[int, ...], after: tuple[int, ...]) -> None:
        """Count the change of a led partition's ISR from ``before`` to ``after`` (the
        same leadership: a new leader's first ISR is not a change)."""
        if len(after) < len(before):
            self.isr_shrinks += 1
        elif len(after) > len(before):
            self.isr_expands += 1


class ReplicaManager:
    def __init__(
        self,
        config: NodeConfig,
        logs: LogManager,
        state: ClusterState,
        peers: Peers,
        broker_epoch: Callable[[], int],
        may_lead: Callable[[], bool],
    ) -> None:
        self.config = config
        self.logs = logs
        self.state = state
        self.peers = peers
        self.broker_epoch = broker_epoch
        self.may_lead = may_lead
        self.counters = ReplicationCounters()
        self._fetchers: dict[int, LeaderFetcher] = {}
        self._followed: dict[Key, int] = {}  # partition -> leader id
        self.proposals = IsrProposals(config.node_id, config.replica_lag_ms_max)
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._tick_forever())

    async def stop(self) -> None:
        """End the ISR checks and every fetcher. Once called, ``reconcile`` starts
        nothing: a metadata change that arrives while the fetchers are being stopped
        cannot leave one running (or change the set being stopped)."""
        self._stopped = True
        await cancel_and_wait(self._task)
        while self._fetchers:
            _leader, fetcher = self._fetchers.popitem()
            await fetcher.stop()
        self._followed.clear()

    def stopping(self) -> bool:
        """Has ``stop`` been called?"""
        return self._stopped

    async def reconcile(
        self, image: MetadataImage, roles: list[tuple[Partition, ReplicaRole]]
    ) -> None:
        """Follow the leader each hosted replica's role names (``ReplicaRole.follow``;
        nothing once ``stop`` has been called)."""
        if self._stopped:
            return
        wanted: dict[Key, tuple[Partition, PartitionState]] = {
            (p.topic, p.index): (p, role.state) for p, role in roles if role.follow is not None
        }
        for key, leader in list(self._followed.items()):
            entry = wanted.get(key)
            if entry is None or entry[1].leader != leader:
                self._fetchers[leader].unfollow(key)
                del self._followed[key]
        for key, (partition, state) in wanted.items():
            fetcher = self._fetchers.get(state.leader)
            address = image.broker_internal_address(state.leader)
            if fetcher is not None and fetcher.address != address:
                del self._fetchers[state.leader]
                for followed in list(fetcher.following):
                    self._followed.pop(followed, None)
                await fetcher.stop()
                if self.stopping():
                    return  # stopped while this fetcher was being stopped
                fetcher = None
            if fetcher is None:
                if not address:
                    continue
                fetcher = self._fetchers[state.leader] = LeaderFetcher(self, state.leader, address)
                fetcher.start()
            fetcher.follow(partition, state.leader_epoch)
            self._followed[key] = state.leader

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(ISR_CHECK_MS / 1000)
            try:
                await self.tick()
            except Exception:
                _log.exception("ISR check failed")

    async def tick(self) -> None:
        """Ask the controller for the ISR changes every led partition needs
        (``IsrProposals.due``), ``ISR_CHECK_SLICE`` partitions at a time, giving the
        event loop back between slices (a node of thousands of partitions held it for
        tens of milliseconds every check)."""
        hosted = self.logs.hosted()
        for start in range(0, len(hosted), ISR_CHECK_SLICE):
            if start:
                await asyncio.sleep(0)
            if not self.may_lead():
                return
            requests = self.proposals.due(
                self.state.image, hosted[start : start + ISR_CHECK_SLICE], now_ms(), monotonic_ms()
            )
            for request in requests:
                asyncio.get_running_loop().create_task(self._alter(request))

    async def _alter(self, request: IsrRequest) -> None:
        partition, state, isr = request.partition, request.made_at, request.isr
        key = request.key
        address = self.state.image.controller_internal_address
        try:
            if not address:
                raise HeadwaterError(ErrorCode.NOT_CONTROLLER, "no active controller known")
            answer = await self.peers.controller(address).AlterPartition(
                pb.AlterPartitionRequest(
                    broker_id=self.config.node_id,
                    broker_epoch=self.broker_epoch(),
                    topic_id=partition.topic_id,
                    partition=partition.index,
                    leader_epoch=state.leader_epoch,
                    partition_epoch=state.partition_epoch,
                    new_isr=isr,
                ),
                timeout=self.peers.timeout_s,
            )
        except (grpc.RpcError, HeadwaterError) as exc:
            error = from_rpc_error(exc, address) if isinstance(exc, grpc.RpcError) else exc
            _log.info("%s-%d: ISR change to %s failed: %s", key[0], key[1], list(isr), error)
            self.proposals.answered(request, None, error, monotonic_ms())
            return
        committed = PartitionState(
            partition=partition.index,
            replicas=tuple(answer.replicas),
            isr=tuple(answer.isr),
            leader=answer.leader,
            leader_epoch=answer.leader_epoch,
            partition_epoch=answer.partition_epoch,
            adding_replicas=tuple(answer.adding_replicas),
            removing_replicas=tuple(answer.removing_replicas),
        )
        held = partition.isr
        if self.proposals.answered(request, committed, None, monotonic_ms()):
            self.counters.isr_changed(held, partition.isr)
            _log.info("%s-%d: ISR %s -> %s", key[0], key[1], list(state.isr), list(committed.isr))

    def under_replicated(self) -> int:
        return sum(
            1
            for p in self.logs.hosted()
            if p.is_leader and p.state is not None and len(p.state.isr) < len(p.state.replicas)
        )
