"""Idempotent producers' sequence window (log/producer_state.py) against an oracle:
producers send, retry, skip ahead, bump their epoch and send from a fenced epoch, in any
interleaving; the partition appends exactly the batches the oracle says, each once and
in order, and answers retries with the original offsets. Snapshots round-trip and any
other bytes are refused."""

from __future__ import annotations

import contextlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.log import producer_state as ps

ACTIONS = st.lists(
    st.tuples(
        st.integers(0, 2),  # producer
        st.sampled_from(["send", "send", "send", "retry", "skip", "bump", "stale"]),
        st.integers(1, 4),  # records in the batch, or how far to skip / which batch to retry
    ),
    max_size=80,
)


@dataclass
class Oracle:
    """What one producer has had appended in its current epoch."""

    epoch: int = 0
    appended: list[tuple[int, int, int]] = field(default_factory=list)  # (first, count, offset)

    @property
    def next_sequence(self) -> int:
        return sum(count for _, count, _ in self.appended)


@given(ACTIONS)
def test_the_window_matches_the_oracle(actions: list[tuple[int, str, int]]) -> None:
    run_history(actions)


def test_seeded_histories_reach_every_verdict() -> None:
    rng = random.Random(13)
    kinds = ["send", "send", "send", "retry", "skip", "bump", "stale"]
    seen: Counter[str] = Counter()
    for _ in range(50):
        actions = [(rng.randrange(3), rng.choice(kinds), rng.randint(1, 4)) for _ in range(80)]
        seen.update(run_history(actions))
    assert set(seen) == {"append", "duplicate", "old", "out_of_order", "unknown", "stale"}


def run_history(actions: list[tuple[int, str, int]]) -> Counter[str]:
    """Play ``actions`` against the partition and the oracle; the verdicts seen."""
    seen: Counter[str] = Counter()
    states = ps.EMPTY
    oracles: dict[int, Oracle] = {}
    log_end = 0
    for producer, action, n in actions:
        pid = 100 + producer
        oracle = oracles.setdefault(pid, Oracle())
        epoch, first, count = oracle.epoch, oracle.next_sequence, n
        expected: str
        if action == "send":
            expected = "append"
        elif action == "retry" and oracle.appended:
            index = max(len(oracle.appended) - n - 3, 0) if n == 4 else len(oracle.appended) - n
            index = max(index, 0)
            first, count, _ = oracle.appended[index]
            expected = "duplicate" if len(oracle.appended) - index <= ps.DUPLICATE_WINDOW else "old"
        elif action == "skip":
            first = oracle.next_sequence + n
            expected = "out_of_order" if pid in states else "unknown"
        elif action == "bump":
            oracle.epoch += 1
            oracle.appended = []
            epoch, first = oracle.epoch, 0
            expected = "append"
        elif action == "stale" and oracle.epoch > 0:
            epoch = oracle.epoch - 1
            expected = "stale"
        else:
            continue
        verdict = ps.check(states, pid, epoch, first, count)
        seen[expected] += 1
        if expected == "append":
            assert isinstance(verdict, ps.Append), (action, verdict)
            states = ps.record(states, pid, epoch, first, count, log_end, 0)
            oracle.appended.append((first, count, log_end))
            log_end += count
        elif expected == "duplicate":
            assert isinstance(verdict, ps.Duplicate), (action, verdict)
            original = next(o for f, c, o in oracle.appended if f == first and c == count)
            assert verdict.original.first_offset == original
        else:
            reason = {
                "old": "old_duplicate",
                "out_of_order": "out_of_order",
                "unknown": "unknown_producer",
                "stale": "stale_epoch",
            }[expected]
            assert isinstance(verdict, ps.Refused) and verdict.reason == reason, (action, verdict)
    # A snapshot carries the whole state.
    restored, end = ps.decode_snapshot(ps.encode_snapshot(states, log_end))
    assert dict(restored) == dict(states) and end == log_end
    return seen


def test_sequences_wrap_at_int32() -> None:
    states = ps.record(ps.EMPTY, 7, 0, 0, 1, 0, 0)
    high = ps.SEQUENCE_MAX - 1
    states = ps.MappingProxyType(
        {7: ps.ProducerEntry(0, (ps.BatchSpan(high - 4, high - 1, 10, 13),), 0)}
    )
    assert isinstance(ps.check(states, 7, 0, high, 3), ps.Append)  # high, max, 0
    states = ps.record(states, 7, 0, high, 3, 14, 0)
    assert states[7].next_sequence == 1
    assert isinstance(ps.check(states, 7, 0, 1, 1), ps.Append)
    assert isinstance(ps.check(states, 7, 0, high, 3), ps.Duplicate)
    refused = ps.check(states, 7, 0, 5, 1)
    assert isinstance(refused, ps.Refused) and refused.reason == "out_of_order"


def test_batches_without_a_producer_are_always_appended_and_not_tracked() -> None:
    assert isinstance(ps.check(ps.EMPTY, ps.NO_PRODUCER, -1, -1, 3), ps.Append)
    assert ps.record(ps.EMPTY, ps.NO_PRODUCER, -1, -1, 3, 0, 0) is ps.EMPTY


def test_silent_producers_expire_and_then_must_start_again() -> None:
    states = ps.record(ps.EMPTY, 1, 0, 0, 2, 0, now := 1_000)
    states = ps.record(states, 2, 0, 0, 2, 2, now + 500)
    kept = ps.expire(states, now + 1_000, expiration_ms=1_000)
    assert list(kept) == [2]
    refused = ps.check(kept, 1, 0, 2, 1)
    assert isinstance(refused, ps.Refused) and refused.reason == "unknown_producer"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[" * 100_000,
        b"[]",
        b'{"version": 2, "end_offset": 0, "producers": []}',
        b'{"version": 1, "end_offset": -1, "producers": []}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 0, []]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, 0, 0, [[1, 2, 3]]]]}',
        b'{"version": 1, "end_offset": 0, "producers": [[1, true, 0, [[1, 2, 3, 4]]]]}',
    ],
)
def test_bad_snapshots_are_refused(data: bytes) -> None:
    with pytest.raises(ps.SnapshotError):
        ps.decode_snapshot(data)


@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_decoding_any_bytes_gives_a_snapshot_or_a_snapshot_error(data: bytes) -> None:
    with contextlib.suppress(ps.SnapshotError):
        ps.decode_snapshot(data)
    with contextlib.suppress(ps.SnapshotError):
        ps.decode_snapshot(
            json.dumps({"version": 1, "end_offset": 0, "producers": [data.hex()]}).encode()
        )
