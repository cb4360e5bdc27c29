"""The group member's core (client/membership.py), pure: when a heartbeat is due, what
fencing and a silent session do, and what the consumer must revoke and take."""

from __future__ import annotations

from typing import Any

import pytest

from headwater.client.membership import (
    SESSION_EXPIRED,
    Membership,
    subscription_of,
    topic_partitions,
)
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb

A0, A1, A2 = (TopicPartition("a", p) for p in range(3))


def answer(epoch: int, *assigned: TopicPartition, session_ms: int = 1000) -> Any:
    return pb.ConsumerGroupHeartbeatResponse(
        member_id="m1",
        member_epoch=epoch,
        heartbeat_interval_ms=500,
        assignment=topic_partitions(assigned),
        session_timeout_ms=session_ms,
    )


def member() -> Membership:
    return Membership(subscription_of("g", "a", None, subscribed=False, assigned=False))


def test_revoke_then_take_and_heartbeat_at_once_after_a_release() -> None:
    m = member()
    assert m.due(0.0) and m.request().member_epoch == 0
    m.answered(answer(1, A0, A1), now_s=0.0, sent_s=0.0)
    assert m.to_assign() == [A0, A1] and not m.due(0.1)
    m.taken([A0, A1])
    m.answered(answer(2, A0), now_s=0.2, sent_s=0.2)
    assert m.to_revoke() == [A1]
    request = m.request()  # a heartbeat goes out while the consumer gives A1 up
    assert sorted(p for t in request.owned for p in t.partitions) == [0, 1]
    m.released([A1], now_s=0.3)
    m.answered(answer(2, A0), now_s=0.35, sent_s=0.25)  # the answer to that heartbeat
    assert m.due(0.35)  # the release is reported at once, not an interval later


def test_fenced_member_gives_everything_up_before_joining_again() -> None:
    m = member()
    m.answered(answer(3, A0, A2), now_s=0.0, sent_s=0.0)
    m.taken([A0, A2])
    m.failed(HeadwaterError(ErrorCode.FENCED_MEMBER_EPOCH, "fenced"), now_s=1.0)
    assert m.lost() and not m.due(100.0)  # no heartbeat until the partitions are given up
    assert m.member_epoch == 3  # a commit now would still carry the fenced membership
    assert m.forget_owned(now_s=2.0) == [A0, A2]
    request = m.request()
    assert (request.member_id, request.member_epoch, list(request.owned)) == ("m1", 0, [])
    m.failed(HeadwaterError(ErrorCode.UNKNOWN_MEMBER_ID, "gone"), now_s=3.0)
    m.forget_owned(now_s=3.0)
    assert m.request().member_id == ""  # an unknown member joins as a new one


def test_a_silent_session_expires_from_when_the_last_good_heartbeat_was_sent() -> None:
    m = member()
    m.answered(answer(1, A0, session_ms=1000), now_s=5.2, sent_s=5.0)
    m.taken([A0])
    assert not m.session_expired(5.9)
    assert m.session_expired(6.0)  # 1 s after sending, not after the answer came
    m.failed(SESSION_EXPIRED, now_s=6.0)
    assert m.lost() and not m.session_expired(7.0)
    m.forget_owned(now_s=7.0)
    assert m.request().member_id == "m1"  # joins again as itself: the old place is freed


def test_static_members_leave_with_minus_two() -> None:
    m = Membership(
        subscription_of("g", ["a"], None, subscribed=False, assigned=False, instance_id="host-1")
    )
    assert m.leave_request() is None  # not a member yet
    m.answered(answer(1, A0), now_s=0.0, sent_s=0.0)
    leave = m.leave_request()
    assert leave is not None and leave.member_epoch == -2


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("g", None, None), ErrorCode.INVALID_CONFIG),
        (("", "a", None), ErrorCode.INVALID_GROUP_ID),
        (("g" * 256, "a", None), ErrorCode.INVALID_GROUP_ID),
    ],
)
def test_bad_subscriptions(args: tuple[str, str | None, str | None], code: ErrorCode) -> None:
    with pytest.raises(HeadwaterError) as caught:
        subscription_of(*args, subscribed=False, assigned=False)
    assert caught.value.code is code
    for flags in ({"subscribed": True, "assigned": False}, {"subscribed": False, "assigned": True}):
        with pytest.raises(HeadwaterError) as caught:
            subscription_of("g", "a", None, **flags)
        assert caught.value.code is ErrorCode.INVALID_REQUEST
