"""The follower's truncation against a leader's OffsetForLeaderEpoch answers, run in one
process: real partitions over memory logs, the real leader-side servicer and the real
follower fetcher, joined by an in-memory transport whose answers the test can hold back
(a paused leader) and release later. Deterministic; no sockets, no clocks waited on.

Reproduces these findings of fault runs:
- an answer from a deposed leader, delivered when it woke, truncated the new leader and
  its follower below their high watermark (``test_an_answer_that_arrives_after_...``);
- replicas of equal length with different bytes: a follower with a tail of an epoch the
  leader never saw kept it where the leader holds another epoch's records (KIP-279,
  ``test_a_tail_of_an_unknown_epoch_is_cut_...``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from headwater.log import batch as batch_format
from headwater.log.api import LogConfig
from headwater.log.memory_log import MemoryLog
from headwater.node.config import NodeConfig
from headwater.node.replicas import replication
from headwater.node.replicas.follower_fetcher import LeaderFetcher
from headwater.node.replicas.follower_truncation import (
    TRUNCATION_ROUNDS_MAX,
    Cut,
    FollowerTruncation,
)
from headwater.node.replicas.following import Following
from headwater.node.replicas.partition import Partition
from headwater.node.replicas.replica_manager import ReplicaManager
from headwater.node.replicas.replica_roles import ReconcileStep
from headwater.node.replicas.replica_service import ReplicaService
from headwater.raft.metadata.image import BrokerState, MetadataImage, PartitionState
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb

TOPIC = "t"
NOW_MS = 1_700_000_000_000


class _Aborted(Exception):
    def __init__(self, details: str) -> None:
        super().__init__(details)
        self.details = details


class _Context:
    """What ``rpc_handler`` needs of a servicer context: ``abort`` ends the call."""

    async def abort(self, _code: Any, details: str, _trailing: Any = None) -> None:
        raise _Aborted(details)


class _Logs:
    def __init__(self, partitions: dict[tuple[str, int], Partition]) -> None:
        self.partitions = partitions

    def partition(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def hosted(self) -> list[Partition]:
        return list(self.partitions.values())


class _ReplicaStub:
    """The follower's view of one leader's Replica service. While ``gate`` is set, answers
    wait for it (the leader is paused); the leader computes its answer when it wakes."""

    def __init__(self, service: ReplicaService) -> None:
        self.service = service
        self.gate: asyncio.Event | None = None
        self.calls = 0
        self.fetches: list[_HeldCall] = []

    def Fetch(self) -> _HeldCall:
        self.fetches.append(_HeldCall())
        return self.fetches[-1]

    async def OffsetForLeaderEpoch(
        self, request: pb.OffsetForLeaderEpochRequest, timeout: float
    ) -> pb.OffsetForLeaderEpochResponse:
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        try:
            return await self.service.OffsetForLeaderEpoch(request, _Context())  # type: ignore[arg-type]
        except _Aborted as aborted:
            raise HeadwaterError(ErrorCode.NOT_LEADER_OR_FOLLOWER, aborted.details) from None


class _HeldCall:
    """A Fetch stream to a leader that never answers (it is paused)."""

    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, _request: Any) -> None:
        await asyncio.Event().wait()

    def cancel(self) -> None:
        self.cancelled = True


class _Peers:
    def __init__(self, stubs: dict[str, _ReplicaStub]) -> None:
        self.stubs = stubs

    def replica(self, address: str) -> _ReplicaStub:
        return self.stubs[address]


def state(leader: int, epoch: int, isr: tuple[int, ...] = (1, 2, 3)) -> PartitionState:
    return PartitionState(0, (1, 2, 3), isr, leader, epoch, epoch)


def batch(epoch: int, base_offset: int, count: int, tag: bytes) -> bytes:
    return batch_format.encode_batch(
        [tag + b"-%d" % (base_offset + i) for i in range(count)],
        timestamps_ms=NOW_MS,
        base_offset=base_offset,
        leader_epoch=epoch,
    )


def replica(node_id: int, batches: list[bytes], high_watermark: int = 0) -> Partition:
    partition = Partition(TOPIC, 0, MemoryLog(), LogConfig(max_message_bytes=1 << 20))
    partition.node_id = node_id
    for data in batches:
        partition.log.append_replicated(data, NOW_MS)
    partition.follower_high_watermark(high_watermark)
    return partition


def stored(partition: Partition) -> bytes:
    return partition.log.read(partition.log.log_start_offset, 1 << 30).data


class _State:
    """The leaders' view of the cluster: the follower registered at broker epoch 1 (the
    epoch its replica manager sends)."""

    def __init__(self, follower: int) -> None:
        broker = BrokerState(follower, "incarnation", 1, "address", "", fenced=False)
        self.image = MetadataImage(brokers={follower: broker})


class Harness:
    """Node ``me`` follows; ``leaders`` maps node ids to their replica of the partition."""

    def __init__(self, me: Partition, leaders: dict[int, Partition], may_lead: bool = True):
        self.me = me
        self.stubs = {
            f"node{n}": _ReplicaStub(
                ReplicaService(
                    NodeConfig(node_id=n),
                    _Logs({(TOPIC, 0): p}),  # type: ignore[arg-type]
                    _State(me.node_id),  # type: ignore[arg-type]
                    lambda: may_lead,
                )
            )
            for n, p in leaders.items()
        }
        self.manager = ReplicaManager(
            NodeConfig(node_id=me.node_id),
            _Logs({(TOPIC, 0): me}),  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            _Peers(self.stubs),  # type: ignore[arg-type]
            lambda: 1,
            lambda: True,
        )

    def fetcher(self, leader: int, epoch: int) -> LeaderFetcher:
        fetcher = LeaderFetcher(self.manager, leader, f"node{leader}")
        self.me.become(state(leader, epoch), self.me.node_id, NOW_MS)
        fetcher.follow(self.me, epoch)
        return fetcher


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# --------------------------------------------------------------------------- pure rule


def epochs_of(entries: list[tuple[int, int]], log_end: int) -> Callable[[int], tuple[int, int]]:
    """own_end_offset_for over ``entries`` ((epoch, start) pairs) and ``log_end``."""

    def end_for(epoch: int) -> tuple[int, int]:
        found = [i for i, (e, _start) in enumerate(entries) if e <= epoch]
        if not found:
            return -1, -1
        i = found[-1]
        end = entries[i + 1][1] if i + 1 < len(entries) else log_end
        return entries[i][0], end

    return end_for


@pytest.mark.parametrize(
    ("entries", "log_end", "hw", "answer", "expected"),
    [
        # The leader knows the follower's epoch: cut to the smaller end.
        ([(0, 0), (2, 50)], 80, 40, (2, 70), replication.TruncationStep(70, True)),
        ([(0, 0), (2, 50)], 80, 40, (2, 95), replication.TruncationStep(80, True)),
        # KIP-279: the leader answers with epoch 1, which the follower never saw: cut to
        # where the follower's own epoch below 1 ends (50), not to min(90, 80) = 80.
        ([(0, 0), (2, 50)], 80, 40, (1, 90), replication.TruncationStep(50, False)),
        # Then the follower asks about epoch 0 and the leader says it ends at 50.
        ([(0, 0)], 50, 40, (0, 50), replication.TruncationStep(50, True)),
        # The leader knows no epoch that old: keep what is committed.
        ([(3, 0)], 30, 20, (-1, -1), replication.TruncationStep(20, True)),
        # The follower has no epoch as old as the leader's answer.
        ([(4, 10)], 30, 10, (2, 25), replication.TruncationStep(25, True)),
    ],
)
def test_truncation_step_follows_kip_279(
    entries: list[tuple[int, int]],
    log_end: int,
    hw: int,
    answer: tuple[int, int],
    expected: replication.TruncationStep,
) -> None:
    step = replication.truncation_step(epochs_of(entries, log_end), log_end, hw, *answer)
    assert step == expected


# --------------------------------------------------------------------------- fetcher


def test_an_answer_that_arrives_after_the_leadership_moved_is_dropped() -> None:
    """Issue 10's loss: node 2 followed node 1 at epoch 2 and asked it where epoch 2
    ends; node 1 was paused. Node 2 became leader at epoch 3 and took writes up to its
    high watermark 120. Node 1 woke and answered "epoch 2 ends at 100" to the old
    question. Applying it truncated the new leader below its high watermark."""

    async def scenario() -> None:
        old_leader = replica(1, [batch(2, 0, 100, b"a")], high_watermark=100)
        old_leader.become(state(1, 2), 1, NOW_MS)
        me = replica(2, [batch(2, 0, 100, b"a")], high_watermark=100)
        harness = Harness(me, {1: old_leader})
        stub = harness.stubs["node1"]
        stub.gate = asyncio.Event()  # node 1 is paused
        fetcher = harness.fetcher(1, 2)
        entry = fetcher.following[(TOPIC, 0)]
        asking = asyncio.ensure_future(fetcher._truncate(entry))
        while stub.calls == 0:
            await asyncio.sleep(0)
        # The controller elects node 2 at epoch 3; it takes writes.
        me.become(state(2, 3, isr=(2, 3)), 2, NOW_MS)
        fetcher.unfollow((TOPIC, 0))
        me.append_now(batch_format.encode_batch([b"b"] * 20, timestamps_ms=NOW_MS), NOW_MS)
        me.on_follower_fetch(3, 120, NOW_MS)
        assert me.high_watermark == 120
        stub.gate.set()  # node 1 wakes and answers the old question
        with pytest.raises(HeadwaterError) as raised:
            await asyncio.wait_for(asking, 5)
        assert raised.value.code is ErrorCode.FENCED_LEADER_EPOCH
        assert me.log.log_end_offset == 120
        assert me.high_watermark == 120

    run(scenario())


def test_a_deposed_leader_answers_with_a_fencing_error() -> None:
    """A node that may not lead (starting, fenced, lease run out) answers replica
    requests with NOT_LEADER_OR_FOLLOWER, never with an epoch end offset."""

    async def scenario() -> None:
        leader = replica(1, [batch(2, 0, 10, b"a")], high_watermark=10)
        leader.become(state(1, 2), 1, NOW_MS)
        me = replica(2, [batch(2, 0, 10, b"a")], high_watermark=5)
        harness = Harness(me, {1: leader}, may_lead=False)
        fetcher = harness.fetcher(1, 2)
        with pytest.raises(HeadwaterError) as raised:
            await fetcher._truncate(fetcher.following[(TOPIC, 0)])
        assert raised.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert "may not act as a leader" in raised.value.message
        assert me.log.log_end_offset == 10

    run(scenario())


def test_a_tail_of_an_unknown_epoch_is_cut_where_the_leader_differs() -> None:
    """Replicas of equal length, different bytes: node 2 led at epoch 2 and wrote 50..80
    that nobody replicated; node 1 then led at epoch 1 (elected by an older view) ...
    concretely, the leader's log is epoch 0 to 50, then epoch 1 to 90, then epoch 3; the
    follower's is epoch 0 to 50, then epoch 2 to 80. Kafka's KIP-101 rule cut to
    min(90, 80) = 80 and kept the follower's epoch-2 records where the leader has
    epoch-1 records."""

    async def scenario() -> None:
        leader = replica(
            1,
            [batch(0, 0, 50, b"a"), batch(1, 50, 40, b"b"), batch(3, 90, 10, b"c")],
            high_watermark=50,
        )
        leader.become(state(1, 3), 1, NOW_MS)
        me = replica(2, [batch(0, 0, 50, b"a"), batch(2, 50, 30, b"x")], high_watermark=50)
        harness = Harness(me, {1: leader})
        fetcher = harness.fetcher(1, 3)
        await fetcher._truncate(fetcher.following[(TOPIC, 0)])
        assert me.log.log_end_offset == 50
        assert harness.stubs["node1"].calls == 2  # epoch 2, then epoch 0
        # Now catch up and compare byte for byte.
        me.append_replicated(leader.log.read(50, 1 << 30).data, NOW_MS)
        assert stored(me) == stored(leader)

    run(scenario())


def test_a_follower_never_truncates_below_its_high_watermark() -> None:
    """An answer that would cut committed records (a leader missing them) is refused
    and nothing is cut; with unclean leader election allowed, it is taken, and the high
    watermark comes down with the log end (never above it: ``broken_promises``)."""

    async def scenario(unclean: bool) -> tuple[int, int, list[str]]:
        leader = replica(1, [batch(4, 0, 30, b"a")], high_watermark=30)
        leader.become(state(1, 4), 1, NOW_MS)
        me = replica(2, [batch(4, 0, 30, b"a"), batch(4, 30, 30, b"a")], high_watermark=60)
        me.unclean_leader_election = unclean
        harness = Harness(me, {1: leader})
        fetcher = harness.fetcher(1, 4)
        if unclean:
            await fetcher._truncate(fetcher.following[(TOPIC, 0)])
        else:
            with pytest.raises(HeadwaterError) as raised:
                await fetcher._truncate(fetcher.following[(TOPIC, 0)])
            assert raised.value.code is ErrorCode.KAFKA_STORAGE_ERROR
            assert "below this replica's high watermark 60" in raised.value.message
        return me.log.log_end_offset, me.high_watermark, me.broken_promises()

    assert run(scenario(unclean=False)) == (60, 60, [])
    assert run(scenario(unclean=True)) == (30, 30, [])


def test_a_joining_follower_holds_the_high_watermark_while_its_isr_change_is_in_flight() -> None:
    """Kafka's maximal ISR: from the moment the leader asks to add a follower, the high
    watermark waits for it, so it never joins the ISR without the committed records."""
    leader = replica(1, [batch(1, 0, 10, b"a")])
    leader.become(state(1, 1, isr=(1,)), 1, NOW_MS)
    assert leader.high_watermark == 10
    leader.on_follower_fetch(2, 10, NOW_MS)  # caught up: the leader asks to add it
    leader.expect_isr((1, 2))
    leader.append_now(batch_format.encode_batch([b"b"] * 5, timestamps_ms=NOW_MS), NOW_MS)
    assert leader.high_watermark == 10  # waits for node 2, joining
    leader.on_follower_fetch(2, 15, NOW_MS)
    assert leader.high_watermark == 15
    leader.expect_isr(None)  # refused: node 2 no longer counts
    leader.append_now(batch_format.encode_batch([b"c"] * 5, timestamps_ms=NOW_MS), NOW_MS)
    assert leader.high_watermark == 20


def test_a_restarted_node_does_not_take_a_leadership_it_may_not_hold() -> None:
    """``become`` with may_lead False (starting, fenced): the metadata names this node
    leader, but the replica takes no leader role and serves nothing as leader."""
    partition = replica(1, [batch(0, 0, 5, b"a")], high_watermark=5)
    partition.become(state(1, 0), 1, NOW_MS, may_lead=False)
    assert not partition.is_leader
    partition.become(state(1, 7), 1, NOW_MS, may_lead=True)
    assert partition.is_leader
    assert partition.leader_epoch == 7


# -------------------------------------------------- the controller's answer is taken


def _state(isr: tuple[int, ...], partition_epoch: int, leader_epoch: int = 3) -> PartitionState:
    return PartitionState(0, (1, 2, 3), isr, 1, leader_epoch, partition_epoch)


def test_a_leader_takes_the_committed_isr_and_an_older_image_does_not_take_it_back() -> None:
    leader = replica(1, [])
    leader.become(_state((1, 3), 7), 1, 0)
    leader.check_min_insync()
    leader.min_insync_replicas = 3
    with pytest.raises(HeadwaterError):
        leader.check_min_insync()
    # The answer to its AlterPartition: follower 2 is back, at partition epoch 8.
    assert leader.take_committed_state(_state((1, 3, 2), 8))
    assert leader.isr == (1, 3, 2)
    leader.check_min_insync()
    # The node's image, still at partition epoch 7, arrives later: the ISR stays.
    leader.become(_state((1, 3), 7), 1, 0)
    assert leader.isr == (1, 3, 2) and leader.is_leader
    # ... but a role change in it still counts: without the lease it steps down.
    leader.become(_state((1, 3), 7), 1, 0, may_lead=False)
    assert not leader.is_leader and leader.isr == (1, 3, 2)
    # Older answers, or those of another leadership, are not taken.
    leader.become(_state((1, 3, 2), 8), 1, 0)
    assert not leader.take_committed_state(_state((1,), 7))
    assert not leader.take_committed_state(_state((1,), 9, leader_epoch=4))
    assert leader.isr == (1, 3, 2)
    # A newer image moves on as always.
    leader.become(_state((1, 2), 9), 1, 0)
    assert leader.isr == (1, 2)


def test_a_follower_never_takes_a_committed_state() -> None:
    follower = replica(2, [])
    follower.become(_state((1, 2, 3), 5), 2, 0)
    assert not follower.take_committed_state(_state((1, 2), 6))
    assert follower.isr == (1, 2, 3)


def test_a_joining_follower_holds_the_high_watermark_until_a_newer_state_is_taken() -> None:
    """A follower being proposed for the ISR counts towards the high watermark until the
    controller has decided. An answer at the partition epoch the request was made at
    does not end that (a copy of the request could still commit and add the follower);
    the controller's answer to a decided request is always newer, and ends it, also when
    it left the follower out (not live), so a dead broker does not hold it for long."""
    leader = replica(1, [])
    leader.become(_state((1, 3), 7), 1, 0)
    leader.expect_isr((1, 3, 2))
    assert leader.maximal_isr == (1, 3, 2)
    assert not leader.take_committed_state(_state((1, 3), 7))
    assert leader.maximal_isr == (1, 3, 2)
    assert leader.take_committed_state(_state((1, 3), 8))  # left out, at a new epoch
    assert leader.maximal_isr == (1, 3) and leader.isr == (1, 3)


# --------------------------------------------------------------------------- stopping


def test_a_metadata_change_while_the_replica_manager_stops_starts_no_fetcher() -> None:
    """A node stopping under a leadership change: the replica manager is stopping its
    fetchers (each stop waits for a task to end) when a new image makes a third node a
    leader. The reconcile starts nothing and every fetcher has ended when the stop
    returns (a stop that walked the fetchers while the reconcile added one failed with
    "dictionary changed size during iteration", and the node exited 1 on SIGTERM)."""

    def leader_image(*leaders: int) -> MetadataImage:
        return MetadataImage(
            brokers={
                n: BrokerState(n, "i", 1, f"node{n}", "", fenced=False, internal_address=f"node{n}")
                for n in leaders
            }
        )

    def hosted(index: int) -> Partition:
        partition = Partition(TOPIC, index, MemoryLog(), LogConfig(max_message_bytes=1 << 20))
        partition.node_id = 2
        return partition

    async def scenario() -> None:
        leaders = {n: replica(n, []) for n in (1, 3, 4)}
        harness = Harness(hosted(0), leaders)
        manager = harness.manager
        partitions = [hosted(0), hosted(1)]
        step = ReconcileStep(2)
        await manager.reconcile(
            leader_image(1, 3),
            [
                (partitions[0], step.role(state(1, 1), -1, True)),
                (partitions[1], step.role(state(3, 1), -1, True)),
            ],
        )
        started = list(manager._fetchers.values())
        assert len(started) == 2
        stopping = asyncio.ensure_future(manager.stop())
        await asyncio.sleep(0)  # the stop is waiting for the first fetcher to end
        assert not stopping.done()
        await manager.reconcile(
            leader_image(1, 3, 4), [(partitions[1], step.role(state(4, 2), -1, True))]
        )
        await asyncio.wait_for(stopping, 5)
        assert manager._fetchers == {}
        assert all(f.task is not None and f.task.done() for f in started)
        assert harness.stubs["node4"].fetches == []
        assert all(call.cancelled for n in (1, 3) for call in harness.stubs[f"node{n}"].fetches)

    run(scenario())


# ------------------------------------------------------ the exchange, without transport


def test_the_exchange_asks_older_epochs_until_the_logs_agree() -> None:
    """KIP-279 in two rounds on the step object both the node and the simulator drive:
    epoch 2's tail the leader never saw is cut, then epoch 0 is agreed."""
    me = replica(2, [batch(0, 0, 5, b"a"), batch(2, 5, 3, b"b")], high_watermark=5)
    me.become(state(1, 3), 2, NOW_MS)
    truncation = FollowerTruncation(me, 1, 3)
    assert truncation.question() == 2
    first = truncation.answer(1, 9, 0, NOW_MS)  # the leader knows epoch 1, not 2
    assert first == Cut(done=False, before=8, after=5)
    assert truncation.question() == 0
    assert truncation.answer(0, 5, 0, NOW_MS) == Cut(done=True, before=5, after=5)


def test_an_answer_about_a_newer_epoch_than_asked_cuts_nothing() -> None:
    me = replica(2, [batch(0, 0, 5, b"a"), batch(2, 5, 3, b"b")])
    me.become(state(1, 3), 2, NOW_MS)
    truncation = FollowerTruncation(me, 1, 3)
    truncation.question()
    with pytest.raises(HeadwaterError, match="answered epoch 3 to a question about epoch 2"):
        truncation.answer(3, 0, 0, NOW_MS)
    assert me.log.log_end_offset == 8


def test_an_answer_from_a_deposed_leader_cuts_nothing() -> None:
    me = replica(2, [batch(0, 0, 5, b"a"), batch(2, 5, 3, b"b")])
    me.become(state(1, 3), 2, NOW_MS)
    truncation = FollowerTruncation(me, 1, 3)
    truncation.question()
    me.become(state(3, 4), 2, NOW_MS)  # leadership moved while the question was out
    with pytest.raises(HeadwaterError) as refused:
        truncation.answer(-1, -1, 0, NOW_MS)
    assert refused.value.code is ErrorCode.FENCED_LEADER_EPOCH
    assert me.log.log_end_offset == 8


def test_rounds_are_bounded_and_an_empty_log_moves_to_the_leaders_start() -> None:
    empty = replica(2, [])
    empty.become(state(1, 3), 2, NOW_MS)
    truncation = FollowerTruncation(empty, 1, 3)
    assert truncation.question() == -1
    assert truncation.answer(-1, -1, 40, NOW_MS).done
    assert empty.log.log_start_offset == empty.log.log_end_offset == 40
    endless = FollowerTruncation(empty, 1, 3)
    for _ in range(TRUNCATION_ROUNDS_MAX):
        endless.question()
    with pytest.raises(HeadwaterError, match=f"after {TRUNCATION_ROUNDS_MAX} rounds"):
        endless.question()


# ------------------------------------------------- the follower's steps, without transport


def test_a_follower_fetches_only_once_truncated_and_appends_what_arrives() -> None:
    """``Following``, as the node's fetcher and the simulator drive it: truncation, then
    fetches from the log end whose records are appended and whose high watermark is
    taken."""
    me = replica(2, [batch(0, 0, 5, b"a")], high_watermark=5)
    me.become(state(1, 3), 2, NOW_MS)
    steps = Following(me, 1, 3)
    assert not steps.fetch_answered(failed=False)  # not truncated yet: dropped
    assert steps.question() == 0
    assert steps.answer(0, 5, 0, NOW_MS).done and steps.ready
    assert steps.fetch_offset == 5
    assert steps.fetch_answered(failed=False)
    me.append_replicated(batch(3, 5, 2, b"c"), NOW_MS)
    steps.appended(high_watermark=7)
    assert (steps.fetch_offset, me.high_watermark) == (7, 7)


def test_a_failed_fetch_sends_the_follower_back_to_truncation() -> None:
    me = replica(2, [batch(0, 0, 5, b"a")], high_watermark=5)
    me.become(state(1, 3), 2, NOW_MS)
    steps = Following(me, 1, 3)
    steps.question()
    steps.answer(0, 5, 0, NOW_MS)
    assert not steps.fetch_answered(failed=True)
    assert not steps.ready and steps.question() == 0


def test_a_fetch_answer_after_the_leadership_moved_is_dropped() -> None:
    me = replica(2, [batch(0, 0, 5, b"a")], high_watermark=5)
    me.become(state(1, 3), 2, NOW_MS)
    steps = Following(me, 1, 3)
    steps.question()
    steps.answer(0, 5, 0, NOW_MS)
    me.become(state(3, 4), 2, NOW_MS)  # a new leader while the fetch was out
    assert not steps.fetch_answered(failed=False)
    assert steps.ready  # the fetcher that follows the new leader truncates on its own


def test_a_refused_answer_starts_the_exchange_over() -> None:
    me = replica(2, [batch(0, 0, 5, b"a"), batch(2, 5, 3, b"b")])
    me.become(state(1, 3), 2, NOW_MS)
    steps = Following(me, 1, 3)
    steps.question()
    with pytest.raises(HeadwaterError, match="answered epoch 3"):
        steps.answer(3, 0, 0, NOW_MS)
    with pytest.raises(HeadwaterError, match="an answer to no question"):
        steps.answer(2, 8, 0, NOW_MS)
    assert steps.question() == 2 and not steps.ready
