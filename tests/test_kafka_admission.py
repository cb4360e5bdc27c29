"""The Kafka listener's bookkeeping without sockets: which connections are kept
(``ConnectionAdmission``), rates per host (``HostRates``), the byte budget of frames being
read (``ByteBudget``) and the SASL rules before a login."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from headwater.node.config import NodeConfig
from headwater.node.kafka import protocol
from headwater.node.kafka.admission import (
    ConnectionAdmission,
    ConnectionLimits,
    RefusedConnectionError,
)
from headwater.node.kafka.listener import ByteBudget
from headwater.node.kafka.sasl import (
    PRELOGIN_FRAME_BYTES_MAX,
    PRELOGIN_REQUESTS_MAX,
    KafkaSasl,
    SaslState,
)
from headwater.node.security.host_rates import HOSTS_TRACKED_MAX, HostRates
from headwater.shared.errors import HeadwaterError


def test_a_host_gets_its_own_cap_and_the_overrides_theirs() -> None:
    admission = ConnectionAdmission(
        ConnectionLimits(connections_max=100, per_host_max=2, per_host_overrides={"10.0.0.9": 3})
    )
    for connection in (1, 2):
        assert admission.admit(connection, "10.0.0.1", 0.0) is None
    with pytest.raises(RefusedConnectionError, match=r"kafka_connections_per_host_max 2"):
        admission.admit(3, "10.0.0.1", 0.0)
    for connection in (4, 5, 6):
        admission.admit(connection, "10.0.0.9", 0.0)
    with pytest.raises(RefusedConnectionError, match=r"kafka_connections_per_host_max 3"):
        admission.admit(7, "10.0.0.9", 0.0)
    admission.close(1)
    admission.admit(8, "10.0.0.1", 0.0)  # a place freed
    assert admission.open == 5


def test_at_the_node_cap_the_oldest_unproven_connection_gives_way() -> None:
    admission = ConnectionAdmission(ConnectionLimits(connections_max=3, per_host_max=10))
    for connection in (1, 2, 3):
        admission.admit(connection, "10.0.0.1", 0.0)
    admission.prove(1)
    assert admission.admit(4, "10.0.0.2", 0.0) == 2  # 1 has proved itself
    assert not admission.is_open(2) and admission.open == 3
    admission.close(2)  # the listener's own close later: nothing more to forget
    assert admission.open == 3
    assert admission.admit(5, "10.0.0.2", 0.0) == 3
    admission.prove(4)
    admission.prove(5)
    with pytest.raises(RefusedConnectionError, match="every one has proved itself"):
        admission.admit(6, "10.0.0.3", 0.0)
    assert admission.open_from("10.0.0.1") == 1 and admission.open_from("10.0.0.2") == 2


def test_the_connection_rate_of_a_host_is_its_own() -> None:
    admission = ConnectionAdmission(
        ConnectionLimits(connections_max=100, per_host_max=100, rate_per_host_max=2)
    )
    admission.admit(1, "10.0.0.1", 5.0)
    admission.admit(2, "10.0.0.1", 5.1)
    with pytest.raises(RefusedConnectionError, match="connection_rate_per_host_max"):
        admission.admit(3, "10.0.0.1", 5.2)
    admission.admit(4, "10.0.0.2", 5.2)
    admission.admit(5, "10.0.0.1", 5.8)  # a token back after half a second


def test_admission_against_a_dumb_oracle() -> None:
    """Random admits, proofs and closes against a plain list model of the same rules."""
    rng = random.Random(7)
    limits = ConnectionLimits(connections_max=12, per_host_max=5)
    admission = ConnectionAdmission(limits)
    model: list[tuple[int, str, bool]] = []  # (connection, host, proven) in arrival order
    for connection in range(1, 3000):
        action = rng.random()
        if action < 0.6:
            host = f"10.0.0.{rng.randrange(4)}"
            held = sum(1 for _, h, _ in model if h == host)
            unproven = [c for c, _, p in model if not p]
            try:
                replaced = admission.admit(connection, host, 0.0)
            except RefusedConnectionError:
                assert held >= 5 or (len(model) >= 12 and not unproven)
                continue
            assert held < 5
            if len(model) >= 12:
                assert replaced == unproven[0]
                model = [m for m in model if m[0] != replaced]
            else:
                assert replaced is None
            model.append((connection, host, False))
        elif model and action < 0.8:
            chosen = rng.choice(model)
            admission.prove(chosen[0])
            model[model.index(chosen)] = (chosen[0], chosen[1], True)
        elif model:
            chosen = rng.choice(model)
            admission.close(chosen[0])
            model.remove(chosen)
        assert admission.open == len(model)
        assert admission.unproven == sum(1 for m in model if not m[2])


def test_host_rates_refill_and_stay_bounded() -> None:
    rates = HostRates(10.0, burst=2)
    assert rates.take("a", 0.0) == 0.0
    assert rates.take("a", 0.0) == 0.0
    assert rates.take("a", 0.0) == pytest.approx(0.1)  # nothing taken
    assert rates.take("a", 0.05) == pytest.approx(0.05)
    assert rates.take("a", 0.1) == 0.0
    assert rates.take("b", 0.1) == 0.0  # its own bucket
    many = HostRates(1.0)
    for n in range(HOSTS_TRACKED_MAX + 10):
        many.take(f"h{n}", 0.0)
    assert len(many) <= HOSTS_TRACKED_MAX


def test_the_host_overrides_setting_is_checked() -> None:
    assert NodeConfig(kafka_connections_per_host_overrides="10.0.0.5:7").kafka_connections_max
    for bad in ("10.0.0.5", "name:3", "10.0.0.5:x", "10.0.0.5:1,10.0.0.5:2", "*:3"):
        with pytest.raises(HeadwaterError, match="kafka_connections_per_host_overrides"):
            NodeConfig(kafka_connections_per_host_overrides=bad)


def test_a_stalled_frame_holds_only_what_has_arrived_and_the_oldest_frame_goes_on() -> None:
    async def scenario() -> None:
        budget = ByteBudget(100)
        stalled, first, second = object(), object(), object()
        budget.begin(stalled, 10, lambda: None)  # announced big, sent 10 bytes, then nothing
        budget.begin(first, 0, lambda: None)
        budget.begin(second, 0, lambda: None)
        await budget.take(first, 60)
        took = asyncio.ensure_future(budget.take(second, 40))
        await asyncio.sleep(0)
        assert not took.done()  # 10 + 60 + 40 > 100: waits
        # The oldest frame holding bytes (the stalled one) may always take more, so
        # frames read at once never hold each other up for good.
        await budget.take(stalled, 50)
        assert budget.held == 120
        budget.release(first)
        await asyncio.wait_for(took, 1)
        assert budget.held == 100
        for frame in (stalled, second):
            budget.release(frame)
        assert budget.held == 0

    asyncio.run(scenario())


def test_a_frame_that_stops_arriving_is_closed_when_another_waits_for_room() -> None:
    """Bytes others wait for are held only by frames that keep arriving: a frame that
    brought less than a chunk in ``stalled_s`` is closed once another frame waits for
    room; a frame that waits itself, and one read whole, are not."""

    async def scenario() -> None:
        now = [0.0]
        budget = ByteBudget(100, lambda: now[0], stalled_s=0.05)
        closed: list[str] = []
        stalled, waiting, whole, later = object(), object(), object(), object()
        budget.begin(stalled, 60, lambda: closed.append("stalled"))
        budget.begin(whole, 20, lambda: closed.append("whole"))
        budget.arrived(whole)
        budget.begin(waiting, 10, lambda: closed.append("waiting"))
        took = asyncio.ensure_future(budget.take(waiting, 30))
        await asyncio.sleep(0.2)
        assert not took.done() and not closed  # nothing stalled yet: it waits
        budget.begin(later, 5, lambda: closed.append("later"))
        now[0] = 1.0  # everything quiet past stalled_s
        await asyncio.wait_for(took, 5)
        # The waiter closes what did not move, but not itself, nor the frame read whole.
        assert sorted(closed) == ["later", "stalled"]
        assert budget.held == 20 + 10 + 30
        await budget.take(waiting, 40)  # the room is its again
        assert budget.held == 100

    asyncio.run(scenario())


def test_before_a_login_only_the_login_apis_in_small_frames_and_few_of_them() -> None:
    state = SaslState()
    refusal = KafkaSasl.refusal_before_login
    assert "before a SASL login" in (refusal(state, protocol.METADATA, 20) or "")
    assert "65536" in (
        refusal(state, protocol.SASL_AUTHENTICATE, PRELOGIN_FRAME_BYTES_MAX + 1) or ""
    )
    state = SaslState()
    for _ in range(PRELOGIN_REQUESTS_MAX):
        assert refusal(state, protocol.API_VERSIONS, 10) is None
    assert "more than" in (refusal(state, protocol.API_VERSIONS, 10) or "")


def test_the_loop_watch_counts_stalls_and_keeps_the_longest() -> None:
    from headwater.node.ops.loop_watch import STALL_REPORTED_S, LoopWatch

    observed: list[float] = []
    watch = LoopWatch(observed.append)
    for late_s in (0.001, STALL_REPORTED_S, 0.2, 0.03):
        watch.record(late_s)
    assert (watch.stalls, watch.longest_s) == (3, 0.2)
    assert observed == [STALL_REPORTED_S, 0.2, 0.03]

    async def held() -> float:
        watch = LoopWatch()
        watch.start()
        await asyncio.sleep(0.05)
        time.sleep(0.12)  # the loop held by a callback that does not yield
        await asyncio.sleep(0.05)
        await watch.stop()
        return watch.longest_s

    assert 0.09 < asyncio.run(held()) < 0.5
