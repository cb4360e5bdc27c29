"""The producer's sans-I/O core (client/accumulator.py) on a virtual clock: batching,
one batch in flight per partition, retries in order, the unknown-outcome barrier, delivery
expiry and buffer accounting; then a seeded random run against a model that checks those
rules after every step."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from headwater.client.accumulator import (
    AccumulatorSettings,
    OpenBatch,
    ProducerBatch,
    RecordAccumulator,
    cut_batches,
    group_by_partition,
    record_size,
)
from headwater.client.partitioner import partition_for_key
from headwater.client.retry import RetryPolicy
from headwater.log.batch import TIMESTAMP_DELTA_MAX, TIMESTAMP_DELTA_MIN, encode_batch
from headwater.shared.errors import ErrorCode, HeadwaterError

T0_MS = 1_700_000_000_000
CLOCK = [0.0]
"""The virtual monotonic clock ``append`` reads when it opens a batch."""
NOT_LEADER = HeadwaterError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
TIMED_OUT = HeadwaterError(ErrorCode.REQUEST_TIMED_OUT, "no answer")
TOO_LARGE = HeadwaterError(ErrorCode.MESSAGE_TOO_LARGE, "too large")


@dataclass
class Completion:
    slot: tuple[str, int]
    outcomes: list[tuple[int, HeadwaterError | None]] = field(default_factory=list)


def make(
    *,
    batch_bytes: int = 1000,
    linger_s: float = 0.005,
    delivery_timeout_s: float = 10.0,
    append_timeout_ms: int = 500,
    retries: int = 5,
    seed: int = 1,
) -> RecordAccumulator[Completion]:
    settings = AccumulatorSettings(
        batch_bytes=batch_bytes,
        linger_s=linger_s,
        delivery_timeout_s=delivery_timeout_s,
        append_timeout_ms=append_timeout_ms,
        retry=RetryPolicy(retries, 100, 1000),
    )
    return RecordAccumulator(
        settings, random.Random(seed), new_completion=Completion, clock=lambda: CLOCK[0]
    )


def values_of(batch: ProducerBatch[Completion]) -> list[bytes]:
    return [v for v in batch.values if v is not None]


def add(acc: RecordAccumulator[Completion], slot: tuple[str, int], value: bytes, now: float) -> int:
    CLOCK[0] = now
    _completion, index, _changed = acc.append(slot, value, None, None, 0, record_size(value, None))
    return index


A = ("t", 0)
B = ("t", 1)


def test_an_open_batch_leaves_after_linger_and_the_drain_says_when() -> None:
    acc = make(linger_s=0.005)
    add(acc, A, b"x", 0.0)
    drained = acc.drain(0.001, T0_MS, flushing=False)
    assert drained.sendable == [] and drained.wake_at_s == pytest.approx(0.005)
    drained = acc.drain(0.005, T0_MS, flushing=False)
    assert [values_of(b) for b in drained.sendable] == [[b"x"]]
    assert drained.sendable[0].append_deadline_unix_ms == T0_MS + 500


def test_flush_closes_open_batches_at_once() -> None:
    acc = make(linger_s=10)
    add(acc, A, b"x", 0.0)
    assert [b.slot for b in acc.drain(0.0, T0_MS, flushing=True).sendable] == [A]


def test_batches_are_cut_before_batch_bytes_and_a_large_record_goes_alone() -> None:
    acc = make(batch_bytes=100, linger_s=0)
    for _ in range(3):
        add(acc, A, b"v" * 30, 0.0)  # 42 bytes each: two fit in 100
    add(acc, A, b"w" * 500, 0.0)
    sizes = []
    while not acc.idle():
        drained = acc.drain(0.0, T0_MS, flushing=True)
        for batch in drained.sendable:
            sizes.append([len(v or b"") for v in batch.values])
            acc.settle(batch, 0.0, T0_MS)
    assert sizes == [[30, 30], [30], [500]]


def test_a_record_whose_timestamp_a_batch_cannot_hold_starts_the_next() -> None:
    """Timestamps are int32 deltas from a batch's first: a record further away than that
    from it (a user-given timestamp) closes the open batch, so every batch encodes."""
    acc = make(batch_bytes=10_000, linger_s=0)
    far = 1 << 32
    for stamp in (far, far + (1 << 31) - 1, far - (1 << 31), 0, 1):
        acc.append(A, b"v", None, None, stamp, record_size(b"v", None))
    stamps = []
    while not acc.idle():
        for batch in acc.drain(0.0, T0_MS, flushing=True).sendable:
            stamps.append(list(batch.timestamps))  # type: ignore[arg-type]
            encode_batch(batch.values, timestamps_ms=batch.timestamps)
            acc.settle(batch, 0.0, T0_MS)
    assert stamps == [[far, far + (1 << 31) - 1, far - (1 << 31)], [0, 1]]


def test_one_batch_in_flight_per_partition_and_the_open_batch_fills_meanwhile() -> None:
    acc = make(linger_s=0)
    add(acc, A, b"1", 0.0)
    add(acc, B, b"b", 0.0)
    first = acc.drain(0.0, T0_MS, flushing=False).sendable
    assert sorted(b.slot for b in first) == [A, B]
    add(acc, A, b"2", 1.0)
    add(acc, A, b"3", 1.0)
    assert acc.drain(2.0, T0_MS, flushing=False).sendable == []  # A's first is in flight
    acc.settle(first[0] if first[0].slot == A else first[1], 2.0, T0_MS)
    (second,) = acc.drain(2.0, T0_MS, flushing=False).sendable
    assert values_of(second) == [b"2", b"3"]  # one batch, not one per record


def test_a_retry_goes_first_after_its_backoff() -> None:
    acc = make(linger_s=0)
    add(acc, A, b"1", 0.0)
    (batch,) = acc.drain(0.0, T0_MS, flushing=False).sendable
    add(acc, A, b"2", 0.0)
    acc.drain(0.0, T0_MS, flushing=True)  # closes "2" behind the batch in flight
    wait = acc.retry_after(batch, NOT_LEADER, True, 0.0, T0_MS)
    assert wait is not None and 0.08 <= wait <= 0.12
    drained = acc.drain(0.01, T0_MS, flushing=False)
    assert drained.sendable == [] and drained.wake_at_s == pytest.approx(wait)
    (again,) = acc.drain(wait, T0_MS, flushing=False).sendable
    assert again is batch and again.attempts == 1


def test_a_retry_after_an_unknown_outcome_waits_out_the_append_deadline() -> None:
    acc = make(linger_s=0, append_timeout_ms=500)
    add(acc, A, b"1", 0.0)
    (batch,) = acc.drain(0.0, T0_MS, flushing=False).sendable
    wait = acc.retry_after(batch, TIMED_OUT, False, 0.2, T0_MS + 200)
    assert wait is not None and wait >= 0.3 + 0.1  # deadline left plus the clock margin


def test_after_a_final_unknown_failure_the_next_batch_waits_for_the_barrier() -> None:
    acc = make(linger_s=0, append_timeout_ms=500, retries=0)
    add(acc, A, b"1", 0.0)
    (batch,) = acc.drain(0.0, T0_MS, flushing=False).sendable
    add(acc, A, b"2", 0.0)
    assert acc.retry_after(batch, TIMED_OUT, False, 0.1, T0_MS + 100) is None
    acc.settle(batch, 0.1, T0_MS + 100, TIMED_OUT, answered=False)
    drained = acc.drain(0.1, T0_MS + 100, flushing=True)
    assert drained.sendable == []
    assert drained.wake_at_s == pytest.approx(0.1 + 0.4 + 0.1)
    assert [values_of(b) for b in acc.drain(0.6, T0_MS + 600, flushing=True).sendable] == [[b"2"]]


def test_a_known_final_failure_sets_no_barrier() -> None:
    acc = make(linger_s=0)
    add(acc, A, b"1", 0.0)
    (batch,) = acc.drain(0.0, T0_MS, flushing=False).sendable
    add(acc, A, b"2", 0.0)
    assert acc.retry_after(batch, TOO_LARGE, True, 0.0, T0_MS) is None
    acc.settle(batch, 0.0, T0_MS, TOO_LARGE)
    assert len(acc.drain(0.0, T0_MS, flushing=True).sendable) == 1


def test_a_queued_batch_expires_at_its_delivery_deadline_unsent() -> None:
    acc = make(linger_s=0, delivery_timeout_s=1.0)
    add(acc, A, b"1", 0.0)
    (stuck,) = acc.drain(0.0, T0_MS, flushing=False).sendable
    add(acc, A, b"2", 0.5)
    drained = acc.drain(0.5, T0_MS, flushing=True)
    assert drained.wake_at_s == pytest.approx(1.5)  # the queued batch's deadline
    drained = acc.drain(1.5, T0_MS, flushing=True)
    assert [values_of(b) for b in drained.expired] == [[b"2"]]
    for batch in drained.expired:
        acc.settle(batch, 1.5, T0_MS)
    acc.settle(stuck, 1.5, T0_MS)
    assert acc.idle() and acc.buffered_bytes == 0


def test_no_retry_starts_past_the_delivery_deadline() -> None:
    acc = make(linger_s=0, delivery_timeout_s=1.0)
    add(acc, A, b"1", 0.0)
    (batch,) = acc.drain(0.0, T0_MS, flushing=False).sendable
    assert acc.retry_after(batch, NOT_LEADER, True, 0.95, T0_MS) is None


def test_buffer_accounting_and_fits() -> None:
    acc = make(linger_s=0)
    assert acc.fits(10**9, 100)  # anything fits an empty buffer
    add(acc, A, b"x" * 50, 0.0)
    assert acc.buffered_bytes == 62 and not acc.fits(50, 100) and acc.fits(38, 100)
    (batch,) = acc.drain(0.0, T0_MS, flushing=False).sendable
    acc.settle(batch, 0.0, T0_MS)
    assert acc.buffered_bytes == 0 and acc.idle()


def test_add_batch_closes_the_open_batch_first() -> None:
    acc = make(linger_s=10)
    add(acc, A, b"open", 0.0)
    acc.add_batch(A, Completion(A), [b"whole"], None, None, 0, 1, 17, 0.0)
    order = []
    while not acc.idle():
        for batch in acc.drain(0.0, T0_MS, flushing=True).sendable:
            order.append(values_of(batch))
            acc.settle(batch, 0.0, T0_MS)
    assert order == [[b"open"], [b"whole"]]


def test_batch_helpers() -> None:
    keys = [b"a", None, b"b", None]
    groups = group_by_partition(keys, 4, 3)
    assert groups[3][-1] == 3 and 1 in groups[3]
    assert 0 in groups[partition_for_key(b"a", 4)]
    cuts = cut_batches([b"x" * 88] * 10, 250)  # 100 bytes each with the overhead
    assert [end - start for start, end, _ in cuts] == [3, 3, 3, 1]
    assert sum(size for *_, size in cuts) <= 1000


# ---------------------------------------------------------------------- random model run


@pytest.mark.parametrize("seed", range(6))
def test_random_runs_keep_order_bounds_and_barriers(seed: int) -> None:
    """Random appends, drains, answers (acknowledged, refused, lost) and clock steps. After
    every step: at most one batch of a partition in flight; buffered bytes equal the
    records not yet settled. Each partition's acknowledged records are in append order
    with none twice; no batch is sent before an unknown-outcome barrier; every record
    ends acknowledged or failed exactly once."""
    rng = random.Random(seed)
    acc = make(linger_s=0.003, batch_bytes=120, delivery_timeout_s=3.0, seed=seed)
    slots = [("t", p) for p in range(3)]
    now, now_ms = 0.0, T0_MS
    appended: dict[tuple[str, int], list[bytes]] = {s: [] for s in slots}
    acknowledged: dict[tuple[str, int], list[bytes]] = {s: [] for s in slots}
    failed: list[bytes] = []
    in_flight: list[ProducerBatch[Completion]] = []
    barrier_ms: dict[tuple[str, int], int] = {}
    sent_size = 0
    counter = 0
    for _step in range(3000):
        action = rng.random()
        if action < 0.4:
            slot = rng.choice(slots)
            value = f"{slot[1]}:{counter}".encode() + b"." * rng.randrange(40)
            counter += 1
            key = b"k" if rng.random() < 0.1 else None
            CLOCK[0] = now
            acc.append(slot, value, key, None, T0_MS, record_size(value, key))
            appended[slot].append(value)
            sent_size += record_size(value, key)
        elif action < 0.7:
            drained = acc.drain(now, now_ms, flushing=rng.random() < 0.2)
            for batch in drained.expired:
                failed += values_of(batch)
                acc.settle(batch, now, now_ms, TIMED_OUT)
            for batch in drained.sendable:
                assert batch.slot not in {b.slot for b in in_flight}, "two in flight"
                assert now_ms >= barrier_ms.get(batch.slot, 0), "sent before the barrier"
                in_flight.append(batch)
        elif action < 0.9 and in_flight:
            batch = in_flight.pop(rng.randrange(len(in_flight)))
            fate = rng.random()
            if fate < 0.6:
                acknowledged[batch.slot] += values_of(batch)
                acc.settle(batch, now, now_ms)
                continue
            error, answered = (NOT_LEADER, True) if fate < 0.8 else (TIMED_OUT, False)
            if acc.retry_after(batch, error, answered, now, now_ms) is None:
                failed += values_of(batch)
                acc.settle(batch, now, now_ms, error, answered)
                if not answered:
                    barrier_ms[batch.slot] = batch.append_deadline_unix_ms
        else:
            step_s = rng.choice([0.001, 0.01, 0.1, 0.5])
            now += step_s
            now_ms += int(step_s * 1000)
        assert acc.buffered_bytes == _unsettled_bytes(acc)
        _check_direct_room(acc, 120)
    # Heal: answer everything until idle.
    while not acc.idle():
        drained = acc.drain(now, now_ms, flushing=True)
        for batch in drained.expired:
            failed += values_of(batch)
            acc.settle(batch, now, now_ms, TIMED_OUT)
        for batch in [*in_flight, *drained.sendable]:
            acknowledged[batch.slot] += values_of(batch)
            acc.settle(batch, now, now_ms)
        in_flight = []
        now += 0.1
        now_ms += 100
    for slot in slots:
        order = [appended[slot].index(v) for v in acknowledged[slot]]
        assert order == sorted(order) and len(set(order)) == len(order), slot
    settled = [v for s in slots for v in acknowledged[s]] + failed
    assert sorted(settled) == sorted(v for s in slots for v in appended[s])


def _unsettled_bytes(acc: RecordAccumulator[Completion]) -> int:
    """Buffer bytes of every record not yet settled, read through the accumulator's state."""
    batches: list[OpenBatch[Completion] | ProducerBatch[Completion]] = list(acc._open.values())
    for queue in acc._queued.values():
        batches += queue
    for flying in acc._in_flight.values():
        batches += flying
    total = 0
    for batch in batches:
        keys = batch.keys or [None] * len(batch.values)
        total += sum(map(record_size, batch.values, keys))
    return total


def _check_direct_room(acc: RecordAccumulator[Completion], batch_bytes: int) -> None:
    """OpenBatch's rule: room for direct appends is what keeps the batch under
    batch_bytes while it holds no key and no header, and none otherwise."""
    for open_batch in acc._open.values():
        plain = open_batch.keys is None and open_batch.headers is None
        expected = batch_bytes - open_batch.size if plain else 0
        assert open_batch.direct_room == expected
        assert open_batch.size < batch_bytes


def _acknowledge_all(
    acc: RecordAccumulator[Completion], now: float
) -> list[ProducerBatch[Completion]]:
    """Flush: every batch, open or queued, sent and acknowledged, in order."""
    batches: list[ProducerBatch[Completion]] = []
    while not acc.idle():
        for batch in acc.drain(now, T0_MS, flushing=True).sendable:
            acc.settle(batch, now, T0_MS)
            batches.append(batch)
    return batches


def _append_directly_when_admitted(
    acc: RecordAccumulator[Completion],
    slot: tuple[str, int],
    value: bytes | None,
    key: bytes | None,
    headers: list[tuple[str, bytes | None]] | None,
    timestamp_ms: int,
    size: int,
) -> tuple[Completion, int, bool]:
    """What the threaded producer's send does: OpenBatch's rule, else ``append``."""
    batch = acc.open_batch(slot)
    if (
        batch is not None
        and key is None
        and not headers
        and size < batch.direct_room
        and TIMESTAMP_DELTA_MIN <= timestamp_ms - batch.first_timestamp <= TIMESTAMP_DELTA_MAX
    ):
        acc.buffered_bytes += size
        return batch.completion, batch.add_direct(value, timestamp_ms, size), False
    return acc.append(slot, value, key, headers, timestamp_ms, size)


@pytest.mark.parametrize("seed", range(4))
def test_direct_appends_make_the_batches_the_general_path_makes(seed: int) -> None:
    """The same records (keyless, keyed, with headers, timestamps near and a month
    apart, sizes up to past batch_bytes) added directly wherever OpenBatch's rule admits
    them, and through ``append`` alone: the same batches, with the same records, indexes
    and sizes; direct room is never left where it must not be."""
    rng = random.Random(seed)
    fast, general = make(batch_bytes=300, seed=seed), make(batch_bytes=300, seed=seed)
    closed: dict[int, list[ProducerBatch[Completion]]] = {0: [], 1: []}
    month_ms = 30 * 86_400_000
    for step in range(2000):
        slot = ("t", rng.randrange(2))
        value = None if rng.random() < 0.05 else b"v" * rng.choice([0, 5, 40, 120, 290, 400])
        key = b"key" if rng.random() < 0.1 else None
        headers = [("h", b"1")] if rng.random() < 0.05 else None
        stamp = T0_MS + rng.choice([0, 0, 0, 1, 7, month_ms, -month_ms])
        size = record_size(value, key)
        CLOCK[0] = step * 0.001
        answers = [
            _append_directly_when_admitted(fast, slot, value, key, headers, stamp, size),
            general.append(slot, value, key, headers, stamp, size),
        ]
        assert answers[0][1:] == answers[1][1:], step
        _check_direct_room(fast, 300)
        if rng.random() < 0.1:
            for which, acc in enumerate((fast, general)):
                closed[which] += _acknowledge_all(acc, step * 0.001)
    for which, acc in enumerate((fast, general)):
        closed[which] += _acknowledge_all(acc, 10.0)

    def shape(batch: ProducerBatch[Completion]) -> tuple[object, ...]:
        return (batch.slot, batch.values, batch.keys, batch.headers, batch.timestamps, batch.size)

    assert [shape(b) for b in closed[0]] == [shape(b) for b in closed[1]]
    assert sum(b.record_count for b in closed[0]) == 2000
