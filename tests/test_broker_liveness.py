"""The active controller's side of the brokers' sessions (``node/cluster/broker_liveness.py``):
when it last heard from each broker, and when those times start over."""

from __future__ import annotations

from headwater.node.cluster.broker_liveness import BrokerLiveness
from headwater.raft.metadata.image import BrokerState, MetadataImage

SESSION_MS, ELECTION_MS = 9_000, 2_000
ME, OLD_CONTROLLER, BROKER = 1, 2, 3
IMAGE = MetadataImage(
    brokers={
        n: BrokerState(n, f"incarnation-{n}", 10 + n, f"address-{n}", "", fenced=False)
        for n in (ME, OLD_CONTROLLER, BROKER)
    }
)


def fenced(liveness: BrokerLiveness, now_ms: int) -> list[int]:
    return liveness.expired(IMAGE, 5, now_ms).response


def test_a_new_term_gives_every_broker_a_whole_session_but_the_replaced_controller() -> None:
    liveness = BrokerLiveness(ME, SESSION_MS, ELECTION_MS)
    assert liveness.leading(IMAGE, 5, OLD_CONTROLLER, 1_000)
    # The old controller has been silent to Raft for an election timeout already.
    assert fenced(liveness, 1_000 + SESSION_MS - ELECTION_MS) == []
    assert fenced(liveness, 1_001 + SESSION_MS - ELECTION_MS) == [OLD_CONTROLLER]
    assert liveness.silent_ms(OLD_CONTROLLER, 1_000) == ELECTION_MS
    assert fenced(liveness, 1_001 + SESSION_MS) == [ME, OLD_CONTROLLER, BROKER]


def test_a_heartbeat_keeps_a_session_and_the_same_term_does_not_start_over() -> None:
    liveness = BrokerLiveness(ME, SESSION_MS, ELECTION_MS)
    liveness.ticked(0)
    liveness.leading(IMAGE, 5, -1, 0)
    liveness.heard(BROKER, 5_000)
    liveness.ticked(4_000)
    assert not liveness.leading(IMAGE, 5, -1, 4_000)
    assert fenced(liveness, SESSION_MS + 1) == [ME, OLD_CONTROLLER]
    assert liveness.silent_ms(BROKER, SESSION_MS + 1) == SESSION_MS + 1 - 5_000


def test_after_its_own_stall_the_controller_blames_no_broker() -> None:
    liveness = BrokerLiveness(ME, SESSION_MS, ELECTION_MS)
    liveness.ticked(0)
    liveness.leading(IMAGE, 5, -1, 0)
    liveness.ticked(SESSION_MS // 2)  # ticks half a session apart: no stall
    liveness.leading(IMAGE, 5, -1, SESSION_MS // 2)
    assert fenced(liveness, SESSION_MS + 1) == [ME, OLD_CONTROLLER, BROKER]
    woke = 3 * SESSION_MS
    liveness.ticked(woke)  # a stall of more than half a session
    assert not liveness.leading(IMAGE, 5, -1, woke)
    assert fenced(liveness, woke + SESSION_MS) == []


def test_a_controller_that_stops_leading_forgets_its_sessions() -> None:
    liveness = BrokerLiveness(ME, SESSION_MS, ELECTION_MS)
    liveness.leading(IMAGE, 5, -1, 0)
    liveness.not_leading()
    assert liveness.leading(IMAGE, 5, -1, 20_000)  # the same term, led again: afresh
    assert fenced(liveness, 20_000 + SESSION_MS) == []
