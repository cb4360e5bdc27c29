"""What the metadata image asks of this node's replicas, decided without I/O.

A broker reconciles its replicas with every new image: it hosts exactly the partitions
the image assigns to it, applies each topic's settings, records a new leadership's epoch
in the log before taking the role, takes the role (``Partition.become``), and follows the
leader of every replica it does not lead. The node does this in
``LogManager.reconcile`` (hosting, settings, epochs; on a worker thread, since opening a
log and recording an epoch touch the disk), ``Node._reconcile`` (roles, on the
loop) and ``ReplicaManager.reconcile`` (whom to follow); the simulated cluster
(``tests/sim_cluster.py``) does the same with these functions, so the seeded fault
search runs the node's rules.

Rules, each kept here:

- a replica is hosted where the image lists the node among the partition's replicas;
- ``min_insync_replicas`` is the topic's setting, else the node's default; unclean
  leader election is on only where the topic says ``true``;
- a leadership's epoch is recorded in the log (``assign_epoch``) only when the node may
  lead, the image names it leader, and the epoch is newer than the log's latest: a node
  that may not lead (starting, fenced, lease expired) takes no role and writes no epoch;
- a replica follows the image's leader unless it is that leader or there is none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from headwater.raft.metadata.decisions import UNCLEAN_ELECTION_KEY
from headwater.raft.metadata.image import MetadataImage, PartitionState, TopicImage

if TYPE_CHECKING:
    from headwater.node.replicas.partition import Partition

Key = tuple[str, int]
NO_LEADER = -1


def assigned_replicas(
    image: MetadataImage, node_id: int
) -> dict[Key, tuple[TopicImage, PartitionState]]:
    """Every partition ``image`` places a replica of on ``node_id``, by (topic, index)."""
    return {
        (topic.name, state.partition): (topic, state)
        for topic, state in image.partitions()
        if node_id in state.replicas
    }


def apply_topic_configs(
    partition: Partition, configs: Mapping[str, str], min_insync_default: int
) -> None:
    """Take the topic's replication settings: ``min_insync_replicas`` (else the node's
    default) and whether unclean leader election is allowed."""
    partition.unclean_leader_election = configs.get(UNCLEAN_ELECTION_KEY, "false") == "true"
    partition.min_insync_replicas = int(configs.get("min_insync_replicas", min_insync_default))


def maybe_record_leader_epoch(
    partition: Partition, state: PartitionState, node_id: int, may_lead: bool
) -> None:
    """Record a new leadership's epoch in the log (the leader-epoch cache and its
    checkpoint) before the role is taken: only when the node ``may_lead``, the image names
    it leader, and the epoch is newer than the log's latest."""
    if may_lead and state.leader == node_id and state.leader_epoch > partition.log.latest_epoch:
        partition.log.assign_epoch(state.leader_epoch)


def leader_to_follow(state: PartitionState, node_id: int) -> int | None:
    """The node ``node_id``'s replica follows (the image's leader), or None: it is the
    leader itself (taken or not), or the partition has none."""
    if state.leader in (node_id, NO_LEADER):
        return None
    return state.leader
