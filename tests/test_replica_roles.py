"""What the image asks of a node's replicas (``headwater.node.replicas.replica_roles``) and what a
leader checks before answering a replica (``headwater.node.replicas.replica_checks``): the rules the
node and the simulated cluster both run, on real partitions over memory logs."""

from __future__ import annotations

import pytest

from headwater.log.api import LogConfig
from headwater.log.memory_log import MemoryLog
from headwater.node.replicas.partition import Partition
from headwater.node.replicas.replica_checks import (
    fetch_position_error,
    leader_partition,
    stale_registration,
)
from headwater.node.replicas.replica_roles import (
    ReconcileStep,
    apply_topic_configs,
    assigned_replicas,
    leader_to_follow,
    take_role,
)
from headwater.raft.metadata.decisions import UNCLEAN_ELECTION_KEY
from headwater.raft.metadata.image import BrokerState, MetadataImage, PartitionState, TopicImage
from headwater.shared.errors import ErrorCode, HeadwaterError

NOW_MS = 1_700_000_000_000


def state(leader: int, epoch: int = 3, replicas: tuple[int, ...] = (1, 2, 3)) -> PartitionState:
    return PartitionState(0, replicas, replicas, leader, epoch, partition_epoch=epoch)


def partition() -> Partition:
    return Partition("t", 0, MemoryLog(), LogConfig(max_message_bytes=1 << 20))


def test_a_node_hosts_exactly_the_partitions_listing_it_as_a_replica() -> None:
    states = (
        PartitionState(0, (1, 2), (1, 2), 1, 1, 1),
        PartitionState(1, (2, 3), (2, 3), 2, 1, 1),
        PartitionState(2, (3, 1), (3,), 3, 1, 1),
    )
    image = MetadataImage(topics={"t": TopicImage("t", "id-t", {}, states)})
    assert sorted(assigned_replicas(image, 1)) == [("t", 0), ("t", 2)]
    assert sorted(assigned_replicas(image, 2)) == [("t", 0), ("t", 1)]
    assert assigned_replicas(image, 4) == {}
    topic, placed = assigned_replicas(image, 3)[("t", 2)]
    assert (topic.topic_id, placed) == ("id-t", states[2])


def test_topic_settings_override_the_nodes_default() -> None:
    replica = partition()
    apply_topic_configs(replica, {}, min_insync_default=2)
    assert (replica.min_insync_replicas, replica.unclean_leader_election) == (2, False)
    apply_topic_configs(replica, {"min_insync_replicas": "3", UNCLEAN_ELECTION_KEY: "true"}, 2)
    assert (replica.min_insync_replicas, replica.unclean_leader_election) == (3, True)
    apply_topic_configs(replica, {UNCLEAN_ELECTION_KEY: "yes"}, 1)  # only "true" turns it on
    assert (replica.min_insync_replicas, replica.unclean_leader_election) == (1, False)


@pytest.mark.parametrize(
    ("leader", "epoch", "may_lead", "recorded"),
    [
        (1, 5, True, 5),  # a new leadership of this node: recorded before the role
        (1, 5, False, 2),  # starting, fenced or lease gone: no role, no epoch
        (2, 5, True, 2),  # another node leads: its epoch comes with its batches
        (1, 2, True, 2),  # not newer than the log's latest: nothing to record
    ],
)
def test_a_leadership_epoch_is_recorded_only_when_the_node_takes_it(
    leader: int, epoch: int, may_lead: bool, recorded: int
) -> None:
    replica = partition()
    replica.log.assign_epoch(2)
    role = ReconcileStep(1).role(state(leader, epoch), replica.log.latest_epoch, may_lead)
    take_role(replica, {}, role, min_insync_default=1)
    assert replica.log.latest_epoch == recorded
    assert role.may_lead is may_lead


def test_a_replica_follows_the_images_leader_unless_it_is_it_or_there_is_none() -> None:
    assert leader_to_follow(state(leader=2), node_id=1) == 2
    assert leader_to_follow(state(leader=1), node_id=1) is None
    assert leader_to_follow(state(leader=-1), node_id=1) is None


def test_a_fetch_counts_only_from_the_replicas_current_registration() -> None:
    broker = BrokerState(2, "incarnation", 7, "127.0.0.1:7700", "", fenced=False)
    image = MetadataImage(brokers={2: broker})
    assert stale_registration(image, 2, 7) is None
    for replica_id, broker_epoch in ((2, 6), (3, 7)):
        refused = stale_registration(image, replica_id, broker_epoch)
        assert refused is not None and refused.code is ErrorCode.STALE_BROKER_EPOCH


def test_a_replica_may_fetch_only_from_the_leader_at_its_exact_epoch() -> None:
    leader = partition()
    leader.become(state(leader=1, epoch=3), node_id=1, now_ms=NOW_MS)
    assert leader_partition(leader, "t", 0, 3, 2, node_id=1, may_lead=True) is leader

    def refusal(
        candidate: Partition | None, epoch: int, replica_id: int = 2, may_lead: bool = True
    ) -> ErrorCode:
        with pytest.raises(HeadwaterError) as refused:
            leader_partition(candidate, "t", 0, epoch, replica_id, node_id=1, may_lead=may_lead)
        return refused.value.code

    assert refusal(leader, 3, may_lead=False) is ErrorCode.NOT_LEADER_OR_FOLLOWER

    assert refusal(None, 3) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert refusal(leader, 2) is ErrorCode.FENCED_LEADER_EPOCH
    assert refusal(leader, 4) is ErrorCode.UNKNOWN_LEADER_EPOCH
    assert refusal(leader, 3, replica_id=9) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    follower = partition()
    follower.become(state(leader=2, epoch=3), node_id=1, now_ms=NOW_MS)
    assert refusal(follower, 3) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    not_allowed = partition()
    not_allowed.become(state(leader=1, epoch=3), node_id=1, now_ms=NOW_MS, may_lead=False)
    assert refusal(not_allowed, 3) is ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_a_fetch_position_past_the_leaders_end_is_refused() -> None:
    leader = partition()
    leader.become(state(leader=1), node_id=1, now_ms=NOW_MS)
    assert leader.log.log_end_offset == 0
    assert fetch_position_error(leader, 0) is None
    past = fetch_position_error(leader, 1)
    assert past is not None and past.code is ErrorCode.OFFSET_OUT_OF_RANGE
    assert "past the leader's log end offset 0" in past.message


def test_the_reconcile_step_removes_what_the_image_moved_and_names_whom_to_follow() -> None:
    """``ReconcileStep.hosting``: a replica the image no longer places here, or of a topic
    created again under the same name (another id), is removed; ``role``: a follower
    fetches from the image's leader."""
    states = (
        PartitionState(0, (1, 2), (1, 2), 2, 1, 1),
        PartitionState(1, (2, 3), (2, 3), 3, 1, 1),
    )
    image = MetadataImage(topics={"t": TopicImage("t", "id-2", {}, states)})
    step = ReconcileStep(1)
    hosting = step.hosting(image, {("t", 0): "id-1", ("t", 1): "id-2", ("u", 0): "id-9"})
    assert sorted(hosting.remove) == [("t", 0), ("t", 1), ("u", 0)]
    assert list(hosting.assigned) == [("t", 0)]
    assert step.role(state(2), latest_epoch=0, may_lead=True).follow == 2
    assert step.role(state(1), latest_epoch=0, may_lead=True).follow is None
