"""Kafka's protocol on one connection, on bytes alone: frame bounds, the SASL gate,
version checks and answer ordering of ``KafkaConnection``, with no socket and no event
loop (the listener is a socket loop around it)."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.node.kafka import protocol
from headwater.node.kafka.connection import (
    HEADER_BYTES,
    IN_FLIGHT_MAX,
    REQUEST_BYTES_MAX,
    Answered,
    Closed,
    Event,
    FrameAnnounced,
    FrameArrived,
    KafkaConnection,
    NeedBytes,
)
from headwater.node.kafka.sasl import PRELOGIN_FRAME_BYTES_MAX
from headwater.node.security.authorizer import Caller
from tests import kafka_raw

PRODUCE_MAX = 8 << 20
METADATA = kafka_raw.frame(protocol.METADATA, 4, correlation_id=7, topics=[{"name": "t"}])
API_VERSIONS = kafka_raw.frame(protocol.API_VERSIONS, 0, correlation_id=8)


def connection(logins: bool = False) -> KafkaConnection:
    return KafkaConnection(PRODUCE_MAX, logins=logins)


def events(kafka: KafkaConnection) -> list[Event]:
    """Every event the bytes received make, up to the next ``NeedBytes`` or ``Closed``."""
    seen: list[Event] = []
    while True:
        event = kafka.next_event()
        seen.append(event)
        if isinstance(event, (NeedBytes, Closed)):
            return seen


def announced(size: int, api_key: int = protocol.METADATA, version: int = 4) -> bytes:
    """A frame's first 12 bytes: its size and fixed header."""
    return struct.pack(">ihhi", size, api_key, version, 1)


def test_a_frame_is_announced_then_arrives_whole() -> None:
    kafka = connection()
    assert kafka.next_event() == NeedBytes(HEADER_BYTES)
    kafka.receive(METADATA)
    header = protocol.FrameHeader(protocol.METADATA, 4, 7)
    assert events(kafka) == [
        FrameAnnounced(len(METADATA) - 4, header),
        FrameArrived(METADATA[4:], header),
        NeedBytes(HEADER_BYTES),
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(METADATA + API_VERSIONS)), max_size=8))
def test_frames_arrive_the_same_however_the_bytes_are_split(cuts: list[int]) -> None:
    stream = METADATA + API_VERSIONS
    kafka = connection()
    arrived = []
    edges = [0, *sorted(cuts), len(stream)]
    for start, end in itertools.pairwise(edges):
        kafka.receive(stream[start:end])
        arrived += [e.frame for e in events(kafka) if isinstance(e, FrameArrived)]
    assert arrived == [METADATA[4:], API_VERSIONS[4:]]


@pytest.mark.parametrize("size", [-1, 0, 7, PRODUCE_MAX + 1, 256 << 20])
def test_a_frame_size_out_of_bounds_closes_on_its_first_four_bytes(size: int) -> None:
    kafka = connection()
    kafka.receive(struct.pack(">i", size))
    assert kafka.next_event() == Closed(f"a request of {size} bytes (valid: 8 to {PRODUCE_MAX})")
    kafka.receive(b"more")
    assert kafka.next_event() == Closed(f"a request of {size} bytes (valid: 8 to {PRODUCE_MAX})")


def test_only_produce_may_pass_the_request_bound() -> None:
    over = REQUEST_BYTES_MAX + 1
    kafka = connection()
    kafka.receive(announced(over))
    assert kafka.next_event() == Closed(f"api key 3 in {over} bytes (at most {REQUEST_BYTES_MAX})")
    produce = connection()
    produce.receive(announced(over, protocol.PRODUCE, 8))
    assert isinstance(produce.next_event(), FrameAnnounced)
    assert produce.next_event() == NeedBytes(over + 4 - HEADER_BYTES)


def test_a_strangers_twelve_bytes_announcing_a_large_frame_close_before_a_login() -> None:
    """Before a login only the login APIs, in small frames: the announcement of a large
    Produce is refused on its first 12 bytes, nothing held for it."""
    kafka = connection(logins=True)
    kafka.receive(announced(256 << 20, protocol.PRODUCE, 8)[:4])
    assert isinstance(kafka.next_event(), Closed)
    login = connection(logins=True)
    login.receive(announced(PRELOGIN_FRAME_BYTES_MAX + 1, protocol.API_VERSIONS, 3))
    refused = login.next_event()
    assert isinstance(refused, Closed) and "before a SASL login" in refused.reason


def test_the_sasl_gate_lets_the_login_apis_through_and_the_rest_after_a_login() -> None:
    kafka = connection(logins=True)
    kafka.receive(API_VERSIONS)
    assert isinstance(events(kafka)[-2], FrameArrived)
    kafka.receive(METADATA)
    assert events(kafka) == [Closed("api key 3 before a SASL login")]
    after = connection(logins=True)
    after.login.caller = Caller("User:alice", "h")
    after.receive(METADATA)
    assert isinstance(events(after)[-2], FrameArrived)


def test_a_version_not_served_is_answered_in_order_and_an_unknown_api_closes() -> None:
    unserved = announced(8, protocol.METADATA, 0)
    kafka = connection()
    first = kafka.begin_answer()
    kafka.receive(unserved)
    assert events(kafka)[1] == Answered(protocol.FrameHeader(protocol.METADATA, 0, 1))
    assert kafka.bytes_to_send() == b""  # the earlier request's answer is awaited
    kafka.answer(first, b"first")
    sent = kafka.bytes_to_send()
    assert sent.startswith(b"first") and sent[5:] == protocol.unsupported_answer(
        protocol.FrameHeader(protocol.METADATA, 0, 1)
    )
    unknown = connection()
    unknown.receive(announced(8, 999, 0))
    assert events(unknown)[-1] == Closed("api key 999 version 0 is not one of Kafka's")


def test_answers_leave_in_request_order_and_a_failed_one_ends_the_rest() -> None:
    kafka = connection()
    slots = [kafka.begin_answer() for _ in range(4)]
    kafka.answer(slots[2], b"c")
    kafka.answer(slots[0], b"a")
    assert kafka.bytes_to_send() == b"a"
    assert kafka.bytes_to_send() == b""
    kafka.answer(slots[1], None)  # failed: the connection closes after "a"
    kafka.answer(slots[3], b"d")
    assert kafka.bytes_to_send() == b""
    assert kafka.done_sending


def test_reading_stops_while_in_flight_max_answers_are_unsent() -> None:
    kafka = connection()
    slots = [kafka.begin_answer() for _ in range(IN_FLIGHT_MAX)]
    assert not kafka.may_read()
    kafka.answer(slots[1], b"b")
    assert not kafka.may_read()  # the first is still awaited
    kafka.answer(slots[0], b"a")
    assert kafka.bytes_to_send() == b"ab"
    assert kafka.may_read()


def test_a_closed_connection_sends_what_it_began_then_is_done() -> None:
    kafka = connection()
    slot = kafka.begin_answer()
    kafka.close("the connection ended")
    assert not kafka.done_sending
    kafka.answer(slot, b"last")
    assert kafka.bytes_to_send() == b"last"
    assert kafka.done_sending


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.booleans())
def test_any_bytes_make_events_and_never_an_error(data: bytes, logins: bool) -> None:
    """Whatever a stranger sends, the connection answers with events: a frame it hands
    on is within its bounds, and it asks for at most one frame's bytes."""
    kafka = connection(logins)
    kafka.receive(data)
    for event in events(kafka):
        if isinstance(event, FrameArrived):
            assert protocol.FRAME_HEADER.size <= len(event.frame) <= REQUEST_BYTES_MAX
        if isinstance(event, NeedBytes):
            assert 0 < event.count <= PRODUCE_MAX + 4
