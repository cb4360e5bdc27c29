"""The consumers' sans-I/O fetch positions (client/positions.py): assignment, seeks,
generations that drop arrivals from before a seek, the reset policy, and positions that
never move backwards."""

from __future__ import annotations

import pytest

from headwater.client.positions import FetchPositions, TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError

A = TopicPartition("t", 0)
B = TopicPartition("t", 1)


def test_positions_start_unknown_and_seek_sets_them() -> None:
    positions = FetchPositions("earliest")
    positions.assign([B, A])
    assert positions.assignment() == [A, B] and positions.unknown() == [B, A]
    positions.seek(A, 5)
    assert positions.offset(A) == 5 and positions.unknown() == [B]


def test_an_arrival_from_before_a_seek_is_dropped() -> None:
    positions = FetchPositions("latest")
    positions.assign([A])
    positions.seek(A, 0)
    before = positions.generation(A)
    positions.seek(A, 100)
    assert positions.accept(A, before) is None
    assert positions.accept(A, positions.generation(A)) == 100


def test_a_reassignment_drops_every_older_arrival() -> None:
    positions = FetchPositions("latest")
    positions.assign([A])
    positions.seek(A, 3)
    before = positions.generation(A)
    positions.assign([A])
    assert positions.accept(A, before) is None and positions.offset(A) is None


def test_positions_never_move_backwards() -> None:
    positions = FetchPositions("latest")
    positions.assign([A])
    positions.seek(A, 10)
    positions.advance(A, 7)
    assert positions.offset(A) == 10
    positions.advance(A, 12)
    assert positions.offset(A) == 12


def test_refusals_name_the_problem() -> None:
    with pytest.raises(HeadwaterError) as bad_policy:
        FetchPositions("smallest")
    assert bad_policy.value.code == ErrorCode.INVALID_CONFIG
    positions = FetchPositions("none")
    positions.assign([A])
    with pytest.raises(HeadwaterError) as negative:
        positions.seek(A, -1)
    assert negative.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    with pytest.raises(HeadwaterError) as unassigned:
        positions.seek(B, 0)
    assert unassigned.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(HeadwaterError) as no_reset:
        positions.reset_to(A)
    assert no_reset.value.code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert FetchPositions("earliest").reset_to(A) == "earliest"
