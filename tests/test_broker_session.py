"""A broker's registration and leadership lease as steps without I/O
(``headwater.node.cluster.broker_session``): what each heartbeat answer does to the lease, on a
clock the test sets."""

from __future__ import annotations

import dataclasses

from headwater.node.cluster.broker_session import BrokerSession, leadership_lease_s
from headwater.node.config import NodeConfig
from headwater.raft.metadata.image import BrokerState, MetadataImage

LEASE_MS = 2000.0


def registered(epoch: int = 7) -> BrokerSession:
    session = BrokerSession(LEASE_MS)
    session.registered_as(epoch)
    return session


def test_an_unfenced_answer_grants_the_lease_from_when_the_heartbeat_left() -> None:
    session = registered()
    assert not session.lease_valid(0)
    heartbeat = session.heartbeat(1000)
    session.answered(heartbeat, fenced=False)  # however late it arrives
    assert session.lease_valid(2999) and not session.lease_valid(3000)


def test_an_older_heartbeat_answered_later_never_shortens_the_lease() -> None:
    session = registered()
    early, late = session.heartbeat(1000), session.heartbeat(1500)
    session.answered(late, fenced=False)
    session.answered(early, fenced=False)
    assert session.lease_until_ms == 3500


def test_a_fenced_answer_ends_the_lease_at_once() -> None:
    session = registered()
    session.answered(session.heartbeat(0), fenced=False)
    assert session.answered(session.heartbeat(100), fenced=True)  # fenced: a change
    assert not session.lease_valid(101)


def test_an_answer_to_a_heartbeat_of_an_earlier_registration_grants_nothing() -> None:
    session = registered(epoch=7)
    old = session.heartbeat(0)
    session.stale()
    assert not session.registered and session.broker_epoch == -1
    session.registered_as(8)
    session.answered(old, fenced=False)
    assert not session.lease_valid(1)


def test_a_stale_epoch_ends_the_lease() -> None:
    session = registered()
    session.answered(session.heartbeat(0), fenced=False)
    session.stale()
    assert not session.lease_valid(1)


def test_a_broker_shutting_down_keeps_its_lease_while_fenced() -> None:
    session = registered()
    session.answered(session.heartbeat(0), fenced=True, want_shutdown=True)
    assert session.lease_valid(LEASE_MS - 1)


def test_leadership_needs_this_registration_unfenced_in_the_image() -> None:
    session = registered(epoch=7)
    broker = BrokerState(1, "incarnation", 7, "127.0.0.1:7700", "", fenced=False)
    image = dataclasses.replace(MetadataImage(), brokers={1: broker})
    assert session.leadership_allowed(image, 1)
    assert not session.leadership_allowed(image, 2)
    fenced = dataclasses.replace(image, brokers={1: dataclasses.replace(broker, fenced=True)})
    assert not session.leadership_allowed(fenced, 1)
    session.registered_as(8)  # the process registered again; the image is older
    assert not session.leadership_allowed(image, 1)


def test_the_lease_ends_before_the_controller_may_fence() -> None:
    config = NodeConfig()
    assert 0 < leadership_lease_s(config) * 1000 < config.broker_session_timeout_ms


def test_leading_needs_leadership_allowed_and_the_lease_both() -> None:
    session = registered(epoch=7)
    broker = BrokerState(1, "incarnation", 7, "127.0.0.1:7700", "", fenced=False)
    image = dataclasses.replace(MetadataImage(), brokers={1: broker})
    assert not session.may_lead(image, 1, 0)  # no heartbeat answered yet: no lease
    session.answered(session.heartbeat(0), fenced=False)
    assert session.may_lead(image, 1, LEASE_MS - 1)
    assert not session.may_lead(image, 1, LEASE_MS)  # the lease ran out
    fenced = dataclasses.replace(image, brokers={1: dataclasses.replace(broker, fenced=True)})
    assert not session.may_lead(fenced, 1, 1)  # lease held, registration fenced
