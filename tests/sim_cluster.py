"""A simulated cluster: brokers, the active controller and a client in one process, on a
virtual clock, over a network that drops, delays and cuts messages, with in-memory logs,
driving the project's own replication and control code.

What is the project's code and what is the simulation's:

- **Shared**: every decision of the controller (``metadata.decisions``: registration,
  heartbeats and fencing, ISR changes, elections) applied to the metadata image
  (``metadata.image.apply``); each replica's ``node.replicas.partition.Partition`` over a
  ``log.memory_log.MemoryLog`` (roles, leader epochs, the high watermark and its
  checkpoint, follower progress, the follower's fencing check, the refusal to truncate
  below the high watermark, the acks=all answer); what the image asks of the replicas
  (``node.replicas.replica_roles.ReconcileStep``: which are hosted and removed, their
  settings, when a leadership's epoch is recorded, whom to follow); the leader's fetch
  sessions (``node.replicas.fetch_session.FetchSession``: each position checked before it
  counts as the follower's progress, silent followers counted at their last position,
  what each answer carries, refusals once a leadership moves on) and its answers to
  truncation questions (``fetch_session.epoch_end``), both behind the replica checks
  (``node.replicas.replica_checks``); the follower's steps, its truncation exchange (rule,
  rounds, checks) and what it does with each fetch answer (``node.following.Following``),
  in sessions kept as the node's fetcher keeps them (truncate what is not ready, then one
  request, then its answer; a failed call starts a new session);
  the ISR proposals and the handling of their answers (``node.isr_proposals.IsrProposals``);
  the registration, heartbeat answers, leadership lease and whether the node may lead
  (``node.broker_session.BrokerSession``), the controller's side of those sessions
  (``node.cluster.broker_liveness.BrokerLiveness``) and the node defaults
  (``NodeConfig``); and
  every produce goes through the node's broker core (``BrokerCore.led``, ``append`` and
  its acks=all wait) on an asyncio event loop that runs on the virtual clock
  (``VirtualLoop``), with the core's clock passed in.
- **Simulated**: the transport (each call is a message with a delivery time; a reply is a
  message back; a call with no reply within ``CALL_TIMEOUT_MS`` failed with an unknown
  outcome), the loops that make the calls (heartbeats, metadata, follower fetch
  cycles, ISR checks, as the node's loops make them; a leader answers a fetch at once,
  the follower's next cycle standing for the long poll), the broker core's view of the
  hosted replicas and of the metadata (``_Hosted``, ``_View``), and the Raft quorum,
  which here is one always-available, linearizable metadata log (Raft itself is
  pysyncobj, tested with real processes); its controller may pause, or be replaced by a
  new one at the next epoch after an election timeout without one.

Faults: the controller paused (its tick runs before what waited for it when it wakes)
or replaced; crash and restart (the log and the high watermark checkpoint survive, as after
fsync), pause (a paused node keeps its inbox and answers everything late when resumed),
network partitions between any nodes and the controller, message loss and delay; and, at
the start of each seeded run, a schedule of partitions that leaves two replicas with
tails of different leader epochs, each without the other's (``diverge_epochs``), which
random faults reach too rarely to test the truncation rule's KIP-279 case.

Invariants, checked after every step (``check``) and at the end (``check_final``):

0. what each replica promises at every moment (``Partition.broken_promises``): its high
   watermark never above its log end nor going back, its leader epoch never going back;
1. one leader per leader epoch, in the metadata and among the replicas acting as leader;
2. replicas agree below the high watermark: any two replicas of a partition hold the same
   records at every offset below both their high watermarks;
3. no acknowledged acks=all record is lost: once the faults heal and the cluster settles,
   every acknowledged record is in the leader's log at the offset it was acknowledged at.

``python -m tests.sim_cluster --seeds 100 --steps 20000`` runs long searches; the tests
run a few seeds of a few thousand steps. A failure names its seed; the run is replayed
exactly from it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from headwater.log import batch as batch_format
from headwater.log.api import LogConfig
from headwater.log.memory_log import MemoryLog
from headwater.node.cluster.broker_liveness import BrokerLiveness
from headwater.node.cluster.broker_session import BrokerSession, leadership_lease_s
from headwater.node.config import NodeConfig
from headwater.node.core.broker_core import BrokerCore, Refusal
from headwater.node.replicas.fetch_session import (
    FetchSession,
    ReplicaData,
    ReplicaRefusal,
    epoch_end,
)
from headwater.node.replicas.following import Following
from headwater.node.replicas.isr_proposals import ISR_CHECK_MS, IsrProposals, IsrRequest
from headwater.node.replicas.partition import Partition
from headwater.node.replicas.replica_roles import (
    ReconcileStep,
    ReplicaRole,
    take_role,
)
from headwater.node.security.authorizer import Authorizer
from headwater.raft.metadata import decisions
from headwater.raft.metadata import records as r
from headwater.raft.metadata.image import MetadataImage, apply
from headwater.shared.acls import Operation
from headwater.shared.errors import ErrorCode, HeadwaterError

STEP_MS: Final = 10
CALL_TIMEOUT_MS: Final = 2000
METADATA_POLL_MS: Final = 50
FOLLOWER_IDLE_MS: Final = 20
CONTROLLER_TICK_MS: Final = 100
PRODUCE_TIMEOUT_MS: Final = 5000
HW_CHECKPOINT_MS: Final = 1000
FETCH_BYTES: Final = 64 << 10
CONTROLLER: Final = 0
CLIENT: Final = -1
TOPIC: Final = "sim"
CONFIG: Final = NodeConfig()
LEASE_MS: Final = int(leadership_lease_s(CONFIG) * 1000)


class InvariantError(AssertionError):
    pass


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop on the simulation's virtual clock: its timers fire as the
    simulation's time passes them, and ``run_ready`` runs what is ready without ever
    waiting. The node's asyncio code (``BrokerCore``, ``Partition``'s waits) runs on it,
    deterministically: one thread, callbacks in the order they were scheduled."""

    def __init__(self, now_ms: Callable[[], int]) -> None:
        super().__init__()
        self._now_ms = now_ms

    def time(self) -> float:
        return self._now_ms() / 1000

    def run_ready(self) -> None:
        """Run every callback ready now, and those they make ready, until none is."""
        for _ in range(10_000):
            self.call_soon(self.stop)
            self.run_forever()
            if not self._ready:  # type: ignore[attr-defined]
                return
        raise InvariantError("the simulated node's event loop never went idle")

    def finish(self) -> None:
        """Cancel what is still waiting (the simulation is over) and close."""
        for task in asyncio.all_tasks(self):
            task.cancel()
        self.run_ready()
        self.close()


# --------------------------------------------------------------------------- network


@dataclass(order=True)
class Envelope:
    due_ms: int
    seq: int
    source: int = field(compare=False)
    target: int = field(compare=False)
    body: Any = field(compare=False)


@dataclass
class Call:
    """A request; its reply is ``Reply(call_id, value, error)`` sent back to ``source``."""

    call_id: int
    kind: str
    args: dict[str, Any]


@dataclass
class Reply:
    call_id: int
    value: Any = None
    error: HeadwaterError | None = None


class Network:
    """Messages between endpoints (node ids, CONTROLLER, CLIENT), each delivered after a
    random delay unless lost or its link is cut. Deterministic for a seed."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.queue: list[Envelope] = []
        self.seq = 0
        self.cut: set[frozenset[int]] = set()
        self.loss = 0.0
        self.delay_ms = (1, 5)

    def send(self, now_ms: int, source: int, target: int, body: Any) -> None:
        if frozenset((source, target)) in self.cut or self.rng.random() < self.loss:
            return
        self.seq += 1
        due = now_ms + self.rng.randint(*self.delay_ms)
        self.queue.append(Envelope(due, self.seq, source, target, body))

    def due(self, now_ms: int) -> list[Envelope]:
        ready = sorted(e for e in self.queue if e.due_ms <= now_ms)
        self.queue = [e for e in self.queue if e.due_ms > now_ms]
        return [e for e in ready if frozenset((e.source, e.target)) not in self.cut]


class Endpoint:
    """Something that makes calls: ids, pending calls and their timeouts."""

    def __init__(self, endpoint_id: int, sim: Simulation) -> None:
        self.id = endpoint_id
        self.sim = sim
        self.pending: dict[int, tuple[int, Any]] = {}  # call id -> (deadline, continuation)

    def call(self, target: int, kind: str, continuation: Any, **args: Any) -> None:
        """Send a call; ``continuation(value, error)`` runs on its reply or timeout. Call
        ids are unique in the whole simulation: a late reply never reaches another call
        (of a restarted process, say)."""
        self.sim.call_ids += 1
        call_id = self.sim.call_ids
        self.pending[call_id] = (self.sim.now_ms + CALL_TIMEOUT_MS, continuation)
        self.sim.network.send(self.sim.now_ms, self.id, target, Call(call_id, kind, args))

    def take_reply(self, reply: Reply) -> None:
        entry = self.pending.pop(reply.call_id, None)
        if entry is not None:
            entry[1](reply.value, reply.error)

    def expire_calls(self) -> None:
        for call_id, (deadline, continuation) in list(self.pending.items()):
            if self.sim.now_ms >= deadline:
                del self.pending[call_id]
                continuation(
                    None, HeadwaterError(ErrorCode.REQUEST_TIMED_OUT, f"call {call_id}: no reply")
                )


# --------------------------------------------------------------------------- controller


class Controller(Endpoint):
    """The active controller over the metadata log (the quorum keeps the log; the
    controller's process may pause, and may be replaced by a new one at a new epoch after
    an election timeout without a controller). Its brokers' sessions are the node's
    ``BrokerLiveness``."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(CONTROLLER, sim)
        self.epoch = 0
        self.image = MetadataImage()
        self.log: list[tuple[r.Record, ...]] = []
        self.liveness = self._new_liveness()
        self.next_tick_ms = 0
        self.paused = False
        self.electing_until_ms: int | None = None
        """While a new controller is being elected: nothing is answered until then."""
        self._activate()

    @staticmethod
    def _new_liveness() -> BrokerLiveness:
        return BrokerLiveness(
            CONTROLLER, CONFIG.broker_session_timeout_ms, CONFIG.raft_election_timeout_ms
        )

    def _activate(self) -> None:
        self.epoch += 1
        self.commit(
            decisions.activate(self.image, self.epoch, CONTROLLER, "sim", self.sim.rng).records
        )

    def fail_over(self) -> None:
        """The controller's process is lost: a new one is active at the next epoch once
        an election timeout has passed, knowing nothing of the brokers' sessions."""
        self.pending.clear()
        self.liveness = self._new_liveness()
        self.electing_until_ms = self.sim.now_ms + CONFIG.raft_election_timeout_ms

    def commit(self, records: tuple[r.Record, ...]) -> None:
        if not records:
            return
        result = apply(self.image, records)
        assert result.refusal is None, result.refusal
        self.image = result.image
        self.log.append(records)
        self.sim.note_metadata(records)

    def decide(self, decision: decisions.ControllerResult[Any]) -> Any:
        self.commit(decision.records)
        return decision.response

    def handle(self, source: int, call: Call) -> Reply | None:
        if self.electing_until_ms is not None:
            return None  # no controller yet: the call times out
        a = call.args
        try:
            if call.kind == "register":
                self.liveness.heard(source, self.sim.now_ms)
                value = self.decide(
                    decisions.register_broker(
                        self.image, self.epoch, source, a["incarnation"], f"node-{source}", ""
                    )
                )
                self.liveness.heard(source, self.sim.now_ms)
            elif call.kind == "heartbeat":
                self.liveness.heard(source, self.sim.now_ms)
                value = self.decide(
                    decisions.heartbeat(self.image, self.epoch, source, a["broker_epoch"])
                )
            elif call.kind == "alter":
                value = self.decide(
                    decisions.alter_partition_isr(self.image, self.epoch, source, **a)
                )
            elif call.kind == "metadata":
                value = self.log[a["offset"] :]
            else:
                raise AssertionError(call.kind)
        except HeadwaterError as error:
            return Reply(call.call_id, None, error)
        return Reply(call.call_id, value)

    def tick(self) -> None:
        if self.paused or self.sim.now_ms < self.next_tick_ms:
            return
        if self.electing_until_ms is not None:
            if self.sim.now_ms < self.electing_until_ms:
                return
            self.electing_until_ms = None
            self._activate()
        self.next_tick_ms = self.sim.now_ms + CONTROLLER_TICK_MS
        self.liveness.ticked(self.sim.now_ms)
        self.liveness.leading(self.image, self.epoch, CONTROLLER, self.sim.now_ms)
        self.decide(self.liveness.expired(self.image, self.epoch, self.sim.now_ms))

    def create_topic(self, partitions: int, replication_factor: int, min_insync: int) -> None:
        limits = decisions.TopicLimits(
            partitions_max=1000,
            topics_max=1000,
            default_partitions=1,
            default_replication_factor=1,
        )
        request = decisions.NewTopic(
            TOPIC, partitions, replication_factor, {"min_insync_replicas": str(min_insync)}
        )
        (outcome,) = self.decide(
            decisions.create_topics(self.image, self.epoch, [request], limits, self.sim.rng)
        )
        assert outcome.error is None, outcome.error


# --------------------------------------------------------------------------- brokers


@dataclass
class Disk:
    """What survives a crash: each partition's log and high watermark checkpoint folder."""

    logs: dict[tuple[str, int], MemoryLog] = field(default_factory=dict)
    folder: Path | None = None


@dataclass
class Fetching:
    """A followed partition: the node's own steps (``node.following.Following``), when
    its truncation may be tried again, and whether its position is due in the next
    request of its leader's session (it became ready, or records were appended)."""

    steps: Following
    retry_ms: int = 0
    position_due: bool = False


@dataclass(frozen=True)
class Position:
    """A fetch position as a replica fetch request carries it (``FetchPosition``)."""

    topic: str
    partition: int
    leader_epoch: int
    fetch_offset: int


@dataclass(frozen=True)
class Ref:
    """A partition no longer followed, as a request's ``removed`` names it."""

    topic: str
    partition: int


@dataclass(frozen=True)
class EpochQuestion:
    """An OffsetForLeaderEpoch question (``fetch_session.EpochQuestion``)."""

    topic: str
    partition: int
    replica_id: int
    current_leader_epoch: int
    leader_epoch: int


@dataclass
class LeaderSession:
    """The follower's fetch session with one leader, kept as ``LeaderFetcher`` keeps its
    stream: each cycle first truncates every partition not yet ready (all at once), then
    sends one request (the positions that are due, the partitions dropped), then acts on
    its answer. A failed call ends the session: every partition truncates again and a new
    session starts."""

    session_id: tuple[int, int]
    """(the process's incarnation, the session's number in it): later sessions are larger."""
    busy: bool = False
    next_ms: int = 0
    truncating: set[tuple[str, int]] = field(default_factory=set)
    removed: set[tuple[str, int]] = field(default_factory=set)


class Broker(Endpoint):
    def __init__(self, node_id: int, sim: Simulation, disk: Disk, incarnation: int) -> None:
        super().__init__(node_id, sim)
        self.disk = disk
        self.incarnation = f"{node_id}.{incarnation}"
        self.incarnation_number = incarnation
        self.image = MetadataImage()
        self.image_batches = 0
        self.session = BrokerSession(LEASE_MS)
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.following: dict[tuple[str, int], Fetching] = {}
        self.sessions: dict[int, LeaderSession] = {}
        """The follower's sessions, by leader."""
        self.sessions_made = 0
        self.served: dict[int, tuple[tuple[int, int], FetchSession]] = {}
        """The leader's sessions, by follower: the session id and its steps."""
        self.isr = IsrProposals(node_id, CONFIG.replica_lag_ms_max)
        self.next_heartbeat_ms = 0
        self.heartbeat_in_call = False
        self.next_metadata_ms = 0
        self.metadata_in_call = False
        self.next_isr_ms = 0
        self.next_checkpoint_ms = 0
        self.reconciled_offset = -1
        self.paused = False
        self.core = BrokerCore(
            dataclasses.replace(CONFIG, node_id=node_id),
            _Hosted(self),
            _View(self),
            authorizer=Authorizer(CONFIG, lambda: self.image),
            may_lead=self.may_lead,
            clock=lambda: self.sim.now_ms,
        )
        self.tasks: set[asyncio.Task[int]] = set()
        """Produce calls the broker core is answering."""
        self.outbox: list[tuple[int, Reply]] = []
        """Their answers, sent by ``step`` (a paused node sends nothing)."""

    def stop(self) -> None:
        """The process ends (a crash): its calls under way end with it, unanswered."""
        for task in self.tasks:
            task.cancel()
        self.outbox.clear()

    # ------------------------------------------------------------------ leadership

    def leadership_allowed(self) -> bool:
        """This process's registration unfenced in the node's image, as
        ``Node._leadership_allowed``: what roles are taken with."""
        return self.session.leadership_allowed(self.image, self.id)

    def may_lead(self) -> bool:
        """Leadership allowed and the lease held (``BrokerSession.may_lead``): what serving
        as a leader (produce, replica fetches, epoch queries) and ISR changes need."""
        return self.session.may_lead(self.image, self.id, self.sim.now_ms)

    def reconcile(self) -> None:
        """Host the partitions the image assigns here and take their roles, as the node's
        reconcile step says (``ReconcileStep``) and as ``LogManager.reconcile``,
        ``Node._reconcile`` and ``ReplicaManager.reconcile`` apply it."""
        may_lead = self.leadership_allowed()
        step = ReconcileStep(self.id)
        hosting = step.hosting(self.image, {k: p.topic_id for k, p in self.partitions.items()})
        for key in hosting.remove:
            del self.partitions[key]
            self._unfollow(key)
        for key, (topic, state) in hosting.assigned.items():
            partition = self.partitions.get(key)
            if partition is None:
                partition = self._open(key, topic.topic_id)
            role = step.role(state, partition.log.latest_epoch, may_lead)
            take_role(partition, topic.configs, role, CONFIG.min_insync_replicas)
            partition.become(role.state, self.id, self.sim.now_ms, role.may_lead)
            self._follow(key, partition, role)
        self.reconciled_offset = self.image.offset

    def _open(self, key: tuple[str, int], topic_id: str) -> Partition:
        log = self.disk.logs.setdefault(key, MemoryLog())
        assert self.disk.folder is not None
        folder = self.disk.folder / f"{key[0]}-{key[1]}"
        folder.mkdir(parents=True, exist_ok=True)
        partition = Partition(key[0], key[1], log, LogConfig(), topic_id=topic_id, directory=folder)
        self.partitions[key] = partition
        return partition

    def _follow(self, key: tuple[str, int], partition: Partition, role: ReplicaRole) -> None:
        """Follow as ``ReplicaManager.reconcile`` and ``LeaderFetcher.follow`` do."""
        leader, epoch = role.follow, role.state.leader_epoch
        current = self.following.get(key)
        if leader is None:
            self._unfollow(key)
            return
        if current is None or not current.steps.is_for(partition, leader, epoch):
            if current is not None and current.steps.leader_id != leader:
                self._unfollow(key)
            self.following[key] = Fetching(Following(partition, leader, epoch))
            session = self.sessions.get(leader)
            if session is not None:
                session.removed.discard(key)

    def _unfollow(self, key: tuple[str, int]) -> None:
        """``LeaderFetcher.unfollow``: the next request of the leader's session drops it."""
        gone = self.following.pop(key, None)
        if gone is not None and (session := self.sessions.get(gone.steps.leader_id)):
            session.removed.add(key)

    # ------------------------------------------------------------------ loops

    def step(self) -> None:
        now = self.sim.now_ms
        self.expire_calls()
        if now >= self.next_heartbeat_ms and not self.heartbeat_in_call:
            self._heartbeat()
        if now >= self.next_metadata_ms and not self.metadata_in_call:
            self.metadata_in_call = True
            self.call(CONTROLLER, "metadata", self._on_metadata, offset=self.image_batches)
        self.reconcile()
        leaders = {entry.steps.leader_id for entry in self.following.values()}
        for leader in leaders - self.sessions.keys():
            self.sessions[leader] = self._new_session()
        for leader, session in list(self.sessions.items()):
            if leader not in leaders and not session.removed and not session.busy:
                del self.sessions[leader]  # the node stops a fetcher with nothing to follow
            elif not session.busy and now >= session.next_ms:
                self._cycle(leader, session)
        if now >= self.next_isr_ms:
            self.next_isr_ms = now + ISR_CHECK_MS
            if self.may_lead():
                for request in self.isr.due(self.image, self.partitions.values(), now, now):
                    self._alter(request)
        for target, reply in self.outbox:
            self.sim.network.send(now, self.id, target, reply)
        self.outbox.clear()
        if now >= self.next_checkpoint_ms:
            self.next_checkpoint_ms = now + HW_CHECKPOINT_MS
            for partition in self.partitions.values():
                partition.maybe_checkpoint_high_watermark()

    def _heartbeat(self) -> None:
        self.heartbeat_in_call = True
        if not self.session.registered:

            def registered(value: Any, error: HeadwaterError | None) -> None:
                self.heartbeat_in_call = False
                if error is None:
                    self.session.registered_as(value)  # heartbeat at once: it unfences
                else:
                    self.next_heartbeat_ms = self.sim.now_ms + 100

            self.call(CONTROLLER, "register", registered, incarnation=self.incarnation)
            return
        heartbeat = self.session.heartbeat(self.sim.now_ms)

        def answered(value: Any, error: HeadwaterError | None) -> None:
            self.heartbeat_in_call = False
            self.next_heartbeat_ms = self.sim.now_ms + (
                CONFIG.broker_heartbeat_interval_ms if error is None else 100
            )
            if error is None:
                self.session.answered(heartbeat, value.fenced)
            elif error.code is ErrorCode.STALE_BROKER_EPOCH:
                self.session.stale()

        self.call(CONTROLLER, "heartbeat", answered, broker_epoch=heartbeat.broker_epoch)

    def _on_metadata(self, batches: Any, error: HeadwaterError | None) -> None:
        self.metadata_in_call = False
        self.next_metadata_ms = self.sim.now_ms + METADATA_POLL_MS
        if error is not None:
            return
        for records in batches:
            result = apply(self.image, records)
            assert result.refusal is None, result.refusal
            self.image = result.image
            self.image_batches += 1

    def _alter(self, request: IsrRequest) -> None:
        made_at = request.made_at

        def answered(value: Any, error: HeadwaterError | None) -> None:
            self.isr.answered(request, value, error, self.sim.now_ms)

        self.call(
            CONTROLLER,
            "alter",
            answered,
            broker_epoch=self.session.broker_epoch,
            topic_id=request.partition.topic_id,
            partition=request.partition.index,
            leader_epoch=made_at.leader_epoch,
            partition_epoch=made_at.partition_epoch,
            new_isr=request.isr,
        )

    # ------------------------------------------------------------------ follower

    def _new_session(self) -> LeaderSession:
        self.sessions_made += 1
        return LeaderSession((self.incarnation_number, self.sessions_made))

    def _of(self, leader: int) -> list[tuple[tuple[str, int], Fetching]]:
        return [(k, e) for k, e in self.following.items() if e.steps.leader_id == leader]

    def _cycle(self, leader: int, session: LeaderSession) -> None:
        """One cycle of the session (``LeaderFetcher._session``): truncate the partitions
        not yet ready, all at once (``_prepare_new``), then the request."""
        session.busy = True
        now = self.sim.now_ms
        waiting = [
            (key, entry)
            for key, entry in self._of(leader)
            if not entry.steps.ready and now >= entry.retry_ms
        ]
        session.truncating = {key for key, _entry in waiting}
        for key, entry in waiting:
            entry.steps.begin_truncation()
            self._ask(leader, session, key, entry)
        if not waiting:
            self._request(leader, session)

    def _truncated(
        self, leader: int, session: LeaderSession, key: tuple[str, int], entry: Fetching, ok: bool
    ) -> None:
        """One partition's truncation ended (``ok``: the replica is ready); the request
        goes out once every partition of the cycle has ended."""
        if ok and self.following.get(key) is entry:
            entry.position_due = True
        elif not ok:
            entry.retry_ms = self.sim.now_ms + FOLLOWER_IDLE_MS
        session.truncating.discard(key)
        if not session.truncating and self.sessions.get(leader) is session:
            self._request(leader, session)
        elif not session.truncating:
            session.busy = False

    def _ask(
        self, leader: int, session: LeaderSession, key: tuple[str, int], entry: Fetching
    ) -> None:
        """One round of a partition's truncation (``LeaderFetcher._truncate``): the
        question as an epoch call, the answer to the node's own ``Following``."""
        steps = entry.steps
        try:
            asked = steps.question()
        except HeadwaterError as gave_up:  # as the node's fetcher: it starts over
            self.sim.refusals.append(str(gave_up))
            self._truncated(leader, session, key, entry, False)
            return

        def answered(value: Any, error: HeadwaterError | None) -> None:
            if error is not None or self.following.get(key) is not entry:
                self._truncated(leader, session, key, entry, False)
                return
            try:
                cut = steps.answer(*value, self.sim.now_ms)
            except HeadwaterError as refused:
                if refused.code is ErrorCode.UNKNOWN_SERVER_ERROR:  # a broken leader
                    raise InvariantError(
                        f"seed {self.sim.seed} at {self.sim.now_ms} ms: {refused}"
                    ) from refused
                if refused.code is not ErrorCode.FENCED_LEADER_EPOCH:  # below the hw
                    self.sim.refusals.append(str(refused))
                self._truncated(leader, session, key, entry, False)
                return
            if cut.done:
                self._truncated(leader, session, key, entry, True)
            else:
                self._ask(leader, session, key, entry)

        self.call(
            leader,
            "epoch",
            answered,
            question=EpochQuestion(key[0], key[1], self.id, steps.leader_epoch, asked),
        )

    def _request(self, leader: int, session: LeaderSession) -> None:
        """One request of the session: the positions due and the partitions dropped
        (``LeaderFetcher._request``); its answer goes to each partition's ``Following``
        (``LeaderFetcher._apply``)."""
        positions = []
        for key, entry in self._of(leader):
            if entry.steps.ready and entry.position_due:
                entry.position_due = False
                steps = entry.steps
                positions.append(Position(key[0], key[1], steps.leader_epoch, steps.fetch_offset))
        removed = [Ref(*key) for key in sorted(session.removed)]
        session.removed.clear()

        def answered(parts: Any, error: HeadwaterError | None) -> None:
            session.busy = False
            now = self.sim.now_ms
            session.next_ms = now + FOLLOWER_IDLE_MS
            if self.sessions.get(leader) is not session:
                return
            if error is not None:  # the stream ended: a new one, every partition truncates
                self.sessions[leader] = self._new_session()
                for _key, entry in self._of(leader):
                    entry.steps.truncate_again()
                return
            for part in parts:
                key = (part.topic, part.partition)
                entry = self.following.get(key)
                if entry is None or entry.steps.leader_id != leader:
                    continue
                steps = entry.steps
                was_ready = steps.ready
                if not steps.fetch_answered(isinstance(part, ReplicaRefusal)):
                    if was_ready and not steps.ready:  # failed: back to truncation
                        entry.retry_ms = now + FOLLOWER_IDLE_MS
                    continue
                assert isinstance(part, ReplicaData)
                if part.records:
                    try:
                        steps.partition.append_replicated(part.records, now)
                    except HeadwaterError as refused:
                        self.sim.refusals.append(str(refused))
                        steps.truncate_again()
                        entry.retry_ms = now + FOLLOWER_IDLE_MS
                        session.removed.add(key)
                        continue
                    entry.position_due = True
                    session.next_ms = now
                steps.appended(part.high_watermark)

        self.call(
            leader,
            "fetch",
            answered,
            session=session.session_id,
            broker_epoch=self.session.broker_epoch,
            positions=positions,
            removed=removed,
        )

    # ------------------------------------------------------------------ serving

    def handle(self, source: int, call: Call) -> Reply | None:
        a = call.args
        try:
            if call.kind == "fetch":
                return Reply(call.call_id, self._serve_fetch(source, a))
            if call.kind == "epoch":
                return Reply(call.call_id, self._serve_epoch(a))
            if call.kind == "produce":
                self._serve_produce(source, call)
                return None
            raise AssertionError(call.kind)
        except HeadwaterError as error:
            return Reply(call.call_id, None, error)

    def _serve_fetch(self, source: int, a: dict[str, Any]) -> list[ReplicaData | ReplicaRefusal]:
        """One request of a follower's fetch session, taken and answered by the node's
        ``FetchSession`` as ``ReplicaService.Fetch`` drives it (answered at once: the
        follower's next cycle stands for the long poll). A request of a new session
        from the same follower ends the old one, as a new stream replaces a broken one."""
        served = self.served.get(source)
        if served is not None and a["session"] < served[0]:
            return []  # a request of a session that has ended (its caller is gone)
        if served is None or served[0] != a["session"]:
            if served is not None:
                served[1].close()
            served = (a["session"], FetchSession(self.id, self._hosted_partition, _no_wake))
            self.served[source] = served
        session = served[1]
        refusals = session.take(
            replica_id=source,
            broker_epoch=a["broker_epoch"],
            positions=a["positions"],
            removed=a["removed"],
            image=self.image,
            may_lead=self.may_lead(),
            now_ms=self.sim.now_ms,
        )
        if refusals:
            return list(refusals)
        parts, _news_pending = session.collect(FETCH_BYTES, with_news=True)
        return parts

    def _hosted_partition(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def _serve_epoch(self, a: dict[str, Any]) -> tuple[int, int, int]:
        question = a["question"]
        end = epoch_end(
            self._hosted_partition(question.topic, question.partition),
            question,
            node_id=self.id,
            may_lead=self.may_lead(),
        )
        return end.leader_epoch, end.end_offset, end.log_start_offset

    def _serve_produce(self, source: int, call: Call) -> None:
        """An acks=all produce through the node's broker core: ``BrokerCore.led`` (this
        node leads the partition, may lead, has taken the role), ``append`` and its
        acknowledgement, on the simulation's event loop; the answer goes out with the
        broker's next step."""
        index, value = call.args["partition"], call.args["value"]

        async def produce() -> int:
            partition = await self.core.led(self.image, Operation.WRITE, TOPIC, index)
            acknowledged = await self.core.append(
                partition,
                batch_format.encode_batch([value]),
                acks_all=True,
                timeout_ms=PRODUCE_TIMEOUT_MS,
            )
            answer = await acknowledged
            if isinstance(answer, Refusal):
                raise answer.error()
            return answer.base_offset

        task = self.sim.loop.create_task(produce())
        self.tasks.add(task)

        def answered(task: asyncio.Task[int]) -> None:
            self.tasks.discard(task)
            if task.cancelled():
                return
            error = task.exception()
            if error is not None and not isinstance(error, HeadwaterError):
                self.sim.failures.append(f"node {self.id}: produce failed: {error!r}")
                return
            reply = Reply(call.call_id, None if error else task.result(), error)
            self.outbox.append((source, reply))

        task.add_done_callback(answered)


def _no_wake() -> None:
    """A simulated leader answers each request at once: nothing waits to be woken."""


class _Hosted:
    """The replicas a simulated broker hosts, as ``BrokerCore`` asks for them."""

    offline_problem = ""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def partition(self, topic: str, index: int) -> Partition | None:
        return self.broker.partitions.get((topic, index))


class _View:
    """A simulated broker's metadata, as ``BrokerCore`` asks for it."""

    current = True

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    @property
    def image(self) -> MetadataImage:
        return self.broker.image

    async def wait_reconciled(self, offset: int, timeout_s: float) -> bool:
        """Until the broker's step has reconciled its replicas with the image at
        ``offset`` (it does at every step)."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.broker.reconciled_offset < offset:
                    await asyncio.sleep(STEP_MS / 1000)
        except TimeoutError:
            return False
        return True

    async def wait_until(
        self, predicate: Callable[[MetadataImage], bool], timeout_s: float
    ) -> bool:
        return predicate(self.broker.image)


# --------------------------------------------------------------------------- client


class Client(Endpoint):
    """Sends acks=all produce calls of unique values to the leader the controller names
    and remembers what was acknowledged where."""

    def __init__(self, sim: Simulation) -> None:
        super().__init__(CLIENT, sim)
        self.sent = 0
        self.acknowledged: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.in_flight = 0

    def step(self) -> None:
        self.expire_calls()
        if self.in_flight >= 4 or self.sim.rng.random() < 0.5:
            return
        topic = self.sim.controller.image.topics.get(TOPIC)
        if topic is None:
            return
        partition = self.sim.rng.randrange(len(topic.partitions))
        leader = topic.partitions[partition].leader
        if leader < 0:
            return
        self.sent += 1
        value = b"v%d" % self.sent
        self.in_flight += 1

        def answered(offset: Any, error: HeadwaterError | None) -> None:
            self.in_flight -= 1
            if error is None:
                self.acknowledged[value] = (partition, offset)

        self.call(leader, "produce", answered, partition=partition, value=value)


# --------------------------------------------------------------------------- simulation


@dataclass
class Metrics:
    steps: int = 0
    crashes: int = 0
    pauses: int = 0
    partitions: int = 0
    diverged: int = 0
    controller_faults: int = 0


class Simulation:
    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        partitions: int = 2,
        root: Path | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.call_ids = 0
        self.network = Network(self.rng)
        self.refusals: list[str] = []
        self.leaders_by_epoch: dict[tuple[str, int], dict[int, int]] = {}
        self.metrics = Metrics()
        self.failures: list[str] = []
        """What the node's code raised that it never should (checked at every step)."""
        self.loop = VirtualLoop(lambda: self.now_ms)
        weakref.finalize(self, self.loop.finish)
        self._root = root or Path(tempfile.mkdtemp(prefix="headwater-sim-"))
        self.controller = Controller(self)
        self.disks = {i: Disk(folder=self._root / f"n{i}") for i in range(1, nodes + 1)}
        self.incarnations = dict.fromkeys(self.disks, 0)
        self.brokers: dict[int, Broker | None] = {i: self._boot(i) for i in self.disks}
        self.client = Client(self)
        self._run_until(lambda: len(self.controller.image.live_broker_ids()) == nodes, 30_000)
        self.controller.create_topic(partitions, min(3, nodes), min(2, nodes))

    def _boot(self, node_id: int) -> Broker:
        self.incarnations[node_id] += 1
        return Broker(node_id, self, self.disks[node_id], self.incarnations[node_id])

    # ------------------------------------------------------------------ faults

    def crash(self, node_id: int) -> None:
        broker = self.brokers[node_id]
        if broker is not None:
            broker.stop()
        self.brokers[node_id] = None
        self.metrics.crashes += 1

    def restart(self, node_id: int) -> None:
        if self.brokers[node_id] is None:
            self.brokers[node_id] = self._boot(node_id)

    def pause(self, node_id: int) -> None:
        broker = self.brokers[node_id]
        if broker is not None:
            broker.paused = True
            self.metrics.pauses += 1

    def resume(self, node_id: int) -> None:
        broker = self.brokers[node_id]
        if broker is not None:
            broker.paused = False

    def resume_controller(self) -> None:
        """The controller's process wakes: its tick's timer fires before it reads the
        heartbeats that waited in its sockets (of the orders a woken process may take,
        the worse one for the brokers)."""
        if self.controller.paused:
            self.controller.paused = False
            self.controller.tick()

    def isolate(self, node_id: int, from_ids: list[int]) -> None:
        for other in from_ids:
            self.network.cut.add(frozenset((node_id, other)))
        self.metrics.partitions += 1

    def heal(self) -> None:
        self.network.cut.clear()
        self.network.loss = 0.0
        self.resume_controller()
        for node_id, broker in self.brokers.items():
            if broker is None:
                self.restart(node_id)
            else:
                broker.paused = False

    def faulted(self) -> list[int]:
        """Nodes down or paused."""
        return [i for i, b in self.brokers.items() if b is None or b.paused]

    def random_fault(self) -> None:
        """One fault or one repair, chosen by the seed: half the time a repair while
        anything is broken; at most ``len(nodes) - 1`` nodes down or paused at once."""
        ids = list(self.disks)
        broken = self.faulted()
        controller = self.controller
        if (
            broken or self.network.cut or self.network.loss or controller.paused
        ) and self.rng.random() < 0.5:
            repairs = [("node", i) for i in broken]
            repairs += [("cut", 0)] if self.network.cut else []
            repairs += [("loss", 0)] if self.network.loss else []
            repairs += [("controller", 0)] if controller.paused else []
            what, node_id = self.rng.choice(repairs)
            if what == "node":
                self.restart(node_id)
                self.resume(node_id)
            elif what == "cut":
                self.network.cut.clear()
            elif what == "controller":
                self.resume_controller()
            else:
                self.network.loss = 0.0
            return
        node_id = self.rng.choice(ids)
        choice = self.rng.random()
        if choice < 0.5 and len(broken) < len(ids) - 1 and node_id not in broken:
            if choice < 0.25:
                self.crash(node_id)
            else:
                self.pause(node_id)
        elif choice < 0.85:
            others = [o for o in (CONTROLLER, CLIENT, *ids) if o != node_id]
            self.isolate(node_id, self.rng.sample(others, self.rng.randint(1, 2)))
        elif choice < 0.92:
            if controller.paused or controller.electing_until_ms is not None:
                return
            self.metrics.controller_faults += 1
            if self.rng.random() < 0.5:
                controller.paused = True
            else:
                controller.fail_over()
        else:
            self.network.loss = self.rng.choice((0.05, 0.2))

    def diverge_epochs(self, index: int = 0) -> bool:
        """A fault schedule that leaves two replicas with uncommitted tails of different
        leader epochs, each without the other's epoch (the case KIP-279 amended KIP-101
        for), then heals: the follower must truncate to where its own older epoch ends,
        not to where the leader's older epoch ends, or the replicas differ below the high
        watermark (invariant 2). With replicas ``[F, M, L]`` in election order and F
        leading: F is deposed and M leads at a new epoch X, M cut off from the client
        until F has caught up and rejoined the ISR; F is then cut off from M, so M's
        records at X reach L only; M is deposed and F, first in the ISR, leads at Y with
        L cut off from it, taking records L never sees; F is deposed and L, the one left
        in the ISR, leads at Z. F asks L where Y ends; L answers with X, an epoch F never
        had. True when the schedule ran to its end; False when the cluster took another
        turn (the faults are cleared either way)."""

        def state() -> Any:
            return self.controller.image.topics[TOPIC].partitions[index]

        def log_end(node_id: int) -> int:
            broker = self.brokers[node_id]
            replica = broker.partitions.get((TOPIC, index)) if broker is not None else None
            return replica.log.log_end_offset if replica is not None else -1

        def reached(condition: Any, steps: int = 1500) -> bool:
            for _ in range(steps):
                if condition():
                    return True
                self.step()
            return False

        first, second, third = state().replicas

        def schedule() -> bool:
            if state().leader != first or len(state().isr) != 3:
                return False
            self.isolate(first, [CONTROLLER])
            if not reached(lambda: state().leader == second):
                return False
            self.network.cut.clear()
            self.isolate(second, [CLIENT])
            if not reached(lambda: first in state().isr, 3000):
                return False
            self.network.cut.clear()
            self.isolate(first, [second])
            start = log_end(second)
            if not reached(lambda: log_end(third) > start):
                return False
            self.isolate(second, [CONTROLLER, third])
            self.isolate(third, [first])
            if not reached(lambda: state().leader == first):
                return False
            start = log_end(first)
            if not reached(lambda: log_end(first) > start):
                return False
            self.isolate(first, [CONTROLLER])
            return reached(lambda: state().leader == third)

        ran = schedule()
        self.network.cut.clear()
        self.metrics.diverged += ran
        return ran

    # ------------------------------------------------------------------ running

    def live_brokers(self) -> Iterator[Broker]:
        for broker in self.brokers.values():
            if broker is not None and not broker.paused:
                yield broker

    def endpoint(self, endpoint_id: int) -> Endpoint | None:
        if endpoint_id == CONTROLLER:
            return self.controller
        if endpoint_id == CLIENT:
            return self.client
        return self.brokers.get(endpoint_id)

    def step(self, with_client: bool = True) -> None:
        self.now_ms += STEP_MS
        self.metrics.steps += 1
        held: list[Envelope] = []
        for envelope in self.network.due(self.now_ms):
            target = self.endpoint(envelope.target)
            if target is None:
                continue  # a crashed node: lost
            if isinstance(target, Broker | Controller) and target.paused:
                held.append(envelope)  # waits in the paused process's socket buffers
                continue
            body = envelope.body
            if isinstance(body, Reply):
                target.take_reply(body)
                continue
            assert isinstance(target, Controller | Broker)
            reply = target.handle(envelope.source, body)
            if reply is not None:
                self.network.send(self.now_ms, envelope.target, envelope.source, reply)
        for envelope in held:
            envelope.due_ms = self.now_ms + STEP_MS
            self.network.queue.append(envelope)
        self.loop.run_ready()
        self.controller.tick()
        for broker in list(self.live_brokers()):
            broker.step()
        self.loop.run_ready()
        if with_client:
            self.client.step()
        self.check()

    def _run_until(self, condition: Any, deadline_ms: int, with_client: bool = False) -> None:
        end = self.now_ms + deadline_ms
        while not condition():
            if self.now_ms >= end:
                raise InvariantError(f"seed {self.seed}: did not settle within {deadline_ms} ms")
            self.step(with_client)

    def run(self, steps: int, fault_every: int = 100) -> None:
        """``steps`` steps, a random fault or repair every ``fault_every`` (0: none)."""
        for i in range(steps):
            if fault_every and i % fault_every == 0 and i:
                self.random_fault()
            self.step()

    # ------------------------------------------------------------------ invariants

    def note_metadata(self, records: tuple[r.Record, ...]) -> None:
        """Invariant 1 in the metadata: one leader per (partition, leader epoch)."""
        for record in records:
            if isinstance(record, r.PartitionChanged | r.PartitionCreated):
                key = (record.topic_id, record.partition)
                leaders = self.leaders_by_epoch.setdefault(key, {})
                known = leaders.setdefault(record.leader_epoch, record.leader)
                if known != record.leader:
                    raise InvariantError(
                        f"seed {self.seed}: partition {key} has leaders {known} and "
                        f"{record.leader} at leader epoch {record.leader_epoch}"
                    )

    def replicas(self, index: int) -> list[tuple[int, Partition]]:
        found = []
        for node_id, broker in self.brokers.items():
            if broker is not None and (TOPIC, index) in broker.partitions:
                found.append((node_id, broker.partitions[(TOPIC, index)]))
        return found

    def check(self) -> None:
        if self.failures:
            raise InvariantError(f"seed {self.seed} at {self.now_ms} ms: {self.failures[0]}")
        topic = self.controller.image.topics.get(TOPIC)
        if topic is None:
            return
        for index in range(len(topic.partitions)):
            replicas = self.replicas(index)
            for node_id, partition in replicas:
                for broken in partition.broken_promises():
                    raise InvariantError(
                        f"seed {self.seed} at {self.now_ms} ms: node {node_id} {broken}"
                    )
            acting = {}
            for node_id, partition in replicas:
                if partition.is_leader:
                    other = acting.setdefault(partition.leader_epoch, node_id)
                    if other != node_id:
                        raise InvariantError(
                            f"seed {self.seed} at {self.now_ms} ms: nodes {other} and {node_id} "
                            f"both lead {TOPIC}-{index} at epoch {partition.leader_epoch}"
                        )
            views = [(n, p.high_watermark, p.log) for n, p in replicas]
            for i, (a, hw_a, log_a) in enumerate(views):
                for b, hw_b, log_b in views[i + 1 :]:
                    below = min(hw_a, hw_b)
                    if stored_below(log_a, below) != stored_below(log_b, below):
                        raise InvariantError(
                            f"seed {self.seed} at {self.now_ms} ms: {TOPIC}-{index} differs "
                            f"between nodes {a} and {b} below their high watermarks "
                            f"({hw_a}, {hw_b})"
                        )

    def settle(self, deadline_ms: int = 60_000) -> None:
        """Heal every fault and run until each partition has a leader whose high watermark
        covers its log and every replica has caught up with it."""
        self.heal()

        def settled() -> bool:
            topic = self.controller.image.topics[TOPIC]
            for state in topic.partitions:
                if state.leader < 0 or len(state.isr) != len(state.replicas):
                    return False
                leader = self.brokers[state.leader]
                if leader is None:
                    return False
                led = leader.partitions.get((TOPIC, state.partition))
                if led is None or not led.is_leader:
                    return False
                end = led.log.log_end_offset
                if led.high_watermark != end:
                    return False
                for _, replica in self.replicas(state.partition):
                    if replica.log.log_end_offset != end or replica.high_watermark != end:
                        return False
            return True

        self._run_until(settled, deadline_ms)

    def check_final(self) -> None:
        """Invariant 3, after ``settle``: every acknowledged record where it was put."""
        logs = {}
        for state in self.controller.image.topics[TOPIC].partitions:
            leader = self.brokers[state.leader]
            assert leader is not None
            logs[state.partition] = values_of(leader.partitions[(TOPIC, state.partition)].log)
        for value, (index, offset) in sorted(self.client.acknowledged.items()):
            log = logs[index]
            if offset >= len(log) or log[offset] != value:
                found = log[offset] if offset < len(log) else None
                raise InvariantError(
                    f"seed {self.seed}: acknowledged {value!r} at {TOPIC}-{index} offset "
                    f"{offset} is lost (now {found!r})"
                )


def stored_below(log: MemoryLog, offset: int) -> bytes:
    """The stored batches below ``offset``, byte for byte (a follower stores the leader's
    batches unchanged, so replicas that agree hold the same bytes)."""
    if offset <= log.log_start_offset:
        return b""
    return bytes(log.read(log.log_start_offset, 1 << 62, upper_bound=offset).data)


def values_of(log: MemoryLog) -> list[bytes | None]:
    """The values at offsets [0, log end) (None below the log start)."""
    values: list[bytes | None] = [None] * log.log_start_offset
    position = log.log_start_offset
    while position < log.log_end_offset:
        result = log.read(position, 1 << 30)
        for decoded in batch_format.decode_batches(result.data):
            values.extend(decoded.records.column("value").to_pylist())
            position = decoded.header.next_offset
    return values


def run_seed(seed: int, steps: int, root: Path | None = None, diverge: bool = True) -> Simulation:
    """One seeded run: the schedule that diverges leader epochs (``diverge_epochs``,
    unless ``diverge`` is false), then random faults every 100 steps, then heal, settle
    and check."""
    sim = Simulation(seed, root=root)
    if diverge:
        sim.run(300, fault_every=0)
        sim.diverge_epochs()
    sim.run(steps)
    sim.settle()
    sim.check_final()
    return sim


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: random)")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20_000)
    options = parser.parse_args()
    first = options.seed if options.seed is not None else random.randrange(1 << 30)
    for seed in range(first, first + options.seeds):
        with tempfile.TemporaryDirectory(prefix="headwater-sim-") as root:
            sim = run_seed(seed, options.steps, Path(root))
            m = sim.metrics
            print(
                f"seed {seed}: {m.steps} steps, {len(sim.client.acknowledged)} acknowledged of "
                f"{sim.client.sent} sent, {m.crashes} crashes, {m.pauses} pauses, "
                f"{m.partitions} partitions, {m.controller_faults} controller faults, "
                f"{m.diverged} diverged epochs, "
                f"{len(sim.refusals)} refused truncations: ok",
                flush=True,
            )
    sys.exit(0)


if __name__ == "__main__":
    main()
