"""ConsumerGroupHeartbeat's translation (``node/kafka/consumer_heartbeat.py``): null fields
keep what the group holds for the member, topics by id both ways, bounds."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.index import load_request_schema

from headwater.node.groups.records import MemberAssignment, MemberJoined
from headwater.node.kafka import consumer_heartbeat, protocol

ORDERS = uuid.UUID(int=1)
CLICKS = uuid.UUID(int=2)
NAMES = {ORDERS: "orders", CLICKS: "clicks"}

JOINED = MemberJoined(
    group_id="g",
    member_id="m",
    instance_id="i-1",
    client_id="c",
    subscribed_topics=("orders", "clicks"),
    subscribed_pattern="",
    session_timeout_ms=45_000,
    rebalance_timeout_ms=300_000,
    assignor="range",
    joined_epoch=3,
)
CURRENT = MemberAssignment("g", "m", 5, (("orders", 0), ("orders", 1)), (("clicks", 2),))


def request(version: int = 1, **fields: Any) -> Any:
    values: dict[str, Any] = {
        "group_id": "g",
        "member_id": "m",
        "member_epoch": 5,
        "instance_id": None,
        "rack_id": None,
        "rebalance_timeout": -1,
        "subscribed_topic_names": None,
        "server_assignor": None,
        "topic_partitions": None,
    }
    if version >= 1:
        values["subscribed_topic_regex"] = None
    values.update(fields)
    return protocol.build(load_request_schema(protocol.CONSUMER_GROUP_HEARTBEAT, version), **values)


def test_null_fields_keep_what_the_group_holds_for_the_member() -> None:
    heartbeat = consumer_heartbeat.heartbeat_of(
        request(), "rdkafka", "10.0.0.7", JOINED, CURRENT, NAMES
    )
    assert heartbeat.subscribed_topics == ("orders", "clicks")
    assert heartbeat.assignor == "range"
    assert heartbeat.instance_id == "i-1"
    assert heartbeat.rebalance_timeout_ms == 300_000
    assert heartbeat.session_timeout_ms == 45_000
    assert heartbeat.client_host == "10.0.0.7"
    # Every partition the coordinator still counts as the member's, the revoked one too:
    # none is handed on before the member says it let it go.
    assert heartbeat.owned == {("orders", 0), ("orders", 1), ("clicks", 2)}
    assert (heartbeat.member_id, heartbeat.member_epoch, heartbeat.client_id) == (
        "m",
        5,
        "rdkafka",
    )


def test_given_fields_replace_the_held_ones_and_owned_topics_are_named_by_id() -> None:
    body = request(
        subscribed_topic_names=["clicks"],
        subscribed_topic_regex="^c.*",
        server_assignor="uniform",
        rebalance_timeout=60_000,
        topic_partitions=[
            {"topic_id": ORDERS, "partitions": [1]},
            {"topic_id": uuid.UUID(int=99), "partitions": [0]},  # deleted: no one's
        ],
    )
    heartbeat = consumer_heartbeat.heartbeat_of(body, "rdkafka", "10.0.0.7", JOINED, CURRENT, NAMES)
    assert heartbeat.subscribed_topics == ("clicks",)
    assert heartbeat.subscribed_pattern == "^c.*"
    assert heartbeat.assignor == "uniform"
    assert heartbeat.rebalance_timeout_ms == 60_000
    assert heartbeat.owned == {("orders", 1)}


def test_a_member_the_group_does_not_hold_gets_empty_fields() -> None:
    body = request(version=0, member_id="", member_epoch=0, subscribed_topic_names=["orders"])
    heartbeat = consumer_heartbeat.heartbeat_of(body, "java", "10.0.0.7", None, None, NAMES)
    assert heartbeat.subscribed_topics == ("orders",)
    assert heartbeat.subscribed_pattern == ""
    assert heartbeat.owned == frozenset()
    assert (heartbeat.session_timeout_ms, heartbeat.rebalance_timeout_ms) == (0, 0)


def test_owned_partitions_are_bounded_and_never_negative() -> None:
    many = [{"topic_id": ORDERS, "partitions": list(range(60_000))}] * 2
    with pytest.raises(consumer_heartbeat.HeartbeatShapeError, match="more than 100000"):
        consumer_heartbeat.heartbeat_of(
            request(topic_partitions=many), "c", "10.0.0.7", JOINED, CURRENT, NAMES
        )
    negative = [{"topic_id": ORDERS, "partitions": [-1]}]
    with pytest.raises(consumer_heartbeat.HeartbeatShapeError, match="negative"):
        consumer_heartbeat.heartbeat_of(
            request(topic_partitions=negative), "c", "10.0.0.7", JOINED, CURRENT, NAMES
        )


def test_the_assignment_names_topics_by_id_and_leaves_out_unknown_ones() -> None:
    assignment = consumer_heartbeat.assignment_of(
        (("orders", 1), ("gone", 0), ("orders", 0), ("clicks", 3)),
        {"orders": ORDERS, "clicks": CLICKS},
    )
    assert assignment == {
        "topic_partitions": [
            {"topic_id": CLICKS, "partitions": [3]},
            {"topic_id": ORDERS, "partitions": [0, 1]},
        ]
    }
