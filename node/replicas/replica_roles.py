"""What the metadata image asks of this node's replicas, decided without I/O.

A broker reconciles its replicas with every new image: it hosts exactly the partitions
the image assigns to it, applies each topic's settings, records a new leadership's epoch
in the log before taking the role, takes the role (``Partition.become``), and follows the
leader of every replica it does not lead. ``ReconcileStep`` decides it without I/O:
``hosting`` which replicas to remove and which the image places here (opened where not
hosted), ``role`` what each hosted replica does (record the epoch, lead or not, whom to
follow). The node applies the step in ``LogManager.reconcile`` (hosting, settings,
epochs; on a worker thread, since opening a log and recording an epoch touch the disk),
``Node._reconcile`` (roles, on the loop) and ``ReplicaManager.reconcile`` (whom to
follow); the simulated cluster (``tests/sim_cluster.py``) applies the same step, so the
seeded fault search runs the node's rules.

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
from dataclasses import dataclass
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


def leader_to_follow(state: PartitionState, node_id: int) -> int | None:
    """The node ``node_id``'s replica follows (the image's leader), or None: it is the
    leader itself (taken or not), or the partition has none."""
    if state.leader in (node_id, NO_LEADER):
        return None
    return state.leader


@dataclass(frozen=True, slots=True)
class Hosting:
    """Which replicas a node hosts after an image."""

    remove: tuple[Key, ...]
    """Hosted replicas the image no longer places here, or of another topic of the same
    name (deleted and created again: another topic id)."""
    assigned: dict[Key, tuple[TopicImage, PartitionState]]
    """Every replica the image places here, in the image's order (opened where not
    hosted)."""


@dataclass(frozen=True, slots=True)
class ReplicaRole:
    """What one hosted replica does with an image (``Partition.become`` takes it)."""

    state: PartitionState
    record_epoch: bool
    """Record ``state.leader_epoch`` in the log before the role is taken."""
    may_lead: bool
    """Whether the role may be leadership (the node's registration unfenced)."""
    follow: int | None
    """The node to fetch from, or None (it leads, or the partition has no leader)."""


class ReconcileStep:
    """The reconcile of one node's hosted replicas against a new image, as a step without
    I/O (see the module doc): the node and the simulated cluster apply what it says."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id

    def hosting(self, image: MetadataImage, hosted: Mapping[Key, str]) -> Hosting:
        """``hosted``: the topic id of each replica hosted now."""
        assigned = assigned_replicas(image, self.node_id)
        remove = tuple(
            key
            for key, topic_id in hosted.items()
            if key not in assigned or assigned[key][0].topic_id != topic_id
        )
        return Hosting(remove, assigned)

    def role(self, state: PartitionState, latest_epoch: int, may_lead: bool) -> ReplicaRole:
        """``latest_epoch``: the newest leader epoch the replica's log records."""
        record = may_lead and state.leader == self.node_id and state.leader_epoch > latest_epoch
        return ReplicaRole(state, record, may_lead, leader_to_follow(state, self.node_id))


def take_role(
    partition: Partition, configs: Mapping[str, str], role: ReplicaRole, min_insync_default: int
) -> None:
    """Apply the topic's settings and record the role's epoch (``ReconcileStep.role``);
    ``Partition.become`` takes the role itself, on the node's loop."""
    apply_topic_configs(partition, configs, min_insync_default)
    if role.record_epoch:
        partition.log.assign_epoch(role.state.leader_epoch)
