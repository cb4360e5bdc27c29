"""What a leader checks before it answers a replica, decided without I/O.

Every replica request (a fetch position, an ``OffsetForLeaderEpoch`` question) passes
these checks before the leader acts on it; the node's ``ReplicaService`` and the
simulated cluster (``tests/sim_cluster.py``) both call them, so the seeded fault search
runs the node's rules:

- the node may lead at all (``may_lead``: registered, unfenced, lease held), else
  NOT_LEADER_OR_FOLLOWER: a deposed leader that wakes up answers with a fencing error,
  never with data or epochs;
- a fetch comes from the replica's current registration (its broker epoch in the
  image), else STALE_BROKER_EPOCH: an old process of that node never counts as the
  replica's progress;
- the replica leads the partition at exactly the epoch asked (older: FENCED_LEADER_EPOCH,
  newer: UNKNOWN_LEADER_EPOCH) and the asker is one of its replicas;
- a fetch position is not past the leader's log end (OFFSET_OUT_OF_RANGE): a replica
  holds nothing its leader lacks once it has truncated, and never counts as caught up
  before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwater.raft.metadata.image import MetadataImage
from headwater.shared.errors import ErrorCode, HeadwaterError

if TYPE_CHECKING:
    from headwater.node.replicas.partition import Partition


def stale_registration(
    image: MetadataImage, replica_id: int, broker_epoch: int
) -> HeadwaterError | None:
    """STALE_BROKER_EPOCH unless ``broker_epoch`` is ``replica_id``'s current registration
    in ``image`` (None when it is). Joining the ISR also needs the controller, which
    admits only registered, unfenced brokers."""
    broker = image.brokers.get(replica_id)
    if broker is not None and broker.broker_epoch == broker_epoch:
        return None
    current = "none" if broker is None else str(broker.broker_epoch)
    return HeadwaterError(
        ErrorCode.STALE_BROKER_EPOCH,
        f"node {replica_id} fetched with broker epoch {broker_epoch}; its current "
        f"registration here has {current}",
    )


def leader_partition(
    partition: Partition | None,
    topic: str,
    index: int,
    leader_epoch: int,
    replica_id: int,
    *,
    node_id: int,
    may_lead: bool,
) -> Partition:
    """``partition`` (node ``node_id``'s replica of ``topic``-``index``, None if not
    hosted) if ``replica_id`` may fetch from it at ``leader_epoch``; raises otherwise.
    ``may_lead``: may the node act as a leader now (``BrokerSession.may_lead``)."""
    if not may_lead:
        raise HeadwaterError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"node {node_id} may not act as a leader now (starting, fenced, or no recent "
            f"heartbeat answer from the controller); {topic}-{index}",
        )
    if partition is None or not partition.is_leader or partition.state is None:
        raise HeadwaterError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER, f"this node does not lead {topic}-{index}"
        )
    if leader_epoch < partition.leader_epoch:
        raise HeadwaterError(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"{topic}-{index}: leader epoch {leader_epoch} is older than {partition.leader_epoch}",
        )
    if leader_epoch > partition.leader_epoch:
        raise HeadwaterError(
            ErrorCode.UNKNOWN_LEADER_EPOCH,
            f"{topic}-{index}: leader epoch {leader_epoch} is newer than {partition.leader_epoch}",
        )
    if replica_id not in partition.state.replicas:
        raise HeadwaterError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"node {replica_id} is not a replica of {topic}-{index}",
        )
    return partition


def fetch_position_error(partition: Partition, fetch_offset: int) -> HeadwaterError | None:
    """OFFSET_OUT_OF_RANGE when ``fetch_offset`` is past the leader's log end (the
    replica must truncate first), else None."""
    end = partition.log.log_end_offset
    if fetch_offset <= end:
        return None
    return HeadwaterError(
        ErrorCode.OFFSET_OUT_OF_RANGE,
        f"fetch offset {fetch_offset} is past the leader's log end offset {end}; truncate first",
    )
