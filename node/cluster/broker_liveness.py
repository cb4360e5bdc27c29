"""The active controller's side of the brokers' sessions, as steps without I/O.

A broker keeps its session by heartbeating the active controller
(``headwater.node.cluster.broker_session`` is the broker's side); the controller fences a
broker it has not heard from for ``broker_session_timeout_ms``
(``decisions.fence_expired``). ``BrokerLiveness`` holds when the controller last heard
from each broker and decides when those times start over. Rules, each kept here:

- a controller that becomes active (a new term) gives every registered broker a whole
  session from that moment: it cannot know when its predecessor last heard from them;
  but the controller it replaced, in combined mode a broker too, has already been silent
  to Raft for an election timeout, and starts with that much of its session gone;
- a controller whose own ticks stalled (its process paused, its loop held) for more
  than half a session gives every broker a whole session again: the silence was its
  own, not theirs;
- a registration or a heartbeat is hearing from the broker, whatever its answer;
- only the active controller keeps sessions: one that stops leading forgets them, and
  starts over when it leads again.

The node's ``ControllerDriver`` drives it on the wall clock, the simulated cluster
(``tests/sim_cluster.py``) on its virtual clock; time is always passed in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwater.raft.metadata import decisions

if TYPE_CHECKING:
    from headwater.raft.metadata.image import MetadataImage


class BrokerLiveness:
    """When the active controller ``node_id`` last heard from each broker (module doc)."""

    def __init__(self, node_id: int, session_timeout_ms: int, election_timeout_ms: int) -> None:
        self.node_id = node_id
        self.session_timeout_ms = session_timeout_ms
        self.election_timeout_ms = election_timeout_ms
        self._heard_ms: dict[int, int] = {}
        self._term = 0
        self._last_tick_ms: int | None = None
        self._stalled = False

    def ticked(self, now_ms: int) -> None:
        """The controller's tick ran at ``now_ms``: it notes whether its ticks stalled
        for more than half a session since the last one."""
        last, self._last_tick_ms = self._last_tick_ms, now_ms
        self._stalled = last is not None and now_ms - last > self.session_timeout_ms // 2

    def not_leading(self) -> None:
        """This node is not the active controller: its sessions are forgotten."""
        self._term = 0
        self._heard_ms = {}

    def leading(
        self, image: MetadataImage, term: int, replaced_controller: int, now_ms: int
    ) -> bool:
        """This node is the active controller of ``term`` (``replaced_controller``: the
        controller the image named before this one activated). Starts every broker's
        session over at a new term or after a stall; returns whether the term is new."""
        first = term != self._term
        if first or self._stalled:
            self._term = term
            self._stalled = False
            self._heard_ms = dict.fromkeys(image.brokers, now_ms)
            if (
                first
                and replaced_controller in image.brokers
                and replaced_controller != self.node_id
            ):
                self._heard_ms[replaced_controller] = now_ms - self.election_timeout_ms
        return first

    def heard(self, node_id: int, now_ms: int) -> None:
        """A registration or heartbeat of ``node_id`` arrived at ``now_ms``."""
        self._heard_ms[node_id] = now_ms

    def expired(
        self, image: MetadataImage, epoch: int, now_ms: int
    ) -> decisions.ControllerResult[list[int]]:
        """The fencing of every broker silent for longer than a session
        (``decisions.fence_expired``)."""
        return decisions.fence_expired(
            image, epoch, self._heard_ms, now_ms, self.session_timeout_ms
        )

    def silent_ms(self, node_id: int, now_ms: int) -> int:
        """How long ``node_id`` has been silent (0 if never heard of)."""
        return now_ms - self._heard_ms.get(node_id, now_ms)
