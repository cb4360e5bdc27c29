"""The simulated cluster (tests/sim_cluster.py): seeded random faults on a virtual clock,
checked for one leader per epoch, replicas that agree below the high watermark, and no
acknowledged acks=all record lost. A failure names its seed: ``python -m
tests.sim_cluster --seed N --seeds 1 --steps S`` replays it exactly."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headwater.node.cluster.broker_liveness import BrokerLiveness
from headwater.node.core.broker_core import BrokerCore
from headwater.node.replicas import replication
from headwater.node.replicas.fetch_session import FetchSession
from headwater.node.replicas.partition import Partition
from headwater.node.replicas.replica_roles import ReconcileStep, ReplicaRole
from headwater.raft.metadata.image import PartitionState
from tests import sim_cluster
from tests.sim_cluster import TOPIC, InvariantError, Simulation, run_seed

SEEDS = range(1, 9)
STEPS = 1500  # 15 s of random faults, a fault or repair every second, after the schedule


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed={s}")
def test_seeded_random_faults_keep_every_promise(seed: int, tmp_path: Path) -> None:
    sim = run_seed(seed, STEPS, tmp_path)
    assert sim.client.acknowledged, f"seed {seed}: nothing was acknowledged"
    assert sim.metrics.crashes + sim.metrics.pauses + sim.metrics.partitions > 0
    assert sim.metrics.diverged == 1, f"seed {seed}: the diverging-epochs schedule did not run"


def test_a_run_is_replayed_exactly_from_its_seed(tmp_path: Path) -> None:
    first = run_seed(5, 1500, tmp_path / "a")
    second = run_seed(5, 1500, tmp_path / "b")
    assert first.client.acknowledged == second.client.acknowledged
    assert first.metrics == second.metrics
    for index in range(2):
        logs = [
            [sim_cluster.stored_below(p.log, p.log.log_end_offset) for _, p in s.replicas(index)]
            for s in (first, second)
        ]
        assert logs[0] == logs[1]


def test_the_checker_catches_an_acknowledgement_before_replication(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks can fail, on the node's own produce path: a broker core that answers
    acks=all as soon as the leader has appended (as for acks=1, not once the high
    watermark passes the batch) loses acknowledged records under these faults, and the
    final check says which."""
    append = BrokerCore.append

    async def acknowledge_on_append(
        self: BrokerCore, partition: Partition, batch: Any, *, acks_all: bool, **rest: Any
    ) -> Any:
        return await append(self, partition, batch, acks_all=False, **rest)

    monkeypatch.setattr(BrokerCore, "append", acknowledge_on_append)
    caught = []
    for seed in SEEDS:
        try:
            run_seed(seed, 2 * STEPS, tmp_path / str(seed), diverge=False)
        except InvariantError as lost:
            caught.append(str(lost))
    # Not every fault schedule happens to crash a leader with an unreplicated tail; most do.
    assert len(caught) >= len(SEEDS) // 2, caught
    assert all("is lost" in message for message in caught), caught


def test_the_search_catches_truncation_to_the_leaders_end_of_an_epoch_never_had(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks can fail on the truncation rule itself: with KIP-101's rule as it was
    before KIP-279 (a follower answered with an epoch it never had cuts to where that
    epoch ends in the leader's log, keeping its own tail of a newer epoch at offsets the
    leader filled differently), each seed's diverging-epochs schedule leaves replicas
    that differ below the high watermark, and the check says so (``make sim`` runs the
    schedule on every seed)."""

    def before_kip_279(
        own_end_offset_for: Callable[[int], tuple[int, int]],
        log_end_offset: int,
        high_watermark: int,
        leader_epoch: int,
        leader_end_offset: int,
    ) -> replication.TruncationStep:
        if leader_end_offset < 0 or leader_epoch < 0:
            return replication.TruncationStep(min(high_watermark, log_end_offset), True)
        own_epoch, own_end = own_end_offset_for(leader_epoch)
        if own_epoch != leader_epoch:
            return replication.TruncationStep(min(leader_end_offset, log_end_offset), True)
        return replication.TruncationStep(min(own_end, leader_end_offset, log_end_offset), True)

    monkeypatch.setattr(replication, "truncation_step", before_kip_279)
    for seed in SEEDS[:3]:
        with pytest.raises(InvariantError, match="differs between nodes"):
            run_seed(seed, STEPS, tmp_path / str(seed))


def test_a_paused_leader_is_replaced_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    """The finding behind the leadership lease: a leader paused while clients write, long
    enough to be fenced and replaced, wakes with requests in its inbox and an image that
    still names it leader. It must acknowledge none of them as committed."""
    sim = Simulation(11, root=tmp_path)
    sim.run(300, fault_every=0)
    before = sim.controller.image.topics[TOPIC].partitions[0]
    sim.pause(before.leader)
    sim.run(800, fault_every=0)  # 8 s: past the session timeout
    after = sim.controller.image.topics[TOPIC].partitions[0]
    assert after.leader != before.leader and after.leader_epoch > before.leader_epoch
    acknowledged = len(sim.client.acknowledged)
    sim.resume(before.leader)
    sim.run(500, fault_every=0)
    assert len(sim.client.acknowledged) > acknowledged  # writes went on
    sim.settle()
    sim.check_final()
    old = sim.brokers[before.leader]
    assert old is not None
    replica = old.partitions[(TOPIC, 0)]
    assert not replica.is_leader and replica.leader_epoch >= after.leader_epoch


# Scripted scenarios: the failover, fencing, ISR and truncation cases that real-process
# tests (marked slow) also run, here on the virtual clock, checked after every step.


def _state(sim: Simulation, index: int = 0) -> Any:
    return sim.controller.image.topics[TOPIC].partitions[index]


def _replica(sim: Simulation, node_id: int, index: int = 0) -> Partition:
    broker = sim.brokers[node_id]
    assert broker is not None
    return broker.partitions[(TOPIC, index)]


def _run_until(sim: Simulation, condition: Callable[[], bool], steps: int, what: str) -> None:
    for _ in range(steps):
        if condition():
            return
        sim.step()
    raise AssertionError(f"seed {sim.seed}: {what} within {steps * sim_cluster.STEP_MS} ms")


def test_a_deposed_leader_truncates_its_unreplicated_tail(tmp_path: Path) -> None:
    """The leader is cut off from its followers but not from the client: it appends
    records only it has (never acknowledged). Then it loses the controller and the client
    too, and the followers elect one of them. When the links heal, the old leader
    truncates that tail and ends byte-identical to the new leader."""
    sim = Simulation(21, partitions=1, root=tmp_path)
    sim.run(300, fault_every=0)
    old = _state(sim).leader
    followers = [n for n in _state(sim).replicas if n != old]
    start = _replica(sim, old).log.log_end_offset
    sim.isolate(old, followers)
    sim.run(40, fault_every=0)
    tail = sim_cluster.values_of(_replica(sim, old).log)[start:]
    assert tail, "the leader took no records while cut off from its followers"
    sim.isolate(old, [sim_cluster.CONTROLLER, sim_cluster.CLIENT])
    _run_until(sim, lambda: _state(sim).leader in followers, 1500, "a follower took over")
    sim.run(200, fault_every=0)
    sim.settle()
    sim.check_final()
    new_log = sim_cluster.values_of(_replica(sim, _state(sim).leader).log)
    assert sim_cluster.values_of(_replica(sim, old).log) == new_log
    assert not set(tail) & set(new_log), "the unreplicated tail survived"
    assert not set(tail) & set(sim.client.acknowledged), "a record only one replica had was acked"


def test_a_follower_fenced_while_it_kept_up_rejoins_once_unfenced(tmp_path: Path) -> None:
    """A follower loses the controller but not the leader: its registration is fenced
    and it leaves the ISR although it kept fetching; once it reaches the controller
    again it is unfenced and the leader takes it back into the ISR."""
    sim = Simulation(22, partitions=1, root=tmp_path)
    sim.run(300, fault_every=0)
    leader = _state(sim).leader
    follower = next(n for n in _state(sim).replicas if n != leader)
    sim.isolate(follower, [sim_cluster.CONTROLLER])

    def fenced_and_out() -> bool:
        broker = sim.controller.image.brokers[follower]
        return broker.fenced and follower not in _state(sim).isr

    _run_until(sim, fenced_and_out, 3000, "the follower was fenced and left the ISR")
    kept_up = _replica(sim, follower).log.log_end_offset
    assert kept_up > 0
    sim.network.cut.clear()
    _run_until(sim, lambda: follower in _state(sim).isr, 3000, "the follower rejoined the ISR")
    assert not sim.controller.image.brokers[follower].fenced
    sim.settle()
    sim.check_final()


def test_acks_all_loses_nothing_while_leaders_are_killed(tmp_path: Path) -> None:
    """The leader is killed three times while the client writes with acks=all, and
    restarted each time: every acknowledged record stays where it was acknowledged."""
    sim = Simulation(23, partitions=1, root=tmp_path)
    sim.run(300, fault_every=0)
    acknowledged = []
    for _ in range(3):
        leader = _state(sim).leader
        epoch = _state(sim).leader_epoch
        sim.crash(leader)
        _run_until(sim, lambda e=epoch: _state(sim).leader_epoch > e, 1500, "a new leader")
        sim.run(200, fault_every=0)
        sim.restart(leader)
        sim.run(300, fault_every=0)
        acknowledged.append(len(sim.client.acknowledged))
    assert acknowledged == sorted(acknowledged) and acknowledged[0] < acknowledged[-1]
    sim.settle()
    sim.check_final()


def _restart_a_leader_into_an_old_image(sim: Simulation) -> None:
    """A leader is killed and its partitions move on to higher epochs; restarted, it
    replays metadata in which it still leads them. At no step may it act as leader at an
    epoch the controller has moved past (AssertionError if it does)."""
    sim.run(300, fault_every=0)
    node = _state(sim).leader
    led = [s.partition for s in sim.controller.image.topics[TOPIC].partitions if s.leader == node]
    sim.crash(node)
    _run_until(
        sim,
        lambda: all(_state(sim, i).leader != node for i in led),
        1500,
        "its partitions moved to other leaders",
    )
    sim.run(200, fault_every=0)
    sim.restart(node)
    for _ in range(1500):
        sim.step()
        broker = sim.brokers[node]
        assert broker is not None
        for (_topic, index), replica in broker.partitions.items():
            if replica.is_leader:
                current = _state(sim, index).leader_epoch
                assert replica.leader_epoch == current, (
                    f"node {node} leads {TOPIC}-{index} at epoch {replica.leader_epoch}, "
                    f"the controller is at {current}"
                )


def test_a_restarted_node_never_takes_a_leadership_from_an_old_image(tmp_path: Path) -> None:
    sim = Simulation(24, partitions=4, root=tmp_path)
    _restart_a_leader_into_an_old_image(sim)
    sim.settle()
    sim.check_final()


def test_the_search_catches_a_reconcile_step_that_follows_another_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconcile step that has followers fetch from a replica other than the leader:
    nothing reaches the followers, acks=all writes are never acknowledged, and every seed
    fails to settle."""
    role = ReconcileStep.role

    def following_another(
        self: ReconcileStep, state: PartitionState, latest_epoch: int, may_lead: bool
    ) -> ReplicaRole:
        taken = role(self, state, latest_epoch, may_lead)
        others = [r for r in state.replicas if r not in (self.node_id, state.leader)]
        wrong = others[0] if taken.follow is not None and others else taken.follow
        return dataclasses.replace(taken, follow=wrong)

    monkeypatch.setattr(ReconcileStep, "role", following_another)
    for seed in SEEDS[:2]:
        with pytest.raises(InvariantError, match="did not settle"):
            run_seed(seed, STEPS, tmp_path / str(seed), diverge=False)


def _idle_follower_rejoins(tmp_path: Path) -> None:
    sim = Simulation(31, partitions=1, root=tmp_path)
    sim.run(300, fault_every=0)
    sim.settle()
    leader = _state(sim).leader
    follower = next(n for n in _state(sim).replicas if n != leader)
    sim.isolate(follower, [sim_cluster.CONTROLLER])

    def fenced_and_out() -> bool:
        return follower not in _state(sim).isr

    _run_until(sim, fenced_and_out, 3000, "the follower was fenced and left the ISR")
    for _ in range(2 * sim_cluster.CONFIG.replica_lag_ms_max // sim_cluster.STEP_MS):
        sim.step(with_client=False)
    assert _replica(sim, follower).log.log_end_offset == _replica(sim, leader).log.log_end_offset
    sim.network.cut.clear()
    for _ in range(300):
        if follower in _state(sim).isr:
            return
        sim.step(with_client=False)
    raise AssertionError(
        f"seed {sim.seed}: node {follower}, caught up and fetching, stayed out of the ISR "
        f"for 3 s after it was unfenced"
    )


def test_an_idle_follower_rejoins_the_isr_once_unfenced(tmp_path: Path) -> None:
    """A follower fenced while it kept up, then idle (nothing produced) for twice
    ``replica_lag_ms_max``: it keeps fetching but reports no moved position; the leader's
    fetch session counts it as fetching at its last position, so once unfenced it is taken
    back into the ISR at once."""
    _idle_follower_rejoins(tmp_path)


def test_the_search_catches_a_fetch_session_that_forgets_silent_followers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run with the fetch session's refresh taken out: the idle follower's last
    fetch ages past ``replica_lag_ms_max`` and the leader never proposes it again."""
    monkeypatch.setattr(FetchSession, "_refresh", lambda *_args: None)
    with pytest.raises(AssertionError, match="stayed out of the ISR"):
        _idle_follower_rejoins(tmp_path)


def _controller_fault_fences_nobody(tmp_path: Path, fault: str) -> None:
    sim = Simulation(41, partitions=2, root=tmp_path)
    sim.run(300, fault_every=0)
    sim.settle()
    fenced_before = _fences(sim)
    if fault == "pause":
        sim.controller.paused = True
        for _ in range(2 * sim_cluster.CONFIG.broker_session_timeout_ms // sim_cluster.STEP_MS):
            sim.step()
        sim.resume_controller()
    else:
        sim.controller.fail_over()
    for _ in range(2 * sim_cluster.CONFIG.broker_session_timeout_ms // sim_cluster.STEP_MS):
        sim.step()
    fenced = _fences(sim) - fenced_before
    assert fenced == 0, (
        f"seed {sim.seed}: the controller fenced {fenced} live broker(s) after a {fault}"
    )
    sim.settle()
    sim.check_final()


def _fences(sim: Simulation) -> int:
    return sum(
        isinstance(record, sim_cluster.r.FenceBroker)
        for records in sim.controller.log
        for record in records
    )


@pytest.mark.parametrize("fault", ["pause", "failover"])
def test_a_controller_that_pauses_or_is_replaced_fences_no_live_broker(
    fault: str, tmp_path: Path
) -> None:
    """A controller paused for twice a session, or replaced by a new one that knows
    nothing of the brokers' sessions: the brokers kept heartbeating (or had no controller
    to heartbeat), so none is fenced; the controller's broker sessions
    (``BrokerLiveness``) start over after its own silence and at a new term."""
    _controller_fault_fences_nobody(tmp_path, fault)


def test_the_search_catches_broker_sessions_that_blame_the_brokers_for_a_controllers_silence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same runs with sessions that never start over: the woken controller and the
    new one fence every broker."""

    def never_start_over(self: BrokerLiveness, _image: Any, term: int, *_rest: Any) -> bool:
        first, self._term = term != self._term, term
        return first

    monkeypatch.setattr(BrokerLiveness, "leading", never_start_over)
    for fault in ("pause", "failover"):
        with pytest.raises(AssertionError, match="fenced"):
            _controller_fault_fences_nobody(tmp_path / fault, fault)
