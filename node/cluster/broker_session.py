"""A broker's registration, heartbeats and leadership lease, as steps without I/O.

``BrokerSession`` holds what the broker knows of its own registration: its broker epoch
(-1 until the controller registers it), whether the controller last answered it fenced,
and until when it may act as a leader. The node's lifecycle loop
(``headwater.node.cluster.broker_lifecycle``) makes the calls over gRPC; the simulated cluster
(``tests/sim_cluster.py``) over its simulated network; both act on the answers through
this object, so the seeded fault search runs this code, not a copy of it. Times are
milliseconds on whatever monotonic clock the driver uses (the event loop's, or the
simulation's virtual one).

Leadership lease: a broker may act as a partition leader only within
``leadership_lease_s(config)`` of sending a heartbeat that the controller answered
unfenced. Why that is safe: a controller answers only while it is the Raft leader and its
loop has not stalled, so its answer at time ``a`` means a majority heard from it at or
after ``a - controller_staleness_ms_max`` (the Raft leader fallback). No other controller
is elected before that majority's election timeout runs out, and a new controller gives
every broker a full session (the replaced controller's broker one election timeout less,
which its silence already covers) before fencing it. So the broker cannot be fenced, nor
another replica elected in its place, before ``send time + session - staleness``, when
the lease has already ended. A leader that was paused, or cut off from the controller,
stops serving as leader (produce, replica fetch, OffsetForLeaderEpoch) once its lease runs
out, before it could learn from the metadata that it was deposed.

Invariants, each kept here:

- the lease is extended only by an unfenced answer to a heartbeat sent under the broker
  epoch the broker still holds, and only to the heartbeat's send time plus the lease (an
  answer that arrives late extends nothing past what its send time allows);
- a fenced answer, or a stale broker epoch, ends the lease at once;
- a broker asking to shut down has its lease extended by every answer under its epoch,
  fenced or not: it keeps leading what the controller has not moved yet until it stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from headwater.node.config import NodeConfig
from headwater.raft.metadata.image import MetadataImage

# A Raft leader that has not heard from a majority for this many election timeouts steps
# down (pysyncobj's leaderFallbackTimeout); a controller whose loop stalled this long
# answers nothing until it has committed a record again.
LEADER_FALLBACK_ELECTIONS: Final = 3


def controller_staleness_ms_max(config: NodeConfig) -> int:
    """The longest a controller may go on answering after a majority last heard from it:
    the Raft leader fallback, which is also the loop stall after which the controller
    answers nothing until it has committed a record again (``ControllerDriver``)."""
    return config.raft_election_timeout_ms * LEADER_FALLBACK_ELECTIONS


def leadership_lease_s(config: NodeConfig) -> float:
    """How long after sending an answered heartbeat a broker may act as leader (see the
    module doc): the session timeout less the longest a controller can go on answering
    after it lost its quorum (``controller_staleness_ms_max``), and at least a third of
    the session timeout when the election timeout is set unusually long."""
    session_ms = config.broker_session_timeout_ms
    return max(session_ms - controller_staleness_ms_max(config), session_ms // 3) / 1000


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A heartbeat sent: the broker epoch it carried and when it left."""

    broker_epoch: int
    sent_at_ms: float


class BrokerSession:
    """One process's registration with the controller and its leadership lease (module
    doc). ``registered`` is false until the controller answers a registration; then
    ``heartbeat(now)`` says what to send and ``answered(...)`` acts on the reply."""

    def __init__(self, lease_ms: float) -> None:
        self.lease_ms = lease_ms
        self.broker_epoch = -1
        self.fenced = True
        self.lease_until_ms = 0.0

    @property
    def registered(self) -> bool:
        return self.broker_epoch >= 0

    def registered_as(self, broker_epoch: int) -> None:
        """The controller registered this process under ``broker_epoch`` (still fenced:
        the first heartbeat unfences it, so send one at once)."""
        self.broker_epoch = broker_epoch

    def heartbeat(self, now_ms: float) -> Heartbeat:
        """The heartbeat to send now."""
        return Heartbeat(self.broker_epoch, now_ms)

    def answered(self, heartbeat: Heartbeat, fenced: bool, want_shutdown: bool = False) -> bool:
        """The controller answered ``heartbeat``: fenced or not. True when that changed
        whether the broker is fenced."""
        changed = fenced != self.fenced
        self.fenced = fenced
        if heartbeat.broker_epoch == self.broker_epoch and (want_shutdown or not fenced):
            self.lease_until_ms = max(self.lease_until_ms, heartbeat.sent_at_ms + self.lease_ms)
        elif fenced:
            self.lease_until_ms = 0.0
        return changed

    def stale(self) -> None:
        """The controller answered STALE_BROKER_EPOCH (it lost or replaced this
        registration): register again; the lease ends now."""
        self.broker_epoch = -1
        self.lease_until_ms = 0.0

    def lease_valid(self, now_ms: float) -> bool:
        """May this broker act as a leader at ``now_ms`` as far as its lease goes?"""
        return now_ms < self.lease_until_ms

    def registered_in(self, image: MetadataImage, node_id: int) -> bool:
        """Does ``image`` hold this process's registration (not an earlier one's)?"""
        broker = image.brokers.get(node_id)
        return broker is not None and broker.broker_epoch == self.broker_epoch

    def leadership_allowed(self, image: MetadataImage, node_id: int) -> bool:
        """Does ``image`` show this process's registration unfenced? What roles are taken
        with (a restarted node must not lead by an old registration)."""
        return self.registered_in(image, node_id) and not image.brokers[node_id].fenced

    def may_lead(self, image: MetadataImage, node_id: int, now_ms: float) -> bool:
        """May this broker act as a partition leader at ``now_ms`` (serve produce,
        consumer and replica fetches, epoch questions; propose ISR changes)? Leadership
        allowed by ``image`` and the lease held: a leader that was paused or cut off
        stops answering as leader before the controller can have elected another."""
        return self.leadership_allowed(image, node_id) and self.lease_valid(now_ms)
